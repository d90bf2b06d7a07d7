"""What an operator has on TorchServe, on Triton (issue #35, part B): the core's metrics on
Triton's metrics port under TorchServe's names and labels, read by a real Prometheus with
config/monitoring's rules; describe and explanations as request parameters of the model,
read by ``tsctl describe/explain --url``.

The sink's units run on a fake ``pb_utils``; the rest against the session's real Triton
(``triton`` in tests/conftest.py: a generated repository, free loopback ports, always stopped),
skipped, saying why, when ``make triton-server`` could not install the wheel.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest
import requests

from buildsteps.configgen import frontend_settings
from serveclient import metrics
from serveclient.errors import ApiError
from serveclient.triton import TritonClient
from servecore.metrics import (
    BATCH_SIZE,
    BATCHES,
    CACHE_BYTES,
    CACHE_HITS,
    ERRORS,
    METRICS,
    BatchMetrics,
)
from tests.conftest import REPO
from tests.served import TSCTL, settled
from tests.served import v2_infer as infer
from tritonrepo.metrics import BUCKETS, TritonMetrics

TAGGER = "resnet50-tagger"


# ---------------------------------------------------------------------- the sink, no server


class FakeMetric:
    """What a ``pb_utils`` metric was told, in order."""

    def __init__(self, family: FakeFamily, labels: dict, buckets) -> None:
        self.family, self.labels, self.buckets = family, labels, buckets
        self.calls: list[tuple[str, float]] = []

    def increment(self, value: float) -> None:
        self.calls.append(("increment", value))

    def set(self, value: float) -> None:
        self.calls.append(("set", value))

    def observe(self, value: float) -> None:
        self.calls.append(("observe", value))


class FakeFamily:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    refused: frozenset[str] = frozenset()

    def __init__(self, name: str, description: str, kind: str) -> None:
        if name in self.refused:
            raise RuntimeError("Failed to create metric family: metrics not enabled")
        self.name, self.description, self.kind = name, description, kind
        self.metrics: list[FakeMetric] = []

    def Metric(self, labels: dict, buckets=None) -> FakeMetric:  # noqa: N802 - pb_utils' name
        self.metrics.append(FakeMetric(self, labels, buckets))
        return self.metrics[-1]


def fake_pb_utils(refused: set[str] = frozenset()):
    return SimpleNamespace(
        MetricFamily=type("MetricFamily", (FakeFamily,), {"refused": frozenset(refused)})
    )


def test_the_sink_declares_the_core_table_under_its_names_and_kinds():
    sink = TritonMetrics(fake_pb_utils(), TAGGER, hostname="h")
    assert set(sink.families) == {metric.name for metric in METRICS}
    for metric in METRICS:
        assert sink.families[metric.name].kind == metric.kind.value
        assert sink.families[metric.name].description == metric.help  # Triton requires one


def test_a_batch_reaches_triton_as_the_same_series_as_on_torchserve():
    """What the core records for one batch, as the metric calls and labels Triton gets:
    model and engine, the Hostname TorchServe adds, then the metric's own."""
    sink = TritonMetrics(fake_pb_utils(), TAGGER, hostname="h")
    recorded = BatchMetrics(sink, "int8+f32")
    recorded.batch(requests=3, images=2, open_ms=1.5, decode_ms=4.0)
    recorded.batch(requests=3, images=3, open_ms=0.5, decode_ms=6.0)
    recorded.forward(12.0)
    recorded.errors(["InvalidImage", "InvalidImage", "Overloaded"])

    def series(name: str) -> dict[tuple, list]:
        return {tuple(sorted(m.labels.items())): m.calls for m in sink.families[name].metrics}

    base = (("Hostname", "h"), ("engine", "triton"), ("model", TAGGER))
    assert series("resnet50_requests_total") == {base: [("increment", 3), ("increment", 3)]}
    assert series("resnet50_images_total") == {base: [("increment", 2), ("increment", 3)]}
    assert series("resnet50_decode_ms_total") == {base: [("increment", 4.0), ("increment", 6.0)]}
    assert series("resnet50_forward_ms_total") == {base: [("increment", 12.0)]}
    assert series("resnet50_batches_by_size_total") == {
        tuple(sorted((*base, ("batch_size", "3")))): [("increment", 1), ("increment", 1)]
    }
    assert series("resnet50_errors_total") == {
        tuple(sorted((*base, ("error_type", "InvalidImage")))): [("increment", 2)],
        tuple(sorted((*base, ("error_type", "Overloaded")))): [("increment", 1)],
    }
    # An update that changes nothing is not sent again (each call is a round trip to Triton).
    assert series("resnet50_precision") == {
        tuple(sorted((*base, ("precision", "int8+f32")))): [("set", 1)]
    }
    assert series("resnet50_batch_size") == {base: [("observe", 3), ("observe", 3)]}
    [histogram] = sink.families["resnet50_images_per_batch"].metrics
    assert histogram.calls == [("observe", 2), ("observe", 3)]
    assert histogram.buckets == BUCKETS and BUCKETS[0] == 1 and BUCKETS[-1] >= 1000
    [counter] = sink.families["resnet50_images_total"].metrics
    assert counter.buckets is None  # Triton refuses buckets on anything but a histogram


def test_updates_that_change_nothing_are_not_sent_and_the_rest_are():
    """A counter's increment by 0 and a gauge set to its last value change no value Triton
    shows, so they cost no round trip; the first use still makes the series (it shows 0)."""
    sink = TritonMetrics(fake_pb_utils(), TAGGER, hostname="h")
    for hits, held in ((0, 0), (0, 0), (2, 0), (0, 512), (1, 512), (0, 0)):
        sink.add(CACHE_HITS, hits)
        sink.add(CACHE_BYTES, held)
    [counter] = sink.families["resnet50_cache_hits_total"].metrics
    assert counter.calls == [("increment", 0), ("increment", 2), ("increment", 1)]
    [gauge] = sink.families["resnet50_cache_bytes"].metrics
    assert gauge.calls == [("set", 0), ("set", 512), ("set", 0)]


def test_the_hostname_is_this_hosts_by_default():
    sink = TritonMetrics(fake_pb_utils(), TAGGER)
    sink.add(BATCHES, 1)
    assert (
        sink.families["resnet50_batches_total"].metrics[0].labels["Hostname"]
        == socket.gethostname()
    )


def test_a_metric_the_server_refuses_is_off_with_a_warning_not_a_failed_batch(caplog):
    with caplog.at_level("WARNING"):
        sink = TritonMetrics(fake_pb_utils(refused={"resnet50_batch_size"}), TAGGER, hostname="h")
    assert any("metric resnet50_batch_size off" in r.getMessage() for r in caplog.records)
    sink.add(BATCH_SIZE, 4)  # nothing to send it to: dropped
    sink.add(BATCHES, 1)
    assert sink.families["resnet50_batches_total"].metrics[0].calls == [("increment", 1)]


def test_wrong_labels_are_a_loud_error():
    sink = TritonMetrics(fake_pb_utils(), TAGGER, hostname="h")
    with pytest.raises(ValueError, match=r"resnet50_errors_total takes labels \('error_type',\)"):
        sink.add(ERRORS, 1)


# ---------------------------------------------------------------------- a real Triton


def tagger_series(triton) -> dict[str, float]:
    """The tagger's series on Triton's metrics port now, by name (the core's with their own
    label values after a colon; Triton's ``nv_*`` under its ``model`` label)."""
    values: dict[str, float] = {}
    text = requests.get(triton.metrics_url, timeout=30).text
    for name, labels, value in metrics.samples(text):
        if labels.get("model") != TAGGER:
            continue
        own = [labels[k] for k in ("error_type", "precision", "batch_size") if k in labels]
        key = ":".join([name, *own])
        values[key] = values.get(key, 0.0) + value
    return values


def test_the_core_counts_what_was_sent_on_tritons_metrics_port(triton):
    """Requests, images and errors as the core counted them equal what the test sent and what
    Triton itself counted; the labels are the same as on TorchServe but for the engine."""
    photo = (REPO / "build" / "samples" / "chelsea.jpg").read_bytes()
    good, bad, three = 8, 3, 1  # one-photo requests, undecodable ones, a three-photo request
    assert infer(triton, TAGGER, [photo]).status_code == 200  # every series exists from here
    before = tagger_series(triton)
    bodies = [[photo]] * good + [[b"not an image"]] * bad + [[photo] * 3] * three
    with ThreadPoolExecutor(4) as pool:
        statuses = list(pool.map(lambda images: infer(triton, TAGGER, images).status_code, bodies))
    assert sorted(statuses) == [200] * (good + three) + [400] * bad
    sent = good + bad + three

    # The core's series and Triton's own are written apart (the stub's, the server's), and a
    # busy host can show one before the other: wait until both have counted every request and
    # Triton every batch the core counted.
    def caught_up(v: dict) -> bool:
        grew = {name: v.get(name, 0.0) - before.get(name, 0.0) for name in v}
        return (
            grew["resnet50_requests"] >= sent
            and grew.get("nv_inference_request_success", 0.0) >= sent
            and grew.get("nv_inference_exec_count", 0.0) >= grew["resnet50_batches"]
        )

    after = settled(lambda: tagger_series(triton), caught_up)
    delta = {name: after[name] - before.get(name, 0.0) for name in after}
    assert delta["resnet50_requests"] == delta["resnet50_batch_size_sum"] == sent
    assert delta["resnet50_images"] == delta["resnet50_images_per_batch_sum"] == good + 3 * three
    assert delta["resnet50_errors:InvalidImage"] == bad
    # Triton's own counts of the same traffic. The python backend reports every request it
    # sent a response for as a success, the core's 4xx error responses included: only the
    # core's resnet50_errors_total tells them apart (docs/operations.md).
    assert delta["nv_inference_request_success"] == sent
    assert delta.get("nv_inference_request_failure", 0) == 0
    assert (
        delta["resnet50_batches"]
        == delta["resnet50_batch_size_count"]
        == delta["nv_inference_exec_count"]
    )
    # What docs/operations.md offers in place of TorchServe's latency rules.
    assert delta["nv_inference_request_duration_us"] > delta["nv_inference_queue_duration_us"] > 0
    assert (
        sum(v for k, v in delta.items() if k.startswith("resnet50_batches_by_size:"))
        == delta["resnet50_batches"]
    )
    assert after["resnet50_precision:f32"] == 1  # the repository is pinned to f32

    text = requests.get(triton.metrics_url, timeout=30).text
    [labels] = [
        s.labels
        for s in metrics.samples(text)
        if s.name == "resnet50_requests" and s.labels.get("model") == TAGGER
    ]
    assert labels == {"model": TAGGER, "engine": "triton", "Hostname": socket.gethostname()}


# ---------------------------------------------------------------------- Prometheus on Triton


def test_make_monitor_can_point_at_tritons_metrics_port():
    from devtools.prometheus import DEFAULT_TARGETS
    from tritonrepo.server import DEFAULT_PORTS

    assert DEFAULT_TARGETS["triton"] == f"127.0.0.1:{DEFAULT_PORTS['metrics']}"
    make = subprocess.run(
        ["make", "-n", "monitor", "MONITOR_ENGINE=triton"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "-m devtools.prometheus --port 9090 --engine triton" in make.stdout, make.stdout


def test_prometheus_with_the_shipped_rules_reads_the_core_on_triton(triton, tmp_path):
    """config/monitoring's rules on a real Prometheus scraping Triton: the recording rules on
    the core's series have values, and they agree with the load sent."""
    from devtools.prometheus import LocalPrometheus

    photo = (REPO / "build" / "samples" / "chelsea.jpg").read_bytes()
    good, bad = 12, 2
    # Every series exists before Prometheus starts, so it holds a baseline before the load.
    assert infer(triton, TAGGER, [photo]).status_code == 200
    assert infer(triton, TAGGER, [b"not an image"]).status_code == 400
    target = triton.metrics_url.removeprefix("http://").removesuffix("/metrics")
    with LocalPrometheus(tmp_path / "prometheus", [target], interval_s=1) as prom:
        seen = settled(
            lambda: prom.value(
                f'min(count_over_time(resnet50_errors_total{{model="{TAGGER}"}}[1m]))'
            ),
            lambda n: n is not None and n >= 3,
            timeout_s=60,
        )
        assert seen is not None and seen >= 3, f"Prometheus scraped Triton {seen} times"
        before = tagger_series(triton)
        with ThreadPoolExecutor(4) as pool:
            statuses = list(
                pool.map(
                    lambda body: infer(triton, TAGGER, [body]).status_code,
                    [photo] * good + [b"not an image"] * bad,
                )
            )
        assert sorted(statuses) == [200] * good + [400] * bad
        after = tagger_series(triton)
        batches = after["resnet50_batches"] - before["resnet50_batches"]
        expected = {
            "requests": good + bad,
            "images": good,
            "invalid": bad,
            "batch": (good + bad) / batches,
            "up": 1,
        }
        queries = {
            "requests": f'model:resnet50_requests:rate1m{{model="{TAGGER}"}} * 60',
            "images": f'model:resnet50_images:rate1m{{model="{TAGGER}"}} * 60',
            "invalid": f'model:resnet50_errors:rate1m{{model="{TAGGER}",'
            'error_type="InvalidImage"} * 60',
            "batch": f'model:resnet50_batch_size:mean1m{{model="{TAGGER}"}}',
            "up": 'up{job="torchserve"}',
        }

        def agree(got: dict) -> bool:
            # rate() extrapolates to the window's edges: counts within -5% / +25%; the batch
            # mean is a ratio of two counters scraped together, exact.
            counts = all(
                got[k] is not None and expected[k] * 0.95 <= got[k] <= expected[k] * 1.25
                for k in ("requests", "images", "invalid")
            )
            return (
                counts
                and got["up"] == 1
                and got["batch"] is not None
                and got["batch"] == pytest.approx(expected["batch"], rel=1e-3)
            )

        readings: list[dict] = []

        def read() -> dict:
            readings.append({k: prom.value(q) for k, q in queries.items()})
            return readings[-1]

        got = settled(read, agree, timeout_s=60, every_s=0.5)
        assert agree(got), (
            f"the rules never agreed with the load sent {expected}; "
            f"readings every 0.5 s: {readings[::4]}"
        )
        # The memory rule reads the worker's gauge: one Triton stub's resident MB.
        rss = prom.value(f'model:resnet50_worker_rss_mb:max{{model="{TAGGER}"}}')
        assert rss is not None and 100 < rss < 64 * 1024


# ---------------------------------------------------------------------- describe on Triton

DESCRIBE_KEYS = {
    "weights",
    "classes",
    "heads",
    "handler",
    "lane",
    "cpu_policy",
    "backend",
    "precision",
    "precision_choice",
    "quantization",
    "device",
    "decode",
    "gpu",
    "preprocessing",
    "crops_input",
}  # servecore's ImageModel.describe


def test_a_describe_request_answers_what_the_model_runs(triton, model_store):
    """The ``describe`` request parameter: the model's describe as one JSON text, from the
    instance that serves (its precision measured or pinned at load), no image read."""
    body = {
        "inputs": [{"name": "images", "shape": [1, 1], "datatype": "BYTES", "data": [""]}],
        "parameters": {"describe": True},
    }
    answer = requests.post(f"{triton.url}/v2/models/{TAGGER}/infer", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    [out] = answer.json()["outputs"]
    assert (out["name"], out["datatype"], out["shape"]) == ("describe", "BYTES", [1, 1])
    described = json.loads(out["data"][0])
    assert set(described) == DESCRIBE_KEYS
    with zipfile.ZipFile(model_store / f"{TAGGER}.mar") as mar:
        assert described["weights"] == json.loads(mar.read("weights_info.json"))
    assert described["precision"] == "f32" and described["handler"]["task"] == "tags"
    assert described["precision_choice"]["summary"]
    # Without the parameter, the same empty element is the core's 400 as before.
    del body["parameters"]
    refused = requests.post(f"{triton.url}/v2/models/{TAGGER}/infer", json=body, timeout=60)
    assert refused.status_code == 400 and "InvalidRequest" in refused.json()["error"]


def test_tsctl_describe_url_prints_it_as_for_torchserve(triton):
    described = tsctl("--json", "describe", TAGGER, "--url", triton.url)
    assert described.returncode == 0, described.stderr
    [entry] = json.loads(described.stdout)
    yaml_settings = frontend_settings(REPO / "config" / "models" / f"{TAGGER}.yaml")
    assert (entry["modelName"], entry["modelVersion"]) == (TAGGER, "1")
    assert entry["batchSize"] == yaml_settings["batchSize"]
    assert entry["maxBatchDelay"] == yaml_settings["maxBatchDelay"]
    assert [w["status"] for w in entry["workers"]] == ["READY"] * yaml_settings["minWorkers"]
    meta = entry["customizedMetadata"]
    assert set(meta) == DESCRIBE_KEYS and meta["precision"] == "f32"
    human = tsctl("describe", TAGGER, "--url", triton.url)
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert lines[0].startswith(
        f"{TAGGER} 1 (default): {yaml_settings['minWorkers']} workers, "
        f"batch {yaml_settings['batchSize']}"
    )
    assert lines[1].startswith(f"  weights {meta['weights']['source']}")
    assert lines[2] == f"  precision {meta['precision_choice']['summary']}"


def test_tsctl_describe_url_refuses_a_server_that_is_not_triton(triton):
    """A v2 URL that is not Triton's (here: a port nothing answers on as Triton, its metrics
    port) is a usage error naming the management API, not a stack trace."""
    other = triton.metrics_url.removesuffix("/metrics")
    refused = tsctl("describe", TAGGER, "--url", other)
    assert refused.returncode == 2, refused.stderr
    assert "describe --url reads a Triton server" in refused.stderr
    assert "TorchServe's describe reads its management and metrics APIs" in refused.stderr


def tsctl(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))  # this checkout's client
    return subprocess.run([str(TSCTL), *argv], env=env, capture_output=True, text=True, timeout=300)


# ---------------------------------------------------------------------- explanations on Triton


def _grids(answer: dict) -> list:
    return [(e["label"], e["index"], e["grid"]) for e in answer["explanations"]]


@pytest.mark.integration
def test_an_explanation_on_triton_equals_torchserves_for_the_same_photo(triton, torchserve):
    """The ``explain`` request parameter through the core's explanation stage, on the
    checkpoint the repository now carries: the same targets and grids as TorchServe's
    ``/explanations`` (the eager model on both; its forward is f32 whatever precision
    serves, so the grids agree to the rounding of their 4 decimals)."""
    photo = (REPO / "build" / "samples" / "chelsea.jpg").read_bytes()
    theirs = torchserve.client().explain(TAGGER, photo, target="tabby", method="gradcam")
    ours = TritonClient(triton.url).explain(TAGGER, photo, target="tabby", method="gradcam")
    assert ours["method"] == theirs["method"] == "gradcam"
    [(label, index, grid)] = _grids(ours)
    [(their_label, their_index, their_grid)] = _grids(theirs)
    assert (label, index) == (their_label, their_index) == ("tabby", 281)
    assert np.array(grid).shape == np.array(their_grid).shape == (7, 7)
    assert np.abs(np.array(grid) - np.array(their_grid)).max() <= 2e-4
    # The embedding model explains its own vector by default, as on TorchServe.
    embedding = TritonClient(triton.url).explain("resnet50-embedding", photo)
    assert [e["target"] for e in embedding["explanations"]] == ["embedding"]


def test_explanation_requests_are_checked_like_torchserves(triton):
    """Bad explanation parameters are this request's 400, in the core's words; explanation
    parameters without ``explain`` are a 400 too (they would be silently ignored)."""
    photo = (REPO / "build" / "samples" / "chelsea.jpg").read_bytes()
    client = TritonClient(triton.url)
    with pytest.raises(ApiError) as refused:
        client.explain(TAGGER, photo, target="no such class")
    assert (refused.value.status, refused.value.type) == (400, "InvalidParameter")
    assert "unknown target class 'no such class'" in refused.value.server_message
    plain = infer(triton, TAGGER, [photo], method="gradcam")
    assert plain.status_code == 400 and "only apply to explanations" in plain.text
    # Two photos in one explanation request: one answer each, as KServe v1's :explain.
    both = infer(triton, TAGGER, [photo, photo], explain=True)
    assert both.status_code == 200, both.text
    [out] = both.json()["outputs"]
    assert out["name"] == "explanations"
    answer = json.loads(out["data"][0])
    assert [len(a["explanations"]) for a in answer["explanations"]] == [1, 1]


def test_tsctl_explain_url_writes_the_heatmap_and_the_gallery(triton, tmp_path):
    from PIL import Image

    photo = REPO / "build" / "samples" / "chelsea.jpg"
    out = tmp_path / "heatmap.png"
    run = tsctl(
        "--json", "explain", str(photo), "--target", "tabby", "--out", str(out), "--url", triton.url
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["explanations"][0]["index"] == 281
    assert Image.open(out).size[0] > 0
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in ("chelsea.jpg", "coffee.jpg"):
        (folder / name).write_bytes((REPO / "build" / "samples" / name).read_bytes())
    (folder / "broken.jpg").write_bytes(b"not an image")
    page = tmp_path / "gallery.html"
    gallery = tsctl("--json", "explain", str(folder), "--html", str(page), "--url", triton.url)
    assert gallery.returncode == 7, gallery.stderr  # the broken file failed alone
    summary = json.loads(gallery.stdout)
    assert sorted(p["path"].rsplit("/", 1)[1] for p in summary["photos"] if p["error"] is None) == [
        "chelsea.jpg",
        "coffee.jpg",
    ]
    assert all(len(p["targets"]) == 3 for p in summary["photos"] if p["error"] is None)
    assert page.stat().st_size > 10_000 and "chelsea.jpg" in page.read_text()


# ---------------------------------------------------------------------- tsctl top on Triton


def test_tsctl_top_once_url_shows_tritons_figures(triton):
    """One frame under a steady load (2 clients, bounded): requests/s and latency from
    Triton's series, batches, precision and the stub's RSS from the core's."""
    photo = (REPO / "build" / "samples" / "chelsea.jpg").read_bytes()
    stop, sent = threading.Event(), []

    def load() -> None:
        while not stop.is_set() and len(sent) < 500:
            sent.append(infer(triton, TAGGER, [photo]).status_code)

    threads = [threading.Thread(target=load) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        settled(lambda: len(sent), lambda n: n >= 2)  # the load flows before the frame
        metrics_base = triton.metrics_url.removesuffix("/metrics")
        run = tsctl(
            "--metrics-url", metrics_base, "top", "--once", "--interval", "2", "--url", triton.url
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=150)
    assert run.returncode == 0, run.stderr
    assert set(sent) == {200}
    lines = run.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), run.stdout
    assert metrics_base.removeprefix("http://") in lines[0]
    assert lines[1].startswith("answers/s  - (no status classes on Triton")
    row = next(line.split() for line in lines if line.startswith(TAGGER))
    requests_per_s, images_per_s, mean_ms = float(row[1]), float(row[2]), float(row[3])
    assert requests_per_s > 0 and images_per_s > 0 and mean_ms > 0, run.stdout
    assert float(row[5]) >= 1, run.stdout  # mean batch size
    worker = next(line.split() for line in lines if line.startswith(TAGGER) and "READY" in line)
    assert int(worker[3]) > 0 and int(worker[4]) > 100 and worker[5] == "f32", run.stdout
