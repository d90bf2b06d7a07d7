"""Where a request's time goes between the client and the worker: ``python -m bench.ingestion``
-> results/ingestion.{md,json}.

One TorchServe serving the tagger alone, once per frontend variant (JVM and netty settings),
variants alternated over ``--rounds`` so that drifting machine load hits each of them alike.
For each image and client count: a closed-loop run, then its time split by TorchServe's own
log (``logs/ts_log.log``) for the batches of that run, and each side's CPU (the parts:
bench/README.md, and the report's own paragraph). ``of raw``: img/s against the raw forward
of the precision the tagger serves, at its batchSize, measured after the servers stopped.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import javaproperties
import psutil
import torch

from bench import layout, machine, raw
from bench.archives import ArchiveInfo
from bench.batchlog import request_ids, settled_log
from bench.layout import BUILD, IMAGES, MODEL_STORE, SAMPLES, TAGGER, WEIGHTS, cli, parse
from bench.loadgen import closed_loop
from bench.markdown import bullets, document, fmt, publish, table
from bench.memory import Cpu
from bench.serving import LoadPlan, ModelUnderTest
from bench.stats import percentile, summarize

log = logging.getLogger("bench.ingestion")
SHIPPED_VMARGS = javaproperties.loads(
    (Path(__file__).resolve().parent.parent / "config" / "server-base.properties").read_text()
)["vmargs"]

# name -> config.properties overrides on top of the shipped config/config.properties.
VARIANTS = {
    # The shipped JVM settings (vmargs in config/server-base.properties): G1 picks heap/2048
    # regions (2 MB for the 3 GiB heap).
    "shipped": {},
    # Uploads over half a region are "humongous" objects for G1; 16 MB regions avoid that.
    "16 MB G1 regions": {"vmargs": f"{SHIPPED_VMARGS} -XX:G1HeapRegionSize=16m"},
    # TorchServe's defaults are one netty thread per core for both (2 here).
    "4 netty threads": {"number_of_netty_threads": "4", "netty_client_threads": "4"},
}
PLAN = LoadPlan(warmup_s=2.0, closed_s=8.0, closed_max_requests=2000)  # clients 1 and 16
QUICK = replace(PLAN, warmup_s=0.5, closed_s=1.5)

# A frontend log line about one worker: its name (model and version in it), then the message.
_WORKER_LINE = (
    r"(?P<worker>W-\d+-(?P<model>[^ ]+?)_[^ ]+) org\.pytorch\.serve\.wlm\.WorkerThread - "
)
_BACKEND = re.compile(_WORKER_LINE + r"Backend response time: (?P<ms>\d+)")
# The frontend restarting a worker that died (killed, crashed): its next backend time is the
# model's load again, not a batch, under the same worker name.
_RESTART = re.compile(_WORKER_LINE + "Retry worker")
_STAGES = {
    "HandlerTime": "handler",
    "resnet50_open_ms_total": "open",
    "resnet50_decode_ms_total": "decode",
    "resnet50_forward_ms_total": "forward",
    "resnet50_answer_ms_total": "answer",
}
_METRIC = re.compile(
    r"(?P<worker>W-\d+-[^ ]+?)-stdout .*"
    rf"\[METRICS\](?P<name>{'|'.join(_STAGES)})"
    r"\.Milliseconds:(?P<ms>[\d.]+)\|#(?:ModelName|model):(?P<model>[^,|]+)"
)


def batch_times(lines: Iterable[str], model: str) -> dict[str, list]:
    """Per-batch figures of ``model`` from ts_log lines, in log order: milliseconds
    ``backend``, ``handler``, ``decode``, ``forward``, and the request ``ids`` each HandlerTime
    line names (each a list, one entry per batch). Each worker's first "Backend response time"
    is its model load, not a batch, and so is its first after the frontend restarted it (a
    long-running server's log: the suite's, after a test killed a worker). The frontend
    writes each log line twice (two appenders), not always next to each other; a line seen
    before is counted once (each carries a millisecond timestamp and a worker, HandlerTime also
    request ids). A call that reached the handler without a batch's stages (a describe:
    HandlerTime and a backend time, no decode) is not a batch: counting it would shift the
    stage lists against the handler and backend ones. A batch without one of the stages (every
    image refused: opened, never decoded) has None there, so that each stage list stays
    aligned with the handler's; a stage no batch has is an empty list."""
    times: dict[str, list] = {"backend": [], **{key: [] for key in _STAGES.values()}, "ids": []}
    seen: set[str] = set()
    loaded: set[str] = set()
    staged: dict[str, dict[str, float]] = {}  # each worker's stages since its last HandlerTime
    not_a_batch: set[str] = set()  # workers whose next backend time is not a batch's
    for line in lines:
        if line in seen:
            continue
        seen.add(line)
        restart = _RESTART.search(line)
        if restart and restart.group("model") == model:
            worker = restart.group("worker")
            loaded.discard(worker)
            staged.pop(worker, None)
            not_a_batch.discard(worker)
            continue
        backend = _BACKEND.search(line)
        if backend and backend.group("model") == model:
            worker = backend.group("worker")
            if worker in not_a_batch:
                not_a_batch.discard(worker)
            elif worker in loaded:
                times["backend"].append(float(backend.group("ms")))
            loaded.add(worker)
            continue
        metric = _METRIC.search(line)
        if metric and metric.group("model") == model:
            key, worker = _STAGES[metric.group("name")], metric.group("worker")
            if key != "handler":
                staged.setdefault(worker, {})[key] = float(metric.group("ms"))
            elif worker not in staged:
                not_a_batch.add(worker)
            else:
                stages = {**staged.pop(worker), "handler": float(metric.group("ms"))}
                for stage in _STAGES.values():
                    times[stage].append(stages.get(stage))
                times["ids"].append(tuple(request_ids(line)))
    for stage in _STAGES.values():
        if all(value is None for value in times[stage]):
            times[stage] = []
    return times


def run_batches(times: dict[str, list], run_ids: set[str]) -> dict[str, list]:
    """The batches of one run: from the first to the last HandlerTime line naming one of
    ``run_ids`` (runs on one server follow each other, never overlap), with the frontend,
    decode and forward lines at the same positions (one of each per batch: one worker, and
    every batch of these runs decodes and forwards an image)."""
    hits = [i for i, ids in enumerate(times["ids"]) if run_ids.intersection(ids)]
    if not hits:
        return {key: [] for key in times}
    return {key: values[hits[0] : hits[-1] + 1] for key, values in times.items()}


def _mean(values: list[float | None]) -> float:
    """The mean of the values there are (a batch without a stage has None)."""
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else float("nan")


def split(times: dict[str, list[float]], wall_s: float) -> dict:
    """Means per batch, the transport share and how busy the worker was."""
    means = {key: _mean(times[key]) for key in ("backend", *_STAGES.values())}
    return {
        "batches": len(times["backend"]),
        **{f"{key}_ms": value for key, value in means.items()},
        "transport_ms": means["backend"] - means["handler"],
        "backend_p50_ms": percentile(times["backend"], 50),
        "worker_busy": sum(times["backend"]) / 1000.0 / wall_s if wall_s > 0 else float("nan"),
    }


def measure_variant(
    name: str,
    overrides: dict[str, str],
    images: dict[str, bytes],
    plan: LoadPlan,
    round_: int,
    attach: Path | None = None,
) -> list[dict]:
    """Start the tagger alone with ``overrides`` (``attach``: measure the running TorchServe in
    that folder instead, and leave it running), and measure each image and client count (each
    row also says what the worker served: describe's backend and precision)."""
    workdir = BUILD / "ingestion" / f"round{round_}-{list(VARIANTS).index(name)}"
    rows = []
    tagger = {"load_models": [f"{TAGGER}.mar"], "properties": overrides}
    with layout.torchserve(attach, workdir, **tagger) as server:
        served = server.client().describe(TAGGER, customized=True)[0]["customizedMetadata"]
        model = ModelUnderTest(server, TAGGER, batches_from_log=False, plan=plan)
        for image, body in images.items():
            for clients in plan.clients:
                log.info("%s, round %d: %s, %d client(s)", name, round_ + 1, image, clients)
                row = {"variant": name, "round": round_, "image": image, "clients": clients}
                row |= {k: served[k] for k in ("backend", "precision")}
                rows.append(row | measure_run(server, model.endpoint(body), clients, plan))
    return rows


def measure_run(server, endpoint, clients: int, plan: LoadPlan) -> dict:
    """One closed-loop run after its warm-up (not ``ModelUnderTest.closed``: the CPU times are
    read between them), split by TorchServe's log: its batches found by the request ids of its
    answers (x-request-id), once every answered request's batch and as many frontend lines as
    batches are in."""
    closed_loop(endpoint, clients, plan.warmup_s, plan.closed_max_requests)
    sides = {"client": lambda: [psutil.Process()], "frontend": lambda: server.processes()[:1],
             "worker": lambda: server.processes()[1:]}  # fmt: skip
    cpu = {side: Cpu(processes).start() for side, processes in sides.items()}
    started = time.monotonic()
    samples = closed_loop(endpoint, clients, plan.closed_s, plan.closed_max_requests)
    wall = time.monotonic() - started
    spent = {side: meter.spent() for side, meter in cpu.items()}
    stats = summarize(samples).to_dict()
    run_ids = {s.request_id for s in samples if s.request_id}
    answered = {s.request_id for s in samples if s.ok} & run_ids
    times = settled_log(
        server.workdir / "logs" / "ts_log.log",
        lambda lines: batch_times(lines, TAGGER),
        lambda t: (
            answered <= {i for ids in t["ids"] for i in ids}
            and len(t["backend"]) >= len(t["handler"])
        ),
    )
    parts = split(run_batches(times, run_ids), wall)
    images_done = max(stats["ok"], 1)
    return {
        **stats,
        **parts,
        "outside_ms": (stats["p50_ms"] - parts["backend_p50_ms"]) if clients == 1 else None,
        **{f"cpu_{side}_ms": 1000 * seconds / images_done for side, seconds in spent.items()},
        "cores_available_ms": 1000 * wall * (os.cpu_count() or 1) / images_done,
    }


def raw_forward(served: dict, batch: int, quick: bool) -> dict:
    """The raw forward of what the worker served (``served``: a row with its backend and
    precision) at ``batch``, in this process, every server stopped."""
    label = raw.served_variant(served)
    budget = replace(raw.Budget(), seconds=0.5, max_iters=5) if quick else raw.Budget(seconds=6)
    backend = raw.load_variant(WEIGHTS, label)
    measured = raw.forward_throughput(
        backend, torch.zeros(3, 224, 224, dtype=torch.uint8), batch, budget
    )
    return {"row": label, "precision": backend.precision, "batch": batch, **measured}


def combine(rows: list[dict]) -> list[dict]:
    """One row per (variant, image, clients): the mean over rounds of each figure, and each
    round's img/s."""
    grouped: dict[tuple, list[dict]] = {}
    for row in rows:
        grouped.setdefault((row["variant"], row["image"], row["clients"]), []).append(row)
    return [
        {"variant": variant, "image": image, "clients": clients,
         "rounds_throughput": [g["throughput"] for g in group],
         **{key: _mean([g[key] for g in group if g.get(key) is not None]) for key in COMBINED}}
        for (variant, image, clients), group in grouped.items()
    ]  # fmt: skip


# The figures ``combine`` averages over rounds.
COMBINED = (
    "throughput", "p50_ms", "batch_mean",
    *(f"{stage}_ms" for stage in ("backend", *_STAGES.values(), "transport")),
    "worker_busy", "outside_ms", "errors", "cpu_client_ms", "cpu_frontend_ms", "cpu_worker_ms",
    "cores_available_ms",
)  # fmt: skip
HEADER = (
    "variant | image | clients | img/s (per round) | of raw | p50 ms | batch | backend ms | "
    "handler ms | open / decode / forward / answer ms | transport ms | worker busy | outside ms "
    "| CPU ms/img client / frontend / worker (of available) | errors"
)


def markdown(meta: dict, rows: list[dict]) -> str:
    f, raw_rate, m = fmt, meta["raw"]["images_per_s"], meta["machine"]
    cells = [
        [r["variant"], r["image"], str(r["clients"]),
         f"{f(r['throughput'])} ({' / '.join(f(t) for t in r['rounds_throughput'])})",
         f"{r['throughput'] / raw_rate:.2f}x", f(r["p50_ms"]), f(r["batch_mean"]),
         f(r["backend_ms"]), f(r["handler_ms"]),
         " / ".join(f(r[k]) for k in ("open_ms", "decode_ms", "forward_ms", "answer_ms")),
         f(r["transport_ms"]), f(r["worker_busy"], 2), f(r["outside_ms"]),
         f"{f(r['cpu_client_ms'], 0)} / {f(r['cpu_frontend_ms'], 0)} / "
         f"{f(r['cpu_worker_ms'], 0)} ({f(r['cores_available_ms'], 0)})", f(r["errors"], 0)]
        for r in rows
    ]  # fmt: skip
    return document(
        "Ingestion: where a request's time goes between the client and the worker",
        bullets([
            f"Date: {m['date']}; `{meta['command']}` took {meta['elapsed_s']:.0f} s; "
            f"{meta['rounds']} round(s), variants alternated; {meta['measure_s']:g} s measured "
            "per row after a warm-up.",
            f"Machine: {m['cpu']}, {m['cores']} cores, CPU flags "
            f"{', '.join(f'{k} {v}' for k, v in m['cpu_flags'].items())}; load average "
            f"before {' / '.join(map(str, m['loadavg_at_start']))}, after "
            f"{' / '.join(map(str, meta['loadavg_at_end']))}.",
            f"The tagger archive of `model-store/` (backend {meta['backend']}), alone on its "
            "server, batchSize and maxBatchDelay as shipped; the load generator shares the cores.",
            f"Raw forward of what it serves ({meta['raw']['row']}, precision "
            f"{meta['raw']['precision']}) at batch {meta['raw']['batch']}: "
            f"{meta['raw']['images_per_s']:.1f} img/s in this process after the servers stopped "
            '(the "of raw" column).',
        ]),
        'Per batch (means): backend = the frontend\'s "Backend response time" (batch '
        "written to the worker until its answer is read), handler = the worker's HandlerTime "
        "(open, decode, forward and answer are parts of it), transport = backend - handler "
        "(socket both ways, TorchServe's message parsing in the worker). Worker busy = backend "
        "time / wall time. Outside (1 client) = client p50 - backend p50 (upload, frontend, "
        "answer). CPU ms per image: the load generator / the Java frontend / the worker, "
        "against the core-ms per image the machine had (cores x wall time / images).",
        table(HEADER, cells),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = cli("python -m bench.ingestion", __doc__, attach="shipped")
    parser.add_argument("--quick", action="store_true", help="seconds, not minutes (smoke)")
    parser.add_argument("--rounds", type=int, default=None, help="default 2 (--quick: 1)")
    parser.add_argument(
        "--images", default="small,12mp-noisy", help=f"comma-separated, of {sorted(IMAGES)}"
    )
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated, of {list(VARIANTS)}"
    )
    args = parse(parser, argv)
    plan = QUICK if args.quick else PLAN
    rounds = args.rounds or (1 if args.quick else 2)
    images = {name: (SAMPLES / IMAGES[name]).read_bytes() for name in args.images.split(",")}
    archive = ArchiveInfo.read(MODEL_STORE / f"{TAGGER}.mar")
    started = time.monotonic()
    machine_info = machine.describe_machine()
    rows: list[dict] = []
    for round_ in range(rounds):
        for name in args.variants.split(","):
            attach = args.attach if name == "shipped" else None
            rows += measure_variant(name, VARIANTS[name], images, plan, round_, attach)
    meta = {
        "command": " ".join(["python -m bench.ingestion", *(argv or sys.argv[1:])]),
        "machine": machine_info,
        "backend": f"{archive.backend} (QUANTIZE {archive.quantize})",
        "raw": raw_forward(rows[0], int(archive.model_config.get("batchSize", 16)), args.quick),
        "rounds": rounds,
        "measure_s": plan.closed_s,
        "elapsed_s": time.monotonic() - started,
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
    }
    combined = combine(rows)
    figures = {"meta": meta, "rows": rows, "combined": combined}
    return publish(args.out / "ingestion.md", markdown(meta, combined), figures)


if __name__ == "__main__":
    raise SystemExit(main())
