"""The model's metrics (``servecore.metrics``) as TorchServe's metric lines: each metric
looked up in TorchServe's metrics cache (what its metrics YAML declares), its values written as
the cache's own metric objects write them, a batch's lines in one log record."""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

from ts.metrics.metric_type_enum import MetricTypes

from servecore.metrics import METRICS, Kind, Metric

logger = logging.getLogger(__name__)
# The logger TorchServe's own metric objects write their lines through (CachingMetric's).
METRIC_LINES = logging.getLogger("ts.metrics.caching_metric")

ENGINE = "torchserve"  # the engine label's value


class TorchServeMetrics:
    """A ``servecore.metrics.MetricsSink``: each metric looked up once per worker. TorchServe
    0.12 raises on a metric its metrics YAML does not declare (``config/metrics.yaml``, with
    the dimensions ``model``, ``engine`` and the metric's own labels), so a missing declaration
    switches that metric off with a warning, never a failed batch.

    A value goes out as the line TorchServe's ``CachingMetric.add_or_update`` writes
    (``[METRICS]name.unit:value|#dim:value,...|#type:TYPE|#hostname:host,unix-seconds``, what
    the frontend parses from the worker's stdout, one metric per line), but a batch's lines
    are held until ``flush`` and written as one log record: a record per metric walked the
    logging machinery (a record, the caller's frame, a write and a flush) fifteen times a
    batch, about a tenth of the 8-image worker's Python time (issue #49)."""

    def __init__(self, cache, model_name: str) -> None:
        self.dimensions = [model_name, ENGINE]
        self.lines: list[str] = []  # the batch's lines, until ``flush``
        self.hostname = socket.gethostname()
        self.formats: dict[str, tuple[str, tuple[str, ...], str]] = {}
        for metric in METRICS if cache is not None else ():
            try:
                found: Any = cache.get_metric(metric.name, MetricTypes[metric.kind.name])
            except Exception as exc:  # noqa: BLE001 - MetricsCacheKeyError and friends
                logger.warning(
                    "metric %s off: %s (declare it as in config/metrics.yaml)", metric.name, exc
                )
                continue
            self.formats[metric.name] = (
                f"[METRICS]{found.metric_name}.{found.unit}:",
                tuple(found.dimension_names),
                f"|#type:{found.metric_type.name}|#hostname:{self.hostname},",
            )

    def add(self, metric: Metric, value: float, labels: tuple[str, ...] = ()) -> None:
        found = self.formats.get(metric.name)
        if found is None:
            return
        head, names, tail = found
        values = (*self.dimensions, *labels)
        if len(values) != len(names) or (metric.kind is Kind.COUNTER and value < 0):
            # TorchServe's own two checks (dimensions, a counter's sign), logged as it logs
            # them: a bug of ours, never a failed batch
            METRIC_LINES.error(
                "[METRICS]Failed to update metric with name:%s: dimension values %s for "
                "dimension names %s, value %s",
                metric.name,
                list(values),
                list(names),
                value,
            )
            return
        dims = ",".join(f"{n}:{v}" for n, v in zip(names, values))
        self.lines.append(f"{head}{value}|#{dims}{tail}{int(time.time())}")

    def flush(self) -> None:
        """Write the lines held so far, one log record."""
        if self.lines:
            METRIC_LINES.info("\n".join(self.lines))
            self.lines.clear()
