"""``bench.beforeafter``'s table from known runs: each side's median round per image, and the
ratio of the medians (the served runs themselves are `make bench-before-after`'s)."""

from __future__ import annotations

from bench.beforeafter import report
from bench.layout import IMAGES

MACHINE = {"cpu": "a test CPU", "cores": 2, "cpu_busy_percent_before": 0.0}


def run(round_: int, image: str, side: str, rate: float) -> dict:
    return {"round": round_, "image": image, "side": side, "throughput": rate,
            "p50_ms": 1000 / rate, "errors": 0}  # fmt: skip


def test_each_image_row_is_the_median_round_of_each_side():
    rates = {"before": (10.0, 30.0, 20.0), "after": (25.0, 21.0, 40.0)}
    runs = [
        run(k, image, side, rate)
        for image in IMAGES
        for side, each in rates.items()
        for k, rate in enumerate(each)
    ]
    text = report(runs, "abc1234", {"before": "int8+bf16", "after": "int8+bf16"}, MACHINE)
    rows = [line for line in text.splitlines() if line.startswith("| small |")]
    assert rows == [
        "| small | 20.0 | 25.0 | 1.25 | 50 | 40 | 0 | 10.0, 30.0, 20.0; 25.0, 21.0, 40.0 |"
    ]
    assert "Before: `abc1234`" in text and "3 rounds" in text
    assert sum(line.startswith("| 12mp") for line in text.splitlines()) == 2
