"""The collection job against the server's own throughput -> results/collection.md, .json.

    python -m bench.collection [--photos 2000] [--vectors 100000]     (make bench-collection)

On one local TorchServe (the archives of model-store/):

1. **server**: the same photos sent by bench's load generator (``bench.loadgen``: keep-alive
   ``http.client`` connections, one image per ``/predictions`` request, closed loop with
   2 x batchSize x workers clients), every photo once: the server's own throughput;
2. **job**: ``tsctl embed PHOTOS --out ...`` as a user runs it: wall time, images/s, and the
   client's CPU (its user + system seconds over the wall time: the share of one core);
3. **kill**: the job again, SIGKILLed once about half the photos are written, then rerun:
   rows written before the kill, images the server answered by then (its ``resnet50_images``
   counter), and what the rerun redid;
4. **similar**: ``ExactSearch.nearest`` over ``--vectors`` stored random unit vectors, and
   ``tsctl similar`` end to end (the query embedded by the server).

The photos (mixed sizes, JPEG and PNG, seeded) are generated once into build/bench-collection/.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from bench.layout import REPO, RESULTS, cli, parse
from bench.loadgen import Endpoint, each_once
from bench.machine import cpu_model, dated
from bench.markdown import document, publish, section, table
from bench.stats import summarize
from devtools.server import LocalTorchServe
from serveclient import metrics
from serveclient.batchjob import Plan
from serveclient.search.exact import ExactSearch
from serveclient.vectors import EMBEDDING_DIM, Output, Row

WORK = REPO / "build" / "bench-collection"
MODEL = "resnet50-embedding"
TSCTL = REPO / ".venv" / "bin" / "tsctl"
# (share of the photos, width, height, format): phone-sized and web-sized photos, some PNG.
MIX = (
    (0.35, 320, 240, "JPEG"),
    (0.35, 800, 600, "JPEG"),
    (0.2, 1600, 1200, "JPEG"),
    (0.05, 2400, 1800, "JPEG"),
    (0.05, 640, 480, "PNG"),
)


def generate(folder: Path, count: int) -> list[Path]:
    """``count`` photos of ``MIX`` in 20 subfolders (kept between runs)."""
    from tests import imagegen

    paths = []
    plan = [spec for share, *spec in MIX for _ in range(round(share * count))][:count]
    for i, (width, height, fmt) in enumerate(plan):
        suffix = ".png" if fmt == "PNG" else ".jpg"
        path = folder / f"album{i % 20:02d}" / f"photo{i:05d}{suffix}"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(imagegen.encode(imagegen.photo(width, height, seed=i), fmt))
        paths.append(path)
    return paths


def mix() -> str:
    """``MIX`` as the reports say it."""
    return ", ".join(f"{int(share * 100)}% {w}x{h} {f}" for share, w, h, f in MIX)


def server_throughput(server: LocalTorchServe, photos: list[Path], clients: int) -> dict:
    """Every photo once through bench's load generator, ``clients`` connections."""
    url, headers = f"{server.inference_url}/predictions/{MODEL}", server.keys.inference_headers()
    endpoints = [Endpoint(url, headers, path, 120.0) for path in photos]
    stats = summarize(each_once(endpoints, clients, float("inf"), None).join())
    return {
        "clients": clients,
        "images": stats.requests,
        "ok": stats.ok,
        "seconds": round(stats.duration_s, 2),
        "images_per_s": round(stats.throughput, 2),
    }


def tsctl(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    """``tsctl --json ARGV`` started with ``env`` (the server's), its output piped."""
    return subprocess.Popen(
        [str(TSCTL), "--json", *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def tsctl_answer(process: subprocess.Popen, command: str) -> dict:
    """The JSON answer of a ``tsctl`` run once it ends (exit 7: some files failed, which the
    answer lists)."""
    out, err = process.communicate(timeout=3600)
    if process.returncode not in (0, 7):
        raise RuntimeError(f"tsctl {command} failed ({process.returncode}): {err[-2000:]}")
    return json.loads(out)


def run_tsctl(server: LocalTorchServe, argv: list[str]) -> dict:
    """One tsctl run: its JSON answer, wall seconds, and CPU seconds (user + system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    answer = tsctl_answer(tsctl(argv, server.cli_env()), argv[0])
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"answer": answer, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "cpu_share": round(cpu / wall, 3)}  # fmt: skip


def handler_images(server: LocalTorchServe, models=(MODEL,)) -> float:
    """Images the handler of ``models`` has answered so far (its ``resnet50_images``)."""
    return sum(
        value
        for name, labels, value in metrics.samples(server.client().metrics_text())
        if name == "resnet50_images" and labels.get("model") in models
    )


def killed_and_resumed(server: LocalTorchServe, photos_dir: Path, total: int) -> dict:
    out = WORK / "killed.parquet"
    parts = out.with_name(out.name + ".parts")
    for stale in (out, *parts.glob("*")):
        stale.unlink(missing_ok=True)

    def written() -> int:
        return sum(pq.ParquetFile(p).metadata.num_rows for p in parts.glob("part-*.parquet"))

    answered_before = handler_images(server)
    process = subprocess.Popen(
        [str(TSCTL), "embed", str(photos_dir), "--out", str(out)],
        env=server.cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while process.poll() is None and written() < total // 2:
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    time.sleep(1.0)  # let the server finish (and count) what was in flight
    rows = written()
    answered = handler_images(server) - answered_before
    rerun = run_tsctl(server, ["embed", str(photos_dir), "--out", str(out)])["answer"]
    return {
        "rows_written_at_kill": rows,
        "answered_by_server_at_kill": int(answered),
        "lost": int(answered) - rows,
        "rerun_skipped": rerun["skipped"],
        "rerun_done": rerun["done"],
        "rerun_failed": rerun["failed"],
        "final_rows": rerun["rows"],
    }


def similar_over(server: LocalTorchServe, count: int, query: Path) -> dict:
    """Time exact search over ``count`` stored vectors (random unit vectors)."""
    index = WORK / f"vectors-{count}.parquet"
    if not index.exists():
        output = Output(index, "embedding", {"model": MODEL})
        rng = np.random.default_rng(0)
        for start in range(0, count, 10000):
            n = min(10000, count - start)
            matrix = rng.normal(size=(n, EMBEDDING_DIM)).astype(np.float32)
            matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
            output.write_part(
                [Row(f"v/{start + i:07d}.jpg", 1, 1, "0" * 64, None, matrix[i]) for i in range(n)]
            )
        output.merge()
    vector = np.random.default_rng(1).normal(size=EMBEDDING_DIM).astype(np.float32)
    for stale in index.parent.glob(index.name + ".search.*"):
        stale.unlink()  # the first search below writes the cache, as a user's first does
    start = time.monotonic()
    ExactSearch(index).nearest(vector, k=10)
    first = time.monotonic() - start
    timings = []
    for _ in range(3):
        start = time.monotonic()
        ExactSearch(index).nearest(vector, k=10)
        timings.append(time.monotonic() - start)
    cli = run_tsctl(server, ["similar", str(query), "--embeddings", str(index), "-k", "10"])
    return {
        "vectors": count,
        "file_mb": round(index.stat().st_size / 2**20, 1),
        "first_search_s": round(first, 3),
        "search_s": [round(t, 3) for t in timings],
        "tsctl_similar_wall_s": cli["wall_s"],
    }


def report(results: dict) -> str:
    s, j, k, q = results["server"], results["job"], results["kill"], results["similar"]
    ratio = j["images_per_s"] / s["images_per_s"] if s["images_per_s"] else float("nan")
    plan = results["plan"]
    rows = [[f"server alone (bench load generator, {s['clients']} clients, /predictions)",
             str(s["ok"]), str(s["seconds"]), str(s["images_per_s"]), "-"]]  # fmt: skip
    if s["images"] > s["ok"]:
        rows.append([f"the rest of the {s['images']} it sent: not answered 200 (no retries: "
                     f"what {s['clients']} clients send beyond the frontend's queue "
                     "(job_queue_size) is refused with 503; tsctl waits and retries)",
                     str(s["images"] - s["ok"]), "", "", ""])  # fmt: skip
    rows.append([f"`tsctl embed` ({plan['concurrency']} requests x {plan['per_request']} images "
                 "in flight, v2)", str(j["done"] + j["failed"]), str(j["wall_s"]),
                 str(j["images_per_s"]), f"{j['cpu_share']:.1%} ({j['cpu_s']} s)"])  # fmt: skip
    return document(
        "The collection job (`make bench-collection`)",
        results["provenance"],
        f"Generated by `python -m bench.collection` on {results['machine']}: "
        f"{results['photos']} photos of mixed sizes ({results['mix']}), one local TorchServe, "
        f"{MODEL} (batchSize {plan['batch_size']}, {plan['workers']} worker(s)).",
        table("run | images | seconds | images/s | client CPU (share of one core)", rows, "lrrrr"),
        f"The job ran at **{ratio:.2f}x** the server's own throughput (target >= 0.9).",
        section(
            "SIGKILL at about 50%, then rerun",
            f"Rows written at the kill: {k['rows_written_at_kill']}; images the server had "
            f"answered by then: {k['answered_by_server_at_kill']} (so {k['lost']} answered but "
            "not yet written, the in-flight requests and the last flush interval). The rerun "
            f"skipped {k['rerun_skipped']}, embedded {k['rerun_done']} "
            f"({k['rerun_failed']} failed) and ended with {k['final_rows']} rows.",
        ),
        section(
            "Exact search",
            f"`ExactSearch.nearest` over {q['vectors']:,} stored vectors "
            f"({q['file_mb']} MB of Parquet), k=10: the first search {q['first_search_s']} s "
            "(it decodes the Parquet once and writes the unit vectors beside it as "
            "`.search.npy`), then three runs: "
            f"{', '.join(f'{t} s' for t in q['search_s'])}; "
            f"`tsctl similar` end to end (start, embed the query on the server, search): "
            f"{q['tsctl_similar_wall_s']} s.",
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = cli("python -m bench.collection", __doc__, out=RESULTS / "collection.md")
    parser.add_argument("--photos", type=int, default=2000)
    parser.add_argument("--vectors", type=int, default=100_000)
    args = parse(parser, argv)
    photos_dir = WORK / f"photos-{args.photos}"
    print(f"bench.collection: generating {args.photos} photos in {photos_dir}", file=sys.stderr)
    photos = generate(photos_dir, args.photos)
    with LocalTorchServe(WORK / "server", REPO / "model-store") as server:
        entry = server.client().describe(MODEL, customized=True)[0]
        plan = Plan.from_describe(entry)
        print("bench.collection: server throughput", file=sys.stderr)
        server_throughput(server, photos[:100], plan.concurrency)  # warm-up
        alone = server_throughput(server, photos, plan.concurrency)
        print("bench.collection: tsctl embed", file=sys.stderr)
        out = WORK / "job.parquet"
        out.unlink(missing_ok=True)
        job = run_tsctl(server, ["embed", str(photos_dir), "--out", str(out)])
        job = {**job["answer"], **{k: v for k, v in job.items() if k != "answer"}}
        print("bench.collection: SIGKILL and rerun", file=sys.stderr)
        kill = killed_and_resumed(server, photos_dir, len(photos))
        print("bench.collection: similar", file=sys.stderr)
        similar = similar_over(server, args.vectors, photos[0])
    results = {
        "machine": f"{cpu_model()}, {os.cpu_count()} CPUs",
        "provenance": dated(),
        "photos": len(photos),
        "mix": mix(),
        "plan": {
            "batch_size": entry.get("batchSize"),
            "workers": len(entry.get("workers") or []),
            "concurrency": plan.concurrency,
            "per_request": plan.per_request,
        },
        "server": alone,
        "job": job,
        "kill": kill,
        "similar": similar,
    }
    return publish(args.out, report(results), results)


if __name__ == "__main__":
    raise SystemExit(main())
