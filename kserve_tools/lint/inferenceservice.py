"""Rules for an InferenceService (the schema aside, ``schema``): KServe's webhook rules the
schema cannot express (kserve/kserve ``pkg/apis/serving/v1beta1/inference_service_validation.go``,
``component.go``, ``pkg/validation/env_policy.go``) and ours, each a function yielding the
problems it finds; ``inference_service_findings`` runs them all."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from kserve_tools.lint.base import (
    BLOCKED_ENV,
    IMPLEMENTATIONS,
    MODE_ANNOTATION,
    MOUNT,
    NAME,
    OUR_RUNTIME,
    OUR_TRITON_RUNTIME,
    Finding,
    Problem,
    mode,
    stamped,
)
from kserve_tools.lint.memory import TRITON, TRITON_FOOTPRINT_GIB, memory_problems
from kserve_tools.lint.servingruntime import Runtime
from kserve_tools.render import Resource

ISVC_API = "serving.kserve.io/v1beta1"
STORAGE_PREFIXES = (
    "gs://",
    "s3://",
    "pvc://",
    "file://",
    "https://",
    "http://",
    "hdfs://",
    "webhdfs://",
    "oci://",
    "oci+native://",
    "oci+fetch://",
    "hf://",
)
CLASS_ANNOTATION = "serving.kserve.io/autoscalerClass"
AUTOSCALER_CLASSES = ("hpa", "external", "keda", "none")
KNATIVE_CLASS_ANNOTATION = "autoscaling.knative.dev/class"


@dataclass(frozen=True)
class ServingLimits:
    """What the models' TorchServe settings require from KServe's scaling and timeout."""

    min_concurrency: int  # max over models of batchSize x maxWorkers
    concurrency_model: str
    response_timeout: int  # max over models of responseTimeout (seconds)

    @classmethod
    def from_models(cls, models: dict[str, dict]) -> ServingLimits:
        fill = {name: s["batchSize"] * s["maxWorkers"] for name, s in models.items()}
        widest = max(fill, key=fill.get)
        return cls(fill[widest], widest, max(s["responseTimeout"] for s in models.values()))


def inference_service_findings(
    resource: Resource, runtimes: dict[str, Runtime], limits: ServingLimits
) -> list[Finding]:
    """KServe's webhook rules and ours for one InferenceService (schema aside)."""
    obj = resource.obj
    if obj.get("apiVersion") != ISVC_API or obj.get("kind") != "InferenceService":
        return stamped(
            resource,
            [
                Problem(
                    "apiVersion",
                    f"{obj.get('apiVersion')}/{obj.get('kind')} is not an InferenceService",
                    f"use apiVersion {ISVC_API}, kind InferenceService",
                )
            ],
        )
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    spec = obj.get("spec") or {}
    predictor = spec.get("predictor") or {}
    model = predictor.get("model") or {}
    return stamped(
        resource,
        [
            *name_problems(resource.name),
            *predictor_problems(predictor),
            *replica_problems(predictor),
            *scaling_problems(annotations, predictor, limits),
            *env_problems(spec),
            *runtime_problems(model, runtimes),
            *(
                memory_problems("spec.predictor.model.resources", model.get("resources"))
                if model.get("runtime") == OUR_RUNTIME
                else ()
            ),
            *(
                memory_problems(
                    "spec.predictor.model.resources",
                    model.get("resources"),
                    TRITON_FOOTPRINT_GIB,
                    TRITON,
                )
                if model.get("runtime") == OUR_TRITON_RUNTIME
                else ()
            ),
            *timeout_problems(predictor, limits),
        ],
    )


def name_problems(name: str) -> Iterator[Problem]:
    if not NAME.match(name):
        yield Problem(
            "metadata.name",
            f"{name!r} does not match {NAME.pattern}",
            "use lower-case letters, digits and '-', starting with a letter",
        )


def predictor_problems(predictor: dict) -> Iterator[Problem]:
    """One implementation, no model name, one storage URI with a scheme KServe reads."""
    implementations = [k for k in IMPLEMENTATIONS if k in predictor]
    if any(c.get("name") == "kserve-container" for c in predictor.get("containers") or []):
        implementations.append("containers[kserve-container]")
    if len(implementations) != 1:
        yield Problem(
            "spec.predictor",
            f"exactly one predictor implementation must be given, "
            f"found {implementations or 'none'}",
            "keep only spec.predictor.model",
        )
    model = predictor.get("model") or {}
    if "name" in model:
        yield Problem(
            "spec.predictor.model.name",
            "the 'name' field is not allowed in standard predictor",
            "remove it (the InferenceService's name names the predictor)",
        )
    if model.get("storageUri") and predictor.get("storageUris"):
        yield Problem(
            "spec.predictor.storageUris",
            "setting both storageUri and storageUris is not supported",
            "keep spec.predictor.model.storageUri only",
        )
    uri = model.get("storageUri")
    if uri is None and not predictor.get("storageUris"):
        yield Problem(
            "spec.predictor.model.storageUri",
            f"missing: the runtime reads the bundle from {MOUNT}",
            "set it to the bundle of `make kserve-bundle`",
        )
    elif uri is not None and "://" in str(uri) and not str(uri).startswith(STORAGE_PREFIXES):
        yield Problem(
            "spec.predictor.model.storageUri",
            f"{uri!r} has an unsupported scheme",
            f"use one of {', '.join(STORAGE_PREFIXES)}",
        )


def replica_problems(predictor: dict) -> Iterator[Problem]:
    low, high = predictor.get("minReplicas"), predictor.get("maxReplicas")
    for field, value in (
        ("minReplicas", low),
        ("maxReplicas", high),
        ("containerConcurrency", predictor.get("containerConcurrency")),
    ):
        if value is not None and value < 0:
            yield Problem(f"spec.predictor.{field}", f"{value} is negative", "use 0 or more")
    if low is not None and high is not None and high != 0 and low > high:
        yield Problem(
            "spec.predictor.minReplicas",
            f"minReplicas {low} is above maxReplicas {high}",
            "lower minReplicas or raise maxReplicas",
        )
    canary = predictor.get("canaryTrafficPercent")
    if canary is not None and not 0 <= canary <= 100:
        yield Problem(
            "spec.predictor.canaryTrafficPercent", f"{canary} is not a percentage", "use 0..100"
        )


def scaling_problems(
    annotations: dict, predictor: dict, limits: ServingLimits
) -> Iterator[Problem]:
    """The deployment mode, the autoscaler and its metric, and a concurrency that lets our
    batches fill."""
    mode_ = mode(annotations)
    if mode_ is None:
        yield Problem(
            f"metadata.annotations.{MODE_ANNOTATION}",
            f"{annotations.get(MODE_ANNOTATION)!r} is not a deployment mode",
            "use Standard or Knative (RawDeployment/Serverless are deprecated aliases)",
        )
        return
    klass = annotations.get(CLASS_ANNOTATION)
    if klass is not None and klass not in AUTOSCALER_CLASSES:
        yield Problem(
            f"metadata.annotations.{CLASS_ANNOTATION}",
            f"[{klass}] is not a supported autoscaler class type",
            f"use one of {', '.join(AUTOSCALER_CLASSES)}",
        )
    metric = predictor.get("scaleMetric")
    knative_hpa = annotations.get(KNATIVE_CLASS_ANNOTATION) == "hpa.autoscaling.knative.dev"
    if mode_ == "Knative" and not knative_hpa:
        allowed, scaler = ("concurrency", "rps"), "Knative's autoscaler (KPA)"
    elif mode_ == "Standard" and klass == "keda":
        allowed, scaler = (), "KEDA"
    elif (mode_ == "Standard" and klass in (None, "hpa")) or knative_hpa:
        allowed, scaler = ("cpu", "memory"), "the HPA"
    else:
        allowed, scaler = None, None  # external/none: KServe creates no autoscaler
    if metric is not None and allowed is not None and metric not in allowed:
        fix = (
            f"use {' or '.join(allowed)}"
            if allowed
            else "remove scaleMetric and describe the trigger in autoScaling.metrics"
        )
        yield Problem(
            "spec.predictor.scaleMetric",
            f"{metric!r} is not allowed with {scaler} ({mode_} mode)",
            fix,
        )
    if predictor.get("canaryTrafficPercent") is not None and mode_ != "Knative":
        yield Problem(
            "spec.predictor.canaryTrafficPercent",
            f"only Knative mode splits traffic by canaryTrafficPercent; this is {mode_} mode",
            f"set {MODE_ANNOTATION}: Knative, or use spec.canary (Standard mode)",
        )
    need = limits.min_concurrency
    concurrency = predictor.get("containerConcurrency")
    if concurrency and concurrency < need:
        yield Problem(
            "spec.predictor.containerConcurrency",
            f"{concurrency} is below batchSize "
            f"x maxWorkers = {need} of {limits.concurrency_model} (config/models): a "
            "batch could never fill",
            f"set it to at least {need} (or 0, unlimited)",
        )
    target = predictor.get("scaleTarget")
    if metric == "concurrency" and target is not None and target < need:
        yield Problem(
            "spec.predictor.scaleTarget",
            f"concurrency target {target} is below "
            f"batchSize x maxWorkers = {need} of {limits.concurrency_model}: pods "
            "would be added before a batch can fill",
            f"set it to at least {need}",
        )


def _containers(component: dict) -> list[tuple[str, dict]]:
    """(path, container) of one component: its framework container, containers, init ones."""
    out = []
    for key in IMPLEMENTATIONS:
        if isinstance(component.get(key), dict):
            out.append((key, component[key]))
    for key in ("containers", "initContainers"):
        for i, container in enumerate(component.get(key) or []):
            out.append((f"{key}[{i}]", container))
    worker = component.get("workerSpec")
    if isinstance(worker, dict):
        out += [(f"workerSpec.{p}", c) for p, c in _containers(worker)]
    return out


def env_problems(spec: dict) -> Iterator[Problem]:
    """No container of any component sets a blocked variable (KServe 0.18+ refuses it)."""
    for component in ("predictor", "transformer", "explainer"):
        for path, container in _containers(spec.get(component) or {}):
            for i, env in enumerate(container.get("env") or []):
                if env.get("name") in BLOCKED_ENV:
                    yield Problem(
                        f"spec.{component}.{path}.env[{i}]",
                        f"setting {env['name']} in container "
                        f"{container.get('name', 'kserve-container')!r} is not "
                        "allowed for security reasons (KServe 0.18+)",
                        "remove it; the image's own site-packages hold the handler's imports",
                    )


def runtime_problems(model: dict, runtimes: dict[str, Runtime]) -> Iterator[Problem]:
    """The runtime (named, or auto-selected by model format) supports the model's format and
    protocol: the controller's check."""
    fmt = model.get("modelFormat") or {}
    name, version = fmt.get("name"), fmt.get("version")
    if not name:
        yield Problem(
            "spec.predictor.model.modelFormat.name",
            "missing",
            "set it (torchserve-mar for resnet50-torchserve)",
        )
        return
    runtime_name = model.get("runtime")
    if runtime_name is None:
        candidates = [
            r for r in runtimes.values() if any(f == name and auto for f, _, auto in r.formats)
        ]
        if not candidates:
            yield Problem(
                "spec.predictor.model.runtime",
                f"missing, and no runtime auto-selects model format {name!r}",
                "set runtime: resnet50-torchserve",
            )
            return
        runtime = candidates[0]
    elif runtime_name not in runtimes:
        yield Problem(
            "spec.predictor.model.runtime",
            f"unknown runtime {runtime_name!r}",
            f"use one of {', '.join(sorted(runtimes))}",
        )
        return
    else:
        runtime = runtimes[runtime_name]
    if not any(
        f == name and (version is None or v is None or str(version) == str(v))
        for f, v, _ in runtime.formats
    ):
        supported = ", ".join(f"{f}" + (f":{v}" if v else "") for f, v, _ in runtime.formats)
        yield Problem(
            "spec.predictor.model.modelFormat",
            f"runtime {runtime.name} does not support {name}" + (f":{version}" if version else ""),
            f"use {supported}",
        )
    protocol = model.get("protocolVersion", "v1")
    if protocol not in runtime.protocols:
        yield Problem(
            "spec.predictor.model.protocolVersion",
            f"{protocol!r} is not supported by runtime {runtime.name}",
            f"use one of {', '.join(runtime.protocols)}",
        )


def timeout_problems(predictor: dict, limits: ServingLimits) -> Iterator[Problem]:
    timeout = predictor.get("timeout")
    if timeout is not None and timeout < limits.response_timeout:
        yield Problem(
            "spec.predictor.timeout",
            f"{timeout} s is below TorchServe's "
            f"responseTimeout ({limits.response_timeout} s, config/models/*.yaml): "
            "KServe would cut off requests TorchServe still works on",
            f"set it to at least {limits.response_timeout}",
        )
