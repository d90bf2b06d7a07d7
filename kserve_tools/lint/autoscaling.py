"""Rules for an InferenceService's ``autoScaling`` (KServe 0.15+: HPA or KEDA metrics), each a
function yielding the problems it finds; ``autoscaling_findings`` runs them all.

KServe's webhook (``validateScalingKedaCompExtension``, ``validateScalingHPACompExtension`` in
``pkg/apis/serving/v1beta1/inference_service_validation.go``): with the HPA only ``Resource``
metrics; with KEDA ``Resource`` (cpu as Utilization, memory as AverageValue or Utilization),
``External`` and ``PodMetric``, each with its ``metric``, a query and the target's value for
its type. KServe hands an External metric to KEDA as a trigger of type ``backend`` with
``serverAddress``, ``query`` and ``threshold`` = ``target.value`` (``keda_reconciler.go``); KEDA
then asks for ceil(query / threshold) replicas.

Ours: KEDA only in Standard mode (KServe creates no ScaledObject otherwise), with at least one
trigger; a prometheus query reads only series that config/monitoring/rules.yml records (the
signals are ours, computed there and unit-tested by config/monitoring/scaling-tests.yml),
names this InferenceService (``inferenceservice="<name>"``, or it scales on another one's load),
aggregates to one series (KEDA refuses several) and reads pods that kserve/monitoring's
PodMonitor scrapes; ``minReplicas`` at least 1 (those signals come from the pods themselves:
at 0 nothing would ever ask for the first one back).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator

from devtools.prometheus import recording_rules, series_names
from kserve_tools.lint import monitoring
from kserve_tools.lint.base import Finding, Problem, mode, stamped
from kserve_tools.render import RenderError, Resource, render

CLASS_ANNOTATION = "serving.kserve.io/autoscalerClass"
KEDA_TYPES = ("Resource", "External", "PodMetric")
TARGET_FIELDS = {
    "Value": "value",
    "AverageValue": "averageValue",
    "Utilization": "averageUtilization",
}
ONE_SERIES = re.compile(r"^\s*(sum|max|min|avg|count)\s*\(.*\)\s*$", re.S)


def autoscaling_findings(resource: Resource) -> list[Finding]:
    """The autoScaling problems of one InferenceService (nothing for other kinds)."""
    if resource.kind != "InferenceService":
        return []
    obj = resource.obj
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    predictor = (obj.get("spec") or {}).get("predictor") or {}
    klass = annotations.get(CLASS_ANNOTATION)
    metrics = (predictor.get("autoScaling") or {}).get("metrics") or []
    problems: list[Problem] = []
    if klass == "hpa":
        problems += hpa_problems(metrics)
    elif klass == "keda":
        problems += keda_problems(mode(annotations), predictor, metrics, resource.name)
    return stamped(resource, problems)


def hpa_problems(metrics: list[dict]) -> Iterator[Problem]:
    for i, metric in enumerate(metrics):
        if metric.get("type") != "Resource":
            yield Problem(
                f"spec.predictor.autoScaling.metrics[{i}].type",
                f"invalid HPA metric source type with value [{metric.get('type')}], valid "
                "metric source types are Resource",
                "use serving.kserve.io/autoscalerClass: keda for External metrics",
            )


def keda_problems(
    mode_: str | None, predictor: dict, metrics: list[dict], name: str
) -> Iterator[Problem]:
    if mode_ != "Standard":
        yield Problem(
            "metadata.annotations.serving.kserve.io/autoscalerClass",
            f"KEDA autoscaling is only supported in Standard mode, this is {mode_}",
            "set serving.kserve.io/deploymentMode: Standard",
        )
    if not metrics:
        yield Problem(
            "spec.predictor.autoScaling.metrics",
            "missing: KServe would give KEDA no trigger",
            "add an External prometheus metric (kserve/overlays/keda)",
        )
    external = False
    for i, metric in enumerate(metrics):
        path = f"spec.predictor.autoScaling.metrics[{i}]"
        kind = metric.get("type")
        if kind not in KEDA_TYPES:
            yield Problem(
                f"{path}.type",
                f"unknown KEDA metric type with value [{kind}]",
                f"use one of {', '.join(KEDA_TYPES)}",
            )
            continue
        spec = metric.get({"PodMetric": "podmetric"}.get(kind, kind.lower()))
        if not isinstance(spec, dict):
            yield Problem(path, f"{kind} metric without its {kind.lower()} section", "add it")
            continue
        yield from target_problems(f"{path}.{kind.lower()}.target", spec.get("target") or {})
        if kind == "Resource":
            yield from resource_problems(f"{path}.resource", spec)
        else:
            yield from query_problems(f"{path}.{kind.lower()}.metric", spec, name)
            external = external or kind == "External"
    if external and predictor.get("minReplicas", 1) < 1:
        yield Problem(
            "spec.predictor.minReplicas",
            f"{predictor['minReplicas']}: the queries read the pods' own metrics, so with no pod "
            "nothing would ever ask for the first one back",
            "set minReplicas: 1",
        )


def target_problems(path: str, target: dict) -> Iterator[Problem]:
    """The target holds the value its type names (KServe's ``validateScaleTarget``)."""
    field = TARGET_FIELDS.get(target.get("type"))
    if field and target.get(field) is None:
        yield Problem(f"{path}.{field}", f"the {target['type']} type should be set", "set it")
    elif field == "averageUtilization" and not 1 <= target[field] <= 100:
        yield Problem(
            f"{path}.{field}",
            "the target utilization percentage should be a [1-100] integer",
            "use 1..100",
        )


def resource_problems(path: str, spec: dict) -> Iterator[Problem]:
    name, kind = spec.get("name"), (spec.get("target") or {}).get("type")
    allowed = {"cpu": ("Utilization",), "memory": ("AverageValue", "Utilization")}.get(name)
    if allowed is None:
        yield Problem(f"{path}.name", f"resource type {name} is not supported", "cpu or memory")
    elif kind not in allowed:
        yield Problem(
            f"{path}.target.type",
            f"the {name} target value type should be {' or '.join(allowed)}",
            f"use {allowed[0]}",
        )


def query_problems(path: str, spec: dict, name: str) -> Iterator[Problem]:
    """An External/PodMetric query: set; for prometheus, our recorded signals only, for this
    InferenceService, one series, from pods the PodMonitor scrapes."""
    metric = spec.get("metric") or {}
    query = str(metric.get("query") or "")
    if not query.strip():
        yield Problem(f"{path}.query", "the query should not be empty", "set a PromQL query")
        return
    if (spec.get("target") or {}).get("value") is None:
        yield Problem(
            f"{path.rsplit('.', 1)[0]}.target.value",
            "the target threshold value should not be empty (KServe hands KEDA target.value)",
            "set target: {type: Value, value: ...}",
        )
    if metric.get("backend") != "prometheus":
        return
    unknown = sorted(series_names(query) - set(recording_rules()))
    if unknown:
        yield Problem(
            f"{path}.query",
            f"reads {unknown}, which no rule of config/monitoring/rules.yml records",
            "query a scaling.recording rule (inferenceservice:queued_requests:sum, ...)",
        )
    if f'inferenceservice="{name}"' not in query.replace(" ", ""):
        yield Problem(
            f"{path}.query",
            f'does not select inferenceservice="{name}": it would scale on other pods\' load',
            f'add {{inferenceservice="{name}"}} to the selector',
        )
    if not ONE_SERIES.match(query):
        yield Problem(
            f"{path}.query",
            "may return several series (KEDA's prometheus scaler refuses that)",
            "wrap it in sum(...)",
        )
    if name not in scraped_services():
        yield Problem(
            f"{path}.query",
            f"kserve/monitoring's PodMonitor scrapes no pod of InferenceService {name}: the "
            "query would read nothing",
            "add it to the PodMonitor's selector",
        )


@functools.cache
def scraped_services() -> frozenset[str]:
    """The InferenceServices kserve/monitoring's PodMonitor selects."""
    try:
        objects = render(monitoring.MONITORING_DIR)
    except (RenderError, OSError):
        return frozenset()
    return frozenset(
        service
        for r in objects
        if r.kind == "PodMonitor"
        for service in monitoring.selected_services((r.obj.get("spec") or {}).get("selector") or {})
    )
