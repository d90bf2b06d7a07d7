"""The model's own metrics, declared once for every engine (``METRICS``: name, kind, labels,
help), and the small interface an engine's adapter implements to export them (``MetricsSink``:
TorchServe's ``handlers/ts_metrics.py`` with ``config/metrics.yaml`` to match; Triton's walks
the same table into the Python backend's ``pb_utils.MetricFamily``).

How many requests and images each batch the engine formed held, which requests failed and why,
where a batch's time went, what arithmetic the worker serves and how much memory it holds.
Every metric carries ``model`` (the model's name) and ``engine`` (``torchserve``, ``triton``)
first, then its own labels:

    resnet50_batches_total, resnet50_requests_total,    batches, requests in them, good images
    resnet50_images_total
    resnet50_batches_by_size_total{batch_size="8"}      batches of each size (at most batchSize
                                                        label values)
    resnet50_errors_total{error_type="InvalidImage"}    failed requests by error type
    resnet50_open_ms_total, resnet50_decode_ms_total,   wall-clock ms of each step of a batch,
    resnet50_forward_ms_total, resnet50_answer_ms_total summed over batches: parsing, reading
                                                        image headers and admission / decoding
                                                        and transforming the images / the
                                                        forward pass / answering: the values
                                                        and the engine's edge writing them
                                                        (JSON, tensors), on every engine
    resnet50_batch_size, resnet50_images_per_batch      the same sizes as histograms
    resnet50_precision{precision="int8+f32"}            1: the precision this worker serves
    resnet50_worker_rss_mb{worker_pid="1234"}           the worker's resident memory, MiB
    resnet50_worker_gpu_mb{worker_pid="1234"}           the GPU memory its PyTorch holds
                                                        (reserved), MiB: GPU workers only
    resnet50_worker_restarts{slot="..."}                times the worker in this slot was started
                                                        again under this server (0: never;
                                                        ``servecore.restarts``)
    resnet50_cache_hits_total,                          images the content cache answered /
    resnet50_cache_misses_total                         looked up and computed (cache on)
    resnet50_cache_bytes                                what the worker's cache holds, bytes
    resnet50_gpu_refused_total                          JPEGs the GPU's decoder gave back to the
                                                        CPU path (GPU workers that decode there)
    resnet50_trace_spans_dropped_total                  spans not delivered to the collector:
                                                        queue full or export failed (tracing on;
                                                        ``servecore.tracing``)

Mean batch size = rate(resnet50_requests_total) / rate(resnet50_batches_total). Counters are
named with ``_total`` and exported as named (TorchServe 0.12 appends no suffix; a sink whose
library appends one passes the name without it). TorchServe keeps its histograms' default
buckets (0.005 ... 10, shaped for seconds: every batch above 10 lands in ``+Inf``), so batch
sizes are counters too. The names before #34 (``HandlerBatches{ModelName}``, ...) and how a
dashboard on them migrates: docs/operations.md.
"""

from __future__ import annotations

import enum
import os
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import psutil


class Kind(enum.Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


# The labels every metric carries first, in this order: the model's name, the serving engine.
COMMON_LABELS = ("model", "engine")


@dataclass(frozen=True)
class Metric:
    """One metric as any sink declares it: its ``name``, ``kind``, its own ``labels`` (after
    ``COMMON_LABELS``) and a one-line ``help``."""

    name: str
    kind: Kind
    labels: tuple[str, ...]
    help: str


BATCH_SIZE = Metric(
    "resnet50_batch_size", Kind.HISTOGRAM, (), "requests in each batch the engine formed"
)
IMAGES_PER_BATCH = Metric(
    "resnet50_images_per_batch", Kind.HISTOGRAM, (), "good images in each batch"
)
BATCHES = Metric("resnet50_batches_total", Kind.COUNTER, (), "batches handled")
REQUESTS = Metric("resnet50_requests_total", Kind.COUNTER, (), "requests in the batches")
IMAGES = Metric("resnet50_images_total", Kind.COUNTER, (), "good images in the batches")
BY_SIZE = Metric(
    "resnet50_batches_by_size_total",
    Kind.COUNTER,
    ("batch_size",),
    "batches of each size (requests per batch)",
)
ERRORS = Metric(
    "resnet50_errors_total",
    Kind.COUNTER,
    ("error_type",),
    "failed requests by error type (the error body's type), as sent",
)
OPEN_MS = Metric(
    "resnet50_open_ms_total",
    Kind.COUNTER,
    (),
    "ms parsing, reading image headers and admitting, summed over batches",
)
DECODE_MS = Metric(
    "resnet50_decode_ms_total",
    Kind.COUNTER,
    (),
    "ms decoding and transforming images, summed over batches",
)
FORWARD_MS = Metric(
    "resnet50_forward_ms_total", Kind.COUNTER, (), "ms in the forward pass, summed over batches"
)
ANSWER_MS = Metric(
    "resnet50_answer_ms_total",
    Kind.COUNTER,
    (),
    "ms answering: the values and the engine's edge writing them, summed over batches",
)
PRECISION = Metric(
    "resnet50_precision", Kind.GAUGE, ("precision",), "1 for the precision this worker serves"
)
WORKER_RSS = Metric(
    "resnet50_worker_rss_mb", Kind.GAUGE, ("worker_pid",), "the worker's resident memory, MiB"
)
WORKER_GPU = Metric(
    "resnet50_worker_gpu_mb",
    Kind.GAUGE,
    ("worker_pid",),
    "the GPU memory the worker's PyTorch holds (reserved), MiB; GPU workers only",
)
WORKER_RESTARTS = Metric(
    "resnet50_worker_restarts",
    Kind.GAUGE,
    ("slot",),
    "times the worker in this slot was started again under this server (0: never)",
)
CACHE_HITS = Metric(
    "resnet50_cache_hits_total",
    Kind.COUNTER,
    (),
    "images answered from the content cache (not decoded, not computed)",
)
CACHE_MISSES = Metric(
    "resnet50_cache_misses_total",
    Kind.COUNTER,
    (),
    "images looked up in the content cache and computed",
)
CACHE_BYTES = Metric(
    "resnet50_cache_bytes", Kind.GAUGE, (), "bytes the worker's content cache holds"
)
GPU_REFUSED = Metric(
    "resnet50_gpu_refused_total",
    Kind.COUNTER,
    (),
    "JPEGs the GPU's decoder was handed and gave back to the CPU path (GPU workers only)",
)
TRACE_DROPPED = Metric(
    "resnet50_trace_spans_dropped_total",
    Kind.COUNTER,
    (),
    "trace spans not delivered to the collector (queue full or export failed); tracing on only",
)

# Every metric, declared once: a sink walks this table (config/metrics.yaml must match it).
METRICS: tuple[Metric, ...] = (
    BATCH_SIZE,
    IMAGES_PER_BATCH,
    BATCHES,
    REQUESTS,
    IMAGES,
    BY_SIZE,
    ERRORS,
    OPEN_MS,
    DECODE_MS,
    FORWARD_MS,
    ANSWER_MS,
    PRECISION,
    WORKER_RSS,
    WORKER_GPU,
    WORKER_RESTARTS,
    CACHE_HITS,
    CACHE_MISSES,
    CACHE_BYTES,
    GPU_REFUSED,
    TRACE_DROPPED,
)


class MetricsSink(Protocol):
    """Where an engine exports metrics. ``add``: count ``value`` into a counter, set a gauge
    to it or observe it in a histogram (the metric's kind says which), with the values of the
    metric's own labels in ``labels`` (the sink adds ``COMMON_LABELS``' values). ``flush``:
    the batch is done; a sink that holds what it was given (TorchServe's, which writes a
    batch's lines together) sends it now."""

    def add(self, metric: Metric, value: float, labels: tuple[str, ...] = ()) -> None: ...

    def flush(self) -> None: ...


class NoMetrics:
    """A sink that drops everything (an engine without metrics, tests)."""

    def add(self, metric: Metric, value: float, labels: tuple[str, ...] = ()) -> None:
        pass

    def flush(self) -> None:
        pass


class BatchMetrics:
    """What the model records per batch, through the engine's sink."""

    def __init__(
        self,
        sink: MetricsSink,
        precision: str,
        slot: str = "",
        restarts: int = 0,
        gpu_bytes: Callable[[], int] | None = None,
    ) -> None:
        """``slot``: where the engine runs this worker; ``restarts``: how often it was started
        there before (``servecore.restarts.mark_start``), set now and with every batch;
        ``gpu_bytes``: the GPU memory the worker holds now (None: a CPU worker)."""
        self.sink, self.gpu_bytes = sink, gpu_bytes
        self.precision = precision
        self.process = psutil.Process()
        self.pid = str(os.getpid())
        self.slot, self.restarts = slot, restarts
        self.sink.add(WORKER_RESTARTS, restarts, (slot,))
        self.sink.flush()

    def batch(
        self,
        requests: int,
        images: int,
        open_ms: float,
        decode_ms: float,
        gpu_refused: int | None = None,
    ) -> None:
        """One batch: ``requests`` requests carrying ``images`` good images; ``gpu_refused``:
        the JPEGs the GPU's decoder gave back (None, and nothing recorded, without one)."""
        for metric, value in (
            (BATCH_SIZE, requests),
            (IMAGES_PER_BATCH, images),
            (BATCHES, 1),
            (REQUESTS, requests),
            (IMAGES, images),
            (OPEN_MS, open_ms),
            (DECODE_MS, decode_ms),
        ):
            self.sink.add(metric, value)
        if gpu_refused is not None:
            self.sink.add(GPU_REFUSED, gpu_refused)
        self.sink.add(BY_SIZE, 1, (str(requests),))
        self.sink.add(PRECISION, 1, (self.precision,))
        self.sink.add(WORKER_RSS, round(self.process.memory_info().rss / 2**20, 1), (self.pid,))
        if self.gpu_bytes is not None:
            self.sink.add(WORKER_GPU, round(self.gpu_bytes() / 2**20, 1), (self.pid,))
        self.sink.add(WORKER_RESTARTS, self.restarts, (self.slot,))

    def flush(self) -> None:
        """The batch is recorded: the sink sends what it holds (``MetricsSink.flush``)."""
        self.sink.flush()

    def forward(self, forward_ms: float) -> None:
        self.sink.add(FORWARD_MS, forward_ms)

    def answer(self, answer_ms: float) -> None:
        self.sink.add(ANSWER_MS, answer_ms)

    def spans_dropped(self, count: int | None) -> None:
        """Trace spans dropped since the last batch (None: tracing off, nothing recorded)."""
        if count is not None:
            self.sink.add(TRACE_DROPPED, count)

    def cache(self, hits: Iterable[bool], held_bytes: int) -> None:
        """One batch's content-cache lookups (per image: answered from the cache or not) and
        what the cache holds after it."""
        counted = Counter(hits)
        self.sink.add(CACHE_HITS, counted[True])
        self.sink.add(CACHE_MISSES, counted[False])
        self.sink.add(CACHE_BYTES, held_bytes)

    def errors(self, error_types: Iterable[str]) -> None:
        """The failed requests of one batch, by error type (``InvalidImage``, ...)."""
        for error_type, count in Counter(error_types).items():
            self.sink.add(ERRORS, count, (error_type,))
