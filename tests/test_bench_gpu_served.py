"""``make bench-gpu-served``'s pieces, in seconds (the whole run: ``make
bench-gpu-served-rehearsal`` on this CPU, about 8 minutes; on a GPU host, bench/gpuserved.sh):
the load spread over client processes, the report's planning figures from measured rows, the
time budget, NVML's absence, the host command stopping first on a missing stage, the make
targets, and the bare host the rehearsal plays."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from bench import gpuserved
from bench.gpureport import Findings, Rate, Setting
from bench.gpuserved import Budget, Nvml, Row
from bench.loadgen import Endpoint
from tests.conftest import REPO


class Answers(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("X-Batch-Size", "4")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"[]")

    def log_message(self, *args) -> None:
        pass


def test_a_row_is_driven_from_several_client_processes_and_their_samples_merged():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = Endpoint(f"http://127.0.0.1:{server.server_port}/predictions/m", {}, b"jpeg")
    try:
        with multiprocessing.get_context("fork").Pool(2) as pool:
            samples, cores = gpuserved.drive(pool, 2, endpoint, 3, 0.5)
            pids = pool.starmap(os.getpid, [()] * 2)
    finally:
        server.shutdown()
    assert len(samples) > 3 and all(s.ok and s.batch_size == 4 for s in samples)
    assert cores > 0 and os.getpid() not in pids  # the clients' CPU, not this process's


def _row(engine: str, workers: int, images: int, rate: float, **kw) -> Row:
    fields = {"clients": 8, "batch_size": 64, "requests": 100, "errors": 0, "error_kinds": {},
              "p50_ms": 5.0, "p99_ms": 9.0, "batch_images": 32.0, "gpu_busy": 0.9,
              "worker_gpu_mb": [2000.0] * workers, "worker_cores": [1.0] * workers,
              "frontend_cores": 2.0, "client_cores": 1.0}  # fmt: skip
    return Row(engine, workers, images, images_per_s=rate, **{**fields, **kw})


def _findings(core: float) -> Findings:
    best = Setting("f16", "channels_last")
    return Findings(
        torch.device("cpu"), {}, {"small": 64}, "seeded", {(best, 64): Rate(14_000, 4.6)}, best,
        64, "", {"small": Rate(6_400, 10.0)}, {"small": Rate(core, 13.0)}, {}, "f16", {}, False,
    )  # fmt: skip


def _cells(text: str, first: str, second: str) -> list[str]:
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[:2] == [first, second]:
            return cells
    raise AssertionError(f"no row {first} | {second} in\n{text}")


def test_the_report_names_the_best_workers_per_gpu_and_the_cpu_a_thousand_images_take():
    """Each engine and form at its fastest count: CPU cores per 1,000 img/s = (its workers'
    cores + the frontend's) / (img/s / 1,000); x core = img/s over the core's in process."""
    rows = [
        _row("torchserve", 1, 1, 4_000.0),
        _row("torchserve", 2, 1, 5_000.0, worker_cores=[1.0, 1.5]),
        _row("torchserve", 2, 8, 7_000.0),
        _row("triton", 2, 1, 3_000.0),
    ]
    text = gpuserved.report(rows, _findings(4_000.0), {}, ["a note"], gpuserved.GPU_PLAN)
    served = _cells(text, "torchserve", "1 image, raw")
    assert served[2:4] == ["1: 4,000, 2: 5,000", "2"]
    assert served[4:8] == ["0.90", "0.40", "0.20", "1.25"]  # (1 + 1.5 + 2) / 5; 2 / 5; 1 / 5
    assert _cells(text, "triton", "1 image, raw")[-1] == "0.75"
    assert _cells(text, "torchserve", "2")[6] == "1.25"  # the served row's x core
    assert "| the core, `ImageModel.run`, batch 64 (f16) | 4,000 |" in text
    assert "- a note" in text


def test_the_budget_leaves_out_what_it_cannot_hold_and_says_so():
    import time

    budget = Budget(time.time() - 400, 480)
    assert budget.fits("torchserve, 1 worker(s) a GPU", 60)
    assert not budget.fits("triton, 3 instance(s) a GPU", 120)
    assert budget.skipped and budget.skipped[0].startswith("triton, 3 instance(s) a GPU: ")
    assert budget.skipped[0].endswith("s left, about 120 s needed")


def test_without_nvml_the_gpu_readings_are_left_out_saying_why():
    nvml = Nvml()
    if nvml.nvml is not None:
        pytest.skip("this host has NVML")
    assert nvml.why.startswith("no NVML (")
    assert nvml.memory_mb([os.getpid()]) == []
    with nvml.sampled(0.01) as busy:
        pass
    assert busy == []


def test_the_gpu_host_command_stops_first_when_the_stage_is_not_there(tmp_path):
    """bash bench/gpuserved.sh installs the stage before anything: without it (or for another
    Python, or beside a venv it did not make) it stops there, saying why, measuring nothing."""
    copy = tmp_path / "tree"
    for name in ("bench/gpuserved.sh", "buildsteps/__init__.py", "buildsteps/stage.py"):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, copy / name)
    done = subprocess.run(
        ["bash", str(copy / "bench" / "gpuserved.sh")],
        env={**os.environ, "HOST_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "stage install: no load in" in done.stderr and "make gpu-stage" in done.stderr
    assert not (copy / ".venv").exists()


def test_the_make_targets_stage_here_run_there_and_rehearse():
    def dry(*args: str) -> str:
        return subprocess.run(
            ["make", "-n", "-C", str(REPO), *args], capture_output=True, text=True, timeout=60
        ).stdout

    assert "-m buildsteps.stage --python 3.13" in dry("gpu-stage", "GPU_PYTHON=3.13")
    assert "-m buildsteps.stage --python 3.12" in dry("gpu-stage")
    assert "bash bench/gpuserved.sh" in dry("bench-gpu-served")
    assert "-m devtools.barehost" in dry("bench-gpu-served-rehearsal")


def test_the_rehearsals_bare_host_sees_torch_and_not_what_serving_adds(tmp_path):
    from devtools.barehost import bare_python

    python = bare_python(tmp_path)
    found = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(*(u.find_spec(n) is not None for n "
         "in ('torch', 'torchvision', 'numpy', 'PIL', 'psutil', 'ts', 'yaml', 'requests')))"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert found == ["True"] * 4 + ["False"] * 4
