"""tsctl's ``tag`` and ``embed``: a whole collection (files, folders, paths on stdin) through
the model into Parquet (``--out``, a path or s3://), resumably; ``tag`` without ``--out``
prints the tags. One run writes an output at a time (``serveclient.outputlock``: a second is
refused, exit 8, or waits with ``--wait``). Exit 7 when some files failed. numpy and pyarrow
load only when these run (tsctl list stays quick)."""

from __future__ import annotations

import argparse
from typing import Any

from serveclient import errors
from serveclient.cli.common import (
    DEFAULT_MODELS,
    Commands,
    endpoint_arguments,
    work_dir_argument,
)
from serveclient.cli.jobs import collection_of, job_options
from serveclient.client import Client
from serveclient.collection import Shard
from serveclient.jobs import DEFAULT_OUTS, PART_ROWS
from serveclient.traffic import CLASSES


def register(commands: Commands) -> None:
    """Add this module's commands to ``commands``."""
    for command, task in (("tag", "tags"), ("embed", "embedding")):
        c = commands.add(
            command,
            cmd_tag if command == "tag" else cmd_embed,
            help=f"{task} of files, folders or a list of paths on stdin "
            f"with {DEFAULT_MODELS[task]}, into Parquet",
        )
        c.add_argument(
            "sources",
            nargs="*",
            metavar="FILE|FOLDER|-",
            help="image files, folders (walked for image files), '-' for paths on stdin",
        )
        c.add_argument("--from-stdin", action="store_true", help="read paths from stdin")
        c.add_argument("--model", help=f"default {DEFAULT_MODELS[task]}")
        c.add_argument(
            "--out",
            default=None if command == "tag" else DEFAULT_OUTS[task],
            help=f"Parquet output, a path or s3://bucket/key (default "
            f"{DEFAULT_OUTS[task]}"
            + ("; tag without --out prints the tags)" if command == "tag" else ")"),
        )
        c.add_argument("--shard", help="i/n: only this machine's share of the collection")
        c.add_argument(
            "--wait",
            action="store_true",
            help="when another run writes the same --out, wait for it to finish "
            "(default: refuse at once, naming it)",
        )
        c.add_argument(
            "--verify-sha256",
            action="store_true",
            help="skip files whose bytes hash as stored (else: same size and mtime)",
        )
        c.add_argument(
            "--concurrency", type=int, help="requests in flight (default 2 x batchSize x workers)"
        )
        c.add_argument(
            "--per-request",
            type=int,
            help="images per request (default max_batch_images // batchSize)",
        )
        c.add_argument(
            "--priority",
            choices=sorted(CLASSES),
            default="bulk",
            help="the requests' class (default bulk: the server serves people first and "
            "the job narrows its window on each 503)",
        )
        c.add_argument(
            "--part-rows",
            type=int,
            default=PART_ROWS,
            help=f"rows per Parquet part while the job runs (default {PART_ROWS}; a part is also "
            "written every 2 s): what a killed job can lose and a rerun does again",
        )
        endpoint_arguments(c)
        work_dir_argument(c, "local copy of an s3:// --out while the job runs")
        c.add_argument(
            "--preprocess",
            choices=("auto", "client", "server"),
            default="auto",
            help="where photos are decoded and cropped: 'client' on this machine's cores, "
            "sending 150 KB crops instead of the files (a 12 MP photo is several MB) and "
            "sparing the server the decode: the choice for a GPU server, whose cores cap it "
            "at decoding, or one across a network; 'server' sends the files. auto (default): "
            "client unless the server is a CPU server on this machine, where both sides "
            "share the same cores. Refused when the server crops by another recipe",
        )
        if command == "tag":
            c.add_argument("--topk", type=int)


def cmd_tag(client: Client, args: argparse.Namespace) -> tuple[Any, str, int]:
    from serveclient import batchjob, jobs
    from serveclient.vectors import stored_path

    if args.out is not None:
        return _into_parquet(client, args, "tags")
    sink = batchjob.ListSink()
    options = job_options(args)
    identity = batchjob.model_identity(
        client, options.model_for("tags"), with_management=client.reaches_management
    )
    collection = collection_of(args)
    summary = jobs.run(client, "tags", sink, collection, identity, options)
    order = {e.path: i for i, e in enumerate(collection.entries(Shard.parse(args.shard)))}
    data, lines = {}, []
    for row in sorted(sink.rows, key=lambda r: order.get(r.path, len(order))):
        tags: list[dict] = row.answer if isinstance(row.answer, list) else []
        path = stored_path(row.path)[0]  # a name that is not UTF-8 printed as the Parquet's
        # Each tag carries the precision its answer came with (the Parquet rows' column):
        # the answer stays the list of tags scripts read.
        data[path] = (
            {"error": row.error}
            if row.error
            else [{**tag, "precision": row.precision} for tag in tags]
        )
        lines.append(
            f"{path}: error: {row.error}"
            if row.error
            else f"{path}: " + ", ".join(_tag_text(t) for t in tags)
        )
    return data, "\n".join(lines), errors.Unhealthy.exit_code if summary.failed else 0


def _tag_text(tag: dict) -> str:
    """``label 0.420``, or ``head:label 0.420`` from a model with several heads."""
    head = f"{tag['head']}:" if tag.get("head") else ""
    return f"{head}{tag['label']} {tag['probability']:.3f}"


def cmd_embed(client: Client, args: argparse.Namespace) -> tuple[Any, str, int]:
    return _into_parquet(client, args, "embedding")


def _into_parquet(client: Client, args, task: str) -> tuple[Any, str, int]:
    """``jobs.into_parquet`` into ``--out``, and its summary in words."""
    from serveclient import jobs

    data = jobs.into_parquet(client, task, collection_of(args), args.out, job_options(args))
    out, gone, failures = data["out"], data["gone"], data["failures"]
    lines = [f"{f['path']}: error: {f['error']}" for f in failures]
    if data["failed"] > len(failures):
        lines.append(
            f"... and {data['failed'] - len(failures)} more failures (status = 'error' in {out})"
        )
    lines.append(
        f"wrote {out}: {data['rows']} rows ({data['done']} done, {data['failed']} failed, "
        f"{data['skipped']} already done, {gone or 0} dropped as no longer found) in "
        f"{data['seconds']:.1f} s, {data['bytes_sent'] / 1e6:.1f} MB sent "
        f"({'crops made here' if data['preprocess'] == 'client' else 'the files'})"
        + (f"; {data['cache_hits']} answered from the server's cache" if data["cache_hits"] else "")
    )
    if gone is None:
        lines.append(
            "a folder or source could not be read (its error row above): rows of files not "
            "found were kept, not dropped; rerun when it can be read"
        )
    return data, "\n".join(lines), errors.Unhealthy.exit_code if data["failed"] else 0
