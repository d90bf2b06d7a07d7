"""Rules for our Triton ClusterServingRuntime (``kserve/triton-runtime``). No CRD schema is kept
here, so our own rules, strict too: known fields only; one ``kserve-container`` running the
project's launcher (``python -m tritonrepo.server``) with options it accepts (its own argument
parser judges them), serving ``/mnt/models`` on the pod's address; a Triton model format, not
auto-selected; v2 protocols only; one port named for Knative and equal to the launcher's HTTP
port, gRPC on KServe's 9000; keys off (``--no-keys``); a stop that ends before the kubelet's
SIGKILL; Triton's own readiness and liveness routes; metrics annotations equal to the metrics
port; a memory-backed ``/dev/shm`` (the Python backend's tensors travel through it); no
``PYTHONPATH``; seccomp and memory. The rules it shares with our TorchServe runtime live in
``runtimes``; this module passes them the launcher's ports and keeps the rest."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from kserve_tools.container import GRACE_SECONDS
from kserve_tools.lint import runtimes
from kserve_tools.lint.base import MOUNT, Finding, Problem
from kserve_tools.lint.memory import TRITON, TRITON_FOOTPRINT_GIB, memory_problems
from kserve_tools.lint.servingruntime import TRITON_PORTS
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

    def rules(spec: dict) -> Iterator[Problem]:
        yield from spec_problems(resource.name, spec)
        yield from runtimes.each_container(
            spec, lambda path, container: container_problems(path, container, spec)
        )

    return runtimes.runtime_checked(resource, rules)


def spec_problems(name: str, spec: dict) -> Iterator[Problem]:
    """The name, known fields, the Triton format (not auto-selected), v2 only, one
    kserve-container."""
    yield from runtimes.name_and_field_problems(name, spec)
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
        yield from runtimes.format_field_problems(i, fmt)
        yield from runtimes.auto_select_problems(
            i,
            fmt,
            "our repository's Python models need this image: it must not be picked for any "
            "Triton InferenceService",
        )
    protocols = spec.get("protocolVersions") or []
    if "v2" not in protocols or set(protocols) - set(PROTOCOLS):
        yield Problem(
            "spec.protocolVersions",
            f"{protocols}: Triton speaks the Open Inference Protocol only ({', '.join(PROTOCOLS)})",
            f"use {list(PROTOCOLS)}",
        )
    yield from runtimes.one_container_problems(spec)


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
        return f"{path}.{sub}"

    yield from runtimes.container_field_problems(path, container)
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
    yield from runtimes.env_problems(path, container)
    yield from runtimes.port_problems(
        path, container, options.http_port, f"the launcher's --http-port {options.http_port}"
    )
    yield from runtimes.metrics_port_problems(
        spec, options.metrics_port, f"the launcher's --metrics-port {options.metrics_port}"
    )
    for kind, (route, meaning) in ROUTES.items():
        get = (container.get(kind) or {}).get("httpGet") or {}
        if (get.get("path"), get.get("port")) != (route, options.http_port):
            yield Problem(
                at(kind),
                f"{container.get(kind) or 'missing'}: Triton's own {route} says it ({meaning})",
                f"use httpGet: {{path: {route}, port: {options.http_port}}}",
            )
    yield from runtimes.seccomp_problems(path, container)
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
