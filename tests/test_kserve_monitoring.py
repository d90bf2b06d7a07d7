"""kserve/monitoring: the PodMonitor and the PrometheusRule pass ``make kserve-lint`` as
shipped, the rule is config/monitoring/rules.yml's copy, and each thing that would leave
Prometheus blind or the alerts silent is named by the lint."""

from __future__ import annotations

import copy

import pytest
import yaml

from kserve_tools import lint as kserve_lint
from kserve_tools.lint import monitoring
from kserve_tools.render import render
from tests.conftest import REPO


def _objects() -> dict:
    return {r.kind: r for r in render(monitoring.MONITORING_DIR)}


def _findings(resource) -> list[str]:
    port = kserve_lint.port(kserve_lint.server_properties()["metrics_address"])
    return [str(f) for f in monitoring.findings(resource, kserve_lint.base_service()[1], port)]


def test_shipped_objects_pass_and_scrape_the_runtime_metrics_port():
    objects = _objects()
    assert set(objects) == {"PodMonitor", "PrometheusRule"}
    for resource in objects.values():
        assert _findings(resource) == []
    relabel = objects["PodMonitor"].obj["spec"]["podMetricsEndpoints"][0]["relabelings"]
    port = kserve_lint.server_properties()["metrics_address"].rsplit(":", 1)[1]
    assert {
        "sourceLabels": ["__meta_kubernetes_pod_ip"],
        "targetLabel": "__address__",
        "replacement": f"$1:{port}",
    } in relabel


def test_prometheus_rule_is_the_generated_copy_of_the_rules():
    assert monitoring.PROMETHEUS_RULE.read_text() == monitoring.prometheus_rule_text(), (
        "kserve/monitoring/prometheusrule.yaml is stale: run python -m kserve_tools.lint.monitoring"
    )
    shipped = yaml.safe_load(monitoring.PROMETHEUS_RULE.read_text())["spec"]["groups"]
    assert (
        shipped
        == yaml.safe_load((REPO / "config" / "monitoring" / "rules.yml").read_text())["groups"]
    )


def _endpoint(obj) -> dict:
    return obj["spec"]["podMetricsEndpoints"][0]


POD_MONITOR_MUTATIONS = {
    "selector": (
        lambda o: o["spec"]["selector"].update(
            matchExpressions=[], matchLabels={"serving.kserve.io/inferenceservice": "resnet"}
        ),
        "['resnet'] selects no pod of InferenceService resnet50",
    ),
    "isvc-label": (
        lambda o: _endpoint(o)["relabelings"].pop(3),
        "no inferenceservice label from the pod's",
    ),
    "port": (
        lambda o: _endpoint(o)["relabelings"][1].update(replacement="$1:8080"),
        "does not point __address__ at the metrics port 8082",
    ),
    "job": (lambda o: _endpoint(o)["relabelings"].pop(2), "job is not 'torchserve'"),
    "every-container": (
        lambda o: _endpoint(o)["relabelings"].pop(0),
        "does not keep only container kserve-container",
    ),
    "path": (lambda o: _endpoint(o).update(path="/metric"), "TorchServe serves /metrics"),
    "typo": (
        lambda o: o["spec"].update(podMetricEndpoints=o["spec"].pop("podMetricsEndpoints")),
        "spec.podMetricEndpoints: unknown field",
    ),
    "api": (
        lambda o: o.update(apiVersion="monitoring.coreos.com/v1alpha1"),
        "not monitoring.coreos.com/v1",
    ),
}


@pytest.mark.parametrize("mutation", POD_MONITOR_MUTATIONS)
def test_mutated_pod_monitor_fails_with_the_expected_message(mutation):
    resource = copy.deepcopy(_objects()["PodMonitor"])
    mutate, expected = POD_MONITOR_MUTATIONS[mutation]
    mutate(resource.obj)
    problems = _findings(resource)
    assert any(expected in p for p in problems), problems
    assert all(": PodMonitor resnet50-torchserve: " in p and "; fix: " in p for p in problems)


def test_a_stale_prometheus_rule_fails():
    resource = copy.deepcopy(_objects()["PrometheusRule"])
    resource.obj["spec"]["groups"][1]["rules"][0]["for"] = "30m"
    problems = _findings(resource)
    assert any(
        "spec.groups: differs from config/monitoring/rules.yml" in p
        and "fix: run python -m kserve_tools.lint.monitoring" in p
        for p in problems
    ), problems
