"""tsctl's search over an ``embed`` output: ``similar`` (the stored photos nearest each query)
and ``duplicates`` (groups of near-duplicates), through whichever ``serveclient.search.open``
chooses: the vector index ``tsctl index build`` writes (``--index``: a folder, by default
``EMBEDDINGS.vindex/`` beside the Parquet, or a Milvus URI, a server's ``http://HOST:19530`` or
Milvus Lite's ``NAME.db``) when there is one, else (or with ``--exact``) exact cosine over the
``--embeddings`` Parquet; ``--html``: also a page of thumbnails. ``similar --stored`` takes
photos of the collection as queries, by the path stored there. ``-k``, ``--threshold`` and
``--max-pairs`` are checked here, whatever answers (exit 2). The spellings of the release
before (``--index PARQUET``, ``--vindex INDEX``) are read with a warning (``_respelled``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serveclient.cli.common import (
    DEFAULT_MODELS,
    Commands,
    endpoint_arguments,
    milvus_token,
    milvus_token_argument,
    read_image,
    work_dir_argument,
    wrote_page,
)
from serveclient.client import Client
from serveclient.errors import UsageError
from serveclient.search import MAX_K, MAX_PAIRS, MOST_PAIRS
from serveclient.traffic import Traffic

if TYPE_CHECKING:
    from serveclient.search import VectorSearch


def register(commands: Commands) -> None:
    """Add this module's commands to ``commands``."""
    q = commands.add(
        "similar", cmd_similar, help="the stored photos most like each QUERY (exact cosine)"
    )
    q.add_argument(
        "queries",
        nargs="+",
        metavar="QUERY",
        help="image files, embedded by the server; with --stored, paths the embed output holds",
    )
    q.add_argument(
        "--stored",
        action="store_true",
        help="each QUERY is a photo of the collection: its stored vector is the query "
        "(no server asked)",
    )
    q.add_argument(
        "-k", type=_whole(MAX_K), default=10, help=f"neighbours per query (10; 1 to {MAX_K:,})"
    )
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
    _search_arguments(q)
    endpoint_arguments(q)
    dup = commands.add(
        "duplicates", cmd_duplicates, help="groups of near-duplicate photos in an embed output"
    )
    dup.add_argument(
        "--threshold", type=_cosine, default=0.97, help="cosine, above 0 and at most 1 (0.97)"
    )
    dup.add_argument(
        "--max-pairs",
        type=_whole(MOST_PAIRS),
        default=MAX_PAIRS,
        help=f"stop after this many pairs, saying so ({MAX_PAIRS:,}; at most {MOST_PAIRS:,})",
    )
    _search_arguments(dup)
    dup.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="also write a page of thumbnails: each group side by side",
    )
    _index_command(commands)


def _index_command(commands: Commands) -> None:
    """``tsctl index build``: its parser."""
    build = commands.add(
        "index", cmd_index, help="build or update the approximate index of embed outputs"
    )
    build.add_argument("action", choices=["build"])
    build.add_argument(
        "inputs",
        nargs="+",
        metavar="PARQUET",
        help="embed outputs, or folders of shards (or s3://BUCKET/PREFIX/ of an Indexed Job's)",
    )
    build.add_argument(
        "--out",
        help="the index folder (default: FIRST.vindex beside the first input), or a Milvus URI "
        "(http://HOST:19530, or Milvus Lite's NAME.db)",
    )
    _collection_argument(build)
    work_dir_argument(build, "local copies of s3:// inputs, fetched again only when they change")
    build.add_argument("--no-progress", action="store_true", help="no progress bar")
    build.add_argument(
        "--wait",
        action="store_true",
        help="another build of the same folder running: wait for it (default: refuse at once)",
    )


def _whole(most: int) -> Callable[[str], int]:
    """An argparse type: a whole number from 1 to ``most``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if not 1 <= value <= most:
            raise argparse.ArgumentTypeError(
                f"expected a whole number from 1 to {most:,}, not {text}"
            )
        return value

    return parse


def _cosine(text: str) -> float:
    """An argparse type: a cosine threshold, above 0 and at most 1 (NaN is neither)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(
            f"expected a cosine above 0 and at most 1 (0.97: near-copies), not {text}"
        )
    return value


def _search_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--embeddings",
        type=Path,
        metavar="PARQUET",
        help="an embed output (Parquet); not needed with --index",
    )
    parser.add_argument(
        "--index",
        metavar="FOLDER|URI",
        help="a vector index: the folder `tsctl index build` wrote (default: EMBEDDINGS.vindex "
        "when it exists), or a Milvus URI",
    )
    parser.add_argument("--vindex", help=argparse.SUPPRESS)  # --index's old name, for a release
    parser.add_argument(
        "--exact", action="store_true", help="exact search over the Parquet, not the index"
    )
    _collection_argument(parser)


def _collection_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--collection",
        help="with a Milvus URI: the collection (default: the first embed output's name)",
    )
    milvus_token_argument(parser)


def _opened(args: argparse.Namespace) -> VectorSearch:
    """The search the options name (``serveclient.search.open``), old spellings read."""
    from serveclient import search

    _respelled(args)
    token = milvus_token(args)
    return search.open(
        args.embeddings, args.index, exact=args.exact, collection=args.collection, token=token
    )


def _respelled(args: argparse.Namespace) -> None:
    """The release before's spellings, read for one more release with a warning on stderr:
    ``--index X`` where X is a file that is not Milvus Lite's ``.db`` (or a missing
    ``.parquet``) was the embed output, now ``--embeddings X``; ``--vindex X`` is ``--index X``."""
    from serveclient.search.milvusindex import is_uri

    old = args.index or ""
    missing_parquet = old.endswith(".parquet") and not Path(old).exists()
    if args.embeddings is None and not is_uri(old) and (Path(old).is_file() or missing_parquet):
        _warn(args, f"--index {old} names a file, not an index: read as --embeddings {old}")
        args.embeddings, args.index = Path(old), None
    if args.vindex is not None:
        _warn(args, f"--vindex is now --index: read as --index {args.vindex}")
        args.index = args.vindex


def _warn(args: argparse.Namespace, text: str) -> None:
    print(
        f"tsctl {args.command}: warning: {text} (--embeddings names the Parquet, --index a "
        "vector index; the old spellings go in the next release)",
        file=sys.stderr,
    )


def cmd_index(client: Client, args: argparse.Namespace) -> tuple[Any, str, int]:
    from serveclient.search import faissindex, milvusindex

    progress, work = not args.no_progress, args.work_dir
    first = Path(args.inputs[0].rstrip("/"))
    if args.out and milvusindex.is_uri(args.out):
        collection = args.collection or milvusindex.collection_for(first)
        where = f"{collection} at {args.out}"
        token = milvus_token(args)
        built = milvusindex.build(args.inputs, args.out, collection, progress, work, token)
        data = {"uri": args.out, "collection": collection, **vars(built)}
    else:
        if not args.out and "://" in args.inputs[0]:
            raise UsageError(f"where should the index of {args.inputs[0]} go?", "add --out")
        folder = Path(args.out) if args.out else faissindex.default_folder(first)
        where = str(folder)
        built = faissindex.build(args.inputs, folder, progress, work, wait=args.wait)
        data = {"folder": where, **vars(built)}
    text = f"{where}: {built.count} vectors ({built.spec}), {built.added} added, "
    text += f"{built.removed} removed"
    if built.trained_at is not None:
        text += (
            f"; quantisers trained on a sample of its {built.trained_at:,} vectors"
            if built.trained
            else f"; not retrained (its quantisers were trained at {built.trained_at:,} vectors)"
        ) + f", trained anew past {built.retrain_past:,}"
    return data, text, 0


def cmd_similar(client: Client, args: argparse.Namespace) -> tuple[Any, str, int]:
    import numpy as np

    searched = _opened(args)
    if args.stored:
        queries = searched.stored(args.queries)
    else:
        vectors = client.infer(
            args.model,
            [read_image(query) for query in args.queries],
            output="embedding",
            protocol=args.protocol,
            traffic=Traffic.within(deadline_ms=args.deadline_ms),
        )
        queries = np.asarray(vectors, np.float32)
    found = searched.nearest(queries, args.k, exclude=args.queries)
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
        html = pages.similar_page(data, thumbs, index=searched.where, model=args.model)
        lines.append(wrote_page(args.html, html))
    return data, "\n".join(lines), 0


def cmd_duplicates(client: Client, args: argparse.Namespace) -> tuple[Any, str, int]:
    searched = _opened(args)
    found = searched.duplicates(args.threshold, args.max_pairs)
    lines = [
        f"{len(g['paths'])} files, cosine >= {g['min_score']:.4f}: " + ", ".join(g["paths"])
        for g in found.groups
    ] or [f"no near-duplicates at cosine >= {args.threshold}"]
    if found.note:
        lines.append(found.note.strip())
    if args.html is not None:
        from serveclient import pages

        thumbs = pages.Thumbnailer(expected=sum(len(g["paths"]) for g in found.groups))
        html = pages.duplicates_page(found, thumbs, index=searched.where, threshold=args.threshold)
        lines.append(wrote_page(args.html, html))
    data = {"groups": found.groups, "pairs": found.pairs, "complete": found.complete}
    return data, "\n".join(lines), 0
