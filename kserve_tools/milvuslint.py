"""Lint rules for Milvus beside KServe (kserve/milvus): the Standalone StatefulSet and its
Service, and the Job that indexes the collection job's shards into it. Called by
``kserve_tools.lint`` for every rendered StatefulSet and Service, and for a Job that runs
``tsctl index build``.

The rules catch what would run but lose or miss data: local storage on more than one replica
or off a persistent claim (the index goes with the pod), no health probe (tsctl reaches a
Milvus still loading), an index Job reading another prefix than the collection job writes, or
writing to another Milvus than the Service, or with credentials in the manifest.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from kserve_tools.joblint import command_words, option, work_dir_problems
from kserve_tools.lint.base import Finding, Problem, stamped
from kserve_tools.render import Resource

SERVICE = "milvus"  # kserve/milvus/milvus.yaml's Service: what the index Job writes to
GRPC_PORT = 19530
HEALTH_PORT = 9091
DATA = "/var/lib/milvus"
VALUED = ("--out", "--collection", "--work-dir")  # tsctl index build's options with a value


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
