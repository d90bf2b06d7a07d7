"""``python -m bench.ceiling --quick --tracing`` on TorchServe: the null models load, take our
requests and answer every one 200, on a server with tracing off and on one with tracing on at
ratio 1.0 whose spans reach the bench's receiver (a seconds-long load, so its rates only have
to be positive); and the plan's arithmetic on known rows."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from bench.ceiling import GPU_FIGURES, Row, median_row, plan
from tests.conftest import REPO


def quick(engine: str, out) -> tuple[list[dict], dict]:
    argv = ["--quick", "--tracing", "--quiet", "--engine", engine, "--out", str(out)]
    run = subprocess.run(
        [sys.executable, "-m", "bench.ceiling", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads((out / "ceiling-tracing.json").read_text())
    rows = figures["rows"]
    assert [(r["engine"], r["kind"], r["images"], r["form"], r["traced"]) for r in rows] == [
        (engine, "core", 8, "binary", False),
        (engine, "core", 8, "binary", True),
    ]
    report = (out / "ceiling-tracing.md").read_text()
    assert f"| {engine} | core | 8 | v2 binary in and out |" in report
    assert f"| {engine} | core, traced | 8 | v2 binary in and out |" in report
    off, on = (r["worker_ms"] for r in rows)
    assert f"| {engine} | 8 | v2 binary in and out | {off:.2f} | {on:.2f} | {on / off:.2f} |" in (
        report
    )
    assert "## Planning one H100" in report and not (out / "ceiling.md").exists()
    return rows, figures["tracing"]


def check(row: dict) -> None:
    assert row["requests"] > 0 and row["errors"] == 0, row["error_kinds"]
    assert row["requests_per_s"] > 0
    assert row["images_per_s"] == pytest.approx(8 * row["requests_per_s"])
    assert row["p99_ms"] >= row["p50_ms"] > 0
    assert 8 <= row["batch_images"] <= 64  # whole requests, at most one full batch
    assert row["worker_ms"] > 0 and row["frontend_ms"] > 0


@pytest.mark.integration
def test_torchserve_null_core_answers_every_request_traced_or_not(tmp_path):
    rows, tracing = quick("torchserve", tmp_path)
    for row in rows:
        check(row)
    # The traced server's spans reached the bench's receiver (the queue's 2,048 spans go out
    # at 512 a post or every 5 s: most of a 2 s row's, not necessarily all, before it stops).
    assert tracing["spans"] > 0 and tracing["exports"] > 0
    assert 0 < tracing["batch_us"] < 1000 and 0 < tracing["request_us"] < 1000


# Triton's null rows run in `make bench-ceiling` (results/ceiling.md), not here: the suite keeps
# one engine's smoke of the tool within its 30 minutes.


def test_plan_counts_workers_and_frontend_cores():
    """2.5 worker ms and 0.5 frontend ms per 8-image request: 10,000 img/s is 1,250
    requests/s, 3.1 worker cores (4 workers) and 0.6 frontend cores."""
    row = Row(
        "torchserve", "core", 8, "json", 16, 100, 0, {}, 50.0, 400.0, 5.0, 9.0, 64.0, 0.5, 2.5, 0.1
    )
    needs = plan([row, Row("triton", "bare", 1, "raw", *[math.nan] * 12)])  # bare: not planned
    assert len(needs) == len(GPU_FIGURES)
    gpu, rate = GPU_FIGURES[1]
    need = next(n for n in needs if n.gpu == gpu)
    assert need.requests_per_s == pytest.approx(rate / 8)
    assert need.worker_cores == pytest.approx(rate / 8 * 2.5 / 1000)
    assert need.workers == math.ceil(rate / 8 * 2.5 / 1000)
    assert need.frontend_cores == pytest.approx(rate / 8 * 0.5 / 1000)
    assert need.form == "json"  # the plan's table says which request form it scales


def test_a_row_of_several_rounds_is_its_median_round():
    """Three rounds of 0.30, 0.10 and 0.20 worker ms: the row is the 0.20 round, with all
    three figures in the order they ran."""
    rounds = [
        Row("triton", "core", 1, "raw", 128, n, 0, {}, 1.0, 1.0, 5.0, 9.0, 64.0, 0.4, ms, 0.1)
        for n, ms in ((1, 0.30), (2, 0.10), (3, 0.20))
    ]
    row = median_row(rounds)
    assert (row.requests, row.worker_ms) == (3, 0.20)
    assert row.worker_ms_runs == (0.30, 0.10, 0.20)
