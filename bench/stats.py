"""Pure statistics over benchmark samples: percentiles and one run's summary.

No I/O, no clocks: everything here takes plain numbers, so it is unit-tested on its own
(``tests/test_bench_stats.py``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass(frozen=True)
class Sample:
    """One request as a client saw it.

    ``start``/``end``: monotonic seconds; for open-loop runs ``start`` is the *scheduled*
    arrival, so time spent waiting for a free client thread counts as latency.
    ``ok``: HTTP 200. ``error``: the status code or exception name otherwise.
    ``batch_size``: the server-side batch this request was part of, when known.
    ``request_id``: TorchServe's ``x-request-id`` answer header (finds the batch in its log).
    ``status``: the HTTP status (0: no answer); ``kind``: the ``type`` an error body names.
    """

    start: float
    end: float
    ok: bool
    error: str = ""
    batch_size: int | None = None
    request_id: str = ""
    status: int = 0
    kind: str = ""

    @property
    def outcome(self) -> str:
        """``200``, the status and the error's type (``503 Overloaded``), or the exception."""
        return f"{self.status} {self.kind}".strip() if self.status else self.error

    @property
    def latency_ms(self) -> float:
        return (self.end - self.start) * 1000.0


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), NumPy's linear interpolation; NaN for no values."""
    return float(np.percentile(values, q)) if len(values) else math.nan


@dataclass
class RunStats:
    """What one load run measured. Latencies are of successful requests only."""

    requests: int
    ok: int
    errors: int
    duration_s: float
    throughput: float  # successful requests (= images) per second
    p50_ms: float
    p95_ms: float
    p99_ms: float
    batch_mean: float = math.nan  # request-weighted mean server batch size
    batch_max: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(samples: Sequence[Sample]) -> RunStats:
    """Throughput over the run's span (first start to last end), latency percentiles of the
    successful requests, errors by kind, and batch sizes from samples that carry one."""
    if not samples:
        return RunStats(0, 0, 0, 0.0, 0.0, math.nan, math.nan, math.nan)
    ok = [s for s in samples if s.ok]
    span = max(s.end for s in samples) - min(s.start for s in samples)
    latencies = [s.latency_ms for s in ok]
    batches = [s.batch_size for s in ok if s.batch_size]
    errors = Counter(s.error or "unknown" for s in samples if not s.ok)
    return RunStats(
        requests=len(samples),
        ok=len(ok),
        errors=len(samples) - len(ok),
        duration_s=span,
        throughput=len(ok) / span if span > 0 else 0.0,
        p50_ms=percentile(latencies, 50),
        p95_ms=percentile(latencies, 95),
        p99_ms=percentile(latencies, 99),
        # Each response reports its own batch's size, so the plain mean is request-weighted.
        batch_mean=sum(batches) / len(batches) if batches else math.nan,
        batch_max=max(batches, default=0),
        error_kinds=dict(errors),
    )


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, NaN when either is missing or the denominator is 0."""
    if denominator is None or numerator is None:
        return math.nan
    if math.isnan(numerator) or math.isnan(denominator) or denominator == 0:
        return math.nan
    return numerator / denominator


def find_run(runs: Sequence[dict], **where) -> dict | None:
    """The first run whose fields equal ``where`` (e.g. ``image="small", clients=16``)."""
    for run in runs:
        if all(run.get(k) == v for k, v in where.items()):
            return run
    return None
