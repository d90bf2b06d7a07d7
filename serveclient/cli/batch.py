"""tsctl's ``tag`` and ``embed``: a whole collection (files, folders, paths on stdin) through
the model into Parquet (``--out``, a path or s3://), resumably; ``tag`` without ``--out``
prints the tags. One run writes an output at a time (``serveclient.outputlock``: a second is
refused, exit 8, or waits with ``--wait``). Exit 7 when some files failed. numpy and pyarrow
load only when these run (tsctl list stays quick)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from serveclient import errors, objectstore
from serveclient.cli.common import (
    DEFAULT_MODELS,
    Commands,
    endpoint_arguments,
    work_dir_argument,
)
from serveclient.cli.jobs import collection_of, run_job
from serveclient.client import Client
from serveclient.collection import Shard
from serveclient.traffic import CLASSES

DEFAULT_OUTS = {"embedding": "embeddings.parquet", "tags": "tags.parquet"}
PART_ROWS = 1024  # rows per Parquet part while a job runs (--part-rows)


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
    from serveclient import batchjob
    from serveclient.vectors import stored_path

    if args.out is not None:
        return _collection(client, args, "tags")
    sink = batchjob.ListSink()
    identity = batchjob.model_identity(
        client, args.model or DEFAULT_MODELS["tags"], with_management=client.reaches_management
    )
    collection = collection_of(args)
    summary = run_job(client, args, "tags", sink, collection, identity)
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
    return _collection(client, args, "embedding")


def _collection(client: Client, args, task: str) -> tuple[Any, str, int]:
    """Run the job into Parquet (``--out``, a local path or s3://) holding the output's lock
    (``--wait``: wait for another run's): resume, merge, report. After a complete run the
    output holds one row for each file of this walk and nothing else."""
    import pyarrow.parquet as pq

    from serveclient import batchjob, outputlock
    from serveclient.vectors import Output

    out = str(args.out or DEFAULT_OUTS[task])
    if out.endswith(".npy"):
        raise errors.UsageError(
            f"--out {out}: embeddings are written as Parquet now",
            "use --out embeddings.parquet; read it with pandas, polars, "
            "DuckDB or serveclient.vectors.read_matrix",
        )
    if args.part_rows < 1:
        raise errors.UsageError(
            f"--part-rows {args.part_rows}: at least 1", f"the default is {PART_ROWS}"
        )
    remote = objectstore.is_remote(out)
    local = objectstore.local_copy(out, args.work_dir) if remote else Path(out)
    # For s3:// the lock guards the local copy (one --work-dir): a bucket has no lock to take.
    with outputlock.hold(local, wait=getattr(args, "wait", False)):
        if remote:
            objectstore.download_if_exists(out, local)
        identity = batchjob.model_identity(
            client, args.model or DEFAULT_MODELS[task], with_management=client.reaches_management
        )
        output = Output(local, task, {**identity[1], "shard": str(Shard.parse(args.shard))})
        output.clean()
        output.check_identity()
        done = output.done(with_sha256=args.verify_sha256)
        walk = batchjob.Walk()
        sink = batchjob.PartSink(output, flush_rows=args.part_rows, walk=walk)
        summary = run_job(
            client, args, task, sink, collection_of(args), identity, done=done, walk=walk
        )
        if remote:
            objectstore.upload(local, out)
        rows = pq.ParquetFile(local).metadata.num_rows
    return _report(out, rows, summary, sink.gone if walk.whole else None)


def _report(out: str, rows: int, summary, gone: int | None) -> tuple[Any, str, int]:
    """The summary of a run into ``out`` (``rows`` now), ``gone`` rows dropped as no longer
    found (None: a folder could not be listed, so none were)."""
    data = {
        "out": out,
        "rows": rows,
        "done": summary.done,
        "failed": summary.failed,
        "skipped": summary.skipped,
        "gone": gone,
        "cache_hits": summary.cache_hits,
        "bytes_sent": summary.bytes_sent,
        "preprocess": "client" if summary.preprocessed else "server",
        "seconds": round(summary.seconds, 2),
        "images_per_s": round((summary.done + summary.failed) / summary.seconds, 2)
        if summary.seconds
        else None,
        "failures": [{"path": p, "error": e} for p, e in summary.failures],
    }
    lines = [f"{p}: error: {e}" for p, e in summary.failures]
    if summary.failed > len(summary.failures):
        lines.append(
            f"... and {summary.failed - len(summary.failures)} more failures "
            f"(status = 'error' in {out})"
        )
    lines.append(
        f"wrote {out}: {rows} rows ({summary.done} done, {summary.failed} failed, "
        f"{summary.skipped} already done, {gone or 0} dropped as no longer found) in "
        f"{summary.seconds:.1f} s, {summary.bytes_sent / 1e6:.1f} MB sent "
        f"({'crops made here' if summary.preprocessed else 'the files'})"
        + (f"; {summary.cache_hits} answered from the server's cache" if summary.cache_hits else "")
    )
    if gone is None:
        lines.append(
            "a folder or source could not be read (its error row above): rows of files not "
            "found were kept, not dropped; rerun when it can be read"
        )
    return data, "\n".join(lines), errors.Unhealthy.exit_code if summary.failed else 0
