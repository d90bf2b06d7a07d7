"""Lint rules for Milvus beside KServe (kserve/milvus): the Standalone StatefulSet and its
Service, and the Job that indexes the collection job's shards into it. Called by
``kserve_tools.lint`` for every rendered StatefulSet and Service, and for a Job that runs
``tsctl index build``.

The rules catch what would run but lose or miss data: local storage on more than one replica
or off a persistent claim (the index goes with the pod), no health probe (tsctl reaches a
Milvus still loading), an index Job reading another prefix than the collection job writes, or
writing to another Milvus than the Service, or with credentials in the manifest. And what would
let any pod rewrite the collection (rows whose paths the pages then read): authentication off,
root's password Milvus's default or written into the manifest, the index Job without its token
from a Secret, no NetworkPolicy in front of Milvus's pods or one admitting more than labelled
pods of the namespace on the gRPC port (``policy_findings``, per rendered target).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from kserve_tools.lint.base import Finding, Problem, finding, stamped
from kserve_tools.lint.job import (
    command_words,
    credential_problems,
    literal_problems,
    option,
    work_dir_problems,
)
from kserve_tools.render import Resource

SERVICE = "milvus"  # kserve/milvus/milvus.yaml's Service: what the index Job writes to
GRPC_PORT = 19530
HEALTH_PORT = 9091
DATA = "/var/lib/milvus"
VALUED = ("--out", "--collection", "--work-dir", "--milvus-token-file")  # options with a value
# Milvus reads milvus.yaml's settings from the environment too (names compared without case,
# dots or underscores): common.security.authorizationEnabled and defaultRootPassword.
AUTH = "COMMON_SECURITY_AUTHORIZATIONENABLED"
ROOT_PASSWORD = "COMMON_SECURITY_DEFAULTROOTPASSWORD"
TOKEN_ENV = "MILVUS_TOKEN"  # tsctl's, when no --milvus-token-file


def is_index_job(resource: Resource) -> bool:
    """A Job whose container runs ``tsctl index build``."""
    pod = ((resource.obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    return any(
        command_words(c)[:3] == ["tsctl", "index", "build"] for c in pod.get("containers") or []
    )


def findings(resource: Resource) -> list[Finding]:
    """Our rules for a rendered StatefulSet or Service (others have none here)."""
    if resource.kind == "StatefulSet":
        return stamped(resource, standalone_problems(resource.obj))
    if resource.kind == "Service" and resource.name == SERVICE:
        ports = {p.get("port") for p in (resource.obj.get("spec") or {}).get("ports") or []}
        if GRPC_PORT not in ports:
            problem = Problem("spec.ports", f"no port {GRPC_PORT}", "expose Milvus's gRPC port")
            return stamped(resource, [problem])
    return []


def standalone_problems(obj: dict) -> Iterator[Problem]:
    spec = obj.get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") or {}
    [container, *_] = pod.get("containers") or [{}]
    env = {e.get("name"): e.get("value") for e in container.get("env") or []}
    if env.get("COMMON_STORAGETYPE") == "local" and spec.get("replicas", 1) != 1:
        yield Problem(
            "spec.replicas",
            f"{spec.get('replicas')} replicas of local storage: each pod holds its own copy",
            "keep 1, or deploy Milvus Distributed (object storage) for more",
        )
    claims = {t.get("metadata", {}).get("name") for t in spec.get("volumeClaimTemplates") or []}
    mounts = {m.get("mountPath"): m.get("name") for m in container.get("volumeMounts") or []}
    if mounts.get(DATA) not in claims:
        yield Problem(
            "spec.template.spec.containers[0].volumeMounts",
            f"{DATA} is not on a volumeClaimTemplate: the index is lost with the pod",
            f"mount a claim of spec.volumeClaimTemplates at {DATA}",
        )
    probe = (container.get("readinessProbe") or {}).get("httpGet") or {}
    if (probe.get("path"), probe.get("port")) != ("/healthz", HEALTH_PORT):
        yield Problem(
            "spec.template.spec.containers[0].readinessProbe",
            f"{probe or None}: the Service sends requests to a Milvus still starting",
            f"probe httpGet /healthz on port {HEALTH_PORT}",
        )
    yield from auth_problems(container)
    yield from literal_problems(pod)


def auth_problems(container: dict) -> Iterator[Problem]:
    """Milvus's authentication off, or root's password not from a Secret."""
    env = {e.get("name"): e for e in container.get("env") or []}
    path = "spec.template.spec.containers[0].env"
    if str((env.get(AUTH) or {}).get("value")).lower() != "true":
        yield Problem(
            path,
            "authentication is off: any pod that reaches port 19530 can rewrite the collection",
            f'set {AUTH}: "true"',
        )
    if "secretKeyRef" not in ((env.get(ROOT_PASSWORD) or {}).get("valueFrom") or {}):
        yield Problem(
            path,
            f"{ROOT_PASSWORD} does not come from a Secret: root keeps Milvus's default "
            "password, or the manifest holds it",
            "take it from the Secret milvus-auth (secretKeyRef, key root-password)",
        )


def build_inputs(words: list[str]) -> list[str]:
    """The PARQUET arguments of ``tsctl index build ...``: its words past the command that are
    neither options nor an option's value (``--out URL`` as well as ``--out=URL``)."""
    inputs, skip = [], False
    for word in words[3:]:
        if skip:
            skip = False
        elif word.startswith("-"):
            skip = word in VALUED
        else:
            inputs.append(word)
    return inputs


def index_job_findings(resource: Resource, shards: str) -> list[Finding]:
    """Our rules for the index Job; ``shards``: the s3:// prefix the collection job's pods
    upload their shards under."""
    return stamped(resource, index_job_problems(resource.obj, shards))


def index_job_problems(obj: dict, shards: str) -> Iterator[Problem]:
    pod = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    if pod.get("restartPolicy") != "OnFailure":
        yield Problem(
            "spec.template.spec.restartPolicy",
            f"{pod.get('restartPolicy')!r}: a new pod fetches every shard again",
            "set OnFailure (the container restarts in its pod, the fetched shards kept)",
        )
    [container, *_] = pod.get("containers") or [{}]
    args = "spec.template.spec.containers[0].command"
    words = command_words(container)
    inputs = build_inputs(words)
    if inputs != [shards]:
        yield Problem(
            args,
            f"indexes {inputs}, not the collection job's shards {shards!r}",
            f"index {shards}",
        )
    out = option(words, "--out") or ""
    host = re.sub(r"^https?://", "", out).split("/", 1)[0]
    if not (host.startswith(f"{SERVICE}.") and host.endswith(f":{GRPC_PORT}")):
        yield Problem(
            args,
            f"--out {out!r} is not the Service {SERVICE!r} on port {GRPC_PORT}",
            f"use http://{SERVICE}.<namespace>.svc.cluster.local:{GRPC_PORT}",
        )
    if not option(words, "--collection"):
        yield Problem(
            args,
            "no --collection: the default is named after the first shard's file",
            "name the collection searches will ask for",
        )
    yield from work_dir_problems(pod, container, args, "the shards land in the image's filesystem")
    yield from credential_problems(pod)
    yield from token_problems(pod, container, words, args)


def token_problems(pod: dict, container: dict, words: list[str], args: str) -> Iterator[Problem]:
    """The index Job without a Milvus token from a Secret: ``--milvus-token-file`` inside a
    mount of a ``secret`` volume, or else ``MILVUS_TOKEN`` from a ``secretKeyRef``."""
    path = option(words, "--milvus-token-file")
    secrets = {v.get("name") for v in pod.get("volumes") or [] if "secret" in v}
    mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") in secrets]
    if path is not None:
        if not any(path.startswith(m.get("mountPath", "").rstrip("/") + "/") for m in mounts):
            yield Problem(
                args,
                f"--milvus-token-file {path!r} is not in a mount of a Secret",
                "mount the Secret milvus-auth (key token) there",
            )
        return
    env = {e.get("name"): e for e in container.get("env") or []}
    if "secretKeyRef" not in ((env.get(TOKEN_ENV) or {}).get("valueFrom") or {}):
        yield Problem(
            args,
            "no Milvus token from a Secret: Milvus (authentication on) refuses the build",
            "mount the Secret milvus-auth (key token) and pass --milvus-token-file=<its path>",
        )


def policy_findings(objects: list[Resource]) -> list[Finding]:
    """For each Milvus StatefulSet among ``objects`` (one rendered target): a NetworkPolicy
    there selects its pods, and every ingress rule of every one that does admits only pods of
    the namespace chosen by label (``podSelector.matchLabels``, no namespace, IP block or empty
    peer) on the gRPC port alone; each index Job's pods carry the labels of one such rule."""
    found: list[Finding] = []
    policies = [r for r in objects if r.kind == "NetworkPolicy"]
    for milvus in (r for r in objects if r.kind == "StatefulSet"):
        template = (milvus.obj.get("spec") or {}).get("template") or {}
        labels = (template.get("metadata") or {}).get("labels") or {}
        selecting = [p for p in policies if _selects(p.obj, labels)]
        if not selecting:
            found.append(
                finding(
                    milvus,
                    "<NetworkPolicy>",
                    f"no NetworkPolicy selects Milvus's pods ({labels}): every pod of the "
                    f"cluster reaches port {GRPC_PORT}",
                    "keep kserve/milvus/networkpolicy.yaml in the kustomization",
                )
            )
        clients = []
        for policy in selecting:
            for i, rule in enumerate((policy.obj.get("spec") or {}).get("ingress") or []):
                problem, admitted = _rule_problem(rule)
                if problem:
                    found.append(finding(policy, f"spec.ingress[{i}]", *problem))
                clients += admitted
        for job in (r for r in objects if r.kind == "Job" and is_index_job(r)):
            pod = ((job.obj.get("spec") or {}).get("template") or {}).get("metadata") or {}
            own = pod.get("labels") or {}
            if not any(c.items() <= own.items() for c in clients):
                found.append(
                    finding(
                        job,
                        "spec.template.metadata.labels",
                        f"{own}: the NetworkPolicy admits none of these pods to Milvus "
                        f"(it admits {clients or 'no pod'})",
                        "label the pod template with the labels the policy admits",
                    )
                )
    return found


def _selects(policy: dict, labels: dict) -> bool:
    """Whether an Ingress ``policy`` selects pods labelled ``labels``."""
    spec = policy.get("spec") or {}
    chosen = (spec.get("podSelector") or {}).get("matchLabels") or {}
    return "Ingress" in (spec.get("policyTypes") or []) and chosen.items() <= labels.items()


def _rule_problem(rule: dict) -> tuple[tuple[str, str] | None, list[dict]]:
    """(what is wrong with one ingress rule and how to fix it, or None; the pod labels it
    admits)."""
    peers = rule.get("from") or []
    admitted = [((p.get("podSelector") or {}).get("matchLabels") or {}) for p in peers]
    if not peers or any(set(p) != {"podSelector"} for p in peers) or not all(admitted):
        return (
            "admits more than labelled pods of this namespace",
            'admit peers by podSelector.matchLabels only (milvus-client: "true")',
        ), []
    ports = {p.get("port") for p in rule.get("ports") or []}
    if not ports or ports - {GRPC_PORT, "grpc"}:
        return (
            f"admits {sorted(map(str, ports)) or 'every port'}, not port {GRPC_PORT} alone",
            f"list port {GRPC_PORT} only",
        ), admitted
    return None, admitted
