"""The job behind tsctl's ``tag``, ``embed`` and ``explain --html``: a ``batchjob.Job`` over a
collection's shard with a progress bar, as ``bulk`` traffic unless ``--priority interactive``
(``run_job``); and the collection the command line names (``collection_of``)."""

from __future__ import annotations

import argparse
import sys
import threading

from serveclient.cli.common import DEFAULT_MODELS
from serveclient.client import Client
from serveclient.collection import STDIN, Collection, Shard
from serveclient.progress import JobProgress
from serveclient.traffic import Traffic


def collection_of(args: argparse.Namespace) -> Collection:
    """The sources given (files, folders, ``-``), and stdin's paths with ``--from-stdin``:
    read as the file system's names (bytes that are not UTF-8 kept, as ``os.fsdecode`` keeps
    them in argv), not in the locale's strict decoding."""
    sources = list(args.sources) + (
        [STDIN] if args.from_stdin and STDIN not in args.sources else []
    )
    if STDIN in sources and hasattr(sys.stdin, "reconfigure"):
        sys.stdin.reconfigure(encoding=sys.getfilesystemencoding(), errors="surrogateescape")
    return Collection(sources, stdin=sys.stdin)


def run_job(
    client: Client,
    args: argparse.Namespace,
    task: str,
    sink,
    collection: Collection,
    identity: tuple[dict | None, dict],
    done=None,
    plan=None,
    explain=None,
    walk=None,
):
    """Run ``batchjob.Job`` over the collection's shard, with a progress bar whose total a
    second walk, beside the job, fills in; the job's summary. ``plan``: default from the describe
    answer; ``explain``: the explanation options of a gallery (else tags or embeddings);
    ``walk``: a ``batchjob.Walk`` that records the job's entries (its sink's)."""
    from serveclient import batchjob

    model = args.model or DEFAULT_MODELS[task]
    entry, _ = identity
    traffic = Traffic(getattr(args, "priority", "bulk"))
    on_lane = False
    if traffic.priority == "bulk":
        # The whole tsctl process from here (every thread it starts inherits it: the walk, the
        # senders, Parquet's): walking, hashing and writing cost the serving host's CPU too.
        batchjob.yield_thread()
    if traffic.priority == "bulk" and explain is None:
        lane, entry = batchjob.bulk_lane(client, model, entry)
        on_lane, model = lane != model, lane
    # On its lane a bulk job is alone with its kind: no share with people to fit requests to.
    plan = plan or batchjob.Plan.from_describe(
        entry, args.concurrency, args.per_request, bulk=traffic.priority == "bulk" and not on_lane
    )
    shard = Shard.parse(getattr(args, "shard", None))
    progress = JobProgress(f"{task} {shard}" if shard.count > 1 else task)
    threading.Thread(
        target=lambda: progress.set_total(sum(1 for _ in collection.entries(shard))), daemon=True
    ).start()
    crops = None
    if explain is None:
        from serveclient.preprocess import ClientCrops, client_side

        if client_side(getattr(args, "preprocess", "server"), entry, client.urls["inference"]):
            crops = ClientCrops(entry)
    job = batchjob.Job(
        client,
        model,
        task,
        sink,
        plan,
        protocol=getattr(args, "protocol", "v2"),
        topk=getattr(args, "topk", None),
        verify_sha256=getattr(args, "verify_sha256", False),
        progress=progress,
        explain=explain,
        traffic=traffic,
        crops=crops,
    )
    entries = collection.entries(shard)
    return job.run(walk.of(entries) if walk is not None else entries, done=done)
