"""What an operator has on TorchServe, on Triton (issue #35, part B): the core's metrics on
Triton's metrics port under TorchServe's names and labels.

The sink's units run on a fake ``pb_utils``; the rest against one real Triton for the module
(``tests.served.local_triton``: a generated repository, free loopback ports, always stopped),
skipped, saying why, when ``make triton-server`` could not install the wheel.
"""
from __future__ import annotations

import base64
import socket
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import requests

from servecore.metrics import METRICS, BatchMetrics
from tests.conftest import REPO
from tests.served import local_triton, settled
from tritonrepo.metrics import BUCKETS, TritonMetrics
from tsclient import metrics

TAGGER = "resnet50-tagger"


# ---------------------------------------------------------------------- the sink, no server

class FakeMetric:
    """What a ``pb_utils`` metric was told, in order."""

    def __init__(self, family: "FakeFamily", labels: dict, buckets) -> None:
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
    refused: set[str] = set()

    def __init__(self, name: str, description: str, kind: str) -> None:
        if name in self.refused:
            raise RuntimeError("Failed to create metric family: metrics not enabled")
        self.name, self.description, self.kind = name, description, kind
        self.metrics: list[FakeMetric] = []

    def Metric(self, labels: dict, buckets=None) -> FakeMetric:  # noqa: N802 - pb_utils' name
        self.metrics.append(FakeMetric(self, labels, buckets))
        return self.metrics[-1]


def fake_pb_utils(refused: set[str] = frozenset()):
    return SimpleNamespace(MetricFamily=type("MetricFamily", (FakeFamily,),
                                             {"refused": set(refused)}))


def test_the_sink_declares_the_core_table_under_its_names_and_kinds():
    sink = TritonMetrics(fake_pb_utils(), TAGGER, hostname="h")
    assert set(sink.families) == set(METRICS)
    for name, (kind, _) in METRICS.items():
        assert sink.families[name].kind == kind.value
        assert sink.families[name].description  # Triton requires a description


def test_a_batch_reaches_triton_as_torchserves_series():
    """What the core records for one batch, as the metric calls and labels Triton gets:
    ModelName, Level and Hostname as TorchServe adds them, then the metric's own."""
    sink = TritonMetrics(fake_pb_utils(), TAGGER, hostname="h")
    recorded = BatchMetrics(sink, "int8+f32")
    recorded.batch(requests=3, images=2, open_ms=1.5, decode_ms=4.0)
    recorded.batch(requests=3, images=3, open_ms=0.5, decode_ms=6.0)
    recorded.forward(12.0)
    recorded.errors(["InvalidImage", "InvalidImage", "Overloaded"])

    def series(name: str) -> dict[tuple, list]:
        return {tuple(sorted(m.labels.items())): m.calls for m in sink.families[name].metrics}

    base = (("Hostname", "h"), ("Level", "Model"), ("ModelName", TAGGER))
    assert series("HandlerRequests") == {base: [("increment", 3), ("increment", 3)]}
    assert series("HandlerImages") == {base: [("increment", 2), ("increment", 3)]}
    assert series("HandlerDecodeMs") == {base: [("increment", 4.0), ("increment", 6.0)]}
    assert series("HandlerForwardMs") == {base: [("increment", 12.0)]}
    assert series("HandlerBatchesBySize") == {
        tuple(sorted((*base, ("BatchSize", "3")))): [("increment", 1), ("increment", 1)]}
    assert series("HandlerErrors") == {
        tuple(sorted((*base, ("ErrorType", "InvalidImage")))): [("increment", 2)],
        tuple(sorted((*base, ("ErrorType", "Overloaded")))): [("increment", 1)]}
    assert series("HandlerPrecision") == {
        tuple(sorted((*base, ("Precision", "int8+f32")))): [("set", 1), ("set", 1)]}
    assert series("HandlerBatchSize") == {base: [("observe", 3), ("observe", 3)]}
    [histogram] = sink.families["HandlerImagesPerBatch"].metrics
    assert histogram.calls == [("observe", 2), ("observe", 3)]
    assert histogram.buckets == BUCKETS and BUCKETS[0] == 1 and BUCKETS[-1] >= 1000
    [counter] = sink.families["HandlerImages"].metrics
    assert counter.buckets is None  # Triton refuses buckets on anything but a histogram


def test_the_hostname_is_this_hosts_by_default():
    sink = TritonMetrics(fake_pb_utils(), TAGGER)
    sink.add("HandlerBatches", 1)
    assert sink.families["HandlerBatches"].metrics[0].labels["Hostname"] == socket.gethostname()


def test_a_metric_the_server_refuses_is_off_with_a_warning_not_a_failed_batch(caplog):
    with caplog.at_level("WARNING"):
        sink = TritonMetrics(fake_pb_utils(refused={"HandlerBatchSize"}), TAGGER, hostname="h")
    assert any("metric HandlerBatchSize off" in r.getMessage() for r in caplog.records)
    sink.add("HandlerBatchSize", 4)  # nothing to send it to: dropped
    sink.add("HandlerBatches", 1)
    assert sink.families["HandlerBatches"].metrics[0].calls == [("increment", 1)]


def test_wrong_labels_are_a_loud_error():
    sink = TritonMetrics(fake_pb_utils(), TAGGER, hostname="h")
    with pytest.raises(ValueError, match=r"HandlerErrors takes labels \('ErrorType',\)"):
        sink.add("HandlerErrors", 1)


# ---------------------------------------------------------------------- a real Triton

@pytest.fixture(scope="module")
def triton(tmp_path_factory, model_store):
    with local_triton(tmp_path_factory.mktemp("triton-ops"), model_store) as server:
        yield server


def infer(triton, model: str, images: list[bytes], **parameters) -> requests.Response:
    """A v2 JSON request: base64 images in the ``images`` BYTES tensor, ``[n, 1]``."""
    body = {"inputs": [{"name": "images", "datatype": "BYTES", "shape": [len(images), 1],
                        "data": [base64.b64encode(i).decode() for i in images]}]}
    if parameters:
        body["parameters"] = parameters
    return requests.post(f"{triton.url}/v2/models/{model}/infer", json=body, timeout=300)


def tagger_series(triton) -> dict[str, float]:
    """The tagger's series on Triton's metrics port now, by name (the core's with their own
    label values after a colon; Triton's ``nv_*`` under its ``model`` label)."""
    values: dict[str, float] = {}
    text = requests.get(triton.metrics_url, timeout=30).text
    for name, labels, value in metrics.samples(text):
        if TAGGER not in (labels.get("ModelName"), labels.get("model")):
            continue
        own = [labels[k] for k in ("ErrorType", "Precision", "BatchSize") if k in labels]
        key = ":".join([name, *own])
        values[key] = values.get(key, 0.0) + value
    return values


def test_the_core_counts_what_was_sent_on_tritons_metrics_port(triton):
    """Requests, images and errors as the core counted them equal what the test sent and what
    Triton itself counted; the labels are TorchServe's."""
    photo = (REPO / "build" / "samples" / "chelsea.jpg").read_bytes()
    good, bad, three = 8, 3, 1  # one-photo requests, undecodable ones, a three-photo request
    assert infer(triton, TAGGER, [photo]).status_code == 200  # every series exists from here
    before = tagger_series(triton)
    bodies = [[photo]] * good + [[b"not an image"]] * bad + [[photo] * 3] * three
    with ThreadPoolExecutor(4) as pool:
        statuses = list(pool.map(lambda images: infer(triton, TAGGER, images).status_code,
                                 bodies))
    assert sorted(statuses) == [200] * (good + three) + [400] * bad
    sent = good + bad + three
    after = settled(lambda: tagger_series(triton),
                    lambda v: v["HandlerRequests"] - before["HandlerRequests"] >= sent)
    delta = {name: after[name] - before.get(name, 0.0) for name in after}
    assert delta["HandlerRequests"] == delta["HandlerBatchSize_sum"] == sent
    assert delta["HandlerImages"] == delta["HandlerImagesPerBatch_sum"] == good + 3 * three
    assert delta["HandlerErrors:InvalidImage"] == bad
    # Triton's own counts of the same traffic. The python backend reports every request it
    # sent a response for as a success, the core's 4xx error responses included: only the
    # core's HandlerErrors tells them apart (docs/operations.md).
    assert delta["nv_inference_request_success"] == sent
    assert delta.get("nv_inference_request_failure", 0) == 0
    assert delta["HandlerBatches"] == delta["HandlerBatchSize_count"] \
        == delta["nv_inference_exec_count"]
    assert sum(v for k, v in delta.items() if k.startswith("HandlerBatchesBySize:")) \
        == delta["HandlerBatches"]
    assert after["HandlerPrecision:f32"] == 1  # the repository is pinned to f32

    text = requests.get(triton.metrics_url, timeout=30).text
    [labels] = [s.labels for s in metrics.samples(text)
                if s.name == "HandlerRequests" and s.labels.get("ModelName") == TAGGER]
    assert labels == {"ModelName": TAGGER, "Level": "Model", "Hostname": socket.gethostname()}
