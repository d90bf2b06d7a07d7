"""Raw model speed in this process, no serving: the ceiling the served numbers are held to.

* forward throughput (images/s) of each backend at fixed batch sizes, on a real preprocessed
  image repeated to the batch size;
* single-image latency (ms) of what the handler does for one request: ``decode_image`` with the
  tagger's handler settings, the weights' transform, one forward at batch 1.

Backends load through ``handlers.backends.load_backend``, exactly as the handler loads them.
Every timing loop stops at a time budget or an iteration cap, whichever comes first.
"""
from __future__ import annotations

import gc
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.stats import percentile
from handlers.backends import Backend, load_backend
from handlers.preprocess import Preprocessor
from model_files.artifacts import SERIALIZED



@dataclass(frozen=True)
class Budget:
    """How long each measurement may take: at least ``min_iters`` timed iterations, then stop
    at ``seconds`` or ``max_iters``."""

    seconds: float = 3.0
    min_iters: int = 3
    max_iters: int = 200
    # TorchScript's profiling executor re-optimises on the first calls with a new input shape.
    warmup_iters: int = 3


def _timed_loop(step, budget: Budget) -> list[float]:
    """Per-iteration seconds of ``step()`` after warm-up, within the budget."""
    for _ in range(budget.warmup_iters):
        step()
    times: list[float] = []
    deadline = time.monotonic() + budget.seconds
    while len(times) < budget.max_iters and (
            len(times) < budget.min_iters or time.monotonic() < deadline):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return times


def forward_throughput(backend: Backend, image: torch.Tensor, batch: int,
                       budget: Budget) -> dict:
    """Images per second of ``backend`` on ``batch`` copies of one preprocessed image."""
    pixels = image.unsqueeze(0).repeat(batch, 1, 1, 1).contiguous()
    times = _timed_loop(lambda: backend(pixels), budget)
    return {"batch": batch, "iterations": len(times),
            "images_per_s": batch * len(times) / sum(times),
            "batch_ms_p50": percentile([t * 1000 for t in times], 50)}


def single_image_latency(backend: Backend, preprocess: Preprocessor, data: bytes,
                         budget: Budget) -> dict:
    """Milliseconds from JPEG bytes to model outputs for one image (decode, transform,
    forward at batch 1), as percentiles over the iterations."""
    times = [t * 1000 for t in _timed_loop(lambda: backend(preprocess(data).unsqueeze(0)), budget)]
    return {"iterations": len(times), "p50_ms": percentile(times, 50),
            "mean_ms": sum(times) / len(times), "p95_ms": percentile(times, 95)}


def run_raw(weights_dir: Path, images: dict[str, bytes], preprocess: Preprocessor,
            batches: tuple[int, ...] = (1, 8), budget: Budget = Budget(),
            backends: tuple[str, ...] = tuple(SERIALIZED)) -> dict[str, dict]:
    """For each backend: forward throughput at each batch size and single-image latency of
    each named image. Returns ``{backend: {"forward": [...], "single_image": {name: {...}}}}``."""
    first = next(iter(images.values()))
    pixels = preprocess(first)
    results: dict[str, dict] = {}
    for kind in backends:
        t = time.monotonic()
        with warnings.catch_warnings():
            # torch.jit.load's deprecation notice says nothing about the measurement.
            warnings.simplefilter("ignore", FutureWarning)
            # Runtime defaults (ONNX Runtime's threads spin): the fastest raw number, so the
            # served-vs-raw ratios are measured against the best the model itself can do.
            backend = load_backend(kind, weights_dir / SERIALIZED[kind], torch.device("cpu"),
                                   spin=True)
        load_s = time.monotonic() - t
        results[kind] = {
            "file": SERIALIZED[kind],
            "load_s": load_s,
            "forward": [forward_throughput(backend, pixels, b, budget) for b in batches],
            "single_image": {name: single_image_latency(backend, preprocess, data, budget)
                             for name, data in images.items()},
        }
        # One model in memory at a time: the next backend's timing should not page.
        del backend
        gc.collect()
    return results
