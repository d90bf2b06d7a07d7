"""tsctl's ``explain``: where the model looked. One FILE: a heatmap on the terminal (and a PNG
with ``--out``); ``--html``: a gallery page of many photos, one request each, paced by the
server's explanation budget and retried like ``embed`` (exit 7 when some failed)."""

from __future__ import annotations

import argparse
import base64
from pathlib import Path
from typing import Any

from serveclient import errors
from serveclient.cli.common import TRITON_URL_HELP, Commands, read_image, url_arguments, wrote_page
from serveclient.cli.jobs import job_options
from serveclient.client import Client
from serveclient.collection import Collection

GALLERY_TOPK = 3  # classes an explanation gallery lists per photo when no target is given


def register(commands: Commands) -> None:
    """Add this module's commands to ``commands``."""
    e = commands.add(
        "explain",
        cmd_explain,
        needs_management=True,
        help="where the model looked: a heatmap for one image, or a gallery page of many (--html)",
    )
    e.add_argument(
        "sources",
        nargs="+",
        metavar="FILE|FOLDER",
        help="one image; with --html, image files and folders (walked)",
    )
    e.add_argument("--model", default="resnet50-tagger")
    e.add_argument("--target", help="a label, or #N for class index N (default: the top-1 class)")
    e.add_argument("--topk", type=int, help="explain the k most probable classes")
    e.add_argument("--method", help="gradcam (default), ig or occlusion")
    e.add_argument("--n-steps", type=int, help="integrated-gradients steps")
    e.add_argument("--out", type=Path, help="write the heatmap PNG here")
    e.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help=f"a gallery page: each photo, its heatmap and the explained classes "
        f"(default: the top {GALLERY_TOPK})",
    )
    e.add_argument(
        "--concurrency",
        type=int,
        help="with --html: requests in flight (default: what the server's "
        "explanation budget admits, from describe)",
    )
    url_arguments(e, TRITON_URL_HELP)


def cmd_explain(client: Client, args: argparse.Namespace) -> tuple[Any, str, int]:
    if args.html is not None:
        return _explain_gallery(client, args)
    if len(args.sources) != 1 or Path(args.sources[0]).is_dir():
        raise errors.UsageError(
            "explain answers one FILE on the terminal",
            "for several files or a folder, add --html gallery.html",
        )
    if args.concurrency is not None:
        raise errors.UsageError("--concurrency paces a gallery", "add --html gallery.html")
    path = Path(args.sources[0])
    image = read_image(path)
    answer = client.explain(
        args.model,
        image,
        filename=path.name,
        target=args.target,
        topk=args.topk,
        method=args.method,
        n_steps=args.n_steps,
        png=args.out is not None,
    )
    lines = [f"{path}: {answer['method']}"]
    for item in answer["explanations"]:
        lines.append(
            f"  {item['label']} (index {item['index']}, probability "
            f"{item['probability']:.3f}): {len(item['grid'])}x{len(item['grid'][0])} "
            "grid" + (", empty" if item.get("empty") else "")
        )
    if args.out is not None:
        args.out.write_bytes(base64.b64decode(answer["explanations"][0]["png"]))
        lines.append(f"wrote {args.out} (heatmap of the first target over the image)")
    data = {
        **answer,
        "explanations": [
            {k: v for k, v in e.items() if k != "png"} for e in answer["explanations"]
        ],
    }
    return data, "\n".join(lines), 0


def _explain_gallery(client: Client, args: argparse.Namespace) -> tuple[Any, str, int]:
    """``explain --html``: every photo explained (one request each, paced by the server's
    explanation budget, retried like ``embed``), into one gallery page."""
    from serveclient import batchjob, jobs, pages

    if args.out is not None:
        raise errors.UsageError("--out writes one heatmap; --html a gallery", "give one of them")
    collection = Collection(list(args.sources))
    identity = batchjob.model_identity(client, args.model)
    # Without a target, the top classes (the gallery's "top tags"; the heatmap is the first's),
    # as many as one request may cost within the batch budget (IG: fewer than GradCAM).
    per_target, budget = batchjob.explain_budget(identity[0], args.method, args.n_steps)
    topk = args.topk or (
        None if args.target is not None else max(1, min(GALLERY_TOPK, budget // per_target))
    )
    targets = topk or 1
    plan = batchjob.Plan.for_explanations(
        identity[0], args.method, args.n_steps, targets, args.concurrency
    )
    gallery = pages.ExplainGallery(
        pages.Thumbnailer(expected=2 * sum(1 for _ in collection.entries()))
    )
    options = {
        "target": args.target,
        "topk": topk,
        "method": args.method,
        "n_steps": args.n_steps,
        "png": True,
    }
    job = job_options(args)
    summary = jobs.run(
        client, "explain", gallery, collection, identity, job, plan=plan, explain=options
    )
    order = {e.path: i for i, e in enumerate(collection.entries())}
    items = sorted(gallery.items, key=lambda item: order.get(item.path, len(order)))
    handler = ((identity[0] or {}).get("customizedMetadata") or {}).get("handler") or {}
    method = args.method or (handler.get("explain") or {}).get("method") or "the model's default"
    target = args.target if args.target is not None else f"the {topk} most probable classes"
    html = pages.explain_page(items, args.model, method, target, gallery.left_out)
    lines = [f"{p}: error: {e}" for p, e in summary.failures]
    lines.append(f"{summary.done} explained, {summary.failed} failed in {summary.seconds:.1f} s")
    lines.append(wrote_page(args.html, html))
    data = {
        "html": str(args.html),
        "method": method,
        "target": target,
        "photos": [
            {
                "path": i.path,
                "error": i.error,
                "targets": [{"label": label, "probability": p} for label, p in i.targets],
            }
            for i in items
        ],
    }
    return data, "\n".join(lines), errors.Unhealthy.exit_code if summary.failed else 0
