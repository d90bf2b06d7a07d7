"""Rules for our ClusterServingRuntime. No CRD schema is kept here, so our own rules, strict
too: known fields only; one ``kserve-container`` started in the foreground from ``/mnt/models``;
model formats not auto-selected; v1/v2 protocols; one port named for Knative and equal to
TorchServe's ``inference_address`` port; the bundle's readiness check as readiness probe;
metrics annotations equal to ``metrics_address``; no ``PYTHONPATH``; seccomp and memory; token
authorization off in its config (probes carry no key)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from kserve_tools.lint.base import (
    BLOCKED_ENV,
    MOUNT,
    NAME,
    Finding,
    Problem,
    port,
    server_properties,
    stamped,
)
from kserve_tools.lint.memory import memory_problems
from kserve_tools.render import Resource

RUNTIME_API = "serving.kserve.io/v1alpha1"
PROTOCOLS = ("v1", "v2", "grpc-v1", "grpc-v2")
KNATIVE_PORT_NAMES = ("http1", "h2c")
# The runtime's readiness probe: kserve/runtime/readiness.py, packed into the bundle.
READINESS_COMMAND = ("python", f"{MOUNT}/config/readiness.py", f"{MOUNT}/config/config.properties")
RUNTIME_SPEC_FIELDS = {
    "annotations",
    "labels",
    "supportedModelFormats",
    "protocolVersions",
    "containers",
    "volumes",
    "disabled",
    "multiModel",
    "grpcEndpoint",
    "grpcDataEndpoint",
    "httpDataEndpoint",
    "replicas",
    "storageHelper",
    "builtInAdapter",
    "nodeSelector",
    "affinity",
    "tolerations",
    "imagePullSecrets",
    "workerSpec",
    "hostIPC",
}
CONTAINER_FIELDS = {
    "name",
    "image",
    "command",
    "args",
    "workingDir",
    "ports",
    "envFrom",
    "env",
    "resources",
    "resizePolicy",
    "restartPolicy",
    "volumeMounts",
    "volumeDevices",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
    "terminationMessagePath",
    "terminationMessagePolicy",
    "imagePullPolicy",
    "securityContext",
    "stdin",
    "stdinOnce",
    "tty",
}
MODEL_FORMAT_FIELDS = {"name", "version", "autoSelect", "priority"}


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
    properties = server_properties() if properties is None else properties
    obj = resource.obj
    if obj.get("apiVersion") != RUNTIME_API or obj.get("kind") not in (
        "ClusterServingRuntime",
        "ServingRuntime",
    ):
        return stamped(
            resource,
            [
                Problem(
                    "apiVersion",
                    f"{obj.get('apiVersion')}/{obj.get('kind')} is not a serving runtime",
                    f"use apiVersion {RUNTIME_API}, kind ClusterServingRuntime",
                )
            ],
        )
    spec = obj.get("spec") or {}
    return stamped(
        resource,
        [
            *spec_problems(resource.name, spec),
            *(
                problem
                for i, container in enumerate(spec.get("containers") or [])
                for problem in container_problems(f"spec.containers[{i}]", container, properties)
            ),
            *server_problems(spec, properties),
        ],
    )


def spec_problems(name: str, spec: dict) -> Iterator[Problem]:
    """The name, known fields, our model format (not auto-selected), v1 and v2, one
    kserve-container."""
    if not NAME.match(name):
        yield Problem(
            "metadata.name",
            f"{name!r} does not match {NAME.pattern}",
            "use lower-case letters, digits and '-'",
        )
    for field in sorted(set(spec) - RUNTIME_SPEC_FIELDS):
        yield Problem(f"spec.{field}", "unknown field", "remove or rename it")
    formats = spec.get("supportedModelFormats") or []
    if not formats:
        yield Problem(
            "spec.supportedModelFormats", "empty", "name the bundle's format (torchserve-mar)"
        )
    for i, fmt in enumerate(formats):
        for field in sorted(set(fmt) - MODEL_FORMAT_FIELDS):
            yield Problem(f"spec.supportedModelFormats[{i}].{field}", "unknown field", "remove it")
        if not fmt.get("name"):
            yield Problem(f"spec.supportedModelFormats[{i}].name", "missing", "name the format")
        if fmt.get("autoSelect", False) is not False:
            yield Problem(
                f"spec.supportedModelFormats[{i}].autoSelect",
                "our bundle format must not be picked automatically",
                "set autoSelect: false (select by runtime: name)",
            )
    protocols = spec.get("protocolVersions") or []
    bad = [p for p in protocols if p not in PROTOCOLS]
    if bad or not {"v1", "v2"} <= set(protocols):
        yield Problem(
            "spec.protocolVersions",
            f"{protocols} must include v1 and v2 and only {', '.join(PROTOCOLS)}",
            "use [v1, v2]",
        )
    names = [c.get("name") for c in spec.get("containers") or []]
    if names != ["kserve-container"]:
        yield Problem(
            "spec.containers",
            f"{names}: expected exactly one container named kserve-container",
            "keep one container, name it kserve-container",
        )


def server_problems(spec: dict, properties: dict[str, str]) -> Iterator[Problem]:
    """Metrics annotations on TorchServe's metrics port; token authorization off (probes and
    the gateway carry no key), so the management API on loopback only."""
    annotations = spec.get("annotations") or {}
    metrics_port = port(properties["metrics_address"])
    if str(annotations.get("prometheus.kserve.io/port")) != str(metrics_port):
        yield Problem(
            "spec.annotations.prometheus.kserve.io/port",
            f"{annotations.get('prometheus.kserve.io/port')!r} is not TorchServe's "
            f"metrics port {metrics_port} (metrics_address)",
            f'set it to "{metrics_port}"',
        )
    if annotations.get("prometheus.kserve.io/path") != "/metrics":
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

    def at(sub: str) -> str:
        return f"{path}.{sub}" if sub else path

    for field in sorted(set(container) - CONTAINER_FIELDS):
        yield Problem(at(field), "unknown container field", "remove or rename it")
    words = [*(container.get("command") or []), *(container.get("args") or [])]
    for needed in (
        "--foreground",
        f"--model-store={MOUNT}/model-store",
        f"--ts-config={MOUNT}/config/config.properties",
    ):
        if needed not in words:
            yield Problem(
                at("args"),
                f"{needed} missing from the TorchServe command line",
                f"add {needed} (the container must run TorchServe in the foreground "
                "from the bundle KServe downloads)",
            )
    for i, env in enumerate(container.get("env") or []):
        if env.get("name") in BLOCKED_ENV:
            yield Problem(
                at(f"env[{i}]"),
                f"setting {env['name']} in container "
                f"{container.get('name')!r} is not allowed for security reasons "
                "(KServe 0.18+)",
                "remove it",
            )
    ports = container.get("ports") or []
    inference_port = port(properties["inference_address"])
    if len(ports) != 1:
        yield Problem(
            at("ports"),
            f"{len(ports)} ports; Knative allows exactly one",
            f"declare one port, {inference_port}, named http1",
        )
    for i, declared in enumerate(ports):
        if declared.get("name") not in KNATIVE_PORT_NAMES:
            yield Problem(
                at(f"ports[{i}].name"),
                f"{declared.get('name')!r}: Knative needs http1 or h2c",
                "name it http1",
            )
        if declared.get("containerPort") != inference_port:
            yield Problem(
                at(f"ports[{i}].containerPort"),
                f"{declared.get('containerPort')} "
                f"is not TorchServe's inference port {inference_port} "
                "(inference_address)",
                f"use {inference_port}",
            )
    seccomp = (container.get("securityContext") or {}).get("seccompProfile") or {}
    if seccomp.get("type") != "RuntimeDefault":
        yield Problem(
            at("securityContext.seccompProfile"),
            f"{seccomp or 'missing'}: no syscall filter",
            "set securityContext.seccompProfile.type: RuntimeDefault",
        )
    yield from memory_problems(at("resources"), container.get("resources"))
    probe = container.get("readinessProbe") or {}
    if (probe.get("exec") or {}).get("command") != list(READINESS_COMMAND):
        yield Problem(
            at("readinessProbe"),
            f"{probe or 'missing'}: only the bundle's readiness "
            "check waits until every model's workers are loaded (TorchServe 0.12's "
            "/ping counts starting workers as healthy; /v2/health/ready is always "
            "true)",
            f"use exec: command: {list(READINESS_COMMAND)}",
        )
