"""Raw model speed in this process, no serving: the ceiling the served numbers are held to.

* forward throughput (images/s) of each backend at fixed batch sizes, on a real preprocessed
  image repeated to the batch size;
* single-image latency (ms) of what the handler does for one request: ``decode_image`` with the
  tagger's handler settings, the weights' transform, one forward at batch 1;
* the in-process pipeline: what the served tagger does without TorchServe, HTTP or the
  frontend (decode and preprocess a batch of the same JPEG on the handler's decode threads,
  stack, one forward), images per second.

Backends load through ``servecore.backends.load_backend``, exactly as the handler loads them.
Every timing loop stops at a time budget or an iteration cap, whichever comes first.
"""

from __future__ import annotations

import gc
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.stats import percentile
from model_files.artifacts import QUANTIZED, SERIALIZED
from servecore.backends import RUNTIME_DEFAULT, Backend, RuntimeOptions, load_backend
from servecore.preprocessor import Preprocessor

# Row label -> (backend, serialized file, precision passed to load_backend). The OpenVINO rows
# are the candidates ``handler.precision: auto`` times (servecore/autoprecision.py): each IR
# at f32 and bf16 (int8: its quantised layers in int8, the others at that precision).
VARIANTS = {
    "eager": ("eager", SERIALIZED["eager"], RUNTIME_DEFAULT),
    "torchscript": ("torchscript", SERIALIZED["torchscript"], RUNTIME_DEFAULT),
    "onnx": ("onnx", SERIALIZED["onnx"], RUNTIME_DEFAULT),
    "openvino-f32": ("openvino", SERIALIZED["openvino"], "f32"),
    "openvino-bf16": ("openvino", SERIALIZED["openvino"], "bf16"),
    "openvino-int8": ("openvino", QUANTIZED[("openvino", "int8")], "f32"),
    "openvino-int8-bf16": ("openvino", QUANTIZED[("openvino", "int8")], "bf16"),
}
# What describe's ``precision`` of an OpenVINO archive names -> its row.
OPENVINO_ROWS = {
    "f32": "openvino-f32",
    "bf16": "openvino-bf16",
    "int8+f32": "openvino-int8",
    "int8+bf16": "openvino-int8-bf16",
}


def variant_for(backend: str, precision: str) -> str | None:
    """The row that runs what a served ``backend`` at ``precision`` (describe's) runs."""
    if backend == "openvino":
        return OPENVINO_ROWS.get(precision)
    return backend if precision == "f32" else None


def served_variant(served: dict) -> str:
    """The row that runs what a served tagger runs (``served``: its describe's backend and
    precision); RuntimeError where no row does."""
    label = variant_for(served["backend"], served["precision"])
    if label is None:
        raise RuntimeError(f"no raw row runs {served['backend']} at {served['precision']}")
    return label


@dataclass(frozen=True)
class Budget:
    """How long each measurement may take: at least ``min_iters`` timed iterations, then stop
    at ``seconds`` or ``max_iters``."""

    seconds: float = 3.0
    min_iters: int = 3
    max_iters: int = 200
    # TorchScript's profiling executor re-optimises on the first calls with a new input shape.
    warmup_iters: int = 3


def timed_loop(step, budget: Budget) -> list[float]:
    """Per-iteration seconds of ``step()`` after warm-up, within the budget."""
    for _ in range(budget.warmup_iters):
        step()
    times: list[float] = []
    deadline = time.monotonic() + budget.seconds
    while len(times) < budget.max_iters and (
        len(times) < budget.min_iters or time.monotonic() < deadline
    ):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return times


def forward_throughput(backend: Backend, image: torch.Tensor, batch: int, budget: Budget) -> dict:
    """Images per second of ``backend`` on ``batch`` copies of one preprocessed image."""
    pixels = image.unsqueeze(0).repeat(batch, 1, 1, 1).contiguous()
    times = timed_loop(lambda: backend(pixels), budget)
    return {
        "batch": batch,
        "iterations": len(times),
        "images_per_s": batch * len(times) / sum(times),
        "batch_ms_p50": percentile([t * 1000 for t in times], 50),
    }


def single_image_latency(
    backend: Backend, preprocess: Preprocessor, data: bytes, budget: Budget
) -> dict:
    """Milliseconds from JPEG bytes to model outputs for one image (decode, transform,
    forward at batch 1), as percentiles over the iterations."""
    times = [t * 1000 for t in timed_loop(lambda: backend(preprocess(data).unsqueeze(0)), budget)]
    return {
        "iterations": len(times),
        "p50_ms": percentile(times, 50),
        "mean_ms": sum(times) / len(times),
        "p95_ms": percentile(times, 95),
    }


def pipeline_throughput(
    backend: Backend,
    preprocess: Preprocessor,
    data: bytes,
    batch: int,
    budget: Budget,
    decode_threads: int = 0,
) -> dict:
    """Images per second of decode + preprocess (``batch`` copies of ``data`` on a pool of
    ``decode_threads``, as the handler's; 0 = one per core, at most 4) + stack + one forward."""
    work = [data] * batch
    with ThreadPoolExecutor(decode_threads or min(4, os.cpu_count() or 1)) as pool:
        times = timed_loop(lambda: backend(torch.stack(list(pool.map(preprocess, work)))), budget)
    return {
        "batch": batch,
        "iterations": len(times),
        "images_per_s": batch * len(times) / sum(times),
    }


def load_variant(weights_dir: Path, label: str) -> Backend:
    kind, file, precision = VARIANTS[label]
    with warnings.catch_warnings():
        # torch.jit.load's deprecation notice says nothing about the measurement.
        warnings.simplefilter("ignore", FutureWarning)
        # Runtime defaults (ONNX Runtime's threads spin): the fastest raw number, so the
        # served-vs-raw ratios are measured against the best the model itself can do.
        return load_backend(
            kind,
            weights_dir / file,
            torch.device("cpu"),
            RuntimeOptions(spin=True),
            precision=precision,
        )


def run_raw(
    weights_dir: Path,
    images: dict[str, bytes],
    preprocess: Preprocessor,
    batches: tuple[int, ...] = (1, 8),
    budget: Budget = Budget(),
    variants: tuple[str, ...] = tuple(VARIANTS),
) -> dict[str, dict]:
    """For each variant (``VARIANTS``; those whose file is missing are left out): forward
    throughput at each batch size and single-image latency of each named image. Returns
    ``{label: {"forward": [...], "single_image": {name: {...}}, "precision": ...}}``; a bf16
    row the CPU cannot run has ``skipped`` (the reason) instead of timings."""
    first = next(iter(images.values()))
    pixels = preprocess(first)
    results: dict[str, dict] = {}
    for label in variants:
        if not (weights_dir / VARIANTS[label][1]).is_file():
            continue
        t = time.monotonic()
        backend = load_variant(weights_dir, label)
        load_s = time.monotonic() - t
        if VARIANTS[label][2] == "bf16" and "bf16" not in backend.precision:
            # OpenVINO runs f32 where the CPU has no bf16 units: not a bf16 row.
            results[label] = {
                "file": VARIANTS[label][1],
                "precision": backend.precision,
                "skipped": "this CPU has no bf16 units (OpenVINO)",
            }
            continue
        results[label] = {
            "file": VARIANTS[label][1],
            "precision": backend.precision,
            "load_s": load_s,
            "forward": [forward_throughput(backend, pixels, b, budget) for b in batches],
            "single_image": {
                name: single_image_latency(backend, preprocess, data, budget)
                for name, data in images.items()
            },
        }
        # One model in memory at a time: the next backend's timing should not page.
        del backend
        gc.collect()
    return results
