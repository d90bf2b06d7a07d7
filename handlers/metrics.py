"""The handler's own metrics: how many requests and images each batch the frontend formed held.

They must be declared in the metrics YAML (``config/metrics.yaml``); TorchServe 0.12 raises on
an undeclared metric, so without the declaration they are switched off with a warning, never a
failed batch.
"""
from __future__ import annotations

import logging

from ts.metrics.metric_type_enum import MetricTypes

logger = logging.getLogger(__name__)

BATCH_METRIC = "HandlerBatchSize"
IMAGES_METRIC = "HandlerImagesPerBatch"


class BatchMetrics:
    """Our two batch histograms, looked up once per worker."""

    def __init__(self, cache, model_name: str) -> None:
        self.dimensions = [model_name, "Model"]
        self.metrics: list = []
        if cache is None:
            return
        try:
            self.metrics = [cache.get_metric(name, MetricTypes.HISTOGRAM)
                            for name in (BATCH_METRIC, IMAGES_METRIC)]
        except Exception as exc:  # noqa: BLE001 - MetricsCacheKeyError and friends
            logger.warning("batch-size metrics off: %s (declare them as in config/metrics.yaml)",
                           exc)

    def record(self, requests: int, images: int) -> None:
        """One batch: ``requests`` requests carrying ``images`` good images."""
        for metric, value in zip(self.metrics, (requests, images)):
            metric.add_or_update(value, self.dimensions)
