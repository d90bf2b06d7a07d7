"""The model's own metrics, what they mean, and the small interface an engine implements to
export them (``MetricsSink``; TorchServe's is ``handlers/ts_metrics.py``).

How many requests and images each batch the frontend formed held, which requests failed and
why, where a batch's time went, what arithmetic the worker serves and how much memory it holds:

    HandlerBatches, HandlerRequests, HandlerImages      batches, requests in them, good images
    HandlerBatchesBySize{BatchSize="8"}                 batches of each size (at most batchSize
                                                        label values)
    HandlerErrors{ErrorType="InvalidImage"}             failed requests by error type
    HandlerOpenMs, HandlerDecodeMs, HandlerForwardMs,   wall-clock ms of each step of a batch,
    HandlerAnswerMs                                     summed over batches: parsing, reading
                                                        image headers and admission / decoding
                                                        and transforming the images / the
                                                        forward pass / encoding the answers
    HandlerBatchSize, HandlerImagesPerBatch             the same sizes as histograms
    HandlerPrecision{Precision="int8+f32"}              1: the precision this worker serves
    HandlerWorkerRssMB{WorkerPid="1234"}                the worker's resident memory, MiB

Mean batch size = rate(HandlerRequests) / rate(HandlerBatches). TorchServe 0.12 keeps its
histograms' default buckets (0.005 ... 10, shaped for seconds: every batch above 10 lands in
``+Inf``), so batch sizes are counters too. TorchServe exposes counters without a ``_total``
suffix, and needs every metric declared in ``config/metrics.yaml``.
"""

from __future__ import annotations

import enum
import os
from collections import Counter
from collections.abc import Iterable
from typing import Protocol

import psutil


class Kind(enum.Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


BATCH_METRIC, IMAGES_METRIC = "HandlerBatchSize", "HandlerImagesPerBatch"
BATCHES, REQUESTS, IMAGES = "HandlerBatches", "HandlerRequests", "HandlerImages"
BY_SIZE, ERRORS = "HandlerBatchesBySize", "HandlerErrors"
OPEN_MS, DECODE_MS = "HandlerOpenMs", "HandlerDecodeMs"
FORWARD_MS, ANSWER_MS = "HandlerForwardMs", "HandlerAnswerMs"
PRECISION, WORKER_RSS = "HandlerPrecision", "HandlerWorkerRssMB"

# Every metric: its kind and the dimensions it adds to the model's own (ModelName, Level).
METRICS: dict[str, tuple[Kind, tuple[str, ...]]] = {
    BATCH_METRIC: (Kind.HISTOGRAM, ()),
    IMAGES_METRIC: (Kind.HISTOGRAM, ()),
    BATCHES: (Kind.COUNTER, ()),
    REQUESTS: (Kind.COUNTER, ()),
    IMAGES: (Kind.COUNTER, ()),
    BY_SIZE: (Kind.COUNTER, ("BatchSize",)),
    ERRORS: (Kind.COUNTER, ("ErrorType",)),
    OPEN_MS: (Kind.COUNTER, ()),
    DECODE_MS: (Kind.COUNTER, ()),
    FORWARD_MS: (Kind.COUNTER, ()),
    ANSWER_MS: (Kind.COUNTER, ()),
    PRECISION: (Kind.GAUGE, ("Precision",)),
    WORKER_RSS: (Kind.GAUGE, ("WorkerPid",)),
}


class MetricsSink(Protocol):
    """Where an engine exports metrics. ``add``: count ``value`` into a counter, set a gauge
    to it or observe it in a histogram (``METRICS`` says which), with the values of the
    metric's own dimensions in ``labels``."""

    def add(self, name: str, value: float, labels: tuple[str, ...] = ()) -> None: ...


class NoMetrics:
    """A sink that drops everything (an engine without metrics, tests)."""

    def add(self, name: str, value: float, labels: tuple[str, ...] = ()) -> None:
        pass


class BatchMetrics:
    """What the model records per batch, through the engine's sink."""

    def __init__(self, sink: MetricsSink, precision: str) -> None:
        self.sink = sink
        self.precision = precision
        self.process = psutil.Process()
        self.pid = str(os.getpid())

    def batch(self, requests: int, images: int, open_ms: float, decode_ms: float) -> None:
        """One batch: ``requests`` requests carrying ``images`` good images."""
        for name, value in (
            (BATCH_METRIC, requests),
            (IMAGES_METRIC, images),
            (BATCHES, 1),
            (REQUESTS, requests),
            (IMAGES, images),
            (OPEN_MS, open_ms),
            (DECODE_MS, decode_ms),
        ):
            self.sink.add(name, value)
        self.sink.add(BY_SIZE, 1, (str(requests),))
        self.sink.add(PRECISION, 1, (self.precision,))
        self.sink.add(WORKER_RSS, round(self.process.memory_info().rss / 2**20, 1), (self.pid,))

    def forward(self, forward_ms: float) -> None:
        self.sink.add(FORWARD_MS, forward_ms)

    def answer(self, answer_ms: float) -> None:
        self.sink.add(ANSWER_MS, answer_ms)

    def errors(self, error_types: Iterable[str]) -> None:
        """The failed requests of one batch, by error type (``InvalidImage``, ...)."""
        for error_type, count in Counter(error_types).items():
            self.sink.add(ERRORS, count, (error_type,))
