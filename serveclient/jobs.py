"""A collection job as a library call, what ``tsctl tag``, ``embed``, ``explain --html`` and
``head train`` run and print:

    options = JobOptions(priority="bulk")                 # tsctl embed's options, as values
    summary = into_parquet(client, "embedding", Collection(["photos/"]), "e.parquet", options)
    summary["rows"], summary["failed"], summary["failures"]

``into_parquet`` runs the job into Parquet (a path or s3://) holding the output's lock,
resumably; ``run`` runs ``batchjob.Job`` over any sink (``tsctl tag`` without ``--out``, a
gallery) with a progress bar. numpy and pyarrow load only when a job runs."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from serveclient import errors, objectstore
from serveclient.client import Client
from serveclient.collection import Collection, Shard
from serveclient.progress import JobProgress
from serveclient.traffic import Traffic

DEFAULT_MODELS = {"embedding": "resnet50-embedding", "tags": "resnet50-tagger"}
DEFAULT_OUTS = {"embedding": "embeddings.parquet", "tags": "tags.parquet"}
PART_ROWS = 1024  # rows per Parquet part while a job runs (--part-rows)


@dataclass(frozen=True)
class JobOptions:
    """How a job runs, as ``tsctl embed``'s options say (their defaults here). ``model``: None
    for the task's ``DEFAULT_MODELS``; ``shard``: ``i/n``; ``concurrency`` and ``per_request``:
    None for what the model's describe gives (``batchjob.Plan``); ``wait``: wait for another
    run's lock on the output instead of refusing."""

    model: str | None = None
    shard: str | None = None
    concurrency: int | None = None
    per_request: int | None = None
    priority: str = "bulk"
    preprocess: str = "auto"
    protocol: str = "v2"
    topk: int | None = None
    verify_sha256: bool = False
    part_rows: int = PART_ROWS
    work_dir: Path = objectstore.WORK_DIR
    wait: bool = False

    def model_for(self, task: str) -> str:
        return self.model or DEFAULT_MODELS[task]


def run(
    client: Client,
    task: str,
    sink,
    collection: Collection,
    identity: tuple[dict | None, dict],
    options: JobOptions,
    *,
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

    model = options.model_for(task)
    entry, _ = identity
    traffic = Traffic(options.priority)
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
        entry,
        options.concurrency,
        options.per_request,
        bulk=traffic.priority == "bulk" and not on_lane,
    )
    shard = Shard.parse(options.shard)
    progress = JobProgress(f"{task} {shard}" if shard.count > 1 else task)
    threading.Thread(
        target=lambda: progress.set_total(sum(1 for _ in collection.entries(shard))), daemon=True
    ).start()
    crops = None
    if explain is None:
        from serveclient.preprocess import ClientCrops, client_side

        if client_side(options.preprocess, entry, client.urls["inference"]):
            crops = ClientCrops(entry)
    job = batchjob.Job(
        client,
        model,
        task,
        sink,
        plan,
        protocol=options.protocol,
        topk=options.topk,
        verify_sha256=options.verify_sha256,
        progress=progress,
        explain=explain,
        traffic=traffic,
        crops=crops,
    )
    entries = collection.entries(shard)
    return job.run(walk.of(entries) if walk is not None else entries, done=done)


def into_parquet(
    client: Client,
    task: str,
    collection: Collection,
    out: str | Path | None,
    options: JobOptions,
) -> dict:
    """Run the job into Parquet (``out``, a local path or s3://; None: ``DEFAULT_OUTS``)
    holding the output's lock (``options.wait``: wait for another run's): resume, merge; the
    run's summary (rows, done, failed, skipped, gone, the failures). After a complete run the
    output holds one row for each file of this walk and nothing else."""
    import pyarrow.parquet as pq

    from serveclient import batchjob, outputlock
    from serveclient.vectors import Output

    out = str(out or DEFAULT_OUTS[task])
    if out.endswith(".npy"):
        raise errors.UsageError(
            f"--out {out}: embeddings are written as Parquet now",
            "use --out embeddings.parquet; read it with pandas, polars, "
            "DuckDB or serveclient.vectors.read_matrix",
        )
    if options.part_rows < 1:
        raise errors.UsageError(
            f"--part-rows {options.part_rows}: at least 1", f"the default is {PART_ROWS}"
        )
    remote = objectstore.is_remote(out)
    local = objectstore.local_copy(out, options.work_dir) if remote else Path(out)
    # For s3:// the lock guards the local copy (one --work-dir): a bucket has no lock to take.
    with outputlock.hold(local, wait=options.wait):
        if remote:
            objectstore.download_if_exists(out, local)
        identity = batchjob.model_identity(
            client, options.model_for(task), with_management=client.reaches_management
        )
        output = Output(local, task, {**identity[1], "shard": str(Shard.parse(options.shard))})
        output.clean()
        output.check_identity()
        done = output.done(with_sha256=options.verify_sha256)
        walk = batchjob.Walk()
        sink = batchjob.PartSink(output, flush_rows=options.part_rows, walk=walk)
        summary = run(client, task, sink, collection, identity, options, done=done, walk=walk)
        if remote:
            objectstore.upload(local, out)
        rows = pq.ParquetFile(local).metadata.num_rows
    return {
        "out": out,
        "rows": rows,
        "done": summary.done,
        "failed": summary.failed,
        "skipped": summary.skipped,
        # Rows dropped as no longer found; None: a folder could not be listed, so none were.
        "gone": sink.gone if walk.whole else None,
        "cache_hits": summary.cache_hits,
        "bytes_sent": summary.bytes_sent,
        "preprocess": "client" if summary.preprocessed else "server",
        "seconds": round(summary.seconds, 2),
        "images_per_s": round((summary.done + summary.failed) / summary.seconds, 2)
        if summary.seconds
        else None,
        "failures": [{"path": p, "error": e} for p, e in summary.failures],
    }
