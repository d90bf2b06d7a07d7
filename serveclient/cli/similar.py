"""tsctl's search over an ``embed`` output: ``similar`` (the stored photos nearest each query,
exact cosine) and ``duplicates`` (groups of near-duplicates);
``--html``: also a page of thumbnails."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from serveclient.cli.common import (
    DEFAULT_MODELS,
    Commands,
    endpoint_arguments,
    read_image,
    wrote_page,
)
from serveclient.client import Client
from serveclient.traffic import Traffic


def register(commands: Commands) -> None:
    """Add this module's commands to ``commands``."""
    q = commands.add(
        "similar", cmd_similar, help="the stored photos most like each QUERY (exact cosine)"
    )
    q.add_argument(
        "queries", nargs="+", metavar="QUERY", help="image files, embedded by the server"
    )
    q.add_argument("--index", type=Path, required=True, help="an embed output (Parquet)")
    q.add_argument("-k", type=int, default=10, help="neighbours per query (10)")
    q.add_argument("--model", default=DEFAULT_MODELS["embedding"])
    q.add_argument(
        "--deadline-ms",
        type=float,
        help="give up on the server's side after this many ms (504 DeadlineExceeded)",
    )
    q.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="also write a page of thumbnails: each query beside its neighbours",
    )
    endpoint_arguments(q)
    dup = commands.add(
        "duplicates", cmd_duplicates, help="groups of near-duplicate photos in an embed output"
    )
    dup.add_argument("--index", type=Path, required=True)
    dup.add_argument("--threshold", type=float, default=0.97, help="cosine (0.97)")
    dup.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="also write a page of thumbnails: each group side by side",
    )


def cmd_similar(client: Client, args: argparse.Namespace) -> tuple[Any, str, int]:
    import numpy as np

    from serveclient import search

    images = [read_image(query) for query in args.queries]
    vectors = client.infer(
        args.model,
        images,
        output="embedding",
        protocol=args.protocol,
        traffic=Traffic.within(deadline_ms=args.deadline_ms),
    )
    found = search.nearest(
        args.index, np.asarray(vectors, np.float32), args.k, exclude=args.queries
    )
    data = {
        q: [{"path": p, "score": round(s, 6)} for p, s in hits]
        for q, hits in zip(args.queries, found)
    }
    lines = []
    for query, hits in data.items():
        lines.append(f"{query}:")
        lines += [f"  {i}. {h['score']:.4f}  {h['path']}" for i, h in enumerate(hits, 1)]
    if args.html is not None:
        from serveclient import pages

        thumbs = pages.Thumbnailer(expected=len(data) + sum(len(h) for h in data.values()))
        html = pages.similar_page(data, thumbs, index=str(args.index), model=args.model)
        lines.append(wrote_page(args.html, html))
    return data, "\n".join(lines), 0


def cmd_duplicates(client: Client, args: argparse.Namespace) -> tuple[Any, str, int]:
    from serveclient import search

    groups = search.duplicates(args.index, args.threshold)
    lines = [
        f"{len(g['paths'])} files, cosine >= {g['min_score']:.4f}: " + ", ".join(g["paths"])
        for g in groups
    ] or [f"no near-duplicates at cosine >= {args.threshold}"]
    if args.html is not None:
        from serveclient import pages

        thumbs = pages.Thumbnailer(expected=sum(len(g["paths"]) for g in groups))
        html = pages.duplicates_page(
            groups, thumbs, index=str(args.index), threshold=args.threshold
        )
        lines.append(wrote_page(args.html, html))
    return groups, "\n".join(lines), 0
