"""``tsctl``: operate a running TorchServe from the shell.

    tsctl list | describe NAME [VERSION] | health | metrics | top [--once] [--interval S]
    tsctl list | health | metrics | describe NAME | explain ... | top ... --url TRITON_URL
          [--key-file build/triton-key_file.json]          (Triton: make serve-triton)
    tsctl keys [--rotate inference|management|all] [--print inference|management]
    tsctl register ARCHIVE [--name N] [--batch-size B] [--max-batch-delay MS] [--workers W]
    tsctl scale NAME --min N [--max M] | set-default NAME VERSION | unregister NAME [VERSION]
    tsctl embed FILE|FOLDER|-... [--out embeddings.parquet] [--shard i/n] [--verify-sha256]
                 [--priority bulk|interactive]
    tsctl tag FILE|FOLDER|-... [--topk K] [--out tags.parquet]    (no --out: print the tags)
    tsctl similar QUERY... --index embeddings.parquet [-k 10] [--html similar.html]
                 [--deadline-ms MS]
    tsctl duplicates --index ... [--threshold 0.97] [--html duplicates.html]
    tsctl explain FILE [--model M] [--target T | --topk K] [--method M] [--n-steps N]
                 [--out heatmap.png]
    tsctl explain FILE|FOLDER... --html gallery.html [--target T | --topk K] [--method M]

Human-readable output by default, ``--json`` (before or after the command) for scripts.
``embed``/``tag`` work through whole collections, resumably (tsclient.batchjob;
docs/operations.md, "Embed a collection"), as ``bulk`` traffic unless ``--priority
interactive``. Exit codes: 0 ok, 1 other server error, 2 bad arguments (including names
TorchServe cannot route), 3 server not running, 4 key file missing or key refused, 5 unknown
model or version, 6 refused by the server (registration outside the allowed sources, a name
already registered, removing the default version, an API switched off, a TorchServe-only command
pointed at Triton), 7 unhealthy (a model without a READY worker, or some files failed in
``tag``/``embed``), 130 interrupted (Ctrl-C: what was answered is kept; rerun to resume).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tabulate import tabulate

from serveshared import ports
from serveshared.keys import KEY_FILE, KINDS, Keys
from tsclient import errors, objectstore
from tsclient.client import TIMEOUT_S, Client, TorchServeClient, connect
from tsclient.collection import STDIN, Collection, Shard
from tsclient.progress import JobProgress, waiting
from tsclient.torchserve import version_row
from tsclient.traffic import CLASSES, Traffic

RESTART_NOTE = (
    "not kept across a restart: `make serve` starts from config/ (--ncs); to keep "
    "it, put it in config/models/{name}.yaml and run `make config`"
)
ROTATE_MARGIN_S = 60.0  # `keys --print` hands out keys that live at least this long


# ---------------------------------------------------------------------- commands
# Each returns (data for --json, text for humans, exit code).


def cmd_list(client: Client, args) -> tuple[Any, str, int]:
    rows = client.model_rows()
    text = (
        tabulate(
            [
                [
                    r["model"],
                    r["version"],
                    "*" if r["default"] else "",
                    r["workers"],
                    r["batchSize"],
                    r["maxBatchDelay"],
                ]
                for r in rows
            ],
            headers=["model", "version", "default", "workers", "batch", "delay ms"],
            tablefmt="plain",
            disable_numparse=True,
        )
        if rows
        else "no models"
    )
    return rows, text, 0


def cmd_describe(client: Client, args) -> tuple[Any, str, int]:
    entries = client.describe(args.name, args.version)
    # Only a single-version describe carries the handler's metadata (weights, top_k).
    custom = client.describe(args.name, args.version, customized=True)[0]
    lines = []
    for entry in entries:
        lines.append(
            _version_line(entry) + f", min/max workers {entry.get('minWorkers')}/"
            f"{entry.get('maxWorkers')}"
            + (f", archive {entry['modelUrl']}" if entry.get("modelUrl") else "")
        )
        meta = custom.get("customizedMetadata")
        if entry.get("modelVersion") == custom.get("modelVersion") and isinstance(meta, dict):
            entry["customizedMetadata"] = meta
            weights = meta.get("weights", {})
            lines.append(
                f"  weights {weights.get('source')} (trained: {weights.get('trained')}), "
                f"backend {meta.get('backend')}, top_k "
                f"{meta.get('handler', {}).get('top_k')}"
            )
            if isinstance(meta.get("precision_choice"), dict):
                lines.append(f"  precision {meta['precision_choice'].get('summary')}")
    return entries, "\n".join(lines), 0


def cmd_register(client: Client, args) -> tuple[Any, str, int]:
    answer = waiting(
        f"registering {args.archive}",
        lambda: client.register(
            args.archive,
            name=args.name,
            workers=args.workers,
            batch_size=args.batch_size,
            max_batch_delay=args.max_batch_delay,
        ),
    )
    name = answer.get("model")
    described = client.describe(name) if name else []
    text = answer.get("status", "registered")
    for entry in described:
        text += "\n" + _version_line(entry)
    text += "\nnote: " + RESTART_NOTE.format(name=name or "NAME")
    return {"status": answer.get("status"), "model": name, "versions": described}, text, 0


def cmd_scale(client: Client, args) -> tuple[Any, str, int]:
    answer = waiting(
        f"scaling {args.name}", lambda: client.scale(args.name, args.min, args.max, args.version)
    )
    return (
        answer,
        (answer.get("status", "scaled") + "\nnote: " + RESTART_NOTE.format(name=args.name)),
        0,
    )


def cmd_set_default(client: Client, args) -> tuple[Any, str, int]:
    answer = client.set_default(args.name, args.version)
    return answer, answer.get("status", "done"), 0


def cmd_unregister(client: Client, args) -> tuple[Any, str, int]:
    answer = client.unregister(args.name, args.version)
    return answer, answer.get("status", "done"), 0


def cmd_health(client: Client, args) -> tuple[Any, str, int]:
    data, lines, code = client.health_report()
    return data, "\n".join(lines), code


def cmd_keys(client: Client, args) -> tuple[Any, str, int]:
    if args.rotate:
        for kind in KINDS if args.rotate == "all" else (args.rotate,):
            client.rotate(kind)
    keys = client.keys
    if args.print:
        if keys.expired(args.print, ROTATE_MARGIN_S):
            keys = client.rotate(args.print)
        return keys.key(args.print), keys.key(args.print), 0
    now = datetime.now(timezone.utc)
    data, lines = {}, [f"key file: {client.key_file.resolve() if client.key_file else '-'}"]
    for kind in KINDS:
        expires = keys.expires(kind)
        left = (expires - now).total_seconds() if expires else None
        data[kind] = {
            "expires": expires.isoformat() if expires else None,
            "seconds_left": round(left) if left is not None else None,
            "expired": left is not None and left <= 0,
        }
        state = (
            f"EXPIRED (tsctl rotates it on its next call; `tsctl keys --rotate {kind}` now)"
            if data[kind]["expired"]
            else f"{_duration(left)} left"
            if left is not None
            else "no expiry: kept until the server restarts with new keys"
        )
        lines.append(f"{kind}: expires {data[kind]['expires']} ({state})")
    lines.append("API key: never expires (rotates the other two)")
    if args.rotate:
        lines.insert(0, f"rotated: {args.rotate}")
    return data, "\n".join(lines), 0


def cmd_metrics(client: Client, args) -> tuple[Any, str, int]:
    data, lines, code = client.metrics_report()
    return data, "\n".join(lines), code


def cmd_top(client: Client, args) -> tuple[Any, str | None, int]:
    from tsclient import top

    if args.once:
        text = top.once(client, args.interval)
        return text, text, 0
    return None, None, top.run(client, interval=args.interval)


# The collection commands load numpy and pyarrow only when they run (tsctl list stays quick).


def cmd_tag(client: Client, args) -> tuple[Any, str, int]:
    from tsclient import batchjob

    if args.out is not None:
        return _collection(client, args, "tags")
    sink = batchjob.ListSink()
    identity = batchjob.model_identity(
        client, args.model or DEFAULT_MODELS["tags"], with_management=args.url is None
    )
    collection = _collection_of(args)
    summary = _run_job(client, args, "tags", sink, collection, identity)
    order = {e.path: i for i, e in enumerate(collection.entries(Shard.parse(args.shard)))}
    data, lines = {}, []
    for row in sorted(sink.rows, key=lambda r: order.get(r.path, len(order))):
        tags: list[dict] = row.answer if isinstance(row.answer, list) else []
        # Each tag carries the precision its answer came with (the Parquet rows' column):
        # the answer stays the list of tags scripts read.
        data[row.path] = (
            {"error": row.error}
            if row.error
            else [{**tag, "precision": row.precision} for tag in tags]
        )
        lines.append(
            f"{row.path}: error: {row.error}"
            if row.error
            else f"{row.path}: " + ", ".join(f"{t['label']} {t['probability']:.3f}" for t in tags)
        )
    return data, "\n".join(lines), errors.Unhealthy.exit_code if summary.failed else 0


def cmd_embed(client: Client, args) -> tuple[Any, str, int]:
    return _collection(client, args, "embedding")


def _collection_of(args) -> Collection:
    sources = list(args.sources) + (
        [STDIN] if args.from_stdin and STDIN not in args.sources else []
    )
    return Collection(sources, stdin=sys.stdin)


def _run_job(
    client: Client,
    args,
    task: str,
    sink,
    collection: Collection,
    identity: tuple[dict | None, dict],
    done=None,
    plan=None,
    explain=None,
):
    """Run ``batchjob.Job`` over the collection's shard, with a progress bar whose total a
    second walk, beside the job, fills in. ``plan``: default from the describe answer."""
    from tsclient import batchjob

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
        from tsclient.preprocess import ClientCrops, client_side

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
    return job.run(collection.entries(shard), done=done)


def _collection(client: Client, args, task: str) -> tuple[Any, str, int]:
    """Run the job into Parquet (``--out``, a local path or s3://): resume, merge, report."""
    import pyarrow.parquet as pq

    from tsclient import batchjob
    from tsclient.vectors import Output

    out = str(args.out or DEFAULT_OUTS[task])
    if out.endswith(".npy"):
        raise errors.UsageError(
            f"--out {out}: embeddings are written as Parquet now",
            "use --out embeddings.parquet; read it with pandas, polars, "
            "DuckDB or tsclient.vectors.read_matrix",
        )
    local = objectstore.local_copy(out, args.work_dir) if objectstore.is_remote(out) else Path(out)
    if objectstore.is_remote(out):
        objectstore.download_if_exists(out, local)
    meta = {"shard": str(Shard.parse(args.shard))}
    identity = batchjob.model_identity(
        client, args.model or DEFAULT_MODELS[task], with_management=args.url is None
    )
    output = Output(local, task, {**identity[1], **meta})
    output.clean()
    output.check_identity()
    done = output.done(with_sha256=args.verify_sha256)
    summary = _run_job(
        client, args, task, batchjob.PartSink(output), _collection_of(args), identity, done=done
    )
    if objectstore.is_remote(out):
        objectstore.upload(local, out)
    rows = pq.ParquetFile(local).metadata.num_rows
    data = {
        "out": out,
        "rows": rows,
        "done": summary.done,
        "failed": summary.failed,
        "skipped": summary.skipped,
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
        f"{summary.skipped} already done) in {summary.seconds:.1f} s, "
        f"{summary.bytes_sent / 1e6:.1f} MB sent "
        f"({'crops made here' if summary.preprocessed else 'the files'})"
        + (f"; {summary.cache_hits} answered from the server's cache" if summary.cache_hits else "")
    )
    return data, "\n".join(lines), errors.Unhealthy.exit_code if summary.failed else 0


def cmd_similar(client: Client, args) -> tuple[Any, str, int]:
    import numpy as np

    from tsclient import search

    images = []
    for query in args.queries:
        try:
            images.append(Path(query).read_bytes())
        except OSError as exc:
            raise errors.UsageError(
                f"cannot read {query}: {exc.strerror}", "check the file path"
            ) from None
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
        from tsclient import pages

        thumbs = pages.Thumbnailer(expected=len(data) + sum(len(h) for h in data.values()))
        html = pages.similar_page(data, thumbs, index=str(args.index), model=args.model)
        lines.append(_wrote_page(args.html, html))
    return data, "\n".join(lines), 0


def cmd_duplicates(client: Client, args) -> tuple[Any, str, int]:
    from tsclient import search

    groups = search.duplicates(args.index, args.threshold)
    lines = [
        f"{len(g['paths'])} files, cosine >= {g['min_score']:.4f}: " + ", ".join(g["paths"])
        for g in groups
    ] or [f"no near-duplicates at cosine >= {args.threshold}"]
    if args.html is not None:
        from tsclient import pages

        thumbs = pages.Thumbnailer(expected=sum(len(g["paths"]) for g in groups))
        html = pages.duplicates_page(
            groups, thumbs, index=str(args.index), threshold=args.threshold
        )
        lines.append(_wrote_page(args.html, html))
    return groups, "\n".join(lines), 0


def _wrote_page(path: Path, html: str) -> str:
    from tsclient import pages

    size = pages.write(path, html)
    return f"wrote {path} ({size / 1e6:.1f} MB; open it in a browser)"


def cmd_explain(client: Client, args) -> tuple[Any, str, int]:
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
    try:
        image = path.read_bytes()
    except OSError as exc:
        raise errors.UsageError(
            f"cannot read {path}: {exc.strerror}", "check the file path"
        ) from None
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


def _explain_gallery(client: Client, args) -> tuple[Any, str, int]:
    """``explain --html``: every photo explained (one request each, paced by the server's
    explanation budget, retried like ``embed``), into one gallery page."""
    from tsclient import batchjob, pages

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
    summary = _run_job(
        client, args, "explain", gallery, collection, identity, plan=plan, explain=options
    )
    order = {e.path: i for i, e in enumerate(collection.entries())}
    items = sorted(gallery.items, key=lambda item: order.get(item.path, len(order)))
    handler = ((identity[0] or {}).get("customizedMetadata") or {}).get("handler") or {}
    method = args.method or (handler.get("explain") or {}).get("method") or "the model's default"
    target = args.target if args.target is not None else f"the {topk} most probable classes"
    html = pages.explain_page(items, args.model, method, target)
    lines = [f"{p}: error: {e}" for p, e in summary.failures]
    lines.append(f"{summary.done} explained, {summary.failed} failed in {summary.seconds:.1f} s")
    lines.append(_wrote_page(args.html, html))
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


# ---------------------------------------------------------------------- helpers


def _version_line(entry: dict) -> str:
    row = version_row(entry)
    return (
        f"{row['model']} {row['version']}{' (default)' if row['default'] else ''}: "
        f"{row['workers']} workers, batch {row['batchSize']}, delay {row['maxBatchDelay']} ms"
    )


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown time"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


COMMANDS = {
    "list": cmd_list,
    "describe": cmd_describe,
    "register": cmd_register,
    "scale": cmd_scale,
    "set-default": cmd_set_default,
    "unregister": cmd_unregister,
    "tag": cmd_tag,
    "embed": cmd_embed,
    "health": cmd_health,
    "keys": cmd_keys,
    "metrics": cmd_metrics,
    "top": cmd_top,
    "explain": cmd_explain,
    "similar": cmd_similar,
    "duplicates": cmd_duplicates,
}
# Commands that need a server's management and metrics APIs, which a TorchServe reached by
# --url alone does not offer (Triton's are behind its one URL).
WHOLE_API = ("describe", "explain", "top")
DEFAULT_MODELS = {"embedding": "resnet50-embedding", "tags": "resnet50-tagger"}
DEFAULT_OUTS = {"embedding": "embeddings.parquet", "tags": "tags.parquet"}
GALLERY_TOPK = 3  # classes an explanation gallery lists per photo when no target is given


def parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="tsctl",
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for api, default in (("inference", ports.INFERENCE_URL), ("management", ports.MANAGEMENT_URL)):
        p.add_argument(
            f"--{api}-url",
            default=env(f"TSCTL_{api.upper()}_URL", default),
            help=f"default: {default} (or $TSCTL_{api.upper()}_URL)",
        )
    # Unset unless given: with --url their defaults depend on the engine found there.
    p.add_argument(
        "--metrics-url",
        default=env("TSCTL_METRICS_URL"),
        help=f"default: {ports.METRICS_URL}; with --url, Triton's metrics port on "
        "its host (or $TSCTL_METRICS_URL)",
    )
    p.add_argument(
        "--key-file",
        default=env("TSCTL_KEY_FILE"),
        help=f"TorchServe's {KEY_FILE} (default: ./{KEY_FILE}, or $TSCTL_KEY_FILE); "
        "with --url, the keys of that server (else $TSCTL_TOKEN)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument(
        "--timeout", type=float, default=TIMEOUT_S, help=f"seconds per call ({TIMEOUT_S:g})"
    )
    # Also accepted after the command; SUPPRESS keeps a --json given before it.
    after = argparse.ArgumentParser(add_help=False)
    after.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="machine-readable output on stdout",
    )
    commands = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    class Sub:
        @staticmethod
        def add_parser(name: str, **kwargs) -> argparse.ArgumentParser:
            return commands.add_parser(name, parents=[after], **kwargs)

    sub = Sub()
    _url_arguments(sub.add_parser("list", help="registered models, versions and workers"))
    d = sub.add_parser("describe", help="one model's versions, workers, settings, weights")
    d.add_argument("name")
    d.add_argument("version", nargs="?")
    _url_arguments(
        d,
        "a Triton server (make serve-triton: http://127.0.0.1:8000) instead of "
        "the local TorchServe",
    )
    r = sub.add_parser("register", help="register an archive from the model store and wait")
    r.add_argument(
        "archive", help="file name in the model store (or a URL allowed by allowed_urls)"
    )
    r.add_argument("--name", help="model name (default: the archive's)")
    r.add_argument("--batch-size", type=int)
    r.add_argument("--max-batch-delay", type=int, help="milliseconds")
    r.add_argument("--workers", type=int, help="exactly this many workers (default: the YAML's)")
    _url_arguments(r)
    s = sub.add_parser("scale", help="set a model's worker count and wait")
    s.add_argument("name")
    s.add_argument("--min", type=int, required=True)
    s.add_argument("--max", type=int)
    s.add_argument("--version")
    _url_arguments(s)
    sd = sub.add_parser("set-default", help="what /predictions/NAME serves")
    sd.add_argument("name")
    sd.add_argument("version")
    _url_arguments(sd)
    u = sub.add_parser("unregister", help="remove a model or one version")
    u.add_argument("name")
    u.add_argument("version", nargs="?")
    _url_arguments(u)
    for command, task in (("tag", "tags"), ("embed", "embedding")):
        c = sub.add_parser(
            command,
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
        _endpoint_arguments(c)
        c.add_argument(
            "--work-dir",
            type=Path,
            default=Path(".tsctl-work"),
            help="local copy of an s3:// --out while the job runs",
        )
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
    q = sub.add_parser("similar", help="the stored photos most like each QUERY (exact cosine)")
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
    _endpoint_arguments(q)
    dup = sub.add_parser("duplicates", help="groups of near-duplicate photos in an embed output")
    dup.add_argument("--index", type=Path, required=True)
    dup.add_argument("--threshold", type=float, default=0.97, help="cosine (0.97)")
    dup.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="also write a page of thumbnails: each group side by side",
    )
    _url_arguments(sub.add_parser("health", help="is the server up and every model READY"))
    k = sub.add_parser("keys", help="key expiry; rotate keys")
    k.add_argument("--rotate", choices=[*KINDS, "all"])
    k.add_argument(
        "--print",
        choices=KINDS,
        help="print a valid key (rotated first when it expires within a minute), "
        "e.g. KEY=$(tsctl keys --print inference)",
    )
    _url_arguments(k)
    _url_arguments(
        sub.add_parser("metrics", help="batch sizes, requests, errors and latency per model")
    )
    t = sub.add_parser(
        "top", help="live per-model rates, latency, batches, errors and workers (q quits)"
    )
    t.add_argument("--once", action="store_true", help="print one frame and exit")
    t.add_argument(
        "--interval",
        type=float,
        default=2.0,
        help="seconds between frames, and the span each one measures (2)",
    )
    _url_arguments(
        t,
        "a Triton server (make serve-triton: http://127.0.0.1:8000; its metrics "
        "from the same host's port 8002 unless --metrics-url names them)",
    )
    e = sub.add_parser(
        "explain",
        help="where the model looked: a heatmap for one image, or a gallery page of many (--html)",
    )
    e.add_argument(
        "sources",
        nargs="+",
        metavar="FILE|FOLDER",
        help="one image; with --html, image files and folders (walked)",
    )
    e.add_argument("--model", default="resnet50-tagger")
    e.add_argument("--target", help="class index or label (default: the top-1 class)")
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
    _url_arguments(
        e,
        "a Triton server (make serve-triton: http://127.0.0.1:8000) instead of "
        "the local TorchServe",
    )
    return p


def _endpoint_arguments(c: argparse.ArgumentParser) -> None:
    _url_arguments(
        c,
        "a KServe endpoint of this runtime instead of the local server, e.g. "
        "https://resnet50.default.example.com",
    )
    c.add_argument(
        "--protocol",
        choices=("v2", "v1"),
        default="v2",
        help="KServe protocol of the requests (v2)",
    )


URL_HELP = (
    "a server other than the local TorchServe: a KServe endpoint "
    "(https://resnet50.default.example.com) or Triton (http://127.0.0.1:8000)"
)


def _url_arguments(c: argparse.ArgumentParser, what: str = URL_HELP) -> None:
    """``--url`` (a server reached by its URL alone) and how to authenticate to it."""
    c.add_argument("--url", help=what)
    c.add_argument(
        "--token-env",
        default="TSCTL_TOKEN",
        help="with --url: the environment variable holding a bearer token",
    )
    c.add_argument(
        "--ca-bundle",
        help="with --url: CA certificates to verify TLS with (verification is always on)",
    )


def make_client(args) -> Client:
    """The local TorchServe with its key file; or whatever engine serves ``--url``
    (``client.connect``: TorchServe behind KServe, or Triton) with the keys of ``--key-file``
    when given, else a bearer token from the environment, else (a Triton) the key file
    ``make serve-triton`` wrote; TLS verified."""
    if getattr(args, "url", None) is None:
        return TorchServeClient(
            args.inference_url,
            args.management_url,
            args.metrics_url or ports.METRICS_URL,
            key_file=args.key_file or KEY_FILE,
            timeout=args.timeout,
        )
    token = os.environ.get(args.token_env, "")
    client = connect(
        args.url,
        args.metrics_url,
        key_file=args.key_file,
        keys=None if args.key_file else Keys(token, token),
        timeout=args.timeout,
        verify=args.ca_bundle or True,
    )
    if args.command in WHOLE_API and not client.reaches_management:
        raise errors.UsageError(
            f"{args.command} --url reads a Triton server (make serve-triton); TorchServe's "
            f"{args.command} reads its management and metrics APIs",
            "drop --url (and give --management-url/--metrics-url if it is not local)",
        )
    return client


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        client = make_client(args)
        try:
            data, text, code = COMMANDS[args.command](client, args)
        except errors.ApiError as exc:
            refusal = client.refusal(args.command, exc)
            if refusal is exc:
                raise
            raise refusal from None
    except KeyboardInterrupt:
        print(
            f"tsctl {args.command}: interrupted; what was answered is kept, rerun the same "
            "command to resume",
            file=sys.stderr,
        )
        return 130
    except errors.TsError as exc:
        if args.json:
            print(
                json.dumps(
                    {"error": exc.message, "hint": exc.hint, "status": getattr(exc, "status", None)}
                )
            )
        print(f"tsctl {args.command}: error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return exc.exit_code
    if text is not None:  # None: the command drew its own screen (top)
        print(json.dumps(data, indent=2) if args.json else text)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
