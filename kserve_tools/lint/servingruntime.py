"""Rules for our ClusterServingRuntime. No CRD schema is kept here, so our own rules, strict
too: known fields only; one ``kserve-container`` started in the foreground from ``/mnt/models``;
model formats not auto-selected; v1/v2 protocols; one port named for Knative and equal to
TorchServe's ``inference_address`` port; the bundle's readiness check as readiness probe;
metrics annotations equal to ``metrics_address``; no ``PYTHONPATH``; seccomp and memory; token
authorization off in its config (probes carry no key). The rules it shares with our Triton
runtime live in ``runtimes``; this module passes them TorchServe's ports and keeps the rest.
Also what an InferenceService needs to know of the runtimes it may name (``Runtime``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from kserve_tools.lint import runtimes
from kserve_tools.lint.base import MOUNT, Finding, Problem, port, server_properties
from kserve_tools.lint.memory import memory_problems
from kserve_tools.render import Resource

PROTOCOLS = ("v1", "v2", "grpc-v1", "grpc-v2")
# The runtime's readiness probe: kserve/runtime/readiness.py, packed into the bundle.
READINESS_COMMAND = ("python", f"{MOUNT}/config/readiness.py", f"{MOUNT}/config/config.properties")


@dataclass(frozen=True)
class Runtime:
    """What an InferenceService needs to know of a serving runtime."""

    name: str
    formats: tuple[tuple[str, str | None, bool], ...]  # (name, version, autoSelect)
    protocols: tuple[str, ...]


# KServe's stock runtime for modelFormat pytorch (config/runtimes/kserve-torchserve.yaml).
STOCK_RUNTIME = Runtime("kserve-torchserve", (("pytorch", "1", True),), ("v1", "v2", "grpc-v2"))
# KServe's Triton runtime (config/runtimes/kserve-tritonserver.yaml): the Python-backend
# repository of `make triton-repo` is modelFormat triton:2 (kserve/triton, docs/triton.md).
TRITON_RUNTIME = Runtime(
    "kserve-tritonserver",
    (
        ("tensorrt", "8", False),
        ("tensorflow", "1", False),
        ("tensorflow", "2", False),
        ("onnx", "1", True),
        ("pytorch", "1", False),
        ("triton", "2", True),
    ),
    ("v2", "grpc-v2"),
)
# Triton in that runtime: --http-port 8080, metrics on Triton's default 8002.
TRITON_PORTS = {"inference": 8080, "metrics": 8002}


def runtime_of(resource: Resource) -> Runtime:
    spec = resource.obj.get("spec") or {}
    formats = tuple(
        (
            f.get("name"),
            None if f.get("version") is None else str(f["version"]),
            bool(f.get("autoSelect", False)),
        )
        for f in spec.get("supportedModelFormats") or []
    )
    return Runtime(resource.name, formats, tuple(spec.get("protocolVersions") or ("v1",)))


def runtime_findings(resource: Resource, properties: dict[str, str] | None = None) -> list[Finding]:
    """Our rules for our ClusterServingRuntime (``properties``: its server.properties)."""
    settings = server_properties() if properties is None else properties

    def rules(spec: dict) -> Iterator[Problem]:
        yield from spec_problems(resource.name, spec)
        yield from runtimes.each_container(
            spec, lambda path, container: container_problems(path, container, settings)
        )
        yield from server_problems(spec, settings)

    return runtimes.runtime_checked(resource, rules)


def spec_problems(name: str, spec: dict) -> Iterator[Problem]:
    """The name, known fields, our model format (not auto-selected), v1 and v2, one
    kserve-container."""
    yield from runtimes.name_and_field_problems(name, spec)
    formats = spec.get("supportedModelFormats") or []
    if not formats:
        yield Problem(
            "spec.supportedModelFormats", "empty", "name the bundle's format (torchserve-mar)"
        )
    for i, fmt in enumerate(formats):
        yield from runtimes.format_field_problems(i, fmt)
        if not fmt.get("name"):
            yield Problem(f"spec.supportedModelFormats[{i}].name", "missing", "name the format")
        yield from runtimes.auto_select_problems(
            i, fmt, "our bundle format must not be picked automatically"
        )
    protocols = spec.get("protocolVersions") or []
    bad = [p for p in protocols if p not in PROTOCOLS]
    if bad or not {"v1", "v2"} <= set(protocols):
        yield Problem(
            "spec.protocolVersions",
            f"{protocols} must include v1 and v2 and only {', '.join(PROTOCOLS)}",
            "use [v1, v2]",
        )
    yield from runtimes.one_container_problems(spec)


def server_problems(spec: dict, properties: dict[str, str]) -> Iterator[Problem]:
    """Metrics annotations on TorchServe's metrics port; token authorization off (probes and
    the gateway carry no key), so the management API on loopback only."""
    metrics_port = port(properties["metrics_address"])
    yield from runtimes.metrics_port_problems(
        spec, metrics_port, f"TorchServe's metrics port {metrics_port} (metrics_address)"
    )
    if (spec.get("annotations") or {}).get("prometheus.kserve.io/path") != "/metrics":
        yield Problem(
            "spec.annotations.prometheus.kserve.io/path", "not /metrics", "set it to /metrics"
        )
    if properties.get("disable_token_authorization") != "true":
        yield Problem(
            "server.properties: disable_token_authorization",
            "token authorization is "
            "on, but the kubelet's probes and KServe's gateway send no TorchServe key",
            "set disable_token_authorization=true and authenticate at the gateway",
        )
    if not properties.get("management_address", "").startswith("http://127.0.0.1:"):
        yield Problem(
            "server.properties: management_address",
            "reachable from outside the pod while tokens are off",
            "bind it to 127.0.0.1",
        )


def container_problems(path: str, container: dict, properties: dict[str, str]) -> Iterator[Problem]:
    """The runtime's container at ``path``: known fields, TorchServe in the foreground from the
    bundle, no blocked env, one Knative port (TorchServe's), seccomp, memory, readiness."""
    yield from runtimes.container_field_problems(path, container)
    words = [*(container.get("command") or []), *(container.get("args") or [])]
    for needed in (
        "--foreground",
        f"--model-store={MOUNT}/model-store",
        f"--ts-config={MOUNT}/config/config.properties",
    ):
        if needed not in words:
            yield Problem(
                f"{path}.args",
                f"{needed} missing from the TorchServe command line",
                f"add {needed} (the container must run TorchServe in the foreground "
                "from the bundle KServe downloads)",
            )
    yield from runtimes.env_problems(path, container)
    inference_port = port(properties["inference_address"])
    yield from runtimes.port_problems(
        path,
        container,
        inference_port,
        f"TorchServe's inference port {inference_port} (inference_address)",
    )
    yield from runtimes.seccomp_problems(path, container)
    yield from memory_problems(f"{path}.resources", container.get("resources"))
    probe = container.get("readinessProbe") or {}
    if (probe.get("exec") or {}).get("command") != list(READINESS_COMMAND):
        yield Problem(
            f"{path}.readinessProbe",
            f"{probe or 'missing'}: only the bundle's readiness "
            "check waits until every model's workers are loaded (TorchServe 0.12's "
            "/ping counts starting workers as healthy; /v2/health/ready is always "
            "true)",
            f"use exec: command: {list(READINESS_COMMAND)}",
        )
