"""The shipped benchmark runs end to end (``python -m bench --quick``: seconds-long loads, so
its numbers mean nothing; what is checked is that every measurement ran and was reported)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

# About two thirds of the suite's time: `make test` runs it, `make test-fast` does not.
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_quick_benchmark_reports_every_measurement(tmp_path, model_store):
    run = subprocess.run([sys.executable, "-m", "bench", "--quick", "--quiet", "--out",
                          str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=840)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "benchmark.json").read_text())
    # --quick never serves int8; openvino-int8 is raw-timed only when its IR was built.
    assert set(results["raw"]) - {"openvino-int8"} == {"eager", "torchscript", "onnx",
                                                       "openvino-f32", "openvino"}
    assert results["pipeline"]["images_per_s"] > 0
    assert all(m["ms_per_image_p50"] > 0 for m in results["explain"]["methods"].values())
    for server in ("ours", "stock"):
        runs = results["served"][server]
        assert runs["closed"] and runs["open"], server
        assert all(r["errors"] == 0 and r["requests"] > 0 for r in runs["closed"] + runs["open"])
    assert {t["key"] for t in results["targets"]} >= {"a1", "a2", "a3", "b", "b2", "c", "c2",
                                                      "d", "e"}
    markdown = (tmp_path / "benchmark.md").read_text()
    assert "## Targets" in markdown and "## Raw model" in markdown
    assert (tmp_path / "benchmark.png").stat().st_size > 10_000
