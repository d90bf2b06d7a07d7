"""The rules both our ClusterServingRuntimes are held to (``servingruntime`` for TorchServe's,
``tritonruntime`` for Triton's): a serving runtime's apiVersion and kind; the name; known fields
of the spec, its model formats and its container; one ``kserve-container``; model formats not
auto-selected; no blocked env; one port named for Knative and equal to the server's inference
port; metrics annotations on the server's metrics port; seccomp.

Each rule yields ``Problem``s at the field path it is given; the runtime modules pass what
differs (which port, whose it is, why a format must not be auto-selected) and keep their own
rules for the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from kserve_tools.lint.base import BLOCKED_ENV, NAME, Finding, Problem, stamped
from kserve_tools.render import Resource

RUNTIME_API = "serving.kserve.io/v1alpha1"
RUNTIME_KINDS = ("ClusterServingRuntime", "ServingRuntime")
KNATIVE_PORT_NAMES = ("http1", "h2c")
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


def runtime_checked(
    resource: Resource, rules: Callable[[dict], Iterable[Problem]]
) -> list[Finding]:
    """``rules`` run on a serving runtime's spec, as findings naming ``resource``; one finding
    and no rules when ``resource`` is not a serving runtime."""
    obj = resource.obj
    if obj.get("apiVersion") != RUNTIME_API or obj.get("kind") not in RUNTIME_KINDS:
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
    return stamped(resource, rules(obj.get("spec") or {}))


def each_container(
    spec: dict, rules: Callable[[str, dict], Iterable[Problem]]
) -> Iterator[Problem]:
    """``rules`` run on each container of the spec, given its field path and the container."""
    for i, container in enumerate(spec.get("containers") or []):
        yield from rules(f"spec.containers[{i}]", container)


def name_and_field_problems(name: str, spec: dict) -> Iterator[Problem]:
    """The runtime's name (Kubernetes' pattern) and the spec's unknown fields."""
    if not NAME.match(name):
        yield Problem(
            "metadata.name",
            f"{name!r} does not match {NAME.pattern}",
            "use lower-case letters, digits and '-'",
        )
    for field in sorted(set(spec) - RUNTIME_SPEC_FIELDS):
        yield Problem(f"spec.{field}", "unknown field", "remove or rename it")


def format_field_problems(i: int, fmt: dict) -> Iterator[Problem]:
    """The unknown fields of model format ``i``."""
    for field in sorted(set(fmt) - MODEL_FORMAT_FIELDS):
        yield Problem(f"spec.supportedModelFormats[{i}].{field}", "unknown field", "remove it")


def auto_select_problems(i: int, fmt: dict, why: str) -> Iterator[Problem]:
    """Model format ``i`` auto-selected (``why``: why it must not be)."""
    if fmt.get("autoSelect", False) is not False:
        yield Problem(
            f"spec.supportedModelFormats[{i}].autoSelect",
            why,
            "set autoSelect: false (select by runtime: name)",
        )


def one_container_problems(spec: dict) -> Iterator[Problem]:
    """Exactly one container, named ``kserve-container``."""
    names = [c.get("name") for c in spec.get("containers") or []]
    if names != ["kserve-container"]:
        yield Problem(
            "spec.containers",
            f"{names}: expected exactly one container named kserve-container",
            "keep one container, name it kserve-container",
        )


def metrics_port_problems(spec: dict, metrics_port: int, whose: str) -> Iterator[Problem]:
    """The ``prometheus.kserve.io/port`` annotation equal to ``metrics_port`` (``whose``:
    the server's setting it comes from, as the message names it)."""
    annotations = spec.get("annotations") or {}
    if str(annotations.get("prometheus.kserve.io/port")) != str(metrics_port):
        yield Problem(
            "spec.annotations.prometheus.kserve.io/port",
            f"{annotations.get('prometheus.kserve.io/port')!r} is not {whose}",
            f'set it to "{metrics_port}"',
        )


def container_field_problems(path: str, container: dict) -> Iterator[Problem]:
    """The unknown fields of the container at ``path``."""
    for field in sorted(set(container) - CONTAINER_FIELDS):
        yield Problem(f"{path}.{field}", "unknown container field", "remove or rename it")


def env_problems(path: str, container: dict) -> Iterator[Problem]:
    """Env the KServe webhook refuses (``BLOCKED_ENV``) in the container at ``path``."""
    for i, env in enumerate(container.get("env") or []):
        if env.get("name") in BLOCKED_ENV:
            yield Problem(
                f"{path}.env[{i}]",
                f"setting {env['name']} in container "
                f"{container.get('name')!r} is not allowed for security reasons "
                "(KServe 0.18+)",
                "remove it",
            )


def port_problems(path: str, container: dict, inference_port: int, whose: str) -> Iterator[Problem]:
    """One port, named for Knative and equal to ``inference_port`` (``whose``: the server's
    setting it comes from, as the message names it), in the container at ``path``."""
    ports = container.get("ports") or []
    if len(ports) != 1:
        yield Problem(
            f"{path}.ports",
            f"{len(ports)} ports; Knative allows exactly one",
            f"declare one port, {inference_port}, named http1",
        )
    for i, declared in enumerate(ports):
        if declared.get("name") not in KNATIVE_PORT_NAMES:
            yield Problem(
                f"{path}.ports[{i}].name",
                f"{declared.get('name')!r}: Knative needs http1 or h2c",
                "name it http1",
            )
        if declared.get("containerPort") != inference_port:
            yield Problem(
                f"{path}.ports[{i}].containerPort",
                f"{declared.get('containerPort')} is not {whose}",
                f"use {inference_port}",
            )


def seccomp_problems(path: str, container: dict) -> Iterator[Problem]:
    """The container at ``path`` without the runtime's default syscall filter."""
    seccomp = (container.get("securityContext") or {}).get("seccompProfile") or {}
    if seccomp.get("type") != "RuntimeDefault":
        yield Problem(
            f"{path}.securityContext.seccompProfile",
            f"{seccomp or 'missing'}: no syscall filter",
            "set securityContext.seccompProfile.type: RuntimeDefault",
        )
