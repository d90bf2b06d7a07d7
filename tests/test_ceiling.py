"""``python -m bench.ceiling --quick`` on TorchServe: the null models load, take our
requests and answer every one 200 (a seconds-long load, so its rates only have to be
positive); and the plan's arithmetic on known rows."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from bench.ceiling import GPU_FIGURES, Row, median_row, plan
from tests.conftest import REPO


def quick(engine: str, out) -> list[dict]:
    argv = ["--quick", "--quiet", "--engine", engine, "--out", str(out)]
    run = subprocess.run(
        [sys.executable, "-m", "bench.ceiling", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads((out / "ceiling.json").read_text())["rows"]
    assert [(r["engine"], r["kind"], r["images"], r["form"]) for r in rows] == [
        (engine, "core", 8, "binary")
    ]
    report = (out / "ceiling.md").read_text()
    assert f"| {engine} | core | 8 | v2 binary in and out |" in report
    assert "## Planning one H100" in report
    return rows


def check(row: dict) -> None:
    assert row["requests"] > 0 and row["errors"] == 0, row["error_kinds"]
    assert row["requests_per_s"] > 0
    assert row["images_per_s"] == pytest.approx(8 * row["requests_per_s"])
    assert row["p99_ms"] >= row["p50_ms"] > 0
    assert 8 <= row["batch_images"] <= 64  # whole requests, at most one full batch
    assert row["worker_ms"] > 0 and row["frontend_ms"] > 0


@pytest.mark.integration
def test_torchserve_null_core_answers_every_request(tmp_path):
    check(*quick("torchserve", tmp_path))


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
