"""How each runtime's raw forward holds up next to other busy processes:
``python -m bench.contention`` (about 2 minutes; bench/README.md says why it exists).

The forward of TorchServe's stock runtime and ours, from the same weights, alone and beside
each of ``NEIGHBOURS``. Prints a Markdown table.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import torch

from bench import raw
from bench.layout import BUILD, WEIGHTS, cli, parse
from bench.markdown import fmt, table
from bench.stock import SERIALIZED as STOCK_FILE
from bench.stock import export_stock_model
from model_files.artifacts import SERIALIZED
from model_files.recipe import normalize

# Each neighbour prints "ready" once it is busy, so no measurement starts before it does.
BUSY_LOOP = "print('ready', flush=True)\nwhile True: pass\n"
TORCH_LOOP = (
    "import torch, torchvision\n"
    "m = torchvision.models.resnet18().eval(); x = torch.rand(4, 3, 224, 224)\n"
    "with torch.inference_mode():\n"
    "    m(x); print('ready', flush=True)\n"
    "    while True: m(x)\n"
)
NEIGHBOURS = {
    "nothing": [],
    "one busy-looping process": [BUSY_LOOP],
    "two busy-looping processes": [BUSY_LOOP, BUSY_LOOP],
    "one PyTorch process (ResNet18 loop, its own OpenMP threads)": [TORCH_LOOP],
}


def main(argv: list[str] | None = None) -> int:
    parser = cli("python -m bench.contention", __doc__, out=None)
    parser.add_argument("--seconds", type=float, default=6.0, help="per measurement")
    parser.add_argument(
        "--warmup", type=int, default=2, help="untimed forwards before each measurement"
    )
    parser.add_argument("--batch", type=int, default=8, help="images per forward (default 8)")
    args = parse(parser, argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.load's deprecation notice
        stock = torch.jit.load(str(export_stock_model(WEIGHTS, BUILD))).eval()
    ours = raw.load_variant(WEIGHTS, "openvino-f32")
    # Each runtime's own input: stock takes the normalised float crop, ours the uint8 crop.
    crop = torch.randint(0, 256, (3, 224, 224), dtype=torch.uint8)
    inputs = (normalize(crop), crop)
    budget = raw.Budget(
        seconds=args.seconds, min_iters=1, max_iters=10**6, warmup_iters=args.warmup
    )

    def run_stock(pixels: torch.Tensor) -> None:
        with torch.inference_mode():
            stock(pixels)

    rows = []
    for label, codes in NEIGHBOURS.items():
        neighbours = [
            subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
            for code in codes
        ]
        try:
            for process in neighbours:
                if process.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"neighbour {label!r} did not start")
            rates = [
                raw.forward_throughput(run, pixels, args.batch, budget)["images_per_s"]
                for run, pixels in zip((run_stock, ours), inputs)
            ]
        finally:
            for process in neighbours:
                process.kill()
                process.wait()
        rows.append([label, *(fmt(rate) for rate in rates)])
        print(" | ".join(rows[-1]), file=sys.stderr)
    header = ["beside", "TorchScript float32 (stock's runtime), img/s",
              f"OpenVINO {ours.precision} (ours), img/s"]  # fmt: skip
    print(
        f"Batch-{args.batch} forward, {STOCK_FILE} vs {SERIALIZED['openvino']}, "
        f"{args.seconds:g} s each.\n\n" + table(header, rows)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
