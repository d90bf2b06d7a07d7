"""What one explanation costs on this machine: time per image of each method at its default settings
(``servecore.config.HandlerConfig``), through ``servecore.explain.compute.Explainer`` exactly as the
handler runs it (top-1 target, no PNG; the PNG is measured on its own), plus the load time and
resident memory of the eager model the explanations need beside the serving backend."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import psutil
import torch

from bench.raw import Budget, timed_loop
from bench.stats import percentile
from model_files.artifacts import CHECKPOINT, ModelFiles
from model_files.recipe import crop, normalize
from servecore.classes import Classes
from servecore.config import EXPLAIN_METHODS, HandlerConfig
from servecore.explain import compute as explain
from servecore.explainvalues import ExplainSpec
from servecore.images import decode_image

# Few iterations: IG at 32 steps is seconds per image here.
FULL_BUDGET = Budget(seconds=10.0, min_iters=3, max_iters=20, warmup_iters=1)
QUICK_BUDGET = Budget(seconds=0.1, min_iters=1, max_iters=1, warmup_iters=0)
QUICK_IG_STEPS = 4  # --quick: a smoke test of the pipeline, not the default's cost


def run_explain(weights_dir: Path, image: bytes, config: HandlerConfig, quick: bool) -> dict:
    """``{"load_s", "rss_added_mb", "methods": {method: {settings, ms_per_image_p50, ...}}}``."""
    rss = psutil.Process().memory_info().rss
    started = time.monotonic()
    explainer = explain.load_explainer(weights_dir / CHECKPOINT, config.explain.png_max_side)
    load_s = time.monotonic() - started
    rss_added_mb = (psutil.Process().memory_info().rss - rss) / 2**20
    picture = decode_image(
        image, max_pixels=config.max_image_pixels, max_bytes=config.max_image_bytes
    )
    pixels = crop(picture).unsqueeze(0)  # the served input: uint8, normalised by the explainer
    with torch.no_grad():
        logits = explainer.dual(normalize(pixels))[1]
    classes = Classes.read(ModelFiles.read(weights_dir, CHECKPOINT))
    budget = QUICK_BUDGET if quick else FULL_BUDGET
    methods = ("gradcam", "ig") if quick else EXPLAIN_METHODS
    results: dict[str, dict] = {}
    for method in methods:
        n_steps = QUICK_IG_STEPS if quick else config.explain.n_steps
        spec = ExplainSpec(method, (), 1, n_steps, config.explain.internal_batch_size, False)
        job = [explain.ExplainJob(spec, range(1), [])]
        run = partial(explainer.explain, pixels, logits, job, classes)
        times = [t * 1000 for t in timed_loop(run, budget)]
        results[method] = {
            "n_steps": n_steps if method == "ig" else None,
            "internal_batch_size": config.explain.internal_batch_size,
            "passes": explain.passes(spec),
            "iterations": len(times),
            "ms_per_image_p50": percentile(times, 50),
        }
    grid = torch.rand(7, 7)
    png_times = [
        t * 1000
        for t in timed_loop(
            lambda: explain.render_png(picture, grid, config.explain.png_max_side), budget
        )
    ]
    png = explain.render_png(picture, grid, config.explain.png_max_side)
    return {
        "load_s": load_s,
        "rss_added_mb": rss_added_mb,
        "methods": results,
        "png": {
            "ms_p50": percentile(png_times, 50),
            "bytes": len(png),
            "max_side": config.explain.png_max_side,
        },
    }
