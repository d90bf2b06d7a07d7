"""tsctl's ``head train FOLDER --out DIR``: tags trained from the user's folders (one subfolder
per label), by ``serveclient.head.train``, which this command calls and prints. The photos are
embedded through the running server by the same resumable job as ``tsctl embed`` (into
``DIR/embeddings.parquet``; a rerun embeds only what is new), a linear head is fitted on exactly
the photos under FOLDER now and measured on a held-out split, and DIR receives the checkpoint
``make archives WEIGHTS=DIR/resnet50.pt LABELS=DIR/labels.txt`` packs, with the report
(``report.json``, ``report.html``: per-label precision/recall, the confusion table and the
mistakes). docs/own-tags.md walks from folders to a served tagger.

What it promises (docs/own-tags.md, "Interrupted, concurrent, refused"): every value, the
labels and the split are checked before the server is asked anything; one run per DIR at a
time (``serveclient.outputlock``, ``--wait`` to queue); the checkpoint carries its labels, and
each file is written beside its name and renamed over it, so a kill at any moment leaves whole
files, never new weights named by old labels (the build refuses a LABELS file that is not the
list the checkpoint carries)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from serveclient import head
from serveclient.cli.common import DEFAULT_MODELS, Commands, endpoint_arguments
from serveclient.cli.jobs import job_options
from serveclient.client import Client


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
        default=head.DEFAULT_BACKBONE,
        help=f"the served checkpoint (default {head.DEFAULT_BACKBONE}); its sha256 must be the "
        "one the server's describe reports",
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


def _path(text: str) -> Path:
    return Path(text).expanduser()  # a quoted "~/photos" is the folder the shell would name


def cmd_head(client: Client, args: argparse.Namespace) -> tuple[Any, str, int]:
    report = head.train(
        client,
        args.folder,
        args.out,
        backbone=args.backbone,
        test_size=args.test_size,
        seed=args.seed,
        c=args.c,
        job=job_options(args),
        note=lambda text: print(f"head train: {text}", file=sys.stderr, flush=True),
    )
    return report, "\n".join(_summary(args, report)), 0


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
    weights, labels_txt = (args.out / name for name in head.OUTPUTS[:2])
    lines += [
        f"wrote {', '.join(str(args.out / name) for name in head.OUTPUTS)}",
        f"pack it: make archives WEIGHTS={weights} LABELS={labels_txt}",
    ]
    return lines
