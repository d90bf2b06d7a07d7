"""Lint the KServe manifests offline: what ``kubectl apply`` and KServe's webhook would refuse,
and what would deploy but serve badly.

    python -m kserve_tools.lint                  # kserve/runtime, kserve/overlays/*, kserve/stock/*
    python -m kserve_tools.lint PATH ...         # kustomization folders or YAML files
    python -m kserve_tools.lint --bundle DIR     # also a storage bundle (make kserve-bundle)

Folders are rendered by ``kubectl kustomize`` (``kserve_tools.render``), as users apply them.

Exit 1 with one line per problem: ``<file>: <Kind> <name>: <field path>: <problem>; fix: <how>``.
Exit 2 when ``kserve/runtime`` itself cannot be rendered (kubectl missing or refusing it).

Checked for every InferenceService:

- the CRD schema (``../shared/reference/kserve/``) made strict: unknown fields refused;
- KServe's webhook rules the schema cannot express (kserve/kserve
  ``pkg/apis/serving/v1beta1/inference_service_validation.go``, ``component.go``,
  ``pkg/validation/env_policy.go``): the name pattern; exactly one predictor implementation;
  no ``predictor.model.name``; not both ``storageUri`` and ``storageUris``; replica and
  ``containerConcurrency`` ranges; ``autoscalerClass``; ``scaleMetric`` per autoscaler (Knative:
  concurrency|rps; HPA: cpu|memory; KEDA: none, ``autoScaling.metrics`` instead); no
  ``PYTHONPATH`` in any container's env; the runtime (by ``runtime:``) supporting the model
  format and ``protocolVersion`` (the controller's check);
- ours: ``containerConcurrency`` and a concurrency ``scaleTarget`` not below batchSize x
  maxWorkers of every model (``config/models/*.yaml``), or batches never fill; ``timeout`` not
  below the models' ``responseTimeout``; a canary percentage only where KServe routes it.

For our ClusterServingRuntime (no CRD schema is kept here, so our own rules, strict too): known
fields only; one ``kserve-container`` started in the foreground from ``/mnt/models``; model
formats not auto-selected; v1/v2 protocols; one port named for Knative and equal to TorchServe's
``inference_address`` port; the bundle's readiness check as readiness probe (no HTTP route of
TorchServe 0.12 waits for loaded workers); metrics annotations equal to ``metrics_address``; no ``PYTHONPATH``; token
authorization off in its config (probes carry no key).

Ours, for the pods: our runtime's container runs with ``seccompProfile: RuntimeDefault`` and a
memory request and limit of at least ``FOOTPRINT_GIB`` (measured, kserve/README.md), as does
every InferenceService on our runtime; each kustomization rendering such an InferenceService
ships a NetworkPolicy selecting its predictor pods (``serving.kserve.io/inferenceservice``)
that admits TorchServe's inference and metrics ports (or Knative's queue-proxy) only from
named namespaces, and nothing from everywhere.

For the collection job (``kserve/batch-job``, an Indexed Job): ``kserve_tools.joblint``.
For the PodMonitor and PrometheusRule (``kserve/monitoring``): ``kserve_tools.monitoring``.

For a bundle: ``config/config.properties`` names exactly the archives in ``model-store/``
(model names and versions from each archive's manifest) and the models of ``config/models``.
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import javaproperties
from kubernetes.utils import parse_quantity

from buildsteps.configgen import REPO, repo_models
from kserve_tools import monitoring
from kserve_tools.joblint import job_findings
from kserve_tools.render import RenderError, Resource, render
from model_files.artifacts import read_manifest

KSERVE = REPO / "kserve"
SCHEMA = REPO.parent / "shared" / "reference" / "kserve" / "inferenceservice-v1beta1.schema.json"
RUNTIME_DIR = KSERVE / "runtime"
BATCH_JOB_DIR = KSERVE / "batch-job"
BASE_ISVC = KSERVE / "base" / "inferenceservice.yaml"
RUNTIME_SERVER_PROPERTIES = RUNTIME_DIR / "server.properties"
MOUNT = "/mnt/models"  # where KServe's storage initializer puts storageUri
# The runtime's readiness probe: kserve/runtime/readiness.py, packed into the bundle.
READINESS_COMMAND = ("python", f"{MOUNT}/config/readiness.py",
                     f"{MOUNT}/config/config.properties")

ISVC_API = "serving.kserve.io/v1beta1"
RUNTIME_API = "serving.kserve.io/v1alpha1"
NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
IMPLEMENTATIONS = ("model", "sklearn", "xgboost", "tensorflow", "pytorch", "triton", "onnx",
                   "huggingface", "pmml", "lightgbm", "paddle")
STORAGE_PREFIXES = ("gs://", "s3://", "pvc://", "file://", "https://", "http://", "hdfs://",
                    "webhdfs://", "oci://", "oci+native://", "oci+fetch://", "hf://")
MODE_ANNOTATION = "serving.kserve.io/deploymentMode"
# The mutating webhook rewrites the deprecated names before anything else reads them.
MODES = {"Standard": "Standard", "RawDeployment": "Standard", "Knative": "Knative",
         "Serverless": "Knative", "ModelMesh": "ModelMesh"}
DEFAULT_MODE = "Standard"
CLASS_ANNOTATION = "serving.kserve.io/autoscalerClass"
AUTOSCALER_CLASSES = ("hpa", "external", "keda", "none")
KNATIVE_CLASS_ANNOTATION = "autoscaling.knative.dev/class"
BLOCKED_ENV = ("PYTHONPATH",)
PROTOCOLS = ("v1", "v2", "grpc-v1", "grpc-v2")
KNATIVE_PORT_NAMES = ("http1", "h2c")

RUNTIME_SPEC_FIELDS = {"annotations", "labels", "supportedModelFormats", "protocolVersions",
                       "containers", "volumes", "disabled", "multiModel", "grpcEndpoint",
                       "grpcDataEndpoint", "httpDataEndpoint", "replicas", "storageHelper",
                       "builtInAdapter", "nodeSelector", "affinity", "tolerations",
                       "imagePullSecrets", "workerSpec", "hostIPC"}
CONTAINER_FIELDS = {"name", "image", "command", "args", "workingDir", "ports", "envFrom", "env",
                    "resources", "resizePolicy", "restartPolicy", "volumeMounts",
                    "volumeDevices", "livenessProbe", "readinessProbe", "startupProbe",
                    "lifecycle", "terminationMessagePath", "terminationMessagePolicy",
                    "imagePullPolicy", "securityContext", "stdin", "stdinOnce", "tty"}
MODEL_FORMAT_FIELDS = {"name", "version", "autoSelect", "priority"}
OUR_RUNTIME = "resnet50-torchserve"
# Measured (kserve/README.md "Memory"): frontend at its heap + direct-memory ceiling during a
# burst of 32 MiB bodies (4.4 GiB) + both workers after it (1.3 + 1.7 GiB), rounded up.
FOOTPRINT_GIB = 7.5
ISVC_LABEL = "serving.kserve.io/inferenceservice"  # KServe labels every predictor pod with it


def memory_findings(add, path: str, resources: dict | None) -> None:
    """``add(path, problem, fix)`` when a memory request or limit is missing, not a Kubernetes
    quantity (read by Kubernetes' own Python parser), or below ``FOOTPRINT_GIB``."""
    for kind in ("requests", "limits"):
        value = ((resources or {}).get(kind) or {}).get("memory")
        try:
            size = parse_quantity(value) if value is not None else None
        except ValueError:
            add(f"{path}.{kind}.memory", f"{value!r} is not a Kubernetes quantity: the API "
                "server refuses the object", f"write a quantity such as 8Gi (at least "
                f"{FOOTPRINT_GIB} GiB)")
            continue
        if size is None or size < FOOTPRINT_GIB * 2**30:
            add(f"{path}.{kind}.memory", f"{value!r} is below the measured footprint of "
                f"frontend and workers ({FOOTPRINT_GIB} GiB, kserve/README.md): a burst of large "
                "bodies gets the pod OOM-killed", f"set it to at least {FOOTPRINT_GIB} GiB "
                "(8Gi)")


@dataclass(frozen=True)
class Finding:
    """One problem: where (file, object, field path), what, and how to fix it."""

    source: str
    obj: str
    path: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.source}: {self.obj}: {self.path}: {self.problem}; fix: {self.fix}"


@dataclass(frozen=True)
class Runtime:
    """What an InferenceService needs to know of a serving runtime."""

    name: str
    formats: tuple[tuple[str, str | None, bool], ...]  # (name, version, autoSelect)
    protocols: tuple[str, ...]


# KServe's stock runtime for modelFormat pytorch (config/runtimes/kserve-torchserve.yaml).
STOCK_RUNTIME = Runtime("kserve-torchserve", (("pytorch", "1", True),), ("v1", "v2", "grpc-v2"))


# ---------------------------------------------------------------------------- schema

def strict(schema: dict) -> dict:
    """A copy of ``schema`` that refuses unknown fields (like kubeconform -strict):
    ``additionalProperties: false`` on every object schema that lists ``properties`` and does
    not preserve unknown fields."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if not isinstance(node, dict):
            return
        if (isinstance(node.get("properties"), dict)
                and not node.get("x-kubernetes-preserve-unknown-fields")
                and "additionalProperties" not in node):
            node["additionalProperties"] = False
        for sub in (node.get("properties") or {}).values():
            walk(sub)
        for key in ("items", "additionalProperties", "not"):
            if isinstance(node.get(key), dict):
                walk(node[key])
        for key in ("anyOf", "allOf", "oneOf", "items"):
            if isinstance(node.get(key), list):
                for sub in node[key]:
                    walk(sub)

    walk(schema)
    return schema


@lru_cache(maxsize=1)
def schema_validator():
    """A Draft 7 validator of the strict InferenceService schema."""
    import jsonschema

    if not SCHEMA.is_file():
        raise SystemExit(f"KServe CRD schema not found at {SCHEMA}: the shared reference folder "
                         "../shared/reference/kserve/ (next to the repository) must hold "
                         "inferenceservice-v1beta1.schema.json")
    schema = strict(json.loads(SCHEMA.read_text()))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def schema_findings(resource: Resource) -> list[Finding]:
    """The strict CRD schema's complaints about one InferenceService."""
    found = []
    for error in sorted(schema_validator().iter_errors(resource.obj),
                        key=lambda e: list(map(str, e.absolute_path))):
        path = ".".join(map(str, error.absolute_path)) or "<root>"
        fix = ("remove or rename the field (unknown fields are dropped by the API server, "
               "so the setting would be lost)" if error.validator == "additionalProperties"
               else "see the InferenceService CRD schema for this field")
        found.append(_finding(resource, path, error.message, fix))
    return found


# ---------------------------------------------------------------------------- the models

@dataclass(frozen=True)
class ServingLimits:
    """What the models' TorchServe settings require from KServe's scaling and timeout."""

    min_concurrency: int  # max over models of batchSize x maxWorkers
    concurrency_model: str
    response_timeout: int  # max over models of responseTimeout (seconds)

    @classmethod
    def from_models(cls, models: dict[str, dict]) -> "ServingLimits":
        fill = {name: s["batchSize"] * s["maxWorkers"] for name, s in models.items()}
        widest = max(fill, key=fill.get)
        return cls(fill[widest], widest, max(s["responseTimeout"] for s in models.values()))


# ---------------------------------------------------------------------------- InferenceService

def _finding(resource: Resource, path: str, problem: str, fix: str) -> Finding:
    return Finding(_rel(resource.source), f"{resource.kind} {resource.name}", path, problem, fix)


def _mode(annotations: dict) -> str | None:
    return MODES.get(str(annotations.get(MODE_ANNOTATION, DEFAULT_MODE)))


def inference_service_findings(resource: Resource, runtimes: dict[str, Runtime],
                               limits: ServingLimits) -> list[Finding]:
    """KServe's webhook rules and ours for one InferenceService (schema aside)."""
    obj = resource.obj
    found: list[Finding] = []

    def add(path: str, problem: str, fix: str) -> None:
        found.append(_finding(resource, path, problem, fix))

    if obj.get("apiVersion") != ISVC_API or obj.get("kind") != "InferenceService":
        add("apiVersion", f"{obj.get('apiVersion')}/{obj.get('kind')} is not an InferenceService",
            f"use apiVersion {ISVC_API}, kind InferenceService")
        return found
    metadata = obj.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    if not NAME.match(resource.name):
        add("metadata.name", f"{resource.name!r} does not match {NAME.pattern}",
            "use lower-case letters, digits and '-', starting with a letter")
    predictor = (obj.get("spec") or {}).get("predictor") or {}
    implementations = [k for k in IMPLEMENTATIONS if k in predictor]
    if any(c.get("name") == "kserve-container" for c in predictor.get("containers") or []):
        implementations.append("containers[kserve-container]")
    if len(implementations) != 1:
        add("spec.predictor", f"exactly one predictor implementation must be given, found "
            f"{implementations or 'none'}", "keep only spec.predictor.model")
    model = predictor.get("model") or {}
    if "name" in model:
        add("spec.predictor.model.name", "the 'name' field is not allowed in standard predictor",
            "remove it (the InferenceService's name names the predictor)")
    if model.get("storageUri") and predictor.get("storageUris"):
        add("spec.predictor.storageUris", "setting both storageUri and storageUris is not "
            "supported", "keep spec.predictor.model.storageUri only")
    uri = model.get("storageUri")
    if uri is None and not predictor.get("storageUris"):
        add("spec.predictor.model.storageUri", "missing: the runtime reads the bundle from "
            f"{MOUNT}", "set it to the bundle of `make kserve-bundle`")
    elif uri is not None and "://" in str(uri) and not str(uri).startswith(STORAGE_PREFIXES):
        add("spec.predictor.model.storageUri", f"{uri!r} has an unsupported scheme",
            f"use one of {', '.join(STORAGE_PREFIXES)}")
    found += _replica_findings(resource, predictor)
    found += _scaling_findings(resource, annotations, predictor, limits)
    found += _env_findings(resource, obj.get("spec") or {})
    found += _runtime_findings(resource, model, runtimes)
    if model.get("runtime") == OUR_RUNTIME:
        memory_findings(add, "spec.predictor.model.resources", model.get("resources"))
    timeout = predictor.get("timeout")
    if timeout is not None and timeout < limits.response_timeout:
        add("spec.predictor.timeout", f"{timeout} s is below TorchServe's responseTimeout "
            f"({limits.response_timeout} s, config/models/*.yaml): KServe would cut off "
            "requests TorchServe still works on", f"set it to at least {limits.response_timeout}")
    return found


def _replica_findings(resource: Resource, predictor: dict) -> list[Finding]:
    found = []
    low, high = predictor.get("minReplicas"), predictor.get("maxReplicas")
    for field, value in (("minReplicas", low), ("maxReplicas", high),
                         ("containerConcurrency", predictor.get("containerConcurrency"))):
        if value is not None and value < 0:
            found.append(_finding(resource, f"spec.predictor.{field}",
                                  f"{value} is negative", "use 0 or more"))
    if low is not None and high is not None and high != 0 and low > high:
        found.append(_finding(resource, "spec.predictor.minReplicas",
                              f"minReplicas {low} is above maxReplicas {high}",
                              "lower minReplicas or raise maxReplicas"))
    canary = predictor.get("canaryTrafficPercent")
    if canary is not None and not 0 <= canary <= 100:
        found.append(_finding(resource, "spec.predictor.canaryTrafficPercent",
                              f"{canary} is not a percentage", "use 0..100"))
    return found


def _scaling_findings(resource: Resource, annotations: dict, predictor: dict,
                      limits: ServingLimits) -> list[Finding]:
    found = []

    def add(path: str, problem: str, fix: str) -> None:
        found.append(_finding(resource, path, problem, fix))

    mode = _mode(annotations)
    if mode is None:
        add(f"metadata.annotations.{MODE_ANNOTATION}",
            f"{annotations.get(MODE_ANNOTATION)!r} is not a deployment mode",
            "use Standard or Knative (RawDeployment/Serverless are deprecated aliases)")
        return found
    klass = annotations.get(CLASS_ANNOTATION)
    if klass is not None and klass not in AUTOSCALER_CLASSES:
        add(f"metadata.annotations.{CLASS_ANNOTATION}",
            f"[{klass}] is not a supported autoscaler class type",
            f"use one of {', '.join(AUTOSCALER_CLASSES)}")
    metric = predictor.get("scaleMetric")
    knative_hpa = annotations.get(KNATIVE_CLASS_ANNOTATION) == "hpa.autoscaling.knative.dev"
    if mode == "Knative" and not knative_hpa:
        allowed, scaler = ("concurrency", "rps"), "Knative's autoscaler (KPA)"
    elif mode == "Standard" and klass == "keda":
        allowed, scaler = (), "KEDA"
    elif mode == "Standard" and klass in (None, "hpa") or knative_hpa:
        allowed, scaler = ("cpu", "memory"), "the HPA"
    else:
        allowed, scaler = None, None  # external/none: KServe creates no autoscaler
    if metric is not None and allowed is not None and metric not in allowed:
        fix = (f"use {' or '.join(allowed)}" if allowed
               else "remove scaleMetric and describe the trigger in autoScaling.metrics")
        add("spec.predictor.scaleMetric", f"{metric!r} is not allowed with {scaler} "
            f"({mode} mode)", fix)
    if predictor.get("canaryTrafficPercent") is not None and mode != "Knative":
        add("spec.predictor.canaryTrafficPercent", f"only Knative mode splits traffic by "
            f"canaryTrafficPercent; this is {mode} mode",
            f"set {MODE_ANNOTATION}: Knative, or use spec.canary (Standard mode)")
    need = limits.min_concurrency
    concurrency = predictor.get("containerConcurrency")
    if concurrency and concurrency < need:
        add("spec.predictor.containerConcurrency", f"{concurrency} is below batchSize x "
            f"maxWorkers = {need} of {limits.concurrency_model} (config/models): a batch could "
            "never fill", f"set it to at least {need} (or 0, unlimited)")
    target = predictor.get("scaleTarget")
    if metric == "concurrency" and target is not None and target < need:
        add("spec.predictor.scaleTarget", f"concurrency target {target} is below batchSize x "
            f"maxWorkers = {need} of {limits.concurrency_model}: pods would be added before "
            "a batch can fill", f"set it to at least {need}")
    return found


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


def _env_findings(resource: Resource, spec: dict) -> list[Finding]:
    found = []
    for component in ("predictor", "transformer", "explainer"):
        for path, container in _containers(spec.get(component) or {}):
            for i, env in enumerate(container.get("env") or []):
                if env.get("name") in BLOCKED_ENV:
                    found.append(_finding(
                        resource, f"spec.{component}.{path}.env[{i}]",
                        f"setting {env['name']} in container "
                        f"{container.get('name', 'kserve-container')!r} is not allowed for "
                        "security reasons (KServe 0.18+)",
                        "remove it; the image's own site-packages hold the handler's imports"))
    return found


def _runtime_findings(resource: Resource, model: dict, runtimes: dict[str, Runtime]):
    found = []
    fmt = model.get("modelFormat") or {}
    name, version = fmt.get("name"), fmt.get("version")
    if not name:
        return [_finding(resource, "spec.predictor.model.modelFormat.name", "missing",
                         "set it (torchserve-mar for resnet50-torchserve)")]
    runtime_name = model.get("runtime")
    if runtime_name is None:
        candidates = [r for r in runtimes.values()
                      if any(f == name and auto for f, _, auto in r.formats)]
        if not candidates:
            return [_finding(resource, "spec.predictor.model.runtime", f"missing, and no "
                             f"runtime auto-selects model format {name!r}",
                             "set runtime: resnet50-torchserve")]
        runtime = candidates[0]
    elif runtime_name not in runtimes:
        return [_finding(resource, "spec.predictor.model.runtime", f"unknown runtime "
                         f"{runtime_name!r}", f"use one of {', '.join(sorted(runtimes))}")]
    else:
        runtime = runtimes[runtime_name]
    if not any(f == name and (version is None or v is None or str(version) == str(v))
               for f, v, _ in runtime.formats):
        supported = ", ".join(f"{f}" + (f":{v}" if v else "") for f, v, _ in runtime.formats)
        found.append(_finding(resource, "spec.predictor.model.modelFormat",
                              f"runtime {runtime.name} does not support {name}"
                              + (f":{version}" if version else ""), f"use {supported}"))
    protocol = model.get("protocolVersion", "v1")
    if protocol not in runtime.protocols:
        found.append(_finding(resource, "spec.predictor.model.protocolVersion",
                              f"{protocol!r} is not supported by runtime {runtime.name}",
                              f"use one of {', '.join(runtime.protocols)}"))
    return found


# ---------------------------------------------------------------------------- ServingRuntime

def server_properties(path: Path = RUNTIME_SERVER_PROPERTIES) -> dict[str, str]:
    return javaproperties.loads(Path(path).read_text())


def _port(address: str) -> int:
    return int(address.rstrip("/").rsplit(":", 1)[1])


def runtime_of(resource: Resource) -> Runtime:
    spec = resource.obj.get("spec") or {}
    formats = tuple((f.get("name"), None if f.get("version") is None else str(f["version"]),
                     bool(f.get("autoSelect", False)))
                    for f in spec.get("supportedModelFormats") or [])
    return Runtime(resource.name, formats, tuple(spec.get("protocolVersions") or ("v1",)))


def runtime_findings(resource: Resource,
                     properties: dict[str, str] | None = None) -> list[Finding]:
    """Our rules for our ClusterServingRuntime (``properties``: its server.properties)."""
    properties = server_properties() if properties is None else properties
    obj = resource.obj
    found: list[Finding] = []

    def add(path: str, problem: str, fix: str) -> None:
        found.append(_finding(resource, path, problem, fix))

    if obj.get("apiVersion") != RUNTIME_API or obj.get("kind") not in (
            "ClusterServingRuntime", "ServingRuntime"):
        add("apiVersion", f"{obj.get('apiVersion')}/{obj.get('kind')} is not a serving runtime",
            f"use apiVersion {RUNTIME_API}, kind ClusterServingRuntime")
        return found
    if not NAME.match(resource.name):
        add("metadata.name", f"{resource.name!r} does not match {NAME.pattern}",
            "use lower-case letters, digits and '-'")
    spec = obj.get("spec") or {}
    for field in sorted(set(spec) - RUNTIME_SPEC_FIELDS):
        add(f"spec.{field}", "unknown field", "remove or rename it")
    formats = spec.get("supportedModelFormats") or []
    if not formats:
        add("spec.supportedModelFormats", "empty", "name the bundle's format (torchserve-mar)")
    for i, fmt in enumerate(formats):
        for field in sorted(set(fmt) - MODEL_FORMAT_FIELDS):
            add(f"spec.supportedModelFormats[{i}].{field}", "unknown field", "remove it")
        if not fmt.get("name"):
            add(f"spec.supportedModelFormats[{i}].name", "missing", "name the format")
        if fmt.get("autoSelect", False) is not False:
            add(f"spec.supportedModelFormats[{i}].autoSelect", "our bundle format must not be "
                "picked automatically", "set autoSelect: false (select by runtime: name)")
    protocols = spec.get("protocolVersions") or []
    bad = [p for p in protocols if p not in PROTOCOLS]
    if bad or not {"v1", "v2"} <= set(protocols):
        add("spec.protocolVersions", f"{protocols} must include v1 and v2 and only "
            f"{', '.join(PROTOCOLS)}", "use [v1, v2]")
    containers = spec.get("containers") or []
    if [c.get("name") for c in containers] != ["kserve-container"]:
        add("spec.containers", f"{[c.get('name') for c in containers]}: expected exactly one "
            "container named kserve-container", "keep one container, name it kserve-container")
    for i, container in enumerate(containers):
        found += _runtime_container_findings(resource, f"spec.containers[{i}]", container,
                                             properties)
    annotations = spec.get("annotations") or {}
    metrics_port = _port(properties["metrics_address"])
    if str(annotations.get("prometheus.kserve.io/port")) != str(metrics_port):
        add("spec.annotations.prometheus.kserve.io/port",
            f"{annotations.get('prometheus.kserve.io/port')!r} is not TorchServe's metrics "
            f"port {metrics_port} (metrics_address)", f'set it to "{metrics_port}"')
    if annotations.get("prometheus.kserve.io/path") != "/metrics":
        add("spec.annotations.prometheus.kserve.io/path", "not /metrics", "set it to /metrics")
    if properties.get("disable_token_authorization") != "true":
        add("server.properties: disable_token_authorization", "token authorization is on, but "
            "the kubelet's probes and KServe's gateway send no TorchServe key",
            "set disable_token_authorization=true and authenticate at the gateway")
    if not properties.get("management_address", "").startswith("http://127.0.0.1:"):
        add("server.properties: management_address", "reachable from outside the pod while "
            "tokens are off", "bind it to 127.0.0.1")
    return found


def _runtime_container_findings(resource: Resource, path: str, container: dict,
                                properties: dict[str, str]) -> list[Finding]:
    found = []

    def add(sub: str, problem: str, fix: str) -> None:
        found.append(_finding(resource, f"{path}.{sub}" if sub else path, problem, fix))

    for field in sorted(set(container) - CONTAINER_FIELDS):
        add(field, "unknown container field", "remove or rename it")
    words = [*(container.get("command") or []), *(container.get("args") or [])]
    for needed in ("--foreground", f"--model-store={MOUNT}/model-store",
                   f"--ts-config={MOUNT}/config/config.properties"):
        if needed not in words:
            add("args", f"{needed} missing from the TorchServe command line",
                f"add {needed} (the container must run TorchServe in the foreground from the "
                "bundle KServe downloads)")
    for i, env in enumerate(container.get("env") or []):
        if env.get("name") in BLOCKED_ENV:
            add(f"env[{i}]", f"setting {env['name']} in container {container.get('name')!r} is "
                "not allowed for security reasons (KServe 0.18+)", "remove it")
    ports = container.get("ports") or []
    inference_port = _port(properties["inference_address"])
    if len(ports) != 1:
        add("ports", f"{len(ports)} ports; Knative allows exactly one",
            f"declare one port, {inference_port}, named http1")
    for i, port in enumerate(ports):
        if port.get("name") not in KNATIVE_PORT_NAMES:
            add(f"ports[{i}].name", f"{port.get('name')!r}: Knative needs http1 or h2c",
                "name it http1")
        if port.get("containerPort") != inference_port:
            add(f"ports[{i}].containerPort", f"{port.get('containerPort')} is not TorchServe's "
                f"inference port {inference_port} (inference_address)",
                f"use {inference_port}")
    seccomp = ((container.get("securityContext") or {}).get("seccompProfile") or {})
    if seccomp.get("type") != "RuntimeDefault":
        add("securityContext.seccompProfile", f"{seccomp or 'missing'}: no syscall filter",
            "set securityContext.seccompProfile.type: RuntimeDefault")
    memory_findings(add, "resources", container.get("resources"))
    probe = container.get("readinessProbe") or {}
    if (probe.get("exec") or {}).get("command") != list(READINESS_COMMAND):
        add("readinessProbe", f"{probe or 'missing'}: only the bundle's readiness check waits "
            "until every model's workers are loaded (TorchServe 0.12's /ping counts starting "
            "workers as healthy; /v2/health/ready is always true)",
            f"use exec: command: {list(READINESS_COMMAND)}")
    return found


# ---------------------------------------------------------------------------- the bundle

def bundle_findings(bundle: Path, models: dict[str, dict] | None = None) -> list[Finding]:
    """The bundle's config.properties against its archives and config/models."""
    models = repo_models() if models is None else models
    bundle = Path(bundle)
    found: list[Finding] = []

    def add(path: str, problem: str, fix: str) -> None:
        found.append(Finding(_rel(bundle), "bundle", path, problem, fix))

    config = bundle / "config" / "config.properties"
    for needed in (config, *(bundle / "config" / name
                             for name in ("metrics.yaml", "readiness.py", "serve.sh"))):
        if not needed.is_file():
            add(str(needed.relative_to(bundle)), "missing", "rebuild with `make kserve-bundle`")
    if found:
        return found
    properties = javaproperties.loads(config.read_text())
    entries = json.loads(properties.get("models", "{}"))
    archives = {}
    for mar in sorted((bundle / "model-store").glob("*.mar")):
        manifest = read_manifest(mar)
        archives[mar.name] = (manifest["modelName"], manifest["modelVersion"])
    if set(entries) != set(models):
        add("config/config.properties: models", f"{sorted(entries)} are not the models of "
            f"config/models ({sorted(models)})", "rebuild with `make kserve-bundle`")
    load = [m for m in properties.get("load_models", "").split(",") if m]
    if sorted(load) != sorted(archives):
        add("config/config.properties: load_models", f"{load} != the archives in model-store "
            f"{sorted(archives)}", "rebuild with `make kserve-bundle`")
    for name, versions in entries.items():
        for version, entry in versions.items():
            mar = entry.get("marName")
            if archives.get(mar) != (name, version):
                add(f"config/config.properties: models.{name}.{version}.marName",
                    f"{mar} holds {archives.get(mar, 'nothing (missing)')}, not "
                    f"({name!r}, {version!r})", "rebuild with `make kserve-bundle` (model "
                    "names and versions come from the archives)")
    return found


# ---------------------------------------------------------------------------- driver

# ---------------------------------------------------------------------------- network

def _admits_only_namespaces(rule: dict) -> bool:
    """An ingress rule whose every peer is a namespace named by label (no pod-only, IP-block
    or empty peer, which would admit more than one namespace's pods)."""
    peers = rule.get("from")
    if not peers:
        return False
    for peer in peers:
        labels = ((peer.get("namespaceSelector") or {}).get("matchLabels") or {})
        if set(peer) != {"namespaceSelector"} or not labels.get("kubernetes.io/metadata.name"):
            return False
    return True


def network_policy_findings(objects: list[Resource]) -> list[Finding]:
    """Each InferenceService on our runtime among ``objects`` (one rendered target) needs a
    NetworkPolicy there selecting its pods, with every ingress rule admitting named
    namespaces only, on the inference port (8080, or Knative's queue-proxy 8012) and the
    metrics port."""
    found: list[Finding] = []
    policies = [r for r in objects if r.kind == "NetworkPolicy"]
    properties = server_properties()
    needed = {_port(properties["metrics_address"])}
    for isvc in (r for r in objects if r.kind == "InferenceService"):
        model = ((isvc.obj.get("spec") or {}).get("predictor") or {}).get("model") or {}
        if model.get("runtime") != OUR_RUNTIME:
            continue
        knative = MODES.get(_mode((isvc.obj.get("metadata") or {}).get("annotations") or {})
                            or DEFAULT_MODE) == "Knative"
        inference = 8012 if knative else _port(properties["inference_address"])
        selecting = [p for p in policies
                     if (((p.obj.get("spec") or {}).get("podSelector") or {})
                         .get("matchLabels") or {}).items() <= {ISVC_LABEL: isvc.name}.items()
                     and "Ingress" in ((p.obj.get("spec") or {}).get("policyTypes") or [])]
        if not selecting:
            found.append(_finding(isvc, "<NetworkPolicy>", "no NetworkPolicy selects this "
                                  f"InferenceService's pods ({ISVC_LABEL}: {isvc.name}) while "
                                  "TorchServe runs without token authorization", "keep "
                                  "kserve/base/networkpolicy.yaml in the kustomization"))
            continue
        for policy in selecting:
            rules = (policy.obj.get("spec") or {}).get("ingress") or []
            ports = set()
            for i, rule in enumerate(rules):
                if not _admits_only_namespaces(rule):
                    found.append(_finding(policy, f"spec.ingress[{i}].from", "admits more than "
                                          "named namespaces", "name each namespace with "
                                          "namespaceSelector.matchLabels"
                                          ".kubernetes.io/metadata.name"))
                ports |= {p.get("port") for p in rule.get("ports") or []}
            for port in sorted((needed | {inference}) - ports):
                found.append(_finding(policy, "spec.ingress", f"port {port} is admitted from "
                                      "no namespace", "add a rule for it (namespaces.env)"))
    return found


def default_targets() -> list[Path]:
    """Our runtime, every overlay, the stock-runtime manifests, the collection job and the
    monitoring objects."""
    return [RUNTIME_DIR, *sorted(p for p in (KSERVE / "overlays").iterdir() if p.is_dir()),
            *sorted((KSERVE / "stock").glob("*.yaml")), BATCH_JOB_DIR,
            monitoring.MONITORING_DIR]


def base_service() -> tuple[str | None, str]:
    """(the bucket of the base InferenceService's s3:// storageUri, or None; its name): what
    the collection job must write to and call."""
    [resource] = render(BASE_ISVC)
    uri = str(resource.obj["spec"]["predictor"]["model"].get("storageUri", ""))
    bucket = uri[len("s3://"):].split("/", 1)[0] if uri.startswith("s3://") else None
    return bucket, resource.name


def lint(targets: list[Path], models: dict[str, dict] | None = None,
         properties: dict[str, str] | None = None) -> list[Finding]:
    """Every finding of every object rendered from ``targets`` (kustomizations or files)."""
    models = repo_models() if models is None else models
    limits = ServingLimits.from_models(models)
    rendered: list[Resource] = []
    found: list[Finding] = []
    for target in targets:
        try:
            objects = render(target)
        except (RenderError, OSError) as exc:
            found.append(Finding(_rel(Path(target)), "kustomization", "<render>", str(exc),
                                 "fix the kustomization"))
            continue
        rendered += objects
        found += network_policy_findings(objects)
    runtimes = {STOCK_RUNTIME.name: STOCK_RUNTIME}
    # Our runtime is known to every InferenceService, linted or not; linted when rendered.
    for resource in render(RUNTIME_DIR) + rendered:
        if resource.kind in ("ClusterServingRuntime", "ServingRuntime"):
            runtimes[resource.name] = runtime_of(resource)
    for resource in rendered:
        if resource.kind in ("ClusterServingRuntime", "ServingRuntime"):
            found += runtime_findings(resource, properties)
            continue
        if resource.kind == "Job":
            found += job_findings(resource, *base_service(), _finding)
            continue
        if resource.kind in ("PodMonitor", "PrometheusRule"):
            found += monitoring.findings(
                resource, base_service()[1],
                _port(server_properties(RUNTIME_SERVER_PROPERTIES)["metrics_address"]), _finding)
            continue
        if resource.kind == "NetworkPolicy":
            continue  # checked with its InferenceService, per target
        if resource.kind == "InferenceService":
            found += schema_findings(resource)
        found += inference_service_findings(resource, runtimes, limits)
    return found


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kserve_tools.lint",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", type=Path,
                        help="kustomization folders or YAML files (default: all of kserve/)")
    parser.add_argument("--bundle", type=Path, action="append", default=[],
                        help="also check a storage bundle folder (make kserve-bundle)")
    args = parser.parse_args(argv)
    targets = args.targets or default_targets()
    try:
        found = lint(targets)
    except RenderError as exc:  # our own runtime unrendered: nothing can be checked
        print(f"kserve-lint: error: {exc}", file=sys.stderr)
        return 2
    for bundle in args.bundle:
        found += bundle_findings(bundle)
    for finding in found:
        print(finding, file=sys.stderr)
    checked = ", ".join(_rel(t) for t in targets + args.bundle)
    print(f"kserve-lint: {len(found)} problem(s) in {checked}",
          file=sys.stderr if found else sys.stdout)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
