"""``make bench-gpu``: how close the core comes to what the device can do, on the device this
process finds (CUDA, else CPU), in one Markdown report.

    python -m bench.gpu [--quick] [--compile] [--weights DIR] [--out PATH] [--handler K=V]

1. **raw forward**: ``build_dual`` per precision (f32; f16 and bf16 where the device has them)
   and layout (contiguous, channels_last) at fixed batch sizes, float inputs already on the
   device; ``--compile``: also ``torch.compile(mode="reduce-overhead")`` at one batch, with its
   compile time;
2. **pipeline limit**: what a perfect server does, in a plain loop: JPEG bytes -> one batched
   ``decode_jpeg`` on the device (nvJPEG on CUDA) -> resize 232 + centre crop 224 there ->
   the weights' mean/std -> forward at the fastest setting of (1) -> outputs to CPU;
3. **the core**: ``ImageModel.run`` on one request per JPEG (eager backend, ``precision:
   auto``, ``device: cuda`` on a GPU; ``--handler decode_threads=16`` changes a setting), as
   an engine calls it, with its own times per part (open, decode, forward, answer), the
   decoder it chose (nvImageCodec, nvJPEG or the CPU, and why), its CUDA graphs, and each
   image kind again with the overlap off (``gpu_overlap_chunks: 1``).

Small JPEGs (451x300) and noisy 12 MP photos: ``build/samples`` when ``make samples`` wrote
them, else generated (``tests/imagegen.py``). Weights: ``--weights`` (``build/weights``) when
it holds a checkpoint, else seeded ones built into a temporary folder (speed is the same).

Runs bare where only torch, torchvision, numpy and Pillow are installed: (3) needs what the
core imports (psutil) and says ``core skipped: <package> missing`` without it. The report goes
to stdout and to ``results/gpu.md`` on a GPU (``build/bench-gpu.md`` on CPU or with
``--quick``: a CPU run never overwrites GPU figures); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms.v2 import functional as F

from bench.gpucore import core_missing, handler_setting, run_core
from bench.gpureport import Findings, Rate, Setting, report
from bench.layout import BUILD, IMAGES, RESULTS, SAMPLES, WEIGHTS, cli, parse
from bench.markdown import publish
from model_files.artifacts import CHECKPOINT, INFO, LABELS
from model_files.resnet_dual import WEIGHTS as PRESET
from model_files.resnet_dual import build_dual

log = logging.getLogger("bench.gpu")
GPU_REPORT = RESULTS / "gpu.md"
SMALL, LARGE = (451, 300), (4242, 2828)  # the samples' sizes (devtools/samples.py)
LAYOUTS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


@dataclass(frozen=True)
class Plan:
    """Batch sizes and time per measurement: ``raw`` forward batches (the first is the one
    the ratios compare with), a batch of ``small`` and of ``large`` JPEGs for (2) and (3)."""

    raw: tuple[int, ...]
    small: int
    large: int
    seconds: float
    warmup: int = 3
    min_iters: int = 3


GPU_PLAN = Plan(raw=(64, 256), small=64, large=16, seconds=2.0)
CPU_PLAN = Plan(raw=(8, 32), small=16, large=4, seconds=3.0, warmup=1)
QUICK_PLAN = Plan(raw=(4,), small=4, large=2, seconds=0.3, warmup=1, min_iters=2)


def measure(
    step: Callable[[], object],
    images: int,
    plan: Plan,
    sync: Callable[[], None],
    warm: Callable[[], None] = lambda: None,
) -> Rate:
    """``step()`` (``images`` images) after warm-up (then ``warm()``), for ``plan.seconds``
    and at least ``plan.min_iters`` times; the device is synchronised before and after, so
    queued work counts."""
    for _ in range(plan.warmup):
        step()
    sync()
    warm()
    count, started = 0, time.perf_counter()
    while count < plan.min_iters or time.perf_counter() - started < plan.seconds:
        step()
        count += 1
    sync()
    elapsed = time.perf_counter() - started
    return Rate(images * count / elapsed, 1000 * elapsed / count)


def precisions(device: torch.device) -> dict[str, torch.dtype]:
    """f32, and the half precisions torch says this device runs natively."""
    found = {"f32": torch.float32}
    if device.type == "cuda":
        found["f16"] = torch.float16
        if torch.cuda.is_bf16_supported():
            found["bf16"] = torch.bfloat16
    elif torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        found["bf16"] = torch.bfloat16
    return found


def raw_forward(
    base: torch.nn.Module, device: torch.device, plan: Plan, sync: Callable[[], None]
) -> dict[tuple[Setting, int], Rate]:
    """(1): images/s per precision, layout and batch, on random normalised-like inputs."""
    rows: dict[tuple[Setting, int], Rate] = {}
    for precision, dtype in precisions(device).items():
        for layout, fmt in LAYOUTS.items():
            setting = Setting(precision, layout, dtype, fmt)
            model = setting.model(base, device)
            for batch in plan.raw:
                rate = measure(partial(model, setting.inputs(batch, device)), batch, plan, sync)
                log.info("raw %s %s b%d: %.0f img/s", precision, layout, batch, rate.images_per_s)
                rows[setting, batch] = rate
    return rows


def compiled_forward(
    base: torch.nn.Module, setting: Setting, batch: int, device: torch.device, plan: Plan
) -> str:
    """``--compile``: ``setting`` under ``torch.compile(mode="reduce-overhead")`` (CUDA graphs
    on a GPU), as a report line with its compile time, or why it failed."""
    model, x = setting.model(base, device), setting.inputs(batch, device)
    sync = partial(torch.cuda.synchronize, device) if device.type == "cuda" else _no_sync
    started = time.perf_counter()
    try:
        compiled = torch.compile(model, mode="reduce-overhead")
        for _ in range(3):  # compiles, then records the graphs
            compiled(x)
        sync()
        compile_s = time.perf_counter() - started
        rate = measure(partial(compiled, x), batch, plan, sync)
    except Exception as error:  # noqa: BLE001 - a missing compiler is a report line, not a crash
        return f"- `torch.compile` failed: {str(error).splitlines()[0][:200]}"
    return (
        f'- `torch.compile(mode="reduce-overhead")`, {setting.precision} {setting.layout}, '
        f"batch {batch}: **{rate.images_per_s:,.0f} img/s** ({compile_s:.1f} s to compile)"
    )


class Pipeline:
    """JPEG bytes -> outputs on the CPU, every per-pixel step on ``device``."""

    def __init__(self, base: torch.nn.Module, setting: Setting, device: torch.device) -> None:
        self.model, self.setting, self.device = setting.model(base, device), setting, device
        preset = PRESET.transforms()
        self.resize, self.crop = list(preset.resize_size), list(preset.crop_size)
        self.mean = torch.tensor(preset.mean, device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(preset.std, device=device).view(1, 3, 1, 1) * 255

    def __call__(self, jpegs: list[bytearray]) -> tuple[torch.Tensor, torch.Tensor]:
        data = [torch.frombuffer(j, dtype=torch.uint8) for j in jpegs]
        images = decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)
        # Float before resizing: torchvision's antialiased resize on CUDA works in float anyway.
        crops = torch.stack(
            [F.center_crop(F.resize(i.float(), self.resize, antialias=True), self.crop)
             for i in images]
        )  # fmt: skip
        x = ((crops - self.mean) / self.std).to(self.setting.dtype)
        x = x.contiguous(memory_format=self.setting.fmt)
        embedding, logits = self.model(x)
        return embedding.float().cpu(), logits.float().cpu()


def jpegs() -> dict[str, tuple[bytes, str]]:
    """The small JPEG and the noisy 12 MP photo, and where each came from."""
    found: dict[str, tuple[bytes, str]] = {}
    for name, size, seed in (("small", SMALL, 1), ("12mp-noisy", LARGE, 2)):
        path = SAMPLES / IMAGES[name]
        if path.is_file():
            found[name] = (path.read_bytes(), str(path.relative_to(SAMPLES.parent.parent)))
        else:
            from tests import imagegen  # the repo's generator; the samples need scikit-image

            found[name] = (imagegen.jpeg(*size, seed=seed), "generated (tests/imagegen.py)")
    return found


def weights_folder(wanted: Path, scratch: Path) -> Path:
    """A folder with the checkpoint, its info and labels: ``wanted``'s files linked into
    ``scratch`` (the core writes its precision choice beside them), or seeded weights."""
    if all((wanted / name).is_file() for name in (CHECKPOINT, INFO, LABELS)):
        for name in (CHECKPOINT, INFO, LABELS):
            (scratch / name).symlink_to((wanted / name).resolve())
        return scratch
    from buildsteps import weights

    log.info("no weights in %s: building seeded weights in %s", wanted, scratch)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the report only
        weights.build("seeded", scratch)
    return scratch


def _no_sync() -> None:
    pass


def core_timed(
    step: Callable[[], object], images: int, warm: Callable[[], None], plan: Plan
) -> Rate:
    """``measure`` for the core, whose answers are on the CPU when ``run`` returns."""
    return measure(step, images, plan, _no_sync, warm)


def measure_all(
    device: torch.device, images: dict[str, tuple[bytes, str]], args: argparse.Namespace
) -> Findings:
    """(1), (2) and (3), with the weights in a scratch folder."""
    plan = QUICK_PLAN if args.quick else GPU_PLAN if device.type == "cuda" else CPU_PLAN
    batches = {"small": plan.small, "12mp-noisy": plan.large}
    sync = partial(torch.cuda.synchronize, device) if device.type == "cuda" else _no_sync
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as scratch:
        folder = weights_folder(args.weights, Path(scratch))
        weights = str(json.loads((folder / INFO).read_text()).get("source", "unknown"))
        base = build_dual(torch.load(folder / CHECKPOINT, map_location="cpu", weights_only=True))
        benchmark = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = True  # the ceiling: cuDNN picks its fastest kernels
        with torch.inference_mode():
            raw = raw_forward(base, device, plan, sync)
            ref = plan.raw[0]
            best = max((s for s, b in raw if b == ref), key=lambda s: raw[s, ref].images_per_s)
            compiled = ""
            if args.compile:
                batch = 128 if device.type == "cuda" and not args.quick else ref
                compiled = compiled_forward(base, best, batch, device, plan)
            pipeline, limit = Pipeline(base, best, device), {}
            for name, (data, _) in images.items():
                batch_of = [bytearray(data) for _ in range(batches[name])]
                limit[name] = measure(partial(pipeline, batch_of), len(batch_of), plan, sync)
        del pipeline, base
        torch.backends.cudnn.benchmark = benchmark
        if device.type == "cuda":
            torch.cuda.empty_cache()
        core: dict[str, Rate] = {}
        parts: dict[str, dict[str, float]] = {}
        chose = core_missing() or ""
        if not chose:
            work = {n: [d] * batches[n] for n, (d, _) in images.items()}
            try:
                timed = partial(core_timed, plan=plan)
                core, parts, chose = run_core(folder, device, work, dict(args.handler), timed)
            except ModuleNotFoundError as error:
                chose = f"core skipped: {error.name} missing"
            except Exception as error:  # 1 and 2 are still reported, and the exit status is 1
                log.exception("the core failed")
                chose = f"core failed: {type(error).__name__}: {str(error).splitlines()[0]}"
    return Findings(
        device, images, batches, weights, raw, best, ref, compiled, limit, core, parts, chose,
        dict(args.handler), args.quick,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = cli("python -m bench.gpu", __doc__, out=None)
    parser.add_argument("--quick", action="store_true", help="tiny counts: a smoke run")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile")
    parser.add_argument("--weights", type=Path, default=WEIGHTS)
    parser.add_argument("--out", type=Path, help="results/gpu.md on a GPU, else build/")
    parser.add_argument(
        "--handler",
        type=handler_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a handler: setting for the core (decode_threads=16), repeatable",
    )
    args = parse(parser, argv)
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    full_gpu = device.type == "cuda" and not args.quick
    out = args.out or (GPU_REPORT if full_gpu else BUILD / "bench-gpu.md")
    if out.resolve() == GPU_REPORT.resolve() and not full_gpu:
        parser.error(f"{GPU_REPORT} holds GPU figures: give --out for a CPU or --quick run")
    text = report(measure_all(device, jpegs(), args))
    publish(out, text)
    return 1 if "**core failed: " in text else 0


if __name__ == "__main__":
    sys.exit(main())
