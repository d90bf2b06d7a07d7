"""Rules for our Triton ClusterServingRuntime (``kserve/triton-runtime``). No CRD schema is kept
here, so our own rules, strict too: known fields only; one ``kserve-container`` running the
project's launcher (``python -m tritonrepo.server``) with options it accepts (its own argument
parser judges them), serving ``/mnt/models`` on the pod's address; a Triton model format, not
auto-selected; v2 protocols only; one port named for Knative and equal to the launcher's HTTP
port, gRPC on KServe's 9000; keys off (``--no-keys``); a stop that ends before the kubelet's
SIGKILL; Triton's own readiness and liveness routes; metrics annotations equal to the metrics
port; a memory-backed ``/dev/shm`` (the Python backend's tensors travel through it); no
``PYTHONPATH``; seccomp and memory."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from kserve_tools.container import GRACE_SECONDS
from kserve_tools.lint.base import BLOCKED_ENV, MOUNT, NAME, Finding, Problem, stamped
from kserve_tools.lint.memory import TRITON, TRITON_FOOTPRINT_GIB, memory_problems
from kserve_tools.lint.servingruntime import (
    CONTAINER_FIELDS,
    KNATIVE_PORT_NAMES,
    MODEL_FORMAT_FIELDS,
    RUNTIME_API,
    RUNTIME_SPEC_FIELDS,
    TRITON_PORTS,
)
from kserve_tools.render import Resource
from tritonrepo.server import ANY_ADDRESS, argument_parser

LAUNCHER = ["python", "-m", "tritonrepo.server"]
FORMAT = ("triton", "2")  # a Triton model repository, as kserve-tritonserver names it
PROTOCOLS = ("v2", "grpc-v2")
GRPC_PORT = 9000  # KServe's gRPC port (kserve-tritonserver's --grpc-port)
SHM = "/dev/shm"
# After its exit timeout Triton ends in about 2 s (measured in tests/test_kserve_triton_image.py).
STOP_MARGIN_SECONDS = 5
# Each probe's route and what Triton's answer there means.
ROUTES = {
    "readinessProbe": (
        "/v2/health/ready",
        "every model loaded: the launcher sets --strict-readiness",
    ),
    "livenessProbe": ("/v2/health/live", "the server runs, loaded or not"),
}


def triton_runtime_findings(resource: Resource) -> list[Finding]:
    """Our rules for our Triton ClusterServingRuntime."""
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
                for problem in container_problems(f"spec.containers[{i}]", container, spec)
            ),
        ],
    )


def spec_problems(name: str, spec: dict) -> Iterator[Problem]:
    """The name, known fields, the Triton format (not auto-selected), v2 only, one
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
    named = [
        (f.get("name"), None if f.get("version") is None else str(f["version"])) for f in formats
    ]
    if FORMAT not in named:
        yield Problem(
            "spec.supportedModelFormats",
            f"{named} lacks {FORMAT[0]}:{FORMAT[1]}, the model repository's format",
            f'name {FORMAT[0]} version "{FORMAT[1]}"',
        )
    for i, fmt in enumerate(formats):
        for field in sorted(set(fmt) - MODEL_FORMAT_FIELDS):
            yield Problem(f"spec.supportedModelFormats[{i}].{field}", "unknown field", "remove it")
        if fmt.get("autoSelect", False) is not False:
            yield Problem(
                f"spec.supportedModelFormats[{i}].autoSelect",
                "our repository's "
                "Python models need this image: it must not be picked for any "
                "Triton InferenceService",
                "set autoSelect: false (select by runtime: name)",
            )
    protocols = spec.get("protocolVersions") or []
    if "v2" not in protocols or set(protocols) - set(PROTOCOLS):
        yield Problem(
            "spec.protocolVersions",
            f"{protocols}: Triton speaks the Open Inference Protocol only ({', '.join(PROTOCOLS)})",
            f"use {list(PROTOCOLS)}",
        )
    names = [c.get("name") for c in spec.get("containers") or []]
    if names != ["kserve-container"]:
        yield Problem(
            "spec.containers",
            f"{names}: expected exactly one container named kserve-container",
            "keep one container, name it kserve-container",
        )


def launcher_options(words: list[str]) -> argparse.Namespace | str:
    """The launcher's options parsed by its own parser, or why they do not parse."""
    parser = argument_parser()
    parser.exit_on_error = False
    try:
        options, unknown = parser.parse_known_args(words)
    except argparse.ArgumentError as exc:
        return str(exc)
    return f"unrecognized arguments: {' '.join(unknown)}" if unknown else options


def container_problems(path: str, container: dict, spec: dict) -> Iterator[Problem]:
    """The runtime's container at ``path`` (``spec``: the runtime's, for its volumes and
    annotations)."""

    def at(sub: str) -> str:
        return f"{path}.{sub}" if sub else path

    for field in sorted(set(container) - CONTAINER_FIELDS):
        yield Problem(at(field), "unknown container field", "remove or rename it")
    if container.get("command") != LAUNCHER:
        yield Problem(
            at("command"),
            f"{container.get('command')}: not the project's launcher, "
            "the one place that builds Triton's command line (its stub, libraries, "
            "readiness and stop)",
            f"use command: {LAUNCHER}",
        )
    options = launcher_options([str(a) for a in container.get("args") or []])
    if isinstance(options, str):
        yield Problem(
            at("args"),
            f"the launcher refuses them: {options}",
            "use python -m tritonrepo.server's options (--help)",
        )
        return
    for name, value, needed in (
        ("--repository", str(options.repository), MOUNT),
        ("--host", options.host, ANY_ADDRESS),
        ("--http-port", options.http_port, TRITON_PORTS["inference"]),
        ("--grpc-port", options.grpc_port, GRPC_PORT),
        ("--metrics-port", options.metrics_port, TRITON_PORTS["metrics"]),
    ):
        if value != needed:
            yield Problem(
                at("args"),
                f"{name}={value}, not {needed}: KServe puts the "
                f"repository at {MOUNT} and reaches the pod's address on its ports "
                "(REST 8080, gRPC 9000; the NetworkPolicy admits metrics on 8002)",
                f"pass {name}={needed}",
            )
    if not options.no_keys:
        yield Problem(
            at("args"),
            "keys on (the launcher's default): KServe's gateway and probes send no keys, and "
            "the image's build/ is read-only for the pod's user, so no key file can be written",
            "pass --no-keys (KServe's own gate stands in front)",
        )
    if options.exit_timeout_secs + STOP_MARGIN_SECONDS > GRACE_SECONDS:
        yield Problem(
            at("args"),
            f"--exit-timeout-secs={options.exit_timeout_secs}: on SIGTERM "
            "Triton waits that long for in-flight requests and for clients' open "
            "connections (a gateway's stay open), and the kubelet SIGKILLs it "
            f"{GRACE_SECONDS} s after SIGTERM (the default grace period)",
            f"pass --exit-timeout-secs={GRACE_SECONDS - STOP_MARGIN_SECONDS} or less",
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
    if len(ports) != 1:
        yield Problem(
            at("ports"),
            f"{len(ports)} ports; Knative allows exactly one",
            f"declare one port, {options.http_port}, named http1",
        )
    for i, declared in enumerate(ports):
        if declared.get("name") not in KNATIVE_PORT_NAMES:
            yield Problem(
                at(f"ports[{i}].name"),
                f"{declared.get('name')!r}: Knative needs http1 or h2c",
                "name it http1",
            )
        if declared.get("containerPort") != options.http_port:
            yield Problem(
                at(f"ports[{i}].containerPort"),
                f"{declared.get('containerPort')} is "
                f"not the launcher's --http-port {options.http_port}",
                f"use {options.http_port}",
            )
    annotations = spec.get("annotations") or {}
    if str(annotations.get("prometheus.kserve.io/port")) != str(options.metrics_port):
        yield Problem(
            "spec.annotations.prometheus.kserve.io/port",
            f"{annotations.get('prometheus.kserve.io/port')!r} is not the launcher's "
            f"--metrics-port {options.metrics_port}",
            f'set it to "{options.metrics_port}"',
        )
    for kind, (route, meaning) in ROUTES.items():
        get = (container.get(kind) or {}).get("httpGet") or {}
        if (get.get("path"), get.get("port")) != (route, options.http_port):
            yield Problem(
                at(kind),
                f"{container.get(kind) or 'missing'}: Triton's own {route} says it ({meaning})",
                f"use httpGet: {{path: {route}, port: {options.http_port}}}",
            )
    seccomp = (container.get("securityContext") or {}).get("seccompProfile") or {}
    if seccomp.get("type") != "RuntimeDefault":
        yield Problem(
            at("securityContext.seccompProfile"),
            f"{seccomp or 'missing'}: no syscall filter",
            "set securityContext.seccompProfile.type: RuntimeDefault",
        )
    yield from memory_problems(
        at("resources"), container.get("resources"), TRITON_FOOTPRINT_GIB, TRITON
    )
    yield from shm_problems(at("volumeMounts"), container, spec)


def shm_problems(path: str, container: dict, spec: dict) -> Iterator[Problem]:
    """``/dev/shm`` mounted from a memory-backed emptyDir: the Python backend passes every
    batch's tensors to the model stubs there, and a container's own is 64 MB."""
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    mounts = [m for m in container.get("volumeMounts") or [] if m.get("mountPath") == SHM]
    source = volumes.get(mounts[0].get("name"), {}) if mounts else {}
    if (source.get("emptyDir") or {}).get("medium") != "Memory":
        yield Problem(
            path,
            f"{SHM} is {'not mounted' if not mounts else source or 'no volume'}"
            ": the container's own is 64 MB, too small for a batch of large photos "
            "on their way to the Python stubs",
            f"mount an emptyDir with medium: Memory (and a sizeLimit) at {SHM}",
        )
