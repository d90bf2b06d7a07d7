"""The issue's target ratios, judged PASS/MISS from numbers measured in one run.

Pure: takes the result dicts ``bench.__main__`` assembles, returns ``Target`` rows. A target
whose inputs are missing (NaN) is a MISS, never a PASS.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from bench.stats import find_run, ratio


@dataclass(frozen=True)
class Target:
    key: str
    description: str
    value: float
    op: str  # ">=" or "<="
    threshold: float
    detail: str

    @property
    def passed(self) -> bool:
        if math.isnan(self.value):
            return False
        return self.value >= self.threshold if self.op == ">=" else self.value <= self.threshold

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def _get(run: dict | None, key: str) -> float:
    return math.nan if run is None else float(run.get(key, math.nan))


def evaluate(raw: dict, backend: str, ours: dict, stock: dict, *, raw_batch: int = 8,
             small: str = "small", large: str = "12mp") -> list[Target]:
    """(a) 16 clients small: ours >= 2x stock and >= 0.85x raw forward at ``raw_batch`` of
    ``backend``; (b) 16 clients 12 MP: ours >= 3x stock; (c) 1 client small: ours p50 <= 1.3x
    raw single-image decode+preprocess+forward; (d) no errors in any of our runs."""
    ours16 = find_run(ours["closed"], image=small, clients=16)
    stock16 = find_run(stock["closed"], image=small, clients=16)
    ours16l = find_run(ours["closed"], image=large, clients=16)
    stock16l = find_run(stock["closed"], image=large, clients=16)
    ours1 = find_run(ours["closed"], image=small, clients=1)
    raw_backend = raw.get(backend, {})
    forward = next((f for f in raw_backend.get("forward", []) if f["batch"] == raw_batch), None)
    forward_ips = _get(forward, "images_per_s")
    single = raw_backend.get("single_image", {}).get(small)
    single_p50 = _get(single, "p50_ms")
    our_runs = ours["closed"] + ours["open"]
    our_errors = sum(r["errors"] for r in our_runs)
    stock_errors = sum(r["errors"] for r in stock["closed"] + stock["open"])

    return [
        Target("a1", "16 clients, small JPEG: tagger img/s vs stock img/s",
               ratio(_get(ours16, "throughput"), _get(stock16, "throughput")), ">=", 2.0,
               f"{_get(ours16, 'throughput'):.1f} vs {_get(stock16, 'throughput'):.1f} img/s"),
        Target("a2", f"16 clients, small JPEG: tagger img/s vs raw {backend} forward "
                     f"at batch {raw_batch}",
               ratio(_get(ours16, "throughput"), forward_ips), ">=", 0.85,
               f"{_get(ours16, 'throughput'):.1f} vs {forward_ips:.1f} img/s"),
        Target("b", "16 clients, 12 MP photo: tagger img/s vs stock img/s",
               ratio(_get(ours16l, "throughput"), _get(stock16l, "throughput")), ">=", 3.0,
               f"{_get(ours16l, 'throughput'):.2f} vs {_get(stock16l, 'throughput'):.2f} img/s"),
        Target("c", f"1 client, small JPEG: tagger p50 vs raw {backend} decode+preprocess+"
                    "forward p50",
               ratio(_get(ours1, "p50_ms"), single_p50), "<=", 1.3,
               f"{_get(ours1, 'p50_ms'):.1f} vs {single_p50:.1f} ms"),
        Target("d", "errors (non-200 or exception) over all tagger runs",
               float(our_errors), "<=", 0.0,
               f"{our_errors} of {sum(r['requests'] for r in our_runs)} requests "
               f"(stock: {stock_errors})"),
    ]
