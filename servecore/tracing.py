"""OpenTelemetry traces of the core's batches, off unless the environment switches them on.

Read once when a model loads (``traced``), from the standard variables, by the
official SDK where it reads them:

    on       OTEL_TRACES_EXPORTER=otlp, or (it unset) OTEL_EXPORTER_OTLP_ENDPOINT or
             OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set; off: OTEL_SDK_DISABLED=true,
             OTEL_TRACES_EXPORTER=none, nothing set
    protocol OTEL_EXPORTER_OTLP_TRACES_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL: http/protobuf
             (the default); another (grpc, http/json) logs a warning and leaves tracing off
    SDK      OTEL_TRACES_SAMPLER / _ARG, OTEL_SERVICE_NAME (else ``resnet50-serve``),
             OTEL_RESOURCE_ATTRIBUTES, the exporter's OTEL_EXPORTER_OTLP_* (timeout, headers,
             compression, certificates); the queue: OTEL_BSP_MAX_QUEUE_SIZE (2048 spans) and
             OTEL_BSP_MAX_EXPORT_BATCH_SIZE (512 spans a post)

Per batch (``servecore.otel.BatchTrace``): a ``resnet50.request`` span per request (kind
SERVER), the child of the W3C ``traceparent`` its engine read (``stages.TraceHeaders``; none:
a new trace), and one ``resnet50.batch`` span linked to them, parent of ``resnet50.open``,
``.decode``, ``.forward`` and ``.answer``: the core's own stage timings laid end to end from
the batch's start (answer ending at the batch's end; explanations fall between forward and
answer). A batch span is sampled when any request it links is, whatever the ratio says.

Spans leave through a bounded queue and one exporting thread, so a collector down or slow
never delays nor fails an answer; what cannot be delivered is counted
(``resnet50_trace_spans_dropped_total``). Here: the switch and what the core holds with tracing
off; ``servecore.otel``, imported only when it is on, holds everything that needs the SDK.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from servecore.errors import RequestError
    from servecore.stages import ComputedBatch, Incoming

logger = logging.getLogger(__name__)

PROTOCOL = "http/protobuf"


def enabled(env: Mapping[str, str]) -> bool:
    """Whether ``env`` switches tracing on (the module's docstring); raises ``ValueError``
    naming the variable when it asks for what this exporter cannot do."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",")} - {""}
    if exporters and "otlp" not in exporters:
        if exporters != {"none"}:
            raise ValueError(f"OTEL_TRACES_EXPORTER={','.join(sorted(exporters))}: only otlp")
        return False
    if not exporters and not (
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        return False
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        if protocol := env.get(name, "").strip():
            if protocol != PROTOCOL:
                raise ValueError(
                    f"{name}={protocol}: only {PROTOCOL} (the collector's OTLP/HTTP port, "
                    "usually 4318)"
                )
            break
    return True


class Trace(Protocol):
    """One batch's trace, made when the batch reaches the core (``traced``'s function)."""

    def answered(
        self, batch: ComputedBatch, answer_ms: float, errors: Sequence[RequestError | None]
    ) -> None:
        """The batch answered in ``answer_ms``: each request's error as sent, in order (None:
        its answer)."""

    def end(self) -> int | None:
        """The batch is done (answered or failed): the spans dropped since the last batch, for
        the metric (None: tracing off)."""


class NoTrace:
    """The trace of a batch nobody traces: every step a no-op."""

    def answered(
        self, batch: ComputedBatch, answer_ms: float, errors: Sequence[RequestError | None]
    ) -> None:
        pass

    def end(self) -> None:
        return None


NO_TRACE = NoTrace()


def untraced(incoming: Sequence[Incoming]) -> Trace:
    """Tracing off: no spans, no SDK loaded."""
    return NO_TRACE


def traced(
    model: str, precision: str, env: Mapping[str, str] = os.environ
) -> Callable[[Sequence[Incoming]], Trace]:
    """What makes a batch's trace, as ``env`` asks for ``model`` serving ``precision`` (its
    spans' ``resnet50.model``, ``resnet50.precision``): ``untraced``, or the SDK's
    (``servecore.otel.Traced``). A setting it cannot serve logs why and leaves tracing off."""
    try:
        if not enabled(env):
            return untraced
    except ValueError as refused:
        logger.warning("%s: tracing off: %s", model, refused)
        return untraced
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from servecore.otel import Traced

    return Traced(model, precision, OTLPSpanExporter(), env).batch
