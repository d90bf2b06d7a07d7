"""Lint rules for the collection job (kserve/batch-job): an Indexed Job whose pods each embed
one shard against the InferenceService and upload it to the storage bucket. Called by
``kserve_tools.lint`` for every rendered ``Job``.

The rules catch what would run but give a wrong or lost result: shards that do not add up
(``--shard .../N`` differing from ``completions``), pods overwriting one output, an output
outside the bucket the storage initializer reads, a restart that forgets the finished parts,
credentials written into the manifest.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator

from kserve_tools.lint.base import Finding, Problem, stamped
from kserve_tools.render import Resource

JOB_API = "batch/v1"
INDEX = "$(JOB_COMPLETION_INDEX)"
CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


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


def job_findings(resource: Resource, bucket: str | None, service: str) -> list[Finding]:
    """Our rules for one collection Job. ``bucket``: the bucket of the InferenceService's
    ``storageUri``; ``service``: its name."""
    return stamped(resource, job_problems(resource.obj, bucket, service))


def job_problems(obj: dict, bucket: str | None, service: str) -> Iterator[Problem]:
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
    elif bucket is not None and out[len("s3://") :].split("/", 1)[0] != bucket:
        yield Problem(
            args,
            f"--out {out!r} is not in the bucket the storage initializer "
            f"reads ({bucket}), whose credentials the pods get",
            f"use s3://{bucket}/...",
        )
    url = option(words, "--url") or ""
    host = re.sub(r"^https?://", "", url).split("/", 1)[0]
    if not host.startswith((f"{service}-predictor.", f"{service}.")):
        yield Problem(
            args,
            f"--url {url!r} is not the InferenceService {service!r}",
            f"use http://{service}-predictor.<namespace>.svc.cluster.local",
        )
    yield from work_dir_problems(pod, container, args, "the finished parts are lost on a restart")
    env = {e.get("name"): e for e in container.get("env") or []}
    if "PYTHONPATH" in env:
        env_path = "spec.template.spec.containers[0].env"
        yield Problem(env_path, "PYTHONPATH set", "remove it; the image installs serveclient")


def work_dir_problems(pod: dict, container: dict, args: str, loss: str) -> Iterator[Problem]:
    """A tsctl pod's ``--work-dir`` off the pod's emptyDir volumes (``loss``: what that costs),
    and its S3 credentials not taken from a Secret."""
    work = option(command_words(container), "--work-dir")
    mounts = {m.get("mountPath"): m.get("name") for m in container.get("volumeMounts") or []}
    empty = {v.get("name") for v in pod.get("volumes") or [] if "emptyDir" in v}
    if work is None or mounts.get(work) not in empty:
        yield Problem(
            args, f"--work-dir {work!r} is not an emptyDir mount: {loss}", "mount an emptyDir there"
        )
    env = {e.get("name"): e for e in container.get("env") or []}
    for name in CREDENTIALS:
        entry = env.get(name)
        if entry is None or "secretKeyRef" not in (entry.get("valueFrom") or {}):
            yield Problem(
                "spec.template.spec.containers[0].env",
                f"{name} does not come from a Secret",
                "take it from the storage initializer's S3 secret (secretKeyRef)",
            )
