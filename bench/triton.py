"""The same tagger at the same precision served by Triton (``tritonrepo``), measured with the
same load plan as TorchServe's: the Triton row of ``python -m bench``.

Requests carry the raw image through Triton's binary tensor extension (a small JSON header,
then the bytes), as TorchServe's rows send the raw image as the body: neither pays base64.
Batch sizes come from Triton's own statistics (``/v2/models/<m>/stats``: images per model
execution over each run, and the largest batch size that ran in it), not from a header, which
Triton's Python backend cannot set; so the mean is per batch, where TorchServe's is per request.

``triton_serving`` is how every benchmark runs a Triton (this row, the ceiling, the crops, soak
and traffic tools): one way to start it on free ports, to fail with its log and to stop it.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path

import psutil
import requests

from bench.layout import BUILD, TAGGER, fresh_dir
from bench.loadgen import Endpoint
from bench.serving import LoadPlan, ModelUnderTest, run_plan
from devtools.server import free_ports
from serveshared.v2binary import binary_body, binary_tensor, bytes_elements
from tritonrepo.generate import generate
from tritonrepo.install import NotInstalled, TritonInstall
from tritonrepo.server import Triton, running


def triton_serving(repository: Path, log_path: Path) -> ContextManager[Triton]:
    """``tritonrepo.server.running`` on free loopback ports: how every benchmark runs a Triton
    (this row, the ceiling, the crops, soak and traffic tools)."""
    return running(repository, log_path, **free_ports(("http", "grpc", "metrics")))


def binary_request(image: bytes, output: str = "tags") -> tuple[bytes, dict[str, str]]:
    """A v2 request of one image in Triton's binary tensor extension, asking for ``output``
    as JSON: body and headers."""
    element = bytes_elements([image])
    header = {
        "inputs": [binary_tensor("images", "BYTES", [1, 1], len(element))],
        "outputs": [{"name": output, "parameters": {"binary_data": False}}],
    }
    return binary_body(header, element)


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
        payload, headers = binary_request(body)
        return Endpoint(
            f"{self.triton.url}/v2/models/{self.model}/infer", headers, payload, self.plan.timeout_s
        )

    def _measured(self, run, watch):
        before = self._counts()
        stats = super()._measured(run, watch)
        after = self._counts()
        images, executions = after[0] - before[0], after[1] - before[1]
        stats["batch_mean"] = images / executions if executions else float("nan")
        stats["batch_max"] = max(
            (size for size, count in after[2].items() if count > before[2].get(size, 0)), default=0
        )
        return stats

    def _counts(self) -> tuple[int, int, dict[int, int]]:
        """(images inferred, model executions, executions per batch size) so far: Triton
        keeps totals only, so a run's figures are the differences across it."""
        stats = self._stats()
        return (
            stats["inference_count"],
            stats["execution_count"],
            {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]},
        )

    def _stats(self) -> dict:
        url = f"{self.triton.url}/v2/models/{self.model}/stats"
        return requests.get(url, timeout=30).json()["model_stats"][0]


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
    try:
        TritonInstall().check()
    except NotInstalled as exc:
        progress(f"no Triton row: {exc}")
        return None
    work = fresh_dir(BUILD / "run" / "triton")
    pinned = precision.split("+")[0]  # "int8+bf16" runs the int8 IR: handler.precision int8
    # Both models, as TorchServe's row loads them (the embedding model idle).
    generate(work / "repository", model_store=model_store, precision=pinned)
    started = time.monotonic()
    with triton_serving(work / "repository", work / "triton.log") as triton:
        startup_s = time.monotonic() - started
        mut = TritonUnderTest(triton, TAGGER, plan)
        # The tagger's Python-backend stub (its model.py is its first argument): the
        # "worker" of this row.
        watch = {
            f"stub {p.pid}": p.pid
            for p in mut.processes()[1:]
            if any(f"/{TAGGER}/" in arg for arg in p.cmdline()[1:2])
        }
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
