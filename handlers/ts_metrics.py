"""The model's metrics (``servecore.metrics``) exported through TorchServe's metrics cache."""

from __future__ import annotations

import logging

from ts.metrics.metric_type_enum import MetricTypes

from servecore.metrics import METRICS

logger = logging.getLogger(__name__)


class TorchServeMetrics:
    """A ``servecore.metrics.MetricsSink``: each metric looked up once per worker. TorchServe
    0.12 raises on a metric its metrics YAML does not declare (``config/metrics.yaml``), so
    a missing declaration switches that metric off with a warning, never a failed batch."""

    def __init__(self, cache, model_name: str) -> None:
        self.dimensions = [model_name, "Model"]
        self.metrics: dict = {}
        for name, (kind, _) in METRICS.items() if cache is not None else ():
            try:
                self.metrics[name] = cache.get_metric(name, MetricTypes[kind.name])
            except Exception as exc:  # noqa: BLE001 - MetricsCacheKeyError and friends
                logger.warning(
                    "metric %s off: %s (declare it as in config/metrics.yaml)", name, exc
                )

    def add(self, name: str, value: float, labels: tuple[str, ...] = ()) -> None:
        metric = self.metrics.get(name)
        if metric is not None:
            metric.add_or_update(value, [*self.dimensions, *labels])
