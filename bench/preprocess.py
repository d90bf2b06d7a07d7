"""The CPU path before and after uint8 went to the model (#41), side by side in one run:
``python -m bench.preprocess`` (``make bench-preprocess``, about 2 minutes) ->
results/preprocess.md.

Before, the intake ran the weights' whole transform per image (resize, crop, to float,
mean/std) and the model took float32 [N, 3, 224, 224]; now the intake stops at the uint8 crop
and the model normalises inside its graph. Measured, on this host and in one process:

1. per image, one thread: decoding alone (as the intake decodes: headers, JPEG draft scaling,
   RGB), then decode + the float transform (before) and decode + the uint8 crop (now), on a
   small JPEG and a noisy 12 MP photo;
2. the in-process pipeline at batch 8 (``bench.raw.pipeline_throughput``: decode threads as
   the handler's, stack, one forward) with the float-input IR exported for this run against
   the served uint8-input IR, OpenVINO at f32 and, where the CPU runs it, bf16. The two
   variants alternate round by round, so drift on the machine hits both alike.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from bench import raw
from bench.layout import IMAGES, RESULTS, SAMPLES, WEIGHTS, cli, parse
from bench.machine import dated
from bench.markdown import document, fmt, publish, section, table
from buildsteps.export import _onnx_to_ir
from model_files.artifacts import CHECKPOINT, SERIALIZED
from model_files.recipe import crop
from model_files.resnet_dual import WEIGHTS as TORCHVISION_WEIGHTS
from model_files.resnet_dual import build_dual
from servecore.backends import Backend, load_backend
from servecore.config import HandlerConfig
from servecore.images import decode
from servecore.preprocessor import Preprocessor

PHOTOS = ("small", "12mp-noisy")


def float_input_ir(weights_dir: Path, folder: Path) -> Path:
    """The served IR as it was before #41: float32 input, no normalisation in the graph."""
    model = build_dual(torch.load(weights_dir / CHECKPOINT, map_location="cpu", weights_only=True))
    onnx = folder / "float_input.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (torch.randn(2, 3, 224, 224),),
            str(onnx),
            input_names=["input"],
            output_names=["embedding", "logits"],
            dynamic_axes={name: {0: "batch"} for name in ("input", "embedding", "logits")},
            opset_version=17,
            dynamo=False,
        )
    xml = folder / "float_input.xml"
    _onnx_to_ir(onnx, xml)
    return xml


def per_image_ms(step: Callable[[], object], seconds: float) -> float:
    """Median milliseconds of ``step`` (after one warm-up call)."""
    times = raw.timed_loop(step, raw.Budget(seconds=seconds, min_iters=3, warmup_iters=1))
    return 1000 * statistics.median(times)


def per_image(preprocess: Preprocessor, data: bytes, seconds: float) -> dict[str, float]:
    transform = TORCHVISION_WEIGHTS.transforms()
    return {
        "decode_ms": per_image_ms(lambda: decode(preprocess.open(data)), seconds),
        "float_ms": per_image_ms(lambda: transform(decode(preprocess.open(data))), seconds),
        "uint8_ms": per_image_ms(lambda: crop(decode(preprocess.open(data))), seconds),
    }


def pipelines(
    before: Backend, now: Backend, data: bytes, rounds: int, seconds: float
) -> tuple[float, float]:
    """img/s of the batch-8 pipeline before and now, the best of ``rounds`` alternating rounds
    each (the best: what each can do, interference only ever slows a round)."""
    config = HandlerConfig()
    transform = TORCHVISION_WEIGHTS.transforms()

    def old_preprocess(data: bytes) -> torch.Tensor:
        return transform(decode(Preprocessor(config).open(data)))

    budget = raw.Budget(seconds=seconds, min_iters=2, warmup_iters=1)
    rates: dict[str, list[float]] = {"before": [], "now": []}
    for _ in range(rounds):
        for label, backend, step in (
            ("before", before, old_preprocess),
            ("now", now, Preprocessor(config)),
        ):
            measured = raw.pipeline_throughput(backend, step, data, 8, budget)
            rates[label].append(measured["images_per_s"])
    return max(rates["before"]), max(rates["now"])


def pipeline_rows(photos: dict[str, bytes], quick: bool, rounds: int, seconds: float) -> list:
    """The pipeline table's rows: each precision (f32; bf16 too where the CPU runs it) and
    photo, the float-input IR before against the served IR now."""
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory(prefix="bench-preprocess.") as tmp:
        old_ir = float_input_ir(WEIGHTS, Path(tmp))
        for precision in ("f32",) if quick else ("f32", "bf16"):
            cpu, served = torch.device("cpu"), WEIGHTS / SERIALIZED["openvino"]
            before = load_backend("openvino", old_ir, cpu, precision=precision)
            now = load_backend("openvino", served, cpu, precision=precision)
            if precision == "bf16" and "bf16" not in now.precision:
                no_bf16 = "not run: no bf16 units on this CPU"
                rows.append([f"openvino {precision}", "-", "-", no_bf16])
                continue
            for name, data in list(photos.items())[: 1 if quick else None]:
                old_rate, new_rate = pipelines(before, now, data, rounds, seconds)
                rows.append([f"openvino {now.precision}, {name}", fmt(old_rate), fmt(new_rate),
                             f"{new_rate / old_rate:.2f}x"])  # fmt: skip
                print(" | ".join(rows[-1]), file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = cli("python -m bench.preprocess", __doc__, out=RESULTS / "preprocess.md")
    parser.add_argument("--quick", action="store_true", help="a smoke run: seconds, not minutes")
    args = parse(parser, argv)
    seconds, rounds = (0.2, 1) if args.quick else (3.0, 3)
    photos = {name: (SAMPLES / IMAGES[name]).read_bytes() for name in PHOTOS}
    preprocess = Preprocessor(HandlerConfig())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    single = {name: per_image(preprocess, data, seconds) for name, data in photos.items()}
    torch.set_num_threads(threads)
    per_photo = [
        [name, fmt(m["decode_ms"], 2), fmt(m["float_ms"], 2), fmt(m["uint8_ms"], 2),
         f"{m['float_ms'] / m['uint8_ms']:.2f}x"]
        for name, m in single.items()
    ]  # fmt: skip
    text = document(
        "The CPU path before and after uint8 to the model",
        "Generated by `make bench-preprocess` (bench/preprocess.py): the intake's float transform"
        " with a float-input model (before #41) against the uint8 crop with the served model,"
        " side by side in one process. Ratios are the figure to read.",
        dated(),
        section(
            "Per image, one thread (median ms)",
            table("photo | decode | + float transform | + uint8 crop | before / now", per_photo),
        ),
        section(
            "Pipeline at batch 8 (decode threads, stack, one forward; img/s, best of "
            f"{rounds} alternating rounds)",
            table("row | before (float), img/s | now (uint8), img/s | now / before",
                  pipeline_rows(photos, args.quick, rounds, seconds)),
        ),
    )  # fmt: skip
    return publish(args.out, text)


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"bench.preprocess: {time.monotonic() - started:.0f} s", file=sys.stderr)
    raise SystemExit(code)
