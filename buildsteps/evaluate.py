"""Check every precision an archive can run on your own photos, against your own labels.

    python -m buildsteps.evaluate FOLDER [--weights build/weights | --archive X.mar] [--json]
    make eval PHOTOS=FOLDER

FOLDER holds images, at any depth. An image in a subfolder named after one of the served
model's labels (its ``index_to_name.json``: ImageNet's ``tabby``, ``Egyptian cat``, or your
checkpoint's LABELS, ``tsctl head train``'s folder names) is labelled with that class, the name
compared as written first: a folder ``3`` is the label ``3``, ``ice_cream`` the label
``ice_cream``. Only a name that is no label is then read loosely, where that cannot take
another label's place: in any case with ``_`` for a space (``tiger_cat``) when exactly one
label matches so, and as a class index (``281``) when no label is a number. Any other image
counts for agreement only. Every precision the archive's files can run here is run on every
image through the served preprocessing (``servecore.intake.Preprocessor``) in batches of
``--batch``: top-1/top-5 accuracy on the labelled images, top-1 agreement and embedding cosine
(mean, worst) against float32 on the same weights, and milliseconds per image. A table, or
``--json``; a progress bar on stderr.

What it proves: how far each precision is from float32 on these photos, and how accurate each
is on these labels. Without labels it says nothing about accuracy; with untrained (seeded)
weights it says nothing about ImageNet (docs/backends.md, "Check int8 on your own photos").
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tabulate import tabulate  # the report's table (pinned in requirements.txt)
from tqdm import tqdm  # the progress bar

from buildsteps.quantize import IMAGE_SUFFIXES
from model_files.artifacts import DEFAULT_BACKEND, SERIALIZED, ModelFiles, read_manifest
from servecore.backends import RuntimeOptions, precision_candidates
from servecore.classes import Classes
from servecore.config import HandlerConfig
from servecore.errors import RequestError
from servecore.precision import agreement
from servecore.preprocessor import Preprocessor

REFERENCE = "f32"


@dataclass(frozen=True)
class Photo:
    path: Path
    label: int | None  # ImageNet class index, None when unlabelled


def class_index(name: str, categories: list[str]) -> int | None:
    """The class a folder name names (the module's docstring says how); None when it names
    none, or more than one label loosely."""
    if name in categories:
        return categories.index(name)

    def loose(text: str) -> str:
        return text.replace("_", " ").strip().lower()

    matches = {c for c in categories if loose(c) == loose(name)}
    if len(matches) == 1:
        return categories.index(matches.pop())
    numbers = re.compile("[0-9]+")
    if numbers.fullmatch(name) and not any(numbers.fullmatch(c) for c in categories):
        return int(name) if int(name) < len(categories) else None
    return None


def find_photos(folder: Path, categories: list[str]) -> list[Photo]:
    """Every image under ``folder``, sorted, labelled by the first subfolder it lies in."""
    photos = []
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES:
            parts = path.relative_to(folder).parts
            photos.append(
                Photo(path, class_index(parts[0], categories) if len(parts) > 1 else None)
            )
    if not photos:
        raise SystemExit(f"evaluate: no images ({', '.join(IMAGE_SUFFIXES)}) under {folder}")
    return photos


def preprocess(photos: list[Photo], progress: bool) -> tuple[torch.Tensor, list[Photo], list]:
    """The photos as the server's model inputs; the ones it would refuse are left out (and
    listed with why)."""
    preprocessor = Preprocessor(HandlerConfig())
    tensors, kept, skipped = [], [], []
    for photo in tqdm(photos, desc="decoding", unit="img", disable=not progress):
        try:
            tensors.append(preprocessor(photo.path.read_bytes()))
            kept.append(photo)
        except RequestError as error:
            skipped.append({"path": str(photo.path), "error": error.message})
    if not tensors:
        raise SystemExit("evaluate: no image could be decoded")
    return torch.stack(tensors), kept, skipped


def run(backend, pixels: torch.Tensor, batch: int, label: str, progress: bool):
    """``backend``'s (embedding, logits) for every row, and its milliseconds per image (the
    forwards alone, the first batch not counted: it warms the runtime up)."""
    outputs, spent, timed = [], 0.0, 0
    chunks = list(pixels.split(batch))
    for k, chunk in enumerate(tqdm(chunks, desc=label, unit="batch", disable=not progress)):
        started = time.perf_counter()
        outputs.append(backend(chunk))
        if k > 0 or len(chunks) == 1:
            spent, timed = spent + time.perf_counter() - started, timed + len(chunk)
    embedding = torch.cat([o[0] for o in outputs]).numpy()
    logits = torch.cat([o[1] for o in outputs]).numpy()
    return embedding, logits, 1000 * spent / timed


def accuracy(logits: np.ndarray, labels: list[int | None], classes: Classes | None = None) -> dict:
    """Top-1 and top-5 accuracy over the labelled rows (None without labels); with several
    heads (``classes``), each photo ranked within its label's head."""
    rows = [i for i, label in enumerate(labels) if label is not None]
    if not rows:
        return {"labelled": 0, "top1_accuracy": None, "top5_accuracy": None}
    truth = np.array([labels[i] for i in rows])
    scores = logits[rows]
    if classes is not None and classes.named:
        scores = np.full_like(scores, -np.inf)
        for j, (i, label) in enumerate(zip(rows, truth.tolist())):
            head = classes.head_of(label).rows
            scores[j, head] = logits[i, head]
    top5 = np.argsort(-scores, axis=1)[:, :5]
    return {
        "labelled": len(rows),
        "top1_accuracy": float((top5[:, 0] == truth).mean()),
        "top5_accuracy": float((top5 == truth[:, None]).any(axis=1).mean()),
    }


def evaluate(
    folder: Path, weights: Path, serialized: str, batch: int = 16, progress: bool = True
) -> dict:
    """Every precision the files in ``weights`` can run here, on the photos of ``folder``."""
    files = ModelFiles.read(weights, serialized)
    # The served model's own labels (index_to_name.json), ImageNet's or the user's checkpoint's.
    photos = find_photos(folder, files.labels)
    pixels, photos, skipped = preprocess(photos, progress)
    candidates = precision_candidates(
        files.backend, files.folder, files.serialized, torch.device("cpu"), RuntimeOptions()
    )
    loaders = {c.precision: c.load for c in candidates if c.load is not None}
    excluded = {c.precision: c.excluded for c in candidates if c.load is None}
    labels = [p.label for p in photos]
    classes = Classes.read(files)
    rows, reference = [], None
    for name, load in loaders.items():
        embedding, logits, ms = run(load(), pixels, batch, name, progress)
        reference = reference or (embedding, logits)
        figures = agreement(reference, (embedding, logits), classes.rows)
        rows.append(
            {
                "precision": name,
                **accuracy(logits, labels, classes),
                "top1_agreement_vs_f32": figures["top1_agreement"],
                "embedding_cosine_mean": figures["embedding_cosine_mean"],
                "embedding_cosine_min": figures["embedding_cosine_min"],
                "ms_per_image": round(ms, 2),
            }
        )
    return {
        "folder": str(folder),
        "photos": len(photos),
        "labelled": sum(label is not None for label in labels),
        "batch": batch,
        "weights": files.weights,
        "reference": next(iter(loaders)),
        "precisions": rows,
        "excluded": excluded,
        "skipped": skipped,
    }


def table(report: dict) -> str:
    """The report as a terminal table, with what it can and cannot say underneath."""

    def pct(value):
        return "-" if value is None else f"{100 * value:.1f}%"

    body = [
        [
            r["precision"],
            pct(r["top1_accuracy"]),
            pct(r["top5_accuracy"]),
            pct(r["top1_agreement_vs_f32"]),
            f"{r['embedding_cosine_mean']:.4f}",
            f"{r['embedding_cosine_min']:.4f}",
            f"{r['ms_per_image']:.1f}",
        ]
        for r in report["precisions"]
    ]
    lines = [
        tabulate(
            body,
            headers=["precision", "top-1", "top-5", "agrees f32", "cos mean", "cos min", "ms/img"],
            disable_numparse=True,
        ),
        f"{report['photos']} photos ({report['labelled']} labelled) from "
        f"{report['folder']}, batch {report['batch']}; weights: "
        f"{report['weights'].get('source')}",
    ]
    if not report["weights"].get("trained", False):
        lines.append("UNTRAINED (seeded) weights: accuracy here says nothing about ImageNet")
    if not report["labelled"]:
        lines.append("no labelled photos (class-named subfolders): agreement only")
    lines += [f"{name}: not run ({why})" for name, why in report["excluded"].items()]
    lines += [f"skipped {s['path']}: {s['error']}" for s in report["skipped"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--weights",
        type=Path,
        default=Path("build/weights"),
        help="a weights folder (the files the archives are built from)",
    )
    source.add_argument("--archive", type=Path, help="a .mar: evaluate the files it carries")
    parser.add_argument(
        "--backend",
        choices=sorted(SERIALIZED),
        default=DEFAULT_BACKEND,
        help="with --weights: which runtime's files",
    )
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--json", action="store_true", help="the report as JSON on stdout")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        parser.error(f"{args.folder} is not a folder")
    with tempfile.TemporaryDirectory(prefix="evaluate.") as tmp:
        weights, serialized = args.weights, SERIALIZED[args.backend]
        if args.archive:
            with zipfile.ZipFile(args.archive) as mar:
                mar.extractall(tmp)
                serialized = read_manifest(mar)["serializedFile"]
            weights = Path(tmp)
        report = evaluate(
            args.folder,
            weights,
            serialized,
            args.batch,
            progress=sys.stderr.isatty() or not args.json,
        )
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
