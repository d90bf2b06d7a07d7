"""The same tagger at the same precision served by Triton (``tritonrepo``), measured with the
same load plan as TorchServe's: the Triton row of ``python -m bench``.

Requests carry the raw image through Triton's binary tensor extension (a small JSON header,
then the bytes), as TorchServe's rows send the raw image as the body: neither pays base64.
Batch sizes come from Triton's own statistics (``/v2/models/<m>/stats``: images per model
execution over each run, and the largest batch size that ran in it), not from a header, which
Triton's Python backend cannot set; so the mean is per batch, where TorchServe's is per request.

``triton_serving`` is how every benchmark runs a Triton (this row, the ceiling, the crops, soak
and traffic tools): one way to start it on free ports, to fail with its log and to stop it;
``stats``, ``batch_meter`` and ``stubs_of`` read what it did and which processes are a model's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path

import psutil
import requests

from bench.layout import BUILD, TAGGER, fresh_dir
from bench.loadgen import Endpoint, v2_binary
from bench.serving import LoadPlan, ModelUnderTest, run_plan
from devtools.server import free_ports
from tritonrepo.generate import generate
from tritonrepo.install import NotInstalled, TritonInstall
from tritonrepo.server import Triton, running


def triton_serving(repository: Path, log_path: Path) -> ContextManager[Triton]:
    """``tritonrepo.server.running`` on free loopback ports: how every benchmark runs a Triton
    (this row, the ceiling, the crops, soak and traffic tools)."""
    return running(repository, log_path, **free_ports(("http", "grpc", "metrics")))


def stats(url: str, model: str) -> dict:
    """Triton's statistics of ``model`` so far (``/v2/models/<model>/stats``): totals only, so
    a run's figures are the differences across it."""
    return requests.get(f"{url}/v2/models/{model}/stats", timeout=30).json()["model_stats"][0]


def batch_meter(url: str, model: str) -> Callable[[], float]:
    """Started now: the mean images per execution of ``model`` since (NaN: none ran)."""
    before = stats(url, model)

    def mean() -> float:
        after = stats(url, model)
        runs = after["execution_count"] - before["execution_count"]
        return (after["inference_count"] - before["inference_count"]) / runs if runs else math.nan

    return mean


def stubs_of(root: psutil.Process, model: str) -> list[psutil.Process]:
    """``model``'s Python-backend stubs among ``root``'s descendants (a stub's first argument
    is its model.py, whose path names the model)."""
    found = []
    for process in root.children(recursive=True):
        try:
            if any(f"/{model}/" in arg for arg in process.cmdline()[1:2]):
                found.append(process)
        except psutil.Error:  # it exited between listing and reading
            continue
    return found


class TritonUnderTest(ModelUnderTest):
    """``ModelUnderTest`` on Triton: its v2 route, its process tree, its batch statistics."""

    def __init__(self, triton: Triton, model: str, plan: LoadPlan) -> None:
        # The "server" whose processes PeakRss samples is this object (``processes`` below).
        super().__init__(self, model, batches_from_log=False, plan=plan)
        self.triton = triton

    def processes(self) -> list[psutil.Process]:
        root = psutil.Process(self.triton.process.pid)
        return [root, *root.children(recursive=True)]

    def endpoint(self, body: bytes) -> Endpoint:
        payload, headers = v2_binary([body], ["tags"], binary_out=False)
        return Endpoint(
            f"{self.triton.url}/v2/models/{self.model}/infer", headers, payload, self.plan.timeout_s
        )

    def _measured(self, run, watch):
        before, mean = (
            batches(self.triton.url, self.model),
            batch_meter(self.triton.url, self.model),
        )
        measured = super()._measured(run, watch)
        after = batches(self.triton.url, self.model)
        measured["batch_mean"] = mean()
        grown = [size for size, count in after.items() if count > before.get(size, 0)]
        measured["batch_max"] = max(grown, default=0)
        return measured


def batches(url: str, model: str) -> dict[int, int]:
    """Executions of ``model`` so far per batch size."""
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats(url, model)["batch_stats"]}


def missing() -> str:
    """Why this host has no Triton to measure (no ``make triton-server``), or empty."""
    try:
        TritonInstall().check()
    except NotInstalled as exc:
        return str(exc)
    return ""


def serve_triton(
    images: dict[str, bytes],
    plan: LoadPlan,
    precision: str,
    *,
    model_store: Path,
    progress=lambda _: None,
) -> dict | None:
    """Triton serving the tagger of ``model_store`` at ``precision`` (what TorchServe's tagger
    served), every closed-loop run and the open-loop sweep; None when Triton is not installed."""
    if why := missing():
        progress(f"no Triton row: {why}")
        return None
    work = fresh_dir(BUILD / "run" / "triton")
    pinned = precision.split("+")[0]  # "int8+bf16" runs the int8 IR: handler.precision int8
    # Both models, as TorchServe's row loads them (the embedding model idle).
    generate(work / "repository", model_store=model_store, precision=pinned)
    started = time.monotonic()
    with triton_serving(work / "repository", work / "triton.log") as triton:
        startup_s = time.monotonic() - started
        mut = TritonUnderTest(triton, TAGGER, plan)
        # The tagger's Python-backend stub: the "worker" of this row.
        watch = {f"stub {p.pid}": p.pid for p in stubs_of(mut.processes()[0], TAGGER)}
        runs = run_plan(mut, images, plan, watch, f"triton {TAGGER}", progress)
    config = (work / "repository" / TAGGER / "config.pbtxt").read_text()
    return {
        "model": TAGGER,
        "backend": f"Triton 2.51 Python backend, {pinned}",
        "precision": pinned,
        "startup_s": startup_s,
        "config_pbtxt": config,
        "settings": {},
        **runs,
    }
