"""The shipped benchmark tools run end to end: ``python -m bench --quick``,
``python -m bench.ingestion --quick`` and ``python -m bench.contention`` (seconds-long loads,
so their numbers mean nothing; what is checked is that every measurement ran, was reported and
is consistent with itself). Those that measure our TorchServe as shipped measure the session's
(``--attach``): the same settings, without a start of their own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

# The suite's largest module by time: `make test` runs it, `make test-fast` does not.
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_quick_benchmark_reports_every_measurement(tmp_path, torchserve):
    """``python -m bench --quick``, ours measured on the session's TorchServe (``--attach``:
    the shipped settings, as the benchmark's own server has them); Triton and the stock
    handler on servers of its own."""
    run = subprocess.run(
        [
            *(sys.executable, "-m", "bench", "--quick", "--quiet"),
            *("--attach", str(torchserve.workdir), "--out", str(tmp_path)),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "benchmark.json").read_text())
    # The int8 rows are raw-timed only when its IR was built (the default build), the bf16 rows
    # say why they were not run on a CPU without bf16 units.
    assert set(results["raw"]) - {"openvino-int8", "openvino-int8-bf16"} == {
        "eager",
        "torchscript",
        "onnx",
        "openvino-f32",
        "openvino-bf16",
    }
    choice = results["served"]["ours"]["precision_choice"]
    assert choice["measured"] and choice["choice"] == results["served"]["ours"]["precision"]
    assert results["pipeline"]["precision"] == choice["choice"]
    assert {"p1", "p2"} <= {t["key"] for t in results["targets"]}
    assert results["pipeline"]["images_per_s"] > 0
    assert all(m["ms_per_image_p50"] > 0 for m in results["explain"]["methods"].values())
    servers = ["ours", "stock"] + (["triton"] if _triton_installed() else [])
    for server in servers:
        runs = results["served"][server]
        assert runs["closed"] and runs["open"], server
        assert all(r["errors"] == 0 and r["requests"] > 0 for r in runs["closed"])
        # An open loop offers a fixed rate: above what a busy machine serves, the frontend's
        # queue (job_queue_size 16) refuses the excess with 503, and nothing else may fail.
        assert all(
            r["requests"] > 0 and set(r["error_kinds"]) <= {"HTTP 503"} for r in runs["open"]
        ), runs["open"]
    assert {t["key"] for t in results["targets"]} >= {"a1", "a2", "b", "b2", "c", "c2", "d", "e"}
    markdown = (tmp_path / "benchmark.md").read_text()
    assert "## Targets" in markdown and "## Raw model" in markdown
    assert (tmp_path / "benchmark.png").stat().st_size > 10_000


def _triton_installed() -> bool:
    """Whether `make triton-server` installed Triton, and so the benchmark has its row."""
    from tritonrepo.install import NotInstalled, TritonInstall

    try:
        TritonInstall().check()
    except NotInstalled:
        return False
    return True


def test_ingestion_split_reads_a_real_torchserve_log(tmp_path, torchserve):
    """``python -m bench.ingestion --quick`` on the shipped settings (the session's TorchServe,
    ``--attach``): every row found its batches in TorchServe's own log, and the parts add up
    (the worker's handler time is part of the frontend's backend time; decode and forward are
    parts of the handler time)."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.ingestion",
            "--quick",
            "--quiet",
            "--variants",
            "shipped",
            "--attach",
            str(torchserve.workdir),
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads((tmp_path / "ingestion.json").read_text())["rows"]
    assert {(r["image"], r["clients"]) for r in rows} == {
        (image, clients) for image in ("small", "12mp-noisy") for clients in (1, 16)
    }
    for r in rows:
        assert r["errors"] == 0 and r["requests"] > 0, r
        assert r["batches"] > 0, r
        assert 0 < r["handler_ms"] <= r["backend_ms"] + 1, r  # backend times are whole ms
        assert r["decode_ms"] > 0 and r["forward_ms"] > 0, r
        assert r["decode_ms"] + r["forward_ms"] <= r["handler_ms"], r
        assert 0 < r["worker_busy"] <= 1.05, r
        # The servers used CPU (a one-client quick run's client can stay under psutil's 10 ms
        # tick), and all sides together no more than the machine had.
        sides = [r["cpu_client_ms"], r["cpu_frontend_ms"], r["cpu_worker_ms"]]
        assert sides[0] >= 0 and sides[1] > 0 and sides[2] > 0, (sides, r)
        assert sum(sides) <= 1.05 * r["cores_available_ms"], r
    assert "| shipped |" in (tmp_path / "ingestion.md").read_text()


def test_contention_probe_measures_both_runtimes_beside_each_neighbour(model_store):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.contention",
            *("--seconds", "0.5", "--warmup", "1", "--batch", "1", "--quiet"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [
        line
        for line in run.stdout.splitlines()
        if line.startswith("| ") and not line.startswith(("| beside", "| ---"))
    ]
    assert [r.split("|")[1].strip() for r in rows] == [
        "nothing",
        "one busy-looping process",
        "two busy-looping processes",
        "one PyTorch process (ResNet18 loop, its own OpenMP threads)",
    ]
    for row in rows:
        stock, ours = (float(cell) for cell in row.strip("|").split("|")[1:])
        assert stock > 0 and ours > 0, row


def test_soak_runs_every_class_and_reports(tmp_path, torchserve):
    """``python -m bench.soak --quick --attach``: 6 s of every traffic class against the
    session's TorchServe (the shipped settings, as a fresh soak server has them); every class
    was sent and answered as a healthy server answers it, no worker restarted, and the report
    and plot were written."""
    run = subprocess.run(
        [
            *(sys.executable, "-m", "bench.soak", "--quick", "--quiet"),
            *("--attach", str(torchserve.workdir), "--out", str(tmp_path)),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "soak.json").read_text())
    for name, row in summary["classes"].items():
        assert row["requests"] > 0, name
        assert not row["unexpected"], (name, row)
    assert summary["five_hundreds_not_503"] == {}
    assert set(summary["restarts"].values()) == {0}
    assert "| photo |" in (tmp_path / "soak.md").read_text()
    assert (tmp_path / "soak.png").stat().st_size > 10_000


def test_soak_on_triton_runs_every_class_and_reports(tmp_path, model_store):
    """``python -m bench.soak --quick --engine triton``: the same mix as Triton takes it, every
    class answered as a healthy server answers it, no stub restarted; the one exception is
    Triton's own frontend answering 500 to JSON it cannot parse, which the report names."""
    from tritonrepo.install import NotInstalled, TritonInstall

    try:
        TritonInstall().check()
    except NotInstalled as exc:
        pytest.skip(f"no Triton server: {exc}")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.soak",
            "--quick",
            "--quiet",
            "--engine",
            "triton",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "soak-triton.json").read_text())
    assert summary["engine"] == "Triton"
    for name, row in summary["classes"].items():
        assert row["requests"] > 0, name
        if name == "deep JSON":
            assert set(row["outcomes"]) == {"500"}, row
        else:
            assert not row["unexpected"], (name, row)
    assert set(summary["five_hundreds_not_503"]) == {"500"}
    assert set(summary["restarts"].values()) == {0}
    report = (tmp_path / "soak-triton.md").read_text()
    assert "| photo |" in report and "- deep JSON: Triton 2.51's own HTTP frontend" in report
    assert (tmp_path / "soak-triton.png").stat().st_size > 10_000


def test_traffic_bench_measures_interactive_clients_beside_the_job(tmp_path, torchserve):
    """``python -m bench.traffic`` tiny on the session's TorchServe (``--attach``: the shipped
    settings, as the bench's own server has them): 2 clients x 5 photos/s x 2 s, alone and
    while ``tsctl embed`` runs over 20 photos; every request and photo answered, and the
    report's row and provenance line written."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.traffic",
            "--photos",
            "20",
            "--seconds",
            "2",
            "--targets",
            "ours",
            "--attach",
            str(torchserve.workdir),
            "--quiet",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    [row] = json.loads((tmp_path / "traffic.json").read_text())["rows"]
    assert row["target"] == "ours"
    for window in ("interactive_idle", "interactive_during"):
        assert row[window]["requests"] == row[window]["ok"] == 2 * 5 * 2, row[window]
        assert 0 < row[window]["p50_ms"] <= row[window]["p95_ms"] <= row[window]["max_ms"]
    for job in ("job_alone", "job_during"):
        assert row[job]["done"] == 20 and row[job]["failed"] == 0, row[job]
        assert row[job]["images_per_s"] > 0
    markdown = (tmp_path / "traffic.md").read_text()
    assert markdown.splitlines()[2].startswith("- Date: ")
    assert "| ours on TorchServe 0.12 |" in markdown


def test_preprocess_bench_compares_before_and_now(tmp_path):
    """``python -m bench.preprocess --quick``: the per-image costs and the pipeline row, before
    (float transform, float-input IR) and now (uint8 crop, the served IR), each measured."""
    from bench import preprocess

    out = tmp_path / "preprocess.md"
    assert preprocess.main(["--quick", "--quiet", "--out", str(out)]) == 0
    text = out.read_text()
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| small")]
    assert len(rows) == 1 and all(float(cell) > 0 for cell in rows[0][1:4])
    pipeline = [line for line in text.splitlines() if line.startswith("| openvino f32, small")]
    assert len(pipeline) == 1
    before, now = (float(cell) for cell in pipeline[0].split(" | ")[1:3])
    assert before > 0 and now > 0
