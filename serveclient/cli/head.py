"""tsctl's ``head train FOLDER --out DIR``: tags trained from the user's folders (one subfolder
per label). The photos are embedded through the running server by the same resumable job as
``tsctl embed`` (into ``DIR/embeddings.parquet``; a rerun embeds only what is new), a linear
head is fitted on exactly the photos under FOLDER now and measured on a held-out split
(serveclient.head), and DIR receives the checkpoint ``make archives WEIGHTS=DIR/resnet50.pt
LABELS=DIR/labels.txt`` packs, with the report (``report.json``, ``report.html``: per-label
precision/recall, the confusion table and the mistakes). docs/own-tags.md walks from folders to
a served tagger.

What it promises (docs/own-tags.md, "Interrupted, concurrent, refused"): every value, the
labels and the split are checked before the server is asked anything; one run per DIR at a
time (``serveclient.outputlock``, ``--wait`` to queue); the checkpoint carries its labels, and
each file is written beside its name and renamed over it, so a kill at any moment leaves whole
files, never new weights named by old labels (the build refuses a LABELS file that is not the
list the checkpoint carries)."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serveclient import errors
from serveclient.cli.common import DEFAULT_MODELS, Commands, endpoint_arguments
from serveclient.client import Client

if TYPE_CHECKING:
    from serveclient.head import Fitted, TrainingSet

DEFAULT_BACKBONE = Path("build/weights/resnet50.pt")
OUTPUTS = ("resnet50.pt", "labels.txt", "report.json", "report.html")  # in the order written


def register(commands: Commands) -> None:
    """Add this module's commands to ``commands``."""
    c = commands.add(
        "head",
        cmd_head,
        help="train a tagger for your own labels from folders of photos (head train)",
    )
    c.add_argument("action", choices=("train",), help="train: fit a head on FOLDER")
    c.add_argument("folder", type=_path, metavar="FOLDER", help="one subfolder of photos per label")
    c.add_argument("--out", type=_path, required=True, metavar="DIR", help="where to write")
    c.add_argument(
        "--backbone",
        type=Path,
        default=DEFAULT_BACKBONE,
        help=f"the served checkpoint (default {DEFAULT_BACKBONE}); its sha256 must be the one "
        "the server's describe reports",
    )
    c.add_argument("--model", help=f"the embedding model (default {DEFAULT_MODELS['embedding']})")
    c.add_argument(
        "--test-size", type=float, default=0.25, help="held-out share, stratified (0.25)"
    )
    c.add_argument("--seed", type=int, default=0, help="the split's seed (0)")
    c.add_argument("--C", type=float, default=1.0, dest="c", help="inverse L2 strength (1.0)")
    c.add_argument(
        "--wait",
        action="store_true",
        help="when another run writes DIR, wait for it (default: refuse at once, naming it)",
    )
    endpoint_arguments(c)
    # What the embed job (serveclient.cli.batch) reads, at its defaults.
    c.set_defaults(
        shard=None,
        from_stdin=False,
        verify_sha256=False,
        concurrency=None,
        per_request=None,
        priority="bulk",
        preprocess="auto",
        work_dir=Path(".tsctl-work"),
    )


def _path(text: str) -> Path:
    return Path(text).expanduser()  # a quoted "~/photos" is the folder the shell would name


def cmd_head(client: Client, args: argparse.Namespace) -> tuple[Any, str, int]:
    from serveclient import head, outputlock
    from serveclient.vectors import read_matrix

    photos = _checked(args)
    with outputlock.hold(args.out, wait=args.wait):
        identity, backbone = _backbone(client, args)
        args.out.mkdir(parents=True, exist_ok=True)
        for stale in args.out.glob(".*.partial"):  # what a killed run was writing
            stale.unlink()
        embeddings = args.out / "embeddings.parquet"
        _note(f"{len(photos)} photos under {args.folder}: embedding what is new into {embeddings}")
        embedded = _embed(client, args, embeddings)
        chosen = head.training_set(*read_matrix(embeddings), photos)
        _note(f"fitting the head on {len(chosen.paths)} photos")
        fitted = head.fit(
            chosen.x, chosen.y, chosen.labels, test_size=args.test_size, seed=args.seed, c=args.c
        )
        report = _report(args, chosen, fitted, identity, backbone)
        _note(f"writing {', '.join(OUTPUTS)} into {args.out}")
        _publish(args.out, args.backbone, fitted, report)
    return {**report, "embedding_job": embedded}, "\n".join(_summary(args, report)), 0


def _checked(args: argparse.Namespace) -> dict:
    """Everything refused before the server is asked anything (exit 2): the paths, the values,
    the folders as labels and the split; the photos under FOLDER now (``head.walk``)."""
    from serveclient import head

    if not args.folder.is_dir():
        raise errors.UsageError(
            f"{args.folder} is not a folder", "FOLDER holds one subfolder of photos per label"
        )
    if not args.backbone.is_file():
        raise errors.UsageError(
            f"no backbone checkpoint at {args.backbone}",
            "pass the checkpoint the server was built from: --backbone build/weights/resnet50.pt",
        )
    if args.out.exists() and not args.out.is_dir():
        raise errors.UsageError(f"--out {args.out} is a file", "--out names a folder")
    if not 0 < args.test_size < 1:
        raise errors.UsageError(
            f"--test-size {args.test_size}: the held-out share is a fraction between 0 and 1",
            "e.g. --test-size 0.25 (the default)",
        )
    if not (math.isfinite(args.c) and args.c > 0):
        raise errors.UsageError(
            f"--C {args.c}: the inverse L2 strength is a positive number",
            "e.g. --C 1.0 (the default; smaller regularises more)",
        )
    if not 0 <= args.seed < 2**32:
        raise errors.UsageError(f"--seed {args.seed}: from 0 to 2**32 - 1", "e.g. --seed 0")
    photos = head.walk(args.folder)
    head.check_split(head.label_counts(photos), args.test_size)
    return photos


def _backbone(client: Client, args: argparse.Namespace) -> tuple[dict, dict]:
    """The embedding model's identity and the backbone's record, refused when the served
    weights are not ``--backbone``."""
    from serveclient.batchjob import model_identity

    _, identity = model_identity(
        client,
        args.model or DEFAULT_MODELS["embedding"],
        with_management=client.reaches_management,
    )
    served = identity.get("weights_sha256")
    sha256 = hashlib.sha256(args.backbone.read_bytes()).hexdigest()
    if served is not None and served != sha256:
        raise errors.UsageError(
            f"{args.backbone} (sha256 {sha256[:16]}...) is not the served backbone "
            f"(describe reports {served[:16]}...)",
            "pass the checkpoint the served archive was built from",
        )
    return identity, {
        "path": str(args.backbone),
        "sha256": sha256,
        "checked_against_server": served is not None,
    }


def _embed(client: Client, args: argparse.Namespace, embeddings: Path) -> dict:
    """The embedding job over FOLDER into ``embeddings``; refused when a photo failed."""
    from serveclient.cli.batch import PART_ROWS, _collection

    job_args = argparse.Namespace(
        **{**vars(args), "sources": [str(args.folder)], "out": embeddings, "part_rows": PART_ROWS}
    )
    embedded, _, code = _collection(client, job_args, "embedding")
    if code:
        failures = "; ".join(f"{f['path']}: {f['error']}" for f in embedded["failures"][:5])
        raise errors.Unhealthy(
            f"{embedded['failed']} photos could not be embedded ({failures})",
            "fix or remove them and rerun: what was embedded is kept",
        )
    return embedded


def _report(
    args: argparse.Namespace, chosen: TrainingSet, fitted: Fitted, identity: dict, backbone: dict
) -> dict:
    """report.json: the fit's figures, the rows left out, where it came from, the held-out
    photos and the mistakes among them."""
    held_out = [
        {
            "path": chosen.paths[row],
            "label": chosen.labels[chosen.y[row]],
            "predicted": chosen.labels[predicted],
            "probability": float(probabilities[predicted]),
        }
        for row, predicted, probabilities in zip(
            fitted.test_rows, fitted.predicted, fitted.probabilities
        )
    ]
    return {
        **fitted.report,
        "photos": len(chosen.paths),
        "left_out": chosen.left_out,
        "embedded_by": identity,
        "backbone": backbone,
        "outputs": {
            "weights": str(args.out / OUTPUTS[0]),
            "labels": str(args.out / OUTPUTS[1]),
        },
        "held_out": held_out,
        "mistakes": [h for h in held_out if h["predicted"] != h["label"]],
    }


def _publish(out: Path, backbone: Path, fitted: Fitted, report: dict) -> None:
    """``OUTPUTS``, each written beside its name (``.NAME.partial``) and renamed over it, in
    that order: a kill leaves every name whole, the old file or the new. The checkpoint
    carries its labels; ``labels.txt`` (UTF-8, one per line) is written from the same list."""
    import torch

    from serveclient import head, pages

    labels = fitted.labels
    state = head.fold(torch.load(backbone, map_location="cpu", weights_only=True), fitted)
    checkpoint = {"state_dict": state, "labels": labels}
    thumbs = pages.Thumbnailer(expected=max(1, len(report["mistakes"])))
    # A path's bytes as the file system gave them (a non-UTF-8 name's are surrogate-escaped).
    page = pages.head_page(report, report["mistakes"], thumbs).encode("utf-8", "surrogateescape")
    writers: list[Callable[[Path], Any]] = [
        lambda path: torch.save(checkpoint, path),
        lambda path: path.write_bytes("".join(f"{label}\n" for label in labels).encode()),
        lambda path: path.write_bytes((json.dumps(report, indent=2) + "\n").encode()),
        lambda path: path.write_bytes(page),
    ]
    for name, write in zip(OUTPUTS, writers):
        partial = out / f".{name}.partial"
        write(partial)
        os.replace(partial, out / name)


def _summary(args: argparse.Namespace, report: dict) -> list[str]:
    split, labels, confusion = report["split"], report["labels"], report["confusion"]
    left_out = report["left_out"]
    lines = [
        f"{len(labels)} labels, {report['photos']} photos: {split['train']} trained on, "
        f"{split['held_out']} held out (stratified, seed {args.seed})",
        f"held-out accuracy {report['held_out_accuracy']:.3f}, expected calibration error "
        f"{report['calibration']['expected_calibration_error']:.3f}",
    ]
    if any(left_out.values()):
        lines.append(
            f"left out {sum(left_out.values())} rows of {args.out / 'embeddings.parquet'}: "
            f"{left_out['not_under_folder']} whose photo is no longer under {args.folder} "
            f"(moved, deleted, or embedded from another FOLDER), {left_out['stored_twice']} "
            "the same photo under another spelling of its path"
        )
    lines += [
        f"  {label}: precision {m['precision']:.3f}, recall {m['recall']:.3f} ({m['support']})"
        for label, m in report["per_label"].items()
    ]
    if confusion["counts"]:
        lines.append("confusion (rows: true, columns: predicted): " + ", ".join(labels))
        lines += [f"  {label}: {row}" for label, row in zip(labels, confusion["counts"])]
    else:
        lines.append(
            "most confused (true -> predicted): "
            + ", ".join(
                f"{m['true']} -> {m['predicted']} ({m['count']})"
                for m in confusion["most_confused"][:10]
            )
        )
    if not report["backbone"]["checked_against_server"]:
        lines.append(f"warning: the server reports no weights sha256; {args.backbone} unchecked")
    lines += [
        f"wrote {', '.join(str(args.out / name) for name in OUTPUTS)}",
        f"pack it: make archives WEIGHTS={args.out / OUTPUTS[0]} LABELS={args.out / OUTPUTS[1]}",
    ]
    return lines


def _note(text: str) -> None:
    """A progress line on stderr (stdout holds the answer)."""
    print(f"head train: {text}", file=sys.stderr, flush=True)
