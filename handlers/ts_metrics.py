"""The model's metrics (``servecore.metrics``) exported through TorchServe's metrics cache."""

from __future__ import annotations

import logging
from typing import Any

from ts.metrics.metric_type_enum import MetricTypes

from servecore.metrics import METRICS, Metric

logger = logging.getLogger(__name__)

ENGINE = "torchserve"  # the engine label's value


class TorchServeMetrics:
    """A ``servecore.metrics.MetricsSink``: each metric looked up once per worker. TorchServe
    0.12 raises on a metric its metrics YAML does not declare (``config/metrics.yaml``, with
    the dimensions ``model``, ``engine`` and the metric's own labels), so a missing declaration
    switches that metric off with a warning, never a failed batch."""

    def __init__(self, cache, model_name: str) -> None:
        self.dimensions = [model_name, ENGINE]
        self.metrics: dict[str, Any] = {}  # TorchServe's metric objects
        for metric in METRICS if cache is not None else ():
            try:
                self.metrics[metric.name] = cache.get_metric(
                    metric.name, MetricTypes[metric.kind.name]
                )
            except Exception as exc:  # noqa: BLE001 - MetricsCacheKeyError and friends
                logger.warning(
                    "metric %s off: %s (declare it as in config/metrics.yaml)", metric.name, exc
                )

    def add(self, metric: Metric, value: float, labels: tuple[str, ...] = ()) -> None:
        found = self.metrics.get(metric.name)
        if found is not None:
            found.add_or_update(value, [*self.dimensions, *labels])
