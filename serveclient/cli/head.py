"""tsctl's ``head train FOLDER --out DIR``: tags trained from the user's folders (one subfolder
per label). The photos are embedded through the running server by the same resumable job as
``tsctl embed`` (into ``DIR/embeddings.parquet``; a rerun embeds only what is new), a linear
head is fitted and measured on a held-out split (serveclient.head), and DIR receives the
checkpoint ``make archives WEIGHTS=DIR/resnet50.pt LABELS=DIR/labels.txt`` packs, with the
report (``report.json``, ``report.html``: per-label precision/recall, the confusion table and
the mistakes). docs/own-tags.md walks from folders to a served tagger."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

from serveclient import errors
from serveclient.cli.common import DEFAULT_MODELS, Commands, endpoint_arguments, wrote_page
from serveclient.client import Client

DEFAULT_BACKBONE = Path("build/weights/resnet50.pt")


def register(commands: Commands) -> None:
    """Add this module's commands to ``commands``."""
    c = commands.add(
        "head",
        cmd_head,
        help="train a tagger for your own labels from folders of photos (head train)",
    )
    c.add_argument("action", choices=("train",), help="train: fit a head on FOLDER")
    c.add_argument("folder", type=Path, metavar="FOLDER", help="one subfolder of photos per label")
    c.add_argument("--out", type=Path, required=True, metavar="DIR", help="where to write")
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


def cmd_head(client: Client, args: argparse.Namespace) -> tuple[Any, str, int]:
    import torch

    from serveclient import head, pages
    from serveclient.batchjob import model_identity
    from serveclient.cli.batch import PART_ROWS, _collection
    from serveclient.vectors import read_matrix

    if not args.folder.is_dir():
        raise errors.UsageError(
            f"{args.folder} is not a folder", "FOLDER holds one subfolder of photos per label"
        )
    if not args.backbone.is_file():
        raise errors.UsageError(
            f"no backbone checkpoint at {args.backbone}",
            "pass the checkpoint the server was built from: --backbone build/weights/resnet50.pt",
        )
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
    args.out.mkdir(parents=True, exist_ok=True)
    embeddings = args.out / "embeddings.parquet"
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
    paths, x = head.in_path_order(*read_matrix(embeddings))
    labels, y = head.labels_of(paths, args.folder)
    fitted = head.fit(x, y, labels, test_size=args.test_size, seed=args.seed, c=args.c)
    backbone = torch.load(args.backbone, map_location="cpu", weights_only=True)
    torch.save(head.fold(backbone, fitted), args.out / "resnet50.pt")
    (args.out / "labels.txt").write_text("".join(f"{label}\n" for label in labels))
    held_out = [
        {
            "path": paths[row],
            "label": labels[y[row]],
            "predicted": labels[predicted],
            "probability": float(probabilities[predicted]),
        }
        for row, predicted, probabilities in zip(
            fitted.test_rows, fitted.predicted, fitted.probabilities
        )
    ]
    mistakes = [h for h in held_out if h["predicted"] != h["label"]]
    report = {
        **fitted.report,
        "photos": len(paths),
        "embedded_by": identity,
        "backbone": {
            "path": str(args.backbone),
            "sha256": sha256,
            "checked_against_server": served is not None,
        },
        "outputs": {
            "weights": str(args.out / "resnet50.pt"),
            "labels": str(args.out / "labels.txt"),
        },
        "held_out": held_out,
        "mistakes": mistakes,
    }
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    thumbs = pages.Thumbnailer(expected=max(1, len(mistakes)))
    page_line = wrote_page(args.out / "report.html", pages.head_page(report, mistakes, thumbs))
    lines = [
        f"{len(labels)} labels, {len(paths)} photos: {report['split']['train']} trained on, "
        f"{report['split']['held_out']} held out (stratified, seed {args.seed})",
        f"held-out accuracy {report['held_out_accuracy']:.3f}, expected calibration error "
        f"{report['calibration']['expected_calibration_error']:.3f}",
    ]
    lines += [
        f"  {label}: precision {m['precision']:.3f}, recall {m['recall']:.3f} ({m['support']})"
        for label, m in report["per_label"].items()
    ]
    lines.append("confusion (rows: true, columns: predicted): " + ", ".join(labels))
    lines += [f"  {label}: {row}" for label, row in zip(labels, report["confusion"]["counts"])]
    if not report["backbone"]["checked_against_server"]:
        lines.append(f"warning: the server reports no weights sha256; {args.backbone} unchecked")
    lines += [
        f"wrote {args.out / 'resnet50.pt'} and {args.out / 'labels.txt'}",
        page_line,
        f"pack it: make archives WEIGHTS={args.out / 'resnet50.pt'} "
        f"LABELS={args.out / 'labels.txt'}",
    ]
    return {**report, "embedding_job": embedded}, "\n".join(lines), 0
