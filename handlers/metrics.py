"""The handler's own metrics: how many requests and images each batch the frontend formed held,
which requests failed and why, and where a batch's time went.

Two histograms (``HandlerBatchSize``, ``HandlerImagesPerBatch``) keep TorchServe's default
buckets, which are shaped for seconds (0.005 ... 10: every batch above 10 lands in ``+Inf``)
and cannot be changed in 0.12; their ``_sum``/``_count`` stay right. So batch sizes are also
exported as counters (Prometheus text, no ``_total`` suffix in 0.12), from which a dashboard
computes rates and means::

    HandlerBatches, HandlerRequests, HandlerImages      batches, requests in them, good images
    HandlerBatchesBySize{BatchSize="8"}                 batches of each size (at most batchSize
                                                        label values)
    HandlerErrors{ErrorType="InvalidImage"}             failed requests by error type
    HandlerDecodeMs, HandlerForwardMs                   wall-clock ms decoding and transforming
                                                        the batch's images (after parsing and
                                                        admission) / in the forward pass,
                                                        summed over batches

Mean batch size = rate(HandlerRequests) / rate(HandlerBatches). Every metric must be declared
in the metrics YAML (``config/metrics.yaml``): TorchServe 0.12 raises on an undeclared one, so
a missing declaration switches that metric off with a warning, never a failed batch.
"""
from __future__ import annotations

import logging
from collections import Counter

from ts.metrics.metric_type_enum import MetricTypes

logger = logging.getLogger(__name__)

BATCH_METRIC = "HandlerBatchSize"
IMAGES_METRIC = "HandlerImagesPerBatch"
BATCHES, REQUESTS, IMAGES = "HandlerBatches", "HandlerRequests", "HandlerImages"
BY_SIZE, ERRORS = "HandlerBatchesBySize", "HandlerErrors"
DECODE_MS, FORWARD_MS = "HandlerDecodeMs", "HandlerForwardMs"


class BatchMetrics:
    """Our batch metrics, looked up once per worker."""

    def __init__(self, cache, model_name: str) -> None:
        self.dimensions = [model_name, "Model"]
        self.metrics: dict = {}
        if cache is None:
            return
        for name, kind in ((BATCH_METRIC, MetricTypes.HISTOGRAM),
                           (IMAGES_METRIC, MetricTypes.HISTOGRAM),
                           *((n, MetricTypes.COUNTER) for n in (
                               BATCHES, REQUESTS, IMAGES, BY_SIZE, ERRORS, DECODE_MS,
                               FORWARD_MS))):
            try:
                self.metrics[name] = cache.get_metric(name, kind)
            except Exception as exc:  # noqa: BLE001 - MetricsCacheKeyError and friends
                logger.warning("batch-size metrics off for %s: %s (declare it as in "
                               "config/metrics.yaml)", name, exc)

    def _add(self, name: str, value: float, *extra: str) -> None:
        metric = self.metrics.get(name)
        if metric is not None:
            metric.add_or_update(value, [*self.dimensions, *extra])

    def record(self, requests: int, images: int) -> None:
        """One batch: ``requests`` requests carrying ``images`` good images."""
        self._add(BATCH_METRIC, requests)
        self._add(IMAGES_METRIC, images)
        self._add(BATCHES, 1)
        self._add(REQUESTS, requests)
        self._add(IMAGES, images)
        self._add(BY_SIZE, 1, str(requests))

    def record_errors(self, error_types: list[str]) -> None:
        """The failed requests of one batch, by error type (``InvalidImage``, ...)."""
        for error_type, count in Counter(error_types).items():
            self._add(ERRORS, count, error_type)

    def record_time(self, decode_ms: float | None = None, forward_ms: float | None = None) -> None:
        """Wall-clock milliseconds one batch spent decoding and in the forward pass."""
        if decode_ms is not None:
            self._add(DECODE_MS, decode_ms)
        if forward_ms is not None:
            self._add(FORWARD_MS, forward_ms)
