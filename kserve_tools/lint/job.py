"""Lint rules for the collection job (kserve/batch-job): an Indexed Job whose pods each embed
one shard against the InferenceService and upload it to the storage bucket. Called by
``kserve_tools.lint`` for every rendered ``Job``.

The rules catch what would run but give a wrong or lost result: shards that do not add up
(``--shard .../N`` differing from ``completions``), pods overwriting one output, a restart that
forgets the finished parts; and what would hand a pod that decodes untrusted photos the models'
archives: an output under (or above) an InferenceService's ``storageUri``, the models' storage
secret mounted, the InferenceService's ServiceAccount or an API token, credentials written into
the manifest.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Iterator

from kserve_tools.lint.base import Finding, Problem, stamped
from kserve_tools.render import Resource

JOB_API = "batch/v1"
INDEX = "$(JOB_COMPLETION_INDEX)"
CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
# The Secrets that reach the models' storage: KServe's storage-config (the storage initializer's
# storageSpec secret) and s3-credentials (the S3 secret on the InferenceService's ServiceAccount,
# as kserve/README.md names it). A job of ours mounts neither.
MODEL_STORAGE_SECRETS = frozenset({"storage-config", "s3-credentials"})
# An environment variable or an assignment in a shell script that holds a credential.
SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|ACCESS_KEY|CREDENTIAL", re.IGNORECASE)
NAMES_A_PLACE = re.compile(r"[-_](FILE|ENV|PATH)$", re.IGNORECASE)  # --milvus-token-file=PATH


def command_words(container: dict) -> list[str]:
    """The container's command line as words; a ``sh -c`` script is split like the shell
    would (``;`` ends a word), so its tsctl arguments are found too."""
    words = [*(container.get("command") or []), *(container.get("args") or [])]
    if words[:2] == ["sh", "-c"] and len(words) > 2:
        return shlex.split(" ".join(words[2:]).replace(";", " ; "))
    return words


def option(words: list[str], name: str) -> str | None:
    """The value of ``--name=V`` or ``--name V`` in ``words``."""
    for i, word in enumerate(words):
        if word.startswith(f"{name}="):
            return word.split("=", 1)[1]
        if word == name and i + 1 < len(words):
            return words[i + 1]
    return None


def job_findings(resource: Resource, storage: Iterable[str], service: str) -> list[Finding]:
    """Our rules for one collection Job. ``storage``: the ``storageUri`` of every
    InferenceService (the models' archives); ``service``: the InferenceService it calls."""
    return stamped(resource, job_problems(resource.obj, tuple(storage), service))


def job_problems(obj: dict, storage: tuple[str, ...], service: str) -> Iterator[Problem]:
    if obj.get("apiVersion") != JOB_API:
        yield Problem("apiVersion", f"{obj.get('apiVersion')} is not {JOB_API}", f"use {JOB_API}")
    spec = obj.get("spec") or {}
    if spec.get("completionMode") != "Indexed":
        yield Problem(
            "spec.completionMode",
            f"{spec.get('completionMode')!r}: pods get no "
            "JOB_COMPLETION_INDEX, so they cannot pick their shard",
            "set Indexed",
        )
    completions = spec.get("completions")
    if not isinstance(completions, int) or completions < 1:
        yield Problem(
            "spec.completions", f"{completions!r} is not a shard count", "set it to n >= 1"
        )
        return
    parallelism = spec.get("parallelism", 1)
    if parallelism > completions:
        yield Problem(
            "spec.parallelism",
            f"{parallelism} pods for {completions} shards",
            f"set it to at most {completions}",
        )
    pod = (spec.get("template") or {}).get("spec") or {}
    if pod.get("restartPolicy") != "OnFailure":
        yield Problem(
            "spec.template.spec.restartPolicy",
            f"{pod.get('restartPolicy')!r}: a "
            "new pod starts with an empty work folder and redoes the whole shard",
            "set OnFailure (the container restarts in its pod and resumes from the emptyDir)",
        )
    containers = pod.get("containers") or []
    if len(containers) != 1:
        yield Problem("spec.template.spec.containers", f"{len(containers)} containers", "keep one")
        return
    container = containers[0]
    args = "spec.template.spec.containers[0].args"
    words = command_words(container)
    shard = option(words, "--shard")
    if shard != f"{INDEX}/{completions}":
        yield Problem(
            args,
            f"--shard is {shard!r}, not {INDEX}/{completions}: the shards "
            f"would not add up to the collection (completions is {completions})",
            f"pass --shard={INDEX}/{completions}",
        )
    out = option(words, "--out") or ""
    if INDEX not in out:
        yield Problem(
            args,
            f"--out {out!r} is the same for every pod: shards overwrite each other",
            f"put {INDEX} in the output name",
        )
    if not out.startswith("s3://"):
        yield Problem(
            args,
            f"--out {out!r} is not in a bucket: a pod's disk goes with it",
            "write to s3://BUCKET/...",
        )
    yield from prefix_problems(out, storage, args)
    url = option(words, "--url") or ""
    host = re.sub(r"^https?://", "", url).split("/", 1)[0]
    if not host.startswith((f"{service}-predictor.", f"{service}.")):
        yield Problem(
            args,
            f"--url {url!r} is not the InferenceService {service!r}",
            f"use http://{service}-predictor.<namespace>.svc.cluster.local",
        )
    yield from work_dir_problems(pod, container, args, "the finished parts are lost on a restart")
    yield from credential_problems(pod)
    yield from identity_problems(pod)
    env = {e.get("name"): e for e in container.get("env") or []}
    if "PYTHONPATH" in env:
        env_path = "spec.template.spec.containers[0].env"
        yield Problem(env_path, "PYTHONPATH set", "remove it; the image installs serveclient")


def prefix_problems(out: str, storage: tuple[str, ...], args: str) -> Iterator[Problem]:
    """The job's output prefix (``out`` up to its last ``/``) and each model ``storage`` URI
    apart: neither under the other, compared as S3 compares prefixes (a ``storageUri`` without
    its trailing ``/`` also reads its siblings, so it is compared without it). The job's
    credentials are scoped to that prefix (kserve/README.md): overlapping, they reach the
    archives."""
    prefix = out.rsplit("/", 1)[0] + "/"
    for uri in storage:
        if out.startswith(uri.rstrip("/")) or uri.startswith(prefix):
            yield Problem(
                args,
                f"--out {out!r} and the models' storage {uri!r} overlap: the job's keys, "
                "scoped to its prefix, would reach the archives",
                "write under a prefix of its own, e.g. s3://BUCKET/embeddings/",
            )


def secret_names(pod: dict) -> set[str]:
    """Every Secret a pod spec names: in its containers' env and envFrom, and its volumes."""
    names = set()
    for container in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
        for entry in container.get("env") or []:
            names.add(((entry.get("valueFrom") or {}).get("secretKeyRef") or {}).get("name"))
        for entry in container.get("envFrom") or []:
            names.add((entry.get("secretRef") or {}).get("name"))
    for volume in pod.get("volumes") or []:
        names.add((volume.get("secret") or {}).get("secretName"))
        for source in (volume.get("projected") or {}).get("sources") or []:
            names.add((source.get("secret") or {}).get("name"))
    return names - {None}


def credential_problems(pod: dict) -> Iterator[Problem]:
    """A tsctl pod's S3 credentials not taken from a Secret, the models' storage secret named
    anywhere in it, and any credential written into the manifest (an env value, or an
    assignment in a container's command line)."""
    env_path = "spec.template.spec.containers[0].env"
    [container, *_] = pod.get("containers") or [{}]
    env = {e.get("name"): e for e in container.get("env") or []}
    for name in CREDENTIALS:
        entry = env.get(name)
        if entry is None or "secretKeyRef" not in (entry.get("valueFrom") or {}):
            yield Problem(
                env_path,
                f"{name} does not come from a Secret",
                "take it from the job's own S3 secret (secretKeyRef)",
            )
    for name in sorted(secret_names(pod) & MODEL_STORAGE_SECRETS):
        yield Problem(
            "spec.template.spec",
            f"names the models' storage secret {name!r}: whatever this pod runs could "
            "overwrite the archives",
            "give the job a Secret of its own (resnet50-embeddings-s3), scoped to its prefix",
        )
    yield from literal_problems(pod)


def literal_problems(pod: dict) -> Iterator[Problem]:
    """A credential written into a pod spec: an env entry named like one with a ``value``,
    or a ``NAME=...`` of that kind among a container's command words."""
    for i, container in enumerate(pod.get("containers") or []):
        path = f"spec.template.spec.containers[{i}]"
        for entry in container.get("env") or []:
            name = str(entry.get("name"))
            if SECRET_NAME.search(name) and not NAMES_A_PLACE.search(name) and "value" in entry:
                yield Problem(
                    f"{path}.env",
                    f"{entry.get('name')} is written into the manifest",
                    "take it from a Secret (valueFrom.secretKeyRef)",
                )
        for word in command_words(container):
            name = word.split("=", 1)[0].lstrip("-")
            if "=" in word and SECRET_NAME.search(name) and not NAMES_A_PLACE.search(name):
                yield Problem(
                    f"{path}.command",
                    f"{name}= is written into the command line",
                    "read it from a file mounted from a Secret (tsctl: --milvus-token-file)",
                )


def identity_problems(pod: dict) -> Iterator[Problem]:
    """A collection job's pods not under a ServiceAccount of their own, or with an API token
    (they call the InferenceService and the bucket, never Kubernetes)."""
    account = pod.get("serviceAccountName")
    if account in (None, "", "default"):
        yield Problem(
            "spec.template.spec.serviceAccountName",
            f"{account or 'none'}: the pods run as the namespace's default ServiceAccount, "
            "which the InferenceService (and its storage secret) may share",
            "run them as the job's own (kserve/batch-job/serviceaccount.yaml: resnet50-embed)",
        )
    if pod.get("automountServiceAccountToken") is not False:
        yield Problem(
            "spec.template.spec.automountServiceAccountToken",
            "a Kubernetes API token is mounted in pods that decode untrusted photos",
            "set automountServiceAccountToken: false",
        )


def work_dir_problems(pod: dict, container: dict, args: str, loss: str) -> Iterator[Problem]:
    """A tsctl pod's ``--work-dir`` off the pod's emptyDir volumes (``loss``: what that costs)."""
    work = option(command_words(container), "--work-dir")
    mounts = {m.get("mountPath"): m.get("name") for m in container.get("volumeMounts") or []}
    empty = {v.get("name") for v in pod.get("volumes") or [] if "emptyDir" in v}
    if work is None or mounts.get(work) not in empty:
        yield Problem(
            args, f"--work-dir {work!r} is not an emptyDir mount: {loss}", "mount an emptyDir there"
        )
