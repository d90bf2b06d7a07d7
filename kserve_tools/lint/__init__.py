"""Lint the KServe manifests offline: what ``kubectl apply`` and KServe's webhook would refuse,
and what would deploy but serve badly.

    python -m kserve_tools.lint                  # kserve/runtime, triton-runtime, overlays/*, ...
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
TorchServe 0.12 waits for loaded workers); metrics annotations equal to ``metrics_address``;
no ``PYTHONPATH``; token authorization off in its config (probes carry no key).

Ours, for the pods: our runtime's container runs with ``seccompProfile: RuntimeDefault`` and a
memory request and limit of at least ``FOOTPRINT_GIB`` (measured, kserve/README.md), as does
every InferenceService on our runtime; each kustomization rendering such an InferenceService
ships a NetworkPolicy selecting its predictor pods (``serving.kserve.io/inferenceservice``)
that admits TorchServe's inference and metrics ports (or Knative's queue-proxy) only from
named namespaces, and nothing from everywhere.

For our Triton ClusterServingRuntime (``kserve/triton-runtime``, the same image):
``tritonruntime`` (the launcher's own argument parser judges its args; v2 only; Triton's
health routes as probes; a memory-backed ``/dev/shm``; ``TRITON_FOOTPRINT_GIB``, also for every
InferenceService on it).

For an InferenceService's ``autoScaling`` (HPA and KEDA metrics, our KEDA queries):
``autoscaling``. For the LocalModelCache (``kserve/localmodel``): ``localmodel`` (its CRD
schema made strict; a URI the download Jobs fetch and kserve/base uses).

For the collection job (``kserve/batch-job``, an Indexed Job): ``kserve_tools.lint.job`` (its
output apart from every InferenceService's ``storageUri``, its own Secret and ServiceAccount).
For Milvus and its index Job (``kserve/milvus``): ``kserve_tools.lint.milvus`` (authentication on,
root's password and the token from Secrets, a NetworkPolicy admitting only labelled pods).
For the PodMonitor and PrometheusRule (``kserve/monitoring``): ``kserve_tools.lint.monitoring``.

One module per kind of object (``schema``, ``inferenceservice``, ``autoscaling``,
``localmodel``, ``servingruntime``, ``tritonruntime``, ``network``, ``bundle``, ``job``,
``milvus``, ``monitoring``; ``memory`` for
every pod of our runtime; ``runtimes`` for the rules both our runtimes share; ``base`` for what
every rule module shares), each rule a function that yields the problems it finds
(``base.Problem``); this module renders the targets, sends each object to its rules and prints
the findings.

For a bundle: ``config/config.properties`` names exactly the archives in ``model-store/``
(model names and versions from each archive's manifest) and the models of ``config/models``.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from buildsteps.configgen import repo_models
from buildsteps.gpu import repo_models as gpu_repo_models
from kserve_tools.lint import milvus as milvuslint
from kserve_tools.lint import monitoring
from kserve_tools.lint.autoscaling import autoscaling_findings
from kserve_tools.lint.base import (
    DEFAULT_MODE,
    ISVC_LABEL,
    KSERVE,
    MODES,
    OUR_TRITON_RUNTIME,
    RUNTIME_DIR,
    RUNTIME_SERVER_PROPERTIES,
    TRITON_RUNTIME_DIR,
    Finding,
    finding,
    mode,
    port,
    rel,
    server_properties,
)
from kserve_tools.lint.bundle import bundle_findings
from kserve_tools.lint.inferenceservice import ServingLimits, inference_service_findings
from kserve_tools.lint.job import command_words, job_findings, option
from kserve_tools.lint.localmodel import localmodel_findings
from kserve_tools.lint.memory import FOOTPRINT_GIB, TRITON_FOOTPRINT_GIB
from kserve_tools.lint.network import network_policy_findings
from kserve_tools.lint.runtimes import RUNTIME_KINDS
from kserve_tools.lint.schema import schema_findings, strict
from kserve_tools.lint.servingruntime import (
    STOCK_RUNTIME,
    TRITON_RUNTIME,
    Runtime,
    runtime_findings,
    runtime_of,
)
from kserve_tools.lint.tritonruntime import triton_runtime_findings
from kserve_tools.render import RenderError, Resource, render

BATCH_JOB_DIR = KSERVE / "batch-job"
MILVUS_DIR = KSERVE / "milvus"  # Milvus Standalone and the index Job
TRITON_DIR = KSERVE / "triton"  # the InferenceService on KServe's Triton runtime
BASE_ISVC = KSERVE / "base" / "inferenceservice.yaml"
LOCALMODEL_DIR = KSERVE / "localmodel"  # the LocalModelCache of the base's bundle

__all__ = [
    "DEFAULT_MODE",
    "FOOTPRINT_GIB",
    "ISVC_LABEL",
    "MODES",
    "OUR_TRITON_RUNTIME",
    "RUNTIME_DIR",
    "STOCK_RUNTIME",
    "TRITON_FOOTPRINT_GIB",
    "TRITON_RUNTIME",
    "TRITON_RUNTIME_DIR",
    "Finding",
    "Runtime",
    "ServingLimits",
    "base_service",
    "bundle_findings",
    "default_targets",
    "finding",
    "inference_service_findings",
    "lint",
    "main",
    "mode",
    "model_storage",
    "network_policy_findings",
    "port",
    "runtime_findings",
    "runtime_of",
    "schema_findings",
    "server_properties",
    "strict",
    "triton_runtime_findings",
]


def default_targets() -> list[Path]:
    """Our runtimes, every overlay, the stock-runtime manifests, the LocalModelCache, the
    collection job, Milvus and its index Job, and the monitoring objects."""
    return [
        RUNTIME_DIR,
        TRITON_RUNTIME_DIR,
        *sorted(p for p in (KSERVE / "overlays").iterdir() if p.is_dir()),
        *sorted((KSERVE / "stock").glob("*.yaml")),
        TRITON_DIR,
        LOCALMODEL_DIR,
        BATCH_JOB_DIR,
        MILVUS_DIR,
        monitoring.MONITORING_DIR,
    ]


def collection_shards() -> str:
    """The s3:// prefix the collection job's pods upload their shards under: what the index
    Job must read."""
    [job] = [r for r in render(BATCH_JOB_DIR) if r.kind == "Job"]
    words = command_words(job.obj["spec"]["template"]["spec"]["containers"][0])
    return (option(words, "--out") or "").rsplit("/", 1)[0] + "/"


def base_service() -> tuple[str | None, str]:
    """(the bucket of the base InferenceService's s3:// storageUri, or None; its name): what
    the collection job must write to and call."""
    [resource] = render(BASE_ISVC)
    uri = str(resource.obj["spec"]["predictor"]["model"].get("storageUri", ""))
    bucket = uri[len("s3://") :].split("/", 1)[0] if uri.startswith("s3://") else None
    return bucket, resource.name


@functools.cache
def model_storage() -> tuple[str, ...]:
    """The ``storageUri`` (and ``storageUris``) of every InferenceService in kserve/'s targets:
    the models' archives, which no job may write under."""
    uris: list[str] = []
    for target in default_targets():
        for resource in render(target) if target not in (BATCH_JOB_DIR, MILVUS_DIR) else []:
            if resource.kind != "InferenceService":
                continue
            model = ((resource.obj.get("spec") or {}).get("predictor") or {}).get("model") or {}
            uris.append(model.get("storageUri"))
            uris += [u.get("uri") for u in model.get("storageUris") or []]
    return tuple(sorted({str(u) for u in uris if u}))


def lint(
    targets: list[Path],
    models: dict[str, dict] | None = None,
    properties: dict[str, str] | None = None,
) -> list[Finding]:
    """Every finding of every object rendered from ``targets`` (kustomizations or files)."""
    repo = models is None
    models = repo_models() if models is None else models
    limits = ServingLimits.from_models(models)
    rendered: list[Resource] = []
    found: list[Finding] = []
    for target in targets:
        try:
            objects = render(target)
        except (RenderError, OSError) as exc:
            found.append(
                Finding(
                    rel(Path(target)),
                    "kustomization",
                    "<render>",
                    str(exc),
                    "fix the kustomization",
                )
            )
            continue
        rendered += objects
        found += network_policy_findings(objects) + milvuslint.policy_findings(objects)
    runtimes = {r.name: r for r in (STOCK_RUNTIME, TRITON_RUNTIME)}
    # Our runtimes are known to every InferenceService, linted or not; linted when rendered.
    for resource in render(RUNTIME_DIR) + render(TRITON_RUNTIME_DIR) + rendered:
        if resource.kind in RUNTIME_KINDS:
            runtimes[resource.name] = runtime_of(resource)
    for resource in rendered:
        gpus = _gpus(resource) if repo else 0
        # A GPU pod runs the GPU deployment's workers (buildsteps/gpu.py): its batches fill
        # against those.
        own = ServingLimits.from_models(gpu_repo_models(gpus)) if gpus else limits
        found += _findings(resource, runtimes, own, properties)
    return found


def _gpus(resource: Resource) -> int:
    """The ``nvidia.com/gpu`` limit of an InferenceService's predictor model, else 0."""
    if resource.kind != "InferenceService":
        return 0
    model = ((resource.obj.get("spec") or {}).get("predictor") or {}).get("model") or {}
    value = ((model.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0)
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _findings(
    resource: Resource,
    runtimes: dict[str, Runtime],
    limits: ServingLimits,
    properties: dict[str, str] | None,
) -> list[Finding]:
    """One rendered object's findings, by the rules of its kind."""
    if resource.kind in RUNTIME_KINDS:
        if resource.name == OUR_TRITON_RUNTIME:
            return triton_runtime_findings(resource)
        return runtime_findings(resource, properties)
    if resource.kind == "Job" and milvuslint.is_index_job(resource):
        return milvuslint.index_job_findings(resource, collection_shards())
    if resource.kind == "Job":
        return job_findings(resource, model_storage(), base_service()[1])
    if resource.kind in ("StatefulSet", "Service", "ConfigMap"):
        return milvuslint.findings(resource)
    if resource.kind in ("PodMonitor", "PrometheusRule"):
        return monitoring.findings(
            resource,
            base_service()[1],
            port(server_properties(RUNTIME_SERVER_PROPERTIES)["metrics_address"]),
        )
    if resource.kind in ("NetworkPolicy", "ServiceAccount"):
        return []  # a policy checked with what it selects, per target; a job's account with it
    if resource.kind == "LocalModelCache":
        return localmodel_findings(resource)
    schema = schema_findings(resource) if resource.kind == "InferenceService" else []
    return (
        schema
        + inference_service_findings(resource, runtimes, limits)
        + autoscaling_findings(resource)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kserve_tools.lint", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "targets",
        nargs="*",
        type=Path,
        help="kustomization folders or YAML files (default: all of kserve/)",
    )
    parser.add_argument(
        "--bundle",
        type=Path,
        action="append",
        default=[],
        help="also check a storage bundle folder (make kserve-bundle)",
    )
    args = parser.parse_args(argv)
    targets = args.targets or default_targets()
    try:
        found = lint(targets)
    except RenderError as exc:  # our own runtime unrendered: nothing can be checked
        print(f"kserve-lint: error: {exc}", file=sys.stderr)
        return 2
    for bundle in args.bundle:
        found += bundle_findings(bundle)
    for problem in found:
        print(problem, file=sys.stderr)
    checked = ", ".join(rel(t) for t in targets + args.bundle)
    print(
        f"kserve-lint: {len(found)} problem(s) in {checked}",
        file=sys.stderr if found else sys.stdout,
    )
    return 1 if found else 0
