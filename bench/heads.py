"""Several tagger heads from one forward, measured: the core's ``ImageModel.run`` (parse, decode,
forward, answers; no engine) on the same batches of JPEGs, side by side in one process,
interleaved round by round:

- **one head**: the built weights (``build/weights``: ImageNet's head, or the seeded stand-in);
- **two heads, one forward**: the same weights with a 37-class head added on the same backbone
  (``buildsteps.weights --add-head``, as a user adds the head ``tsctl head train`` made);
- **two models**: the one-head model, then the 37-class head served as a model of its own (two
  forwards: what serving a second tagger costs without heads).

Each row: the median milliseconds per batch of the whole ``run`` and of the forward alone
(the backend called on the batch's crops), and the ratio to one head. The 37-class head is a
seeded random ``fc`` on the built backbone: its timing is what is measured, not its tags. The
backend is eager PyTorch at f32 (every backend computes the heads as one ``fc``, so the
comparison holds for each; eager needs no export).

    python -m bench.heads [--batch 8] [--rounds 7]      # -> results/heads.md
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.layout import BUILD, IMAGES, RESULTS, SAMPLES, WEIGHTS, cli, parse
from bench.machine import dated
from bench.markdown import document, publish, table

CLASSES = 37
HEAD = "products"


def _weights(root: Path) -> dict[str, Path]:
    """The weights folders of the three set-ups, built under ``root`` (the one-head model is
    the built weights themselves)."""
    import torch

    from buildsteps import weights
    from model_files.artifacts import CHECKPOINT, LABELS, load_labels

    state = torch.load(WEIGHTS / CHECKPOINT, weights_only=True)
    generator = torch.Generator().manual_seed(CLASSES)
    head = {
        **state,
        "fc.weight": torch.randn(CLASSES, state["fc.weight"].shape[1], generator=generator),
        "fc.bias": torch.zeros(CLASSES),
    }
    root.mkdir(parents=True, exist_ok=True)
    torch.save(head, root / f"{HEAD}.pt")
    (root / f"{HEAD}.txt").write_text("".join(f"{HEAD}-{i}\n" for i in range(CLASSES)))
    added = weights.AddedHead(HEAD, root / f"{HEAD}.pt", root / f"{HEAD}.txt")
    # The built checkpoint itself as the source: the same backbone and first head, whatever
    # it came from (1,000 classes: ImageNet's names; else its own labels).
    labels = None
    if state["fc.weight"].shape[0] != 1000:
        labels = root / "labels.txt"
        labels.write_text("".join(f"{name}\n" for name in load_labels(WEIGHTS / LABELS)))
    weights.build(str(WEIGHTS / CHECKPOINT), root / "two-heads", labels, heads=[added])
    weights.build(str(root / f"{HEAD}.pt"), root / HEAD, root / f"{HEAD}.txt")
    return {"one head": WEIGHTS, "two heads": root / "two-heads", HEAD: root / HEAD}


def _model(folder: Path, batch: int) -> Any:
    from model_files.artifacts import CHECKPOINT, ModelFiles
    from servecore.config import HandlerConfig
    from servecore.service import ImageModel, ModelSettings

    config = HandlerConfig.from_mapping(
        {"task": "tags", "precision": "f32", "precision_cache": "off", "device": "cpu"}
    )
    files = ModelFiles.read(folder, CHECKPOINT)
    return ImageModel(ModelSettings(files, "resnet50-tagger", "bench", config, batch_size=batch))


def _values(reply: Any) -> Any:
    """An edge that sends the core's reply as it is (no engine's encoding)."""
    if reply.error is not None:
        raise RuntimeError(f"the core refused a bench image: {reply.error}")
    return reply, reply


def measure(batch: int, rounds: int) -> dict[str, dict[str, float]]:
    """Per set-up, the median ms per batch of ``run`` and of the forward alone."""
    import torch

    from servecore.edges.http import HttpRequest
    from servecore.stages import Incoming

    folders = _weights(BUILD / "heads")
    models = {name: _model(folder, batch) for name, folder in folders.items()}
    jpeg = (SAMPLES / IMAGES["small"]).read_bytes()
    one = models["one head"]
    incoming = [Incoming(str(i), HttpRequest(body=jpeg)) for i in range(batch)]
    crops = torch.stack([one.intake.preprocessor(jpeg)] * batch)
    setups: dict[str, list[Any]] = {
        "one head": [models["one head"]],
        "two heads, one forward": [models["two heads"]],
        "two models, two forwards": [models["one head"], models[HEAD]],
    }
    runs: dict[str, list[float]] = {name: [] for name in setups}
    forwards: dict[str, list[float]] = {name: [] for name in setups}

    def timed(call: Callable[[], object]) -> float:
        started = time.perf_counter()
        call()
        return 1000 * (time.perf_counter() - started)

    with torch.inference_mode():
        for served in setups.values():  # warm-up, and a check that each answers
            for model in served:
                model.run(incoming, _values)
        for _ in range(rounds):
            for name, served in setups.items():
                runs[name].append(sum(timed(partial(m.run, incoming, _values)) for m in served))
                forwards[name].append(sum(timed(partial(m.backend, crops)) for m in served))
    return {
        name: {
            "run_ms": statistics.median(runs[name]),
            "forward_ms": statistics.median(forwards[name]),
        }
        for name in setups
    }


def render(figures: dict[str, dict[str, float]], batch: int, rounds: int) -> str:
    base = figures["one head"]
    rows = [
        [name, f"{f['run_ms']:.1f}", f"{f['run_ms'] / base['run_ms']:.3f}",
         f"{f['forward_ms']:.1f}", f"{f['forward_ms'] / base['forward_ms']:.3f}"]
        for name, f in figures.items()
    ]  # fmt: skip
    return document(
        "Several heads from one forward",
        "Written by `make bench-heads` (bench/heads.py): the core's `ImageModel.run` on "
        f"batches of {batch} small JPEGs ({IMAGES['small']}), eager PyTorch f32, median "
        f"of {rounds} interleaved rounds. A head adds one `fc` of {CLASSES} x 2,048 "
        "multiply-adds per image to the backbone's ~4.1 G.",
        dated(),
        table("set-up | run ms/batch | x one head | forward ms/batch | x one head", rows, "lrrrr"),
    )


def main(argv: list[str] | None = None) -> int:
    parser = cli("python -m bench.heads", __doc__, out=RESULTS / "heads.md")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    args = parse(parser, argv)
    return publish(args.out, render(measure(args.batch, args.rounds), args.batch, args.rounds))


if __name__ == "__main__":
    raise SystemExit(main())
