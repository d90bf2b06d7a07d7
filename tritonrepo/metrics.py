"""The model's metrics (``servecore.metrics``) exported through the Python backend's custom
metrics API, on Triton's own metrics port beside its ``nv_*`` series.

One naming for both engines: every metric of the core's table (``METRICS``) under its own
name, kind and labels, with the common ones (``model``, ``engine="triton"``) and the
``Hostname`` TorchServe adds to a model metric, so config/monitoring's rules and dashboard read
either engine. Triton's exposition writes a counter as named (ours end in ``_total``), as
TorchServe 0.12 does. Histograms (the python backend has them since 24.08; the wheel's 2.51 is
24.10) get buckets of powers of two, not TorchServe's fixed 0.005 ... 10: the rules read only
their ``_sum`` and ``_count``.
"""

from __future__ import annotations

import logging
import socket
from types import ModuleType
from typing import Any

from servecore.metrics import METRICS, Kind, Metric

logger = logging.getLogger(__name__)

ENGINE = "triton"  # the engine label's value
# Batch sizes and images per batch: 1, 2, 4 ... 1024 (TorchServe's are shaped for seconds).
BUCKETS = [float(2**i) for i in range(11)]


class TritonMetrics:
    """A ``servecore.metrics.MetricsSink`` on ``pb_utils`` (``triton_python_backend_utils``,
    passed in so tests can hand a fake): one ``MetricFamily`` per metric, made once per model
    instance, and one ``Metric`` per label set, made when it is first used. Instances of a
    model, and models, share a family by name; Triton counts a series' users and keeps it
    until the last lets go.

    Each call on a ``Metric`` is a round trip through the stub's message queue: a counter's
    increment by 0 and a gauge set to the value this instance last set are not sent.

    A family the server refuses (``--allow-metrics=false``, a name clash with another
    kind) switches that metric off with a warning, never a failed batch."""

    def __init__(self, pb_utils: ModuleType, model_name: str, hostname: str | None = None) -> None:
        self.labels = {
            "model": model_name,
            "engine": ENGINE,
            "Hostname": hostname or socket.gethostname(),
        }
        kinds = {kind: getattr(pb_utils.MetricFamily, kind.name) for kind in Kind}  # same names
        self.families: dict = {}
        for metric in METRICS:
            try:
                self.families[metric.name] = pb_utils.MetricFamily(
                    name=metric.name, description=metric.help, kind=kinds[metric.kind]
                )
            except Exception as exc:  # noqa: BLE001 - pb_utils raises TritonModelException
                logger.warning("metric %s off: %s", metric.name, exc)
        # pb_utils' Metric objects (the stub's classes, untyped), by name and label values.
        self.series: dict[tuple[str, tuple[str, ...]], Any] = {}
        self.gauges: dict[tuple[str, tuple[str, ...]], float] = {}  # the value each was set to

    def add(self, metric: Metric, value: float, labels: tuple[str, ...] = ()) -> None:
        key = (metric.name, labels)
        series = self.series.get(key)
        if series is None:
            series = self._series(metric, labels)
            if series is None:
                return
        elif (metric.kind is Kind.COUNTER and not value) or self.gauges.get(key) == value:
            return  # it would change no value Triton shows: no round trip
        if metric.kind is Kind.COUNTER:
            series.increment(value)
        elif metric.kind is Kind.GAUGE:
            series.set(value)
            self.gauges[key] = value
        else:
            series.observe(value)

    def flush(self) -> None:
        """Nothing held: each value went to Triton's metric when it was added."""

    def close(self) -> None:
        """Let go of every series, then the families (Triton's order: a family deleted before
        its metrics is logged as a leak). ``finalize`` calls it."""
        self.series.clear()
        self.gauges.clear()
        self.families.clear()

    def _series(self, metric: Metric, labels: tuple[str, ...]):
        family = self.families.get(metric.name)
        if family is None:
            return None
        if len(labels) != len(metric.labels):
            raise ValueError(f"metric {metric.name} takes labels {metric.labels}, got {labels}")
        series = family.Metric(
            labels={**self.labels, **dict(zip(metric.labels, labels))},
            buckets=BUCKETS if metric.kind is Kind.HISTOGRAM else None,
        )
        self.series[(metric.name, labels)] = series
        return series
