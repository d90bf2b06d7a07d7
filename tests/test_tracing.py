"""OpenTelemetry traces (#70): a real OTLP/HTTP receiver here (the official protobuf messages),
one real TorchServe and one real Triton with tracing on, pointed at it, each serving the
embedding model. A client's ``traceparent`` is continued through both engines, tsctl and the
KServe transformer; the span tree and attributes are as servecore/tracing.py says; a collector
that is slow or down costs no answer and its lost spans are counted. The bounded processor and
the sampler are driven with small objects first."""

from __future__ import annotations

import base64
import contextlib
import logging
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from devtools import otlp
from serveclient import metrics
from servecore.errors import InvalidImage
from servecore.otel import BoundedProcessor, Traced
from servecore.stages import ComputedBatch, Incoming, PreparedBatch, TraceHeaders
from servecore.tracing import enabled, traced, untraced
from serveshared.wire import PRECISION_HEADER
from tests.served import TSCTL, local_triton, settled, v2_body

REPO = Path(__file__).resolve().parent.parent
MODEL = "resnet50-embedding"
PHOTO = (REPO / "build" / "heldout" / "astronaut.jpg").read_bytes()
STAGES = {"resnet50.open", "resnet50.decode", "resnet50.forward", "resnet50.answer"}
DROPPED = "resnet50_trace_spans_dropped_total"


def client_context(sampled: bool = True) -> tuple[str, str, str]:
    """A client's (trace id, span id, traceparent) as W3C writes them."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


# --- the parts, with small objects ------------------------------------------------------------


def test_tracing_is_switched_on_by_the_standard_variables_and_refuses_what_it_cannot_send():
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert not enabled({})
    assert enabled(endpoint)
    assert enabled({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert enabled({"OTEL_TRACES_EXPORTER": "otlp"})  # the SDK's default endpoint
    assert not enabled({**endpoint, "OTEL_SDK_DISABLED": "true"})
    assert not enabled({**endpoint, "OTEL_TRACES_EXPORTER": "none"})
    assert enabled({**endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_PROTOCOL=grpc: only http/protobuf"):
        enabled({**endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER=zipkin: only otlp"):
        enabled({"OTEL_TRACES_EXPORTER": "zipkin"})


def test_a_protocol_it_cannot_send_leaves_tracing_off_with_a_warning(caplog):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    with caplog.at_level(logging.WARNING):
        assert traced("m", "f32", env) is untraced
    assert "m: tracing off: OTEL_EXPORTER_OTLP_PROTOCOL=grpc: only http/protobuf" in caplog.text


class HeldExporter(InMemorySpanExporter):
    """Holds each export until ``release`` is set; ``entered`` says one is being held."""

    def __init__(self, result: SpanExportResult = SpanExportResult.SUCCESS) -> None:
        super().__init__()
        self.entered, self.release, self.result = threading.Event(), threading.Event(), result

    def export(self, spans):
        self.entered.set()
        self.release.wait(30)
        super().export(spans)
        return self.result


def processor_tracer(processor):
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(processor)
    return provider.get_tracer("test")


def test_the_processor_drops_and_counts_what_its_queue_cannot_hold_without_waiting():
    exporter = HeldExporter()
    processor = BoundedProcessor(exporter, capacity=2, batch=8)
    tracer = processor_tracer(processor)
    tracer.start_span("first").end()
    assert exporter.entered.wait(10)  # the thread holds "first" in an export that waits
    for name in ("a", "b", "c", "d"):  # ended while the exporter is held: none may wait
        tracer.start_span(name).end()
    assert processor.dropped == 2  # "c" and "d": the queue holds two
    exporter.release.set()
    names = settled(lambda: [s.name for s in exporter.get_finished_spans()], lambda n: len(n) == 3)
    assert names == ["first", "a", "b"]
    processor.shutdown()


def test_the_processor_counts_the_spans_of_an_export_that_failed():
    exporter = HeldExporter(SpanExportResult.FAILURE)
    exporter.release.set()
    processor = BoundedProcessor(exporter, capacity=16, batch=16)
    tracer = processor_tracer(processor)
    for name in ("a", "b", "c"):
        tracer.start_span(name).end()
    assert settled(lambda: processor.dropped, lambda n: n == 3) == 3
    processor.shutdown()


def incoming(request_id: str, traceparent: str | None) -> Incoming:
    trace = TraceHeaders(traceparent, "vendor=1") if traceparent else None
    return Incoming(request_id, payload=None, trace=trace)  # type: ignore[arg-type]


def batch_done() -> ComputedBatch:
    """A batch's outcome as the trace reads it: its stage timings (no pixels)."""
    prepared = PreparedBatch((), None, open_ms=2.0, decode_ms=3.0)
    return ComputedBatch(prepared, None, None, forward_ms=5.0)


def test_a_batch_is_sampled_with_its_requests_at_ratio_0_and_its_stages_are_its_children(
    monkeypatch,
):
    """The sampling trap: at ratio 0 a request keeps its client's decision; the batch span,
    which has no parent, follows its linked requests, not the ratio."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    exporter = InMemorySpanExporter()
    trace = Traced("m", "f32", exporter, {}).batch
    _, _, unsampled = client_context(sampled=False)
    first = trace([incoming("r0", unsampled), incoming("r1", None)])  # nobody asks for it
    first.answered(batch_done(), 1.0, [None, None])
    assert first.end() == 0
    trace_id, span_id, sampled = client_context()
    second = trace([incoming("r2", sampled), incoming("r3", unsampled)])
    time.sleep(0.05)  # the batch's work: longer than its stages' 2 + 3 + 5 + 1 ms
    second.answered(batch_done(), 1.0, [None, InvalidImage("not an image")])
    second.end()
    spans = settled(exporter.get_finished_spans, lambda s: len(s) == 6)  # FIFO: r0/r1's first
    by_name: dict = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    (request,) = by_name.pop("resnet50.request")  # r2 only
    (batch,) = by_name.pop("resnet50.batch")
    assert set(by_name) == STAGES
    assert format(request.context.trace_id, "032x") == trace_id
    assert format(request.parent.span_id, "016x") == span_id
    assert dict(request.attributes) == {
        "resnet50.model": "m",
        "resnet50.precision": "f32",
        "resnet50.request_id": "r2",
        "resnet50.batch_size": 2,
        "resnet50.status": "ok",
    }
    assert [dict(link.attributes)["resnet50.request_id"] for link in batch.links] == ["r2", "r3"]
    assert batch.links[0].context.span_id == request.context.span_id
    for stage in (s for (s,) in by_name.values()):
        assert stage.parent.span_id == batch.context.span_id
        assert batch.start_time <= stage.start_time <= stage.end_time <= batch.end_time
    forward = by_name["resnet50.forward"][0]
    assert (forward.end_time - forward.start_time) == 5_000_000  # the core's own 5.0 ms


# --- a receiver and the two engines ----------------------------------------------------------


class Receiver(otlp.Receiver):
    """``devtools.otlp.Receiver``, every span kept, and the span tree of one trace."""

    def request_span(self, trace_id: str) -> dict:
        """The server's request span in ``trace_id`` and its batch's spans come with it (the
        batch ends after its requests); the test fails when they do not come."""
        found = settled(lambda: self._traced(trace_id), lambda f: f is not None)
        assert found is not None, f"no request and batch spans for trace {trace_id}"
        return found

    def _traced(self, trace_id: str) -> dict | None:
        requests_ = [s for s in self.spans if s["trace_id"] == trace_id]
        for request in requests_:
            for batch in self.spans:
                linked = [link[1] for link in batch["links"]]
                stages = [s for s in self.spans if s["parent"] == batch["span_id"]]
                if request["span_id"] in linked and len(stages) == len(STAGES):
                    return {**request, "batch": batch, "stages": stages}
        return None


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    try:
        yield receiver
    finally:
        receiver.woken.set()
        receiver.close()


def otel_env(receiver: Receiver, service: str) -> dict[str, str]:
    """Tracing on towards ``receiver``: ratio 0 for traces nobody asked for, a short export
    timeout and a small queue (so a slow collector fills it within a few requests)."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": service,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2",
        "OTEL_BSP_MAX_QUEUE_SIZE": "24",
    }


@pytest.fixture(scope="module")
def ts(receiver, tmp_path_factory, model_store):
    from devtools.server import LocalTorchServe

    server = LocalTorchServe(
        tmp_path_factory.mktemp("traced-ts"),
        model_store,
        load_models=[f"{MODEL}.mar"],
        env=otel_env(receiver, "traced-torchserve"),
    )
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def triton(receiver, tmp_path_factory, model_store):
    """This module's own Triton (its stubs read the environment as Triton starts them)."""
    workdir = tmp_path_factory.mktemp("traced-triton")
    with pytest.MonkeyPatch.context() as env, contextlib.ExitStack() as stack:
        for name, value in otel_env(receiver, "traced-triton").items():
            env.setenv(name, value)
        server = stack.enter_context(
            local_triton(workdir, model_store, exit_timeout=2, only=(MODEL,))
        )
        env.undo()
        yield server


def ts_predict(ts, headers: dict, body: bytes = PHOTO) -> requests.Response:
    return requests.post(
        f"{ts.inference_url}/predictions/{MODEL}",
        data=body,
        headers={**ts.keys.inference_headers(), **headers},
        timeout=120,
    )


def triton_infer(triton, headers: dict) -> requests.Response:
    return requests.post(
        f"{triton.url}/v2/models/{MODEL}/infer",
        json=v2_body([PHOTO], {}),
        headers=headers,
        timeout=120,
    )


def ts_precision(ts) -> str:
    """The precision ``ts``'s model serves, as its answers name it (describe's)."""
    return ts.client().describe(MODEL, customized=True)[0]["customizedMetadata"]["precision"]


def assert_continued(span: dict, parent: str, service: str, status: str, precision: str) -> None:
    """A request span, the child of the client's ``parent``, with its batch and stages."""
    assert span["service"] == service
    assert span["parent"] == parent  # the client's span id
    assert span["kind"] == ProtoSpan.SpanKind.SPAN_KIND_SERVER
    assert span["attributes"]["resnet50.model"] == MODEL
    assert span["attributes"]["resnet50.status"] == status
    assert span["attributes"]["resnet50.precision"] == precision
    assert span["attributes"]["resnet50.batch_size"] >= 1
    batch = span["batch"]
    assert batch["attributes"]["resnet50.batch_size"] == span["attributes"]["resnet50.batch_size"]
    assert batch["attributes"]["resnet50.precision"] == precision
    assert {s["name"] for s in span["stages"]} == STAGES
    for stage in span["stages"]:
        assert stage["trace_id"] == batch["trace_id"]
        assert batch["start"] <= stage["start"] <= stage["end"] <= batch["end"]


def test_torchserve_continues_the_clients_trace(ts, receiver):
    trace_id, span_id, traceparent = client_context()
    # TorchServe keeps the client's spelling of a header's name: any case is read.
    answer = ts_predict(ts, {"TraceParent": traceparent, "tracestate": "vendor=1"})
    assert answer.status_code == 200, answer.text
    span = receiver.request_span(trace_id)
    precision = answer.headers[PRECISION_HEADER]
    assert_continued(span, span_id, "traced-torchserve", "ok", precision)
    assert span["batch"]["attributes"]["resnet50.images"] >= 1
    assert span["status"] == Status.StatusCode.STATUS_CODE_UNSET

    bad_trace, bad_span, bad_parent = client_context()
    refused = ts_predict(ts, {"traceparent": bad_parent}, b"not an image")
    assert refused.status_code == 400
    failed = receiver.request_span(bad_trace)
    assert_continued(failed, bad_span, "traced-torchserve", "refused", precision)
    assert failed["attributes"]["error.type"] == refused.json()["type"]
    assert failed["status"] == Status.StatusCode.STATUS_CODE_UNSET  # a client's error: 4xx


def test_triton_continues_the_clients_trace_from_its_forwarded_headers(triton, receiver):
    trace_id, span_id, traceparent = client_context()
    answer = triton_infer(triton, {"traceparent": traceparent, "tracestate": "vendor=1"})
    assert answer.status_code == 200, answer.text
    assert_continued(receiver.request_span(trace_id), span_id, "traced-triton", "ok", "f32")


def test_tsctl_continues_the_trace_in_its_environment(ts, receiver, tmp_path):
    trace_id, span_id, traceparent = client_context()
    photos = tmp_path / "photos"
    photos.mkdir()
    shutil.copy(REPO / "build" / "heldout" / "astronaut.jpg", photos)
    run = subprocess.run(
        [str(TSCTL), "embed", str(photos), "--out", str(tmp_path / "out.parquet")],
        env={**ts.cli_env(), "TRACEPARENT": traceparent},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    span = receiver.request_span(trace_id)
    assert_continued(span, span_id, "traced-torchserve", "ok", ts_precision(ts))


def test_the_transformer_forwards_the_callers_trace_to_its_predictor(ts, receiver, tmp_path):
    from devtools.transformer import LocalTransformer

    trace_id, span_id, traceparent = client_context()
    predictor = ts.inference_url.removeprefix("http://")
    body = {"instances": [{"image": {"b64": base64.b64encode(PHOTO).decode()}}]}
    key = ts.keys.inference_headers()  # forwarded to the predictor by the transformer
    with LocalTransformer(MODEL, predictor, tmp_path) as transformer:
        answer = requests.post(
            f"{transformer.url}/v1/models/{MODEL}:predict",
            json=body,
            headers={**key, "traceparent": traceparent},
            timeout=120,
        )
    assert answer.status_code == 200, answer.text
    span = receiver.request_span(trace_id)
    assert_continued(span, span_id, "traced-torchserve", "ok", ts_precision(ts))


def dropped(server) -> float:
    url = server.metrics_url  # Triton's names the path, TorchServe's is the base
    text = requests.get(url if url.endswith("/metrics") else f"{url}/metrics", timeout=30).text
    return sum(
        value
        for name, labels, value in metrics.samples(text)
        if name == DROPPED.removesuffix("_total") and labels.get("model") == MODEL
    )


def test_a_slow_or_dead_collector_costs_no_answer_and_its_lost_spans_are_counted(
    ts, triton, receiver
):
    _, _, traceparent = client_context()
    answers = (  # each engine, asked with a sampled trace: 6 spans a batch into a queue of 24
        (ts, lambda: ts_predict(ts, {"traceparent": traceparent})),
        (triton, lambda: triton_infer(triton, {"traceparent": traceparent})),
    )
    before = [dropped(server) for server, _ in answers]
    try:
        receiver.hold_s = 60.0  # slow: each export held past the exporter's 2 s timeout
        for _ in range(6):
            assert [ask().status_code for _, ask in answers] == [200, 200]
        receiver.close()  # down: the port refuses
        for _ in range(3):
            assert [ask().status_code for _, ask in answers] == [200, 200]
        # The count goes out with the next batch: ask until it shows, each answer a 200.
        for (server, ask), was in zip(answers, before):
            counted = settled(
                lambda server=server, ask=ask: dropped(server) if ask().ok else -1.0,
                lambda n, was=was: n > was or n < 0,
                timeout_s=60,
                every_s=1,
            )
            assert counted > was, server
    finally:
        receiver.woken.set()
        receiver.hold_s = 0.0
        if receiver.server is None:
            receiver.open()
