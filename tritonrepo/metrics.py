"""The model's metrics (``servecore.metrics``) exported through the Python backend's custom
metrics API, on Triton's own metrics port beside its ``nv_*`` series.

One naming for both engines: every metric of the core's table (``METRICS``) under its own
name, kind and dimensions, with the labels TorchServe adds to a model metric (``ModelName``,
``Level="Model"``, ``Hostname``), so config/monitoring's rules and dashboard read either
engine. Triton's exposition writes counters without a ``_total`` suffix, as TorchServe 0.12
does. Histograms (the python backend has them since 24.08; the wheel's 2.51 is 24.10) get
buckets of powers of two, not TorchServe's fixed 0.005 ... 10: the rules read only their
``_sum`` and ``_count``.
"""

from __future__ import annotations

import logging
import socket
from types import ModuleType
from typing import Any

from servecore.metrics import METRICS, Kind

logger = logging.getLogger(__name__)

LEVEL = "Model"  # TorchServe's Level dimension of a model metric
# Batch sizes and images per batch: 1, 2, 4 ... 1024 (TorchServe's are shaped for seconds).
BUCKETS = [float(2**i) for i in range(11)]


class TritonMetrics:
    """A ``servecore.metrics.MetricsSink`` on ``pb_utils`` (``triton_python_backend_utils``,
    passed in so tests can hand a fake): one ``MetricFamily`` per metric, made once per model
    instance, and one ``Metric`` per label set, made when it is first used. Instances of a
    model, and models, share a family by name; Triton counts a series' users and keeps it
    until the last lets go.

    A family the server refuses (``--allow-metrics=false``, a name clash with another
    kind) switches that metric off with a warning, never a failed batch."""

    def __init__(self, pb_utils: ModuleType, model_name: str, hostname: str | None = None) -> None:
        self.labels = {
            "ModelName": model_name,
            "Level": LEVEL,
            "Hostname": hostname or socket.gethostname(),
        }
        kinds = {
            Kind.COUNTER: pb_utils.MetricFamily.COUNTER,
            Kind.GAUGE: pb_utils.MetricFamily.GAUGE,
            Kind.HISTOGRAM: pb_utils.MetricFamily.HISTOGRAM,
        }
        self.families: dict = {}
        for name, (kind, _) in METRICS.items():
            try:
                self.families[name] = pb_utils.MetricFamily(
                    name=name,
                    description=f"{name}: resnet50-serve's servecore/metrics.py",
                    kind=kinds[kind],
                )
            except Exception as exc:  # noqa: BLE001 - pb_utils raises TritonModelException
                logger.warning("metric %s off: %s", name, exc)
        # pb_utils' Metric objects (the stub's classes, untyped), by name and label values.
        self.series: dict[tuple[str, tuple[str, ...]], Any] = {}

    def add(self, name: str, value: float, labels: tuple[str, ...] = ()) -> None:
        metric = self.series.get((name, labels))
        if metric is None:
            metric = self._series(name, labels)
        if metric is None:
            return
        kind = METRICS[name][0]
        if kind is Kind.COUNTER:
            metric.increment(value)
        elif kind is Kind.GAUGE:
            metric.set(value)
        else:
            metric.observe(value)

    def close(self) -> None:
        """Let go of every series, then the families (Triton's order: a family deleted before
        its metrics is logged as a leak). ``finalize`` calls it."""
        self.series.clear()
        self.families.clear()

    def _series(self, name: str, labels: tuple[str, ...]):
        family = self.families.get(name)
        if family is None:
            return None
        kind, dimensions = METRICS[name]
        if len(labels) != len(dimensions):
            raise ValueError(f"metric {name} takes labels {dimensions}, got {labels}")
        metric = family.Metric(
            labels={**self.labels, **dict(zip(dimensions, labels))},
            buckets=BUCKETS if kind is Kind.HISTOGRAM else None,
        )
        self.series[(name, labels)] = metric
        return metric
