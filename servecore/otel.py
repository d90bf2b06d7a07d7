"""Tracing on: the OpenTelemetry SDK's provider, a batch's spans, the sampler that keeps a
batch with its requests and the bounded way out (``servecore.tracing`` says what each span
is and which variables switch it on). Imported only when tracing is on.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, StatusCode, get_current_span, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from servecore.errors import ClientError

if TYPE_CHECKING:
    from servecore.errors import RequestError
    from servecore.stages import ComputedBatch, Incoming

logger = logging.getLogger(__name__)

SERVICE = "resnet50-serve"  # service.name when OTEL_SERVICE_NAME is unset
EXIT_WAIT_S = 1.0  # how long a worker's exit waits for the queue to drain
_STOP = object()  # the worker thread's last item
# resnet50.status: the answer, the caller's input refused (a 4xx), the server failed it (5xx)
OK, REFUSED, FAILED = "ok", "refused", "failed"
_extract = TraceContextTextMapPropagator().extract


class Traced:
    """Tracing on for one model: the SDK's provider (sampler and resource from the
    environment, ``LinkedSampler`` around the sampler) exporting through ``BoundedProcessor``."""

    def __init__(
        self, model: str, precision: str, exporter: SpanExporter, env: Mapping[str, str]
    ) -> None:
        self.model = {"resnet50.model": model, "resnet50.precision": precision}
        resource = Resource.create(
            {} if env.get("OTEL_SERVICE_NAME") else {"service.name": SERVICE}
        )
        provider = TracerProvider(resource=resource)
        provider.sampler = LinkedSampler(provider.sampler)  # before any tracer takes it
        self.processor = BoundedProcessor(
            exporter,
            int(env.get("OTEL_BSP_MAX_QUEUE_SIZE") or 2048),
            int(env.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") or 512),
        )
        provider.add_span_processor(self.processor)
        self.tracer = provider.get_tracer("servecore")
        self.counted = 0  # drops already handed to the metrics

    def batch(self, incoming: Sequence[Incoming]) -> BatchTrace:
        """The trace of the batch of ``incoming`` now reaching the core."""
        return BatchTrace(self, incoming)

    def take_dropped(self) -> int:
        """Spans dropped since the last call: the metric's increment."""
        total = self.processor.dropped
        new, self.counted = total - self.counted, total
        return new


class BatchTrace:
    """One batch's spans, started when the batch reaches the core: one per request, the
    child of the trace context it came with, and the batch's, linked to them."""

    def __init__(self, tracing: Traced, incoming: Sequence[Incoming]) -> None:
        self.tracing, tracer = tracing, tracing.tracer
        self.started = time.time_ns()
        model, size = tracing.model, len(incoming)
        self.requests = [
            tracer.start_span(
                "resnet50.request",
                _extract(r.trace.carrier()) if r.trace else None,
                SpanKind.SERVER,
                {
                    **model,
                    "resnet50.request_id": r.request_id,
                    "resnet50.batch_size": size,
                },
                start_time=self.started,
            )
            for r in incoming
        ]
        links = [
            Link(span.get_span_context(), {"resnet50.request_id": r.request_id})
            for span, r in zip(self.requests, incoming)
        ]
        self.batch = tracer.start_span(
            "resnet50.batch",
            attributes={**model, "resnet50.batch_size": size},
            links=links,
            start_time=self.started,
        )

    def answered(
        self, batch: ComputedBatch, answer_ms: float, errors: Sequence[RequestError | None]
    ) -> None:
        """Its stage spans from the core's own timings (open, decode and forward laid end to
        end from the start, answer ending now) and each request's outcome (``errors``: as
        sent, in order; None: answered)."""
        ended, prepared = time.time_ns(), batch.prepared
        parent, at = set_span_in_context(self.batch), self.started
        stages = (
            ("resnet50.open", prepared.open_ms),
            ("resnet50.decode", prepared.decode_ms),
            ("resnet50.forward", batch.forward_ms),
        )
        for name, ms in stages:
            stage = self.tracing.tracer.start_span(name, parent, start_time=at)
            at += int(ms * 1e6)
            stage.end(at)
        start = ended - int(answer_ms * 1e6)
        self.tracing.tracer.start_span("resnet50.answer", parent, start_time=start).end(ended)
        self.batch.set_attribute(
            "resnet50.images", 0 if prepared.pixels is None else len(prepared.pixels)
        )
        for span, error in zip(self.requests, errors):
            refused = isinstance(error, ClientError)  # the caller's input: not the server's fault
            span.set_attribute(
                "resnet50.status", OK if error is None else REFUSED if refused else FAILED
            )
            if error is not None:
                span.set_attribute("error.type", error.kind)
                if not refused:  # the server's part (an HTTP edge's 5xx): the span's status says so
                    span.set_status(StatusCode.ERROR, error.message)
            span.end(ended)

    def end(self) -> int:
        """The batch's span ended, and any request span not answered (the batch failed) as
        an error; the spans dropped since the last batch."""
        for span in self.requests:
            if span.is_recording():  # not ended: not answered
                span.set_attribute("error.type", "BatchFailed")
                span.set_status(StatusCode.ERROR, "the batch failed")
                span.end()
        self.batch.end()
        return self.tracing.take_dropped()


class LinkedSampler(Sampler):
    """``base``'s decision (the environment's sampler), but a span with links and no parent
    (a batch) is sampled exactly when a span it links is: a request sampled by its client's
    flag keeps its batch at any ratio, an unsampled batch is not a root of its own."""

    def __init__(self, base: Sampler) -> None:
        self.base = base

    def should_sample(self, parent_context, trace_id, name, *rest, **named) -> SamplingResult:
        """As ``Sampler.should_sample`` (``rest`` / ``named``: its kind, attributes, links and
        trace_state, as the SDK passes them)."""
        given = {**dict(zip(("kind", "attributes", "links", "trace_state"), rest)), **named}
        links = given.get("links")
        if links and not get_current_span(parent_context).get_span_context().is_valid:
            sampled = any(link.context.trace_flags.sampled for link in links)
            decision = Decision.RECORD_AND_SAMPLE if sampled else Decision.DROP
            return SamplingResult(decision, given.get("attributes") if sampled else None)
        return self.base.should_sample(parent_context, trace_id, name, **given)

    def get_description(self) -> str:
        return f"LinkedSampler{{{self.base.get_description()}}}"


class BoundedProcessor(SpanProcessor):
    """Ended spans into a queue of at most ``capacity`` (``put_nowait``: a full queue drops
    the span and counts it), exported by one thread up to ``batch`` spans a call as they come;
    an export that fails counts its spans dropped too (``dropped``). The request path never
    waits on the exporter: ``force_flush`` does not block, and ``shutdown`` (a worker's exit)
    waits at most ``EXIT_WAIT_S``."""

    def __init__(self, exporter: SpanExporter, capacity: int = 2048, batch: int = 512) -> None:
        self.exporter, self.batch = exporter, max(1, batch)
        self.queue: queue.Queue = queue.Queue(max(1, capacity))
        self._dropped, self._lock = 0, threading.Lock()
        self.thread = threading.Thread(target=self._export, name="span-export", daemon=True)
        self.thread.start()

    @property
    def dropped(self) -> int:
        """Spans not delivered so far: the queue was full, or their export failed."""
        return self._dropped

    def _drop(self, count: int) -> None:
        with self._lock:
            self._dropped += count

    def on_start(self, span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is None or not span.context.trace_flags.sampled:
            return
        try:
            self.queue.put_nowait(span)
        except queue.Full:
            self._drop(1)

    def _export(self) -> None:
        while (first := self.queue.get()) is not _STOP:
            spans = [first]
            while len(spans) < self.batch:
                try:
                    span = self.queue.get_nowait()
                except queue.Empty:
                    break
                if span is _STOP:
                    self._send(spans)
                    return
                spans.append(span)
            self._send(spans)

    def _send(self, spans: list[ReadableSpan]) -> None:
        try:
            result = self.exporter.export(spans)
        except Exception:  # a broken exporter must not end the thread
            logger.exception("exporting %d spans failed", len(spans))
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self._drop(len(spans))

    def shutdown(self) -> None:
        with contextlib.suppress(queue.Full):  # full: the daemon thread dies with the process
            self.queue.put_nowait(_STOP)
        self.thread.join(EXIT_WAIT_S)
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Never blocks (the spans go as the thread gets to them); True when none wait."""
        return self.queue.empty()
