"""config/monitoring checked with Prometheus's own tools: promtool accepts the rules and passes
their unit tests, every alert is tested firing and quiet; then a real Prometheus scrapes a real
TorchServe under a small load and its recording rules agree with what the test sent."""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from devtools.prometheus import RULES, UNIT_TESTS, LocalPrometheus, alert_rules, series_names
from serveclient import metrics
from servecore.metrics import COMMON_LABELS, METRICS
from tests.conftest import REPO
from tests.served import settled


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool missing: `make setup` installs Prometheus (devtools/ensure_prometheus.sh)"
        )
    return path


def test_torchserves_metrics_yaml_declares_the_cores_metrics_as_the_core_does():
    """servecore/metrics.py declares every metric once (name, kind, labels); TorchServe needs
    each in config/metrics.yaml, with the same kind and the dimensions model, engine and its
    own labels, in that order (a worker sets them positionally)."""
    import yaml

    declared = yaml.safe_load((REPO / "config" / "metrics.yaml").read_text())["model_metrics"]
    found = {
        entry["name"]: (kind, tuple(entry["dimensions"]))
        for kind, entries in declared.items()
        for entry in entries
    }
    for metric in METRICS:
        assert found.get(metric.name) == (metric.kind.value, (*COMMON_LABELS, *metric.labels)), (
            metric.name
        )
        assert metric.help and "\n" not in metric.help  # what a sink with help text shows
    ours = {name for name in found if name.startswith("resnet50_")}
    assert ours == {metric.name for metric in METRICS}


def test_promtool_accepts_the_rules():
    result = subprocess.run(
        [_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_pass():
    result = subprocess.run(
        [_promtool(), "test", "rules", str(UNIT_TESTS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=UNIT_TESTS.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr


SCALING_TESTS = RULES.parent / "scaling-tests.yml"
KEDA_OVERLAYS = ("keda", "keda-gpu")


def test_promtool_scaling_tests_pass():
    """The replica count KEDA asks for crosses to one more exactly when the synthetic load
    says it should (config/monitoring/scaling-tests.yml)."""
    result = subprocess.run(
        [_promtool(), "test", "rules", str(SCALING_TESTS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=SCALING_TESTS.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("overlay", KEDA_OVERLAYS)
def test_scaling_tests_ask_each_keda_overlays_query_with_its_target(overlay):
    """Each External trigger of the overlay is tested as KEDA computes it, ceil(query /
    target.value), on the overlay's own query and target, once asking for 1 replica and once
    for more: editing a query or a target without its test fails here."""
    import yaml

    from kserve_tools.render import render

    [isvc] = [
        r for r in render(REPO / "kserve" / "overlays" / overlay) if r.kind == "InferenceService"
    ]
    metrics = isvc.obj["spec"]["predictor"]["autoScaling"]["metrics"]
    asked: dict[str, set] = {}
    for test in yaml.safe_load(SCALING_TESTS.read_text())["tests"]:
        for check in test.get("promql_expr_test", []):
            for sample in check["exp_samples"]:
                asked.setdefault(check["expr"], set()).add(sample["value"])
    assert metrics
    for metric in metrics:
        external = metric["external"]
        expr = f"ceil({external['metric']['query']} / {external['target']['value']})"
        assert expr in asked, f"{overlay}: no promtool test evaluates {expr}"
        assert 1 in asked[expr] and max(asked[expr]) > 1, (expr, asked[expr])


def test_every_alert_is_tested_firing_and_quiet():
    import yaml

    tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    checks = [check for test in tests for check in test.get("alert_rule_test", [])]
    for name in alert_rules():
        mine = [c for c in checks if c["alertname"] == name]
        assert any(c.get("exp_alerts") for c in mine), f"{name}: no test where it fires"
        assert any(not c.get("exp_alerts") for c in mine), f"{name}: no test where it stays quiet"


def test_every_alert_waits_and_says_what_to_do():
    for name, rule in alert_rules().items():
        assert rule.get("for"), f"{name}: no `for:` (one bad scrape would page)"
        annotations = rule.get("annotations", {})
        assert annotations.get("summary"), f"{name}: no summary"
        assert "docs/operations.md" in annotations.get("description", ""), (
            f"{name}: the description should point at docs/operations.md"
        )
        assert name in (REPO / "docs" / "operations.md").read_text(), (
            f"{name}: not explained in docs/operations.md"
        )


# ---------------------------------------------------------------------- a real Prometheus

MODEL = "resnet50-tagger"
GOOD, BAD = 12, 2  # the load: photos and undecodable bodies, 4 in flight


@pytest.fixture(scope="module")
def prometheus(torchserve, tmp_path_factory):
    """A real Prometheus scraping the session's TorchServe every second with our rules, always
    stopped. Started here, so every increase it sees comes from this module's requests."""
    target = torchserve.metrics_url.removeprefix("http://")
    with LocalPrometheus(tmp_path_factory.mktemp("prometheus"), [target], interval_s=1) as prom:
        yield prom


def _server_counters(torchserve) -> dict[str, float]:
    """The tagger's counters as TorchServe exposes them right now."""
    text = requests.get(f"{torchserve.metrics_url}/metrics", timeout=30).text
    wanted = {
        "ts_inference_requests",
        "ts_inference_latency_microseconds",
        "resnet50_batch_size_sum",
        "resnet50_batch_size_count",
        "resnet50_images",
    }
    values = dict.fromkeys(wanted, 0.0)
    for name, labels, value in metrics.samples(text):
        if name in wanted and MODEL in (labels.get("model"), labels.get("model_name")):
            values[name] += value
    return values


@pytest.mark.integration
def test_recording_rules_agree_with_the_requests_sent(torchserve, prometheus):
    headers = torchserve.keys.inference_headers()
    url = f"{torchserve.inference_url}/predictions/{MODEL}"
    photo = (REPO / "build" / "samples" / "chelsea.jpg").read_bytes()
    # Counters exist only once used: a photo and a bad body first, then Prometheus holds a few
    # samples of them before the load (a series' first sample is its baseline, not an
    # increase).
    assert requests.post(url, data=photo, headers=headers, timeout=120).status_code == 200
    assert requests.post(url, data=b"not an image", headers=headers, timeout=120).status_code == 400
    seen = settled(
        lambda: prometheus.value(
            f'min(count_over_time(resnet50_errors_total{{model="{MODEL}"}}[1m]))'
        ),
        lambda n: n is not None and n >= 3,
        timeout_s=60,
    )
    assert seen is not None and seen >= 3, f"Prometheus scraped the tagger {seen} times"
    before = _server_counters(torchserve)

    def send(body: bytes) -> int:
        return requests.post(url, data=body, headers=headers, timeout=120).status_code

    with ThreadPoolExecutor(4) as pool:
        statuses = list(pool.map(send, [photo] * GOOD + [b"not an image"] * BAD))
    assert sorted(statuses) == [200] * GOOD + [400] * BAD
    after = settled(
        lambda: _server_counters(torchserve),
        lambda c: c["resnet50_batch_size_sum"] - before["resnet50_batch_size_sum"] >= GOOD + BAD,
    )
    delta = {name: after[name] - before[name] for name in after}
    assert delta["ts_inference_requests"] == GOOD + BAD
    assert delta["resnet50_batch_size_sum"] == GOOD + BAD
    assert delta["resnet50_images"] == GOOD

    # Ratios of two counters scraped together are exact; rates over the 1m window carry
    # rate()'s extrapolation to the window's edges (at most a scrape interval each side).
    expected = {
        "requests": GOOD + BAD,
        "images": GOOD,
        "invalid": BAD,
        "4xx": BAD,
        "batch": delta["resnet50_batch_size_sum"] / delta["resnet50_batch_size_count"],
        "latency": delta["ts_inference_latency_microseconds"] / 1000 / (GOOD + BAD),
    }
    queries = {
        "requests": f'model_name:ts_inference_requests:rate1m{{model_name="{MODEL}"}} * 60',
        "images": f'model:resnet50_images:rate1m{{model="{MODEL}"}} * 60',
        "invalid": f'model:resnet50_errors:rate1m{{model="{MODEL}",'
        'error_type="InvalidImage"} * 60',
        "4xx": 'job:ts_requests:rate1m{code="4xx"} * 60',
        "batch": f'model:resnet50_batch_size:mean1m{{model="{MODEL}"}}',
        "latency": f'model_name:ts_inference_latency_ms:mean1m{{model_name="{MODEL}"}}',
    }

    def agree(got: dict) -> bool:
        counts = all(
            got[k] is not None and expected[k] * 0.95 <= got[k] <= expected[k] * 1.25
            for k in ("requests", "images", "invalid", "4xx")
        )
        means = all(
            got[k] is not None and got[k] == pytest.approx(expected[k], rel=1e-3)
            for k in ("batch", "latency")
        )
        return counts and means

    readings: list[dict] = []

    def read() -> dict:
        readings.append({k: prometheus.value(q) for k, q in queries.items()})
        return readings[-1]

    got = settled(read, agree, timeout_s=60, every_s=0.5)
    assert agree(got), (
        f"Prometheus's rules never agreed with the load sent {expected}; "
        f"readings every 0.5 s: {readings[::4]}"
    )


# ---------------------------------------------------------------------- the dashboard


def _exported_names() -> set[str]:
    """Every series name the server exports (config/metrics.yaml; histograms as _sum, _count
    and _bucket), every recorded rule, and Prometheus's own ``up``."""
    import yaml

    from devtools.prometheus import recording_rules

    declared = yaml.safe_load((REPO / "config" / "metrics.yaml").read_text())
    names = {"up", *recording_rules()}
    for section in ("ts_metrics", "model_metrics"):
        for kind, declared_metrics in declared[section].items():
            for metric in declared_metrics:
                names.add(metric["name"])
                if kind == "histogram":
                    names |= {metric["name"] + s for s in ("_sum", "_count", "_bucket")}
    return names


def test_committed_dashboard_is_what_the_code_builds():
    from buildsteps.dashboard import OUT, render

    assert OUT.read_text() == render(), (
        "config/monitoring/dashboard.json is stale: run python -m buildsteps.dashboard"
    )


def test_every_dashboard_query_names_a_real_series_and_parses(tmp_path):
    import json

    import yaml

    from buildsteps.dashboard import OUT, exprs

    queries = exprs(json.loads(OUT.read_text()))
    assert len(queries) >= 10
    known = _exported_names()
    for expr in queries:
        names = series_names(expr)
        assert names, f"no series found in {expr!r}"
        assert names <= known, (
            f"{expr!r} reads {sorted(names - known)}: nothing exports or records it"
        )
    # promtool parses rule expressions: each query as a recording rule of a scratch file.
    scratch = tmp_path / "dashboard-queries.yml"
    scratch.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "dashboard",
                        "rules": [
                            {"record": f"dashboard:query:{i}", "expr": expr}
                            for i, expr in enumerate(queries)
                        ],
                    }
                ]
            }
        )
    )
    result = subprocess.run(
        [_promtool(), "check", "rules", str(scratch)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_series_names_are_read_from_an_expression():
    expr = (
        'sum by (model, batch_size) (rate(resnet50_batches_by_size_total{job="x"}[5m])) / '
        "ignoring (batch_size) group_left sum by (model) (rate(resnet50_batches_total[5m]))"
    )
    assert series_names(expr) == {"resnet50_batches_by_size_total", "resnet50_batches_total"}
    assert series_names('job:ts_requests:rate1m{code="5xx"} > 0.5') == {"job:ts_requests:rate1m"}
