"""Interactive latency beside a collection job, per engine -> results/traffic.md, .json.

    python -m bench.traffic [--photos 3000] [--seconds 20] [--targets ours,triton,stock]
                                                                        (make bench-traffic)

Per target (ours on TorchServe, ours on Triton, TorchServe's stock ``image_classifier``), the
job alone, the interactive clients alone, then both (bench/README.md says what each step
sends and measures). The issue's targets (interactive p95 during the job <= 1.5x idle, the job
>= 0.85x its img/s alone) are stated beside the ratios, not asserted: the figures move with
the machine's load.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests

from bench import collection, stock
from bench.collection import TSCTL, handler_images, tsctl, tsctl_answer
from bench.layout import BUILD, EMBEDDING, MODEL_STORE, REPO, cli, fresh_dir, parse, torchserve
from bench.loadgen import Endpoint, closed_loop, each_once, scheduled, v2_binary
from bench.machine import dated
from bench.markdown import document, publish, section, table
from bench.stats import Sample, percentile, ratio, summarize
from bench.triton import missing as triton_missing
from bench.triton import stats, triton_serving
from buildsteps.configgen import bulk_lanes
from serveclient.batchjob import Plan

log = logging.getLogger("bench.traffic")

WORK = BUILD / "traffic"
TARGETS = ("ours", "triton", "stock")
CLIENTS = 2
PERIOD_S = 0.2
INTERACTIVE_SIZE = (800, 600)
# #37's handler settings that size the bulk share (reported when the served model has them).
SHARE_SETTINGS = ("bulk_model", "bulk_batch_images", "interactive_window_ms", "cache_bytes")
# The registrations the job may be answered by: the model and its bulk lane, where tsctl sends
# bulk work when the server serves one (servecore/lanes.py).
JOB_MODELS = (EMBEDDING, *(lane for lane, model in bulk_lanes().items() if model == EMBEDDING))
# The stock job stops sending after this many interactive windows (it outlasts the window).
STOCK_JOB_WINDOWS = 3
REFUSED_PAUSE_S = 1.0  # the stock job's pause after a 503 (tsctl's first backoff)
IDLE_TARGET, JOB_TARGET = 1.5, 0.85  # the issue's: p95 during / idle, job img/s during / alone


@dataclass(frozen=True)
class Settings:
    photos: int = 3000  # the folder; at ~100 img/s the job outlasts the window
    seconds: float = 20.0
    warmup_s: float = 3.0
    start_timeout_s: float = 120.0  # for the job to be seen running


def interactive_photos(count: int) -> list[bytes]:
    """``count`` distinct 800x600 JPEGs (seeded, kept in build/bench/traffic-interactive/):
    distinct so that no answer cache can serve a repeat."""
    from tests import imagegen

    folder = BUILD / "traffic-interactive"
    folder.mkdir(parents=True, exist_ok=True)
    bodies = []
    for i in range(count):
        path = folder / f"photo{i:04d}.jpg"
        if not path.exists():
            path.write_bytes(imagegen.jpeg(*INTERACTIVE_SIZE, seed=1_000_000 + i))
        bodies.append(path.read_bytes())
    return bodies


def latency(samples: list[Sample]) -> dict:
    """p50/p95/max of the answered requests, and every other outcome by kind."""
    ok = [s.latency_ms for s in samples if s.ok]
    return {
        "requests": len(samples),
        "ok": len(ok),
        "p50_ms": round(percentile(ok, 50), 1),
        "p95_ms": round(percentile(ok, 95), 1),
        "max_ms": round(max(ok, default=math.nan), 1),
        "errors": dict(Counter(s.error or "unknown" for s in samples if not s.ok)),
    }


class TsctlJob:
    """The collection job in the background, ``tsctl --json embed FOLDER --out OUT [extra]``:
    ``finish()`` waits and returns ``{"done", "failed", "seconds", "images_per_s",
    "errors"}``; ``stop()`` ends it now (a measurement that failed leaves nothing running)."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.process = tsctl(["embed", *argv], env)

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.running():
            self.process.kill()
            self.process.communicate()

    def finish(self) -> dict:
        answer = tsctl_answer(self.process, "embed")
        # tsctl lists the first failures' messages (its own words, not a status): cut short.
        errors = Counter(e["error"][:60] for e in answer.get("failures", []))
        if answer["failed"] > sum(errors.values()):
            errors["(not listed)"] += answer["failed"] - sum(errors.values())
        seconds = answer["seconds"]
        return {
            "done": answer["done"],
            "failed": answer["failed"],
            "seconds": seconds,
            "images_per_s": round(answer["done"] / seconds, 2) if seconds else 0.0,
            "errors": dict(errors),
        }


class LoadgenJob:
    """Every photo once through bench's load generator, ``clients`` keep-alive connections,
    no new request after ``limit_s`` (the stock handler's job: it takes no v2 request, so
    tsctl cannot drive it; and at its speed a large folder would outlast the run). A photo
    refused by a full queue (503) is sent again after a pause, as tsctl's job would."""

    def __init__(self, url: str, headers: dict[str, str], photos: list[Path], clients: int,
                 limit_s: float) -> None:  # fmt: skip
        endpoints = [Endpoint(url, headers, path, 120.0) for path in photos]
        self.load = each_once(endpoints, clients, limit_s, REFUSED_PAUSE_S)
        self.running, self.stop = self.load.running, self.load.stop

    def answered(self) -> int:
        return self.load.answered()

    def finish(self) -> dict:
        samples = self.load.join()
        stats = summarize([s for s in samples if s.status != 503])
        return {
            "done": stats.ok,
            "failed": stats.errors,
            "seconds": round(stats.duration_s, 2),
            "images_per_s": round(stats.throughput, 2),
            "errors": stats.error_kinds,
            "refused_and_resent": len(samples) - stats.requests,
        }


class OursOnTorchServe:
    """One server under test, started and stopped by ``serving()``: how its interactive
    clients call it (``endpoint``), how its job runs and at what concurrency, how many images
    it has answered, and what shapes the bulk share as served (``settings``: batching, and
    #37's handler settings or Triton's priority levels where the checkout has them). This
    one: ours on TorchServe, ``attach``: the folder of a running ``LocalTorchServe`` to
    measure, left running."""

    name, label = "ours", "ours on TorchServe 0.12"
    model = EMBEDDING
    has_classes = True  # whether the job can send a class (tsctl --priority)

    def __init__(self, attach: Path | None = None) -> None:
        self.server = torchserve(attach, WORK / "ours")
        self.runs = 0

    @contextmanager
    def serving(self) -> Iterator[OursOnTorchServe]:
        with self.server:
            yield self

    def endpoint(self, body: bytes | Path) -> Endpoint:
        url = f"{self.server.inference_url}/predictions/{self.model}"
        return Endpoint(url, self.server.keys.inference_headers(), body)

    def described(self) -> dict:
        return self.server.client().describe(self.model, customized=True)[0]

    def concurrency(self) -> int:
        return Plan.from_describe(self.described()).concurrency

    def job(self, folder: Path, photos: list[Path], extra: list[str]):
        return TsctlJob([str(folder), "--out", str(self._out()), *extra], self.server.cli_env())

    def _out(self) -> Path:
        self.runs += 1
        return fresh_dir(WORK / f"{self.name}-job{self.runs}") / "embeddings.parquet"

    def settings(self) -> dict:
        entry = self.described()
        handler = (entry.get("customizedMetadata") or {}).get("handler") or {}
        return {
            "batchSize": entry.get("batchSize"),
            "maxBatchDelay": entry.get("maxBatchDelay"),
            "workers": len(entry.get("workers") or []),
            **{k: handler[k] for k in SHARE_SETTINGS if k in handler},
        }

    def answered(self) -> int:
        return int(handler_images(self.server, JOB_MODELS))


class OursOnTriton(OursOnTorchServe):
    name, label = "triton", "ours on Triton 2.51"

    def __init__(self) -> None:
        from tritonrepo.generate import generate

        self.work = fresh_dir(WORK / "triton")
        generate(self.work / "repository", model_store=MODEL_STORE)
        self.runs = 0

    @contextmanager
    def serving(self) -> Iterator[OursOnTorchServe]:
        with triton_serving(self.work / "repository", self.work / "triton.log") as self.triton:
            yield self

    def endpoint(self, body: bytes | Path) -> Endpoint:
        payload, headers = v2_binary([body], ["embedding"], binary_out=False)
        return Endpoint(f"{self.triton.url}/v2/models/{EMBEDDING}/infer", headers, payload)

    def concurrency(self) -> int:
        return Plan.from_describe(None).concurrency  # what tsctl --url plans without describe

    def job(self, folder: Path, photos: list[Path], extra: list[str]):
        argv = [str(folder), "--url", self.triton.url, "--out", str(self._out()), *extra]
        return TsctlJob(argv, dict(os.environ, PYTHONPATH=str(REPO)))

    def settings(self) -> dict:
        """The generated config.pbtxt's dynamic batcher, as Triton loaded it."""
        url = f"{self.triton.url}/v2/models/{EMBEDDING}/config"
        config = requests.get(url, timeout=30).json()
        return {k: config.get(k) for k in ("max_batch_size", "dynamic_batching")}

    def answered(self) -> int:
        return sum(int(stats(self.triton.url, model)["inference_count"]) for model in JOB_MODELS)


class StockTorchServe(OursOnTorchServe):
    name, label = "stock", "stock TorchServe 0.12 (image_classifier)"
    has_classes = False
    model = stock.MODEL_NAME

    def __init__(self, job_limit_s: float) -> None:
        self.job_limit_s = job_limit_s
        # The embedding model's frontend settings: the model our job and clients share.
        self.server = stock.stock_server(WORK / "stock", like=EMBEDDING)
        self.jobs: list[LoadgenJob] = []

    def described(self) -> dict:
        return self.server.client().describe(stock.MODEL_NAME)[0]

    def job(self, folder: Path, photos: list[Path], extra: list[str]):
        url, headers = self.endpoint(b"").url, self.server.keys.inference_headers()
        self.jobs.append(LoadgenJob(url, headers, photos, self.concurrency(), self.job_limit_s))
        return self.jobs[-1]

    def answered(self) -> int:
        # Every job's answers, as the server counts them: a job is "seen running" when this
        # grows past the count taken before it started.
        return sum(job.answered() for job in self.jobs)


def tsctl_has_priority() -> bool:
    """Whether this checkout's ``tsctl embed`` can send a class (``--priority``)."""
    done = subprocess.run([TSCTL, "embed", "--help"], capture_output=True, text=True, timeout=60)
    return "--priority" in done.stdout


def measure(target: OursOnTorchServe, settings: Settings, folder: Path, photos: list[Path]) -> dict:
    """The three steps of the module docstring on ``target``, after its warm-up."""
    per_client = math.ceil(settings.seconds / PERIOD_S) + 1
    bodies = interactive_photos(CLIENTS * per_client)
    classes = target.has_classes and tsctl_has_priority()

    def clients() -> list[Sample]:
        mine = [bodies[i * per_client : (i + 1) * per_client] for i in range(CLIENTS)]
        return scheduled(
            [[target.endpoint(b) for b in m] for m in mine], PERIOD_S, settings.seconds
        )

    with target.serving():
        concurrency = target.concurrency()
        closed_loop(target.endpoint(bodies[0]), concurrency, settings.warmup_s, 10_000)
        # The job's own request shapes too (v2, several images per request: batches of
        # more rows than one-image requests form), on one album of the folder.
        first = folder / "album00"
        target.job(first, [p for p in photos if p.parent == first], []).finish()
        log.info("%s: job alone (%d photos)", target.name, len(photos))
        alone = target.job(folder, photos, []).finish()
        unclassed = None
        if classes:
            log.info("%s: job alone, --priority interactive", target.name)
            unclassed = target.job(folder, photos, ["--priority", "interactive"]).finish()
        log.info("%s: interactive alone, %g s", target.name, settings.seconds)
        idle = latency(clients())
        log.info("%s: both", target.name)
        both = beside_the_job(target, settings, folder, photos, concurrency, clients)
        served = target.settings()
    return {
        "target": target.name,
        "label": target.label,
        "concurrency": concurrency,
        "settings": served,
        "classes_sent": classes,
        "job_alone": alone,
        "job_alone_unclassed": unclassed,
        "interactive_idle": idle,
        **both,
        "p95_ratio": round(ratio(both["interactive_during"]["p95_ms"], idle["p95_ms"]), 2),
        "job_ratio": round(ratio(both["job_during"]["images_per_s"], alone["images_per_s"]), 2),
        "class_ratio": round(ratio(alone["images_per_s"], unclassed["images_per_s"]), 2)
        if unclassed
        else None,
    }


def beside_the_job(target, settings: Settings, folder: Path, photos: list[Path],
                   concurrency: int, clients) -> dict:  # fmt: skip
    """The job started and seen running (the server answered a round of its requests), the
    interactive ``clients()`` meanwhile, then the job left to finish."""
    before, started = target.answered(), time.monotonic()
    job = target.job(folder, photos, [])
    try:
        waited = time.monotonic() + settings.start_timeout_s
        while job.running() and target.answered() - before < concurrency:
            if time.monotonic() > waited:
                raise RuntimeError(f"{target.name}: the job was not seen running")
            time.sleep(0.05)
        seen_running_s = time.monotonic() - started
        during = latency(clients())
        window_end = time.monotonic()
        job_running_at_end = job.running()
        during_job = job.finish()
    finally:
        job.stop()
    return {
        "interactive_during": during,
        "job_during": during_job,
        "job_seen_running_after_s": round(seen_running_s, 2),
        # False: the job ended inside the window, whose tail then ran without it.
        "job_outlasted_window": job_running_at_end,
        "job_ran_after_window_s": round(time.monotonic() - window_end, 2),
    }


def errors_cell(row: dict) -> str:
    windows = {"interactive_idle": "idle", "interactive_during": "during",
               "job_alone": "job alone", "job_during": "job during"}  # fmt: skip
    parts = [
        f"{name}: {kind} x{n}"
        for key, name in windows.items()
        for kind, n in sorted(row[key]["errors"].items())
    ]
    return "; ".join(parts) or "none"


def verdict(value: float, target: float, most: bool) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    met = value <= target if most else value >= target
    return f"**{value:.2f}x** ({'met' if met else 'missed'}: {'<=' if most else '>='} {target}x)"


FIRST = ("target | interactive p95 idle (ms) | p95 during (ms) | during / idle | job img/s alone | "
         "job img/s during | during / alone | errors by status")  # fmt: skip
SECOND = ("target | idle p50 / max (ms) | during p50 / max (ms) | interactive answered idle, "
          "during | job (bulk) seen running after | job outlasted the window")  # fmt: skip
LIMITS = (
    "On 2 cores one batch takes every core, and no engine pre-empts a batch already "
    "running: a person's photo that arrives behind a bulk batch waits for all of it. The "
    "kernel can pre-empt a process, so ours sends the job to the model's bulk lane "
    "(`handler.bulk_model`, servecore/lanes.py): the same archive registered a second "
    "time, its worker under Linux's `SCHED_IDLE`, which runs only on CPU time no normal "
    "process wants; when the interactive worker wakes it takes both cores back at once, "
    "mid-batch, and alone the lane has the whole machine. tsctl's job threads yield the "
    "same way on the serving host. Where no lane is registered (a KServe runtime), bulk "
    "requests share the model: while interactive traffic is about they get at most "
    "`handler.bulk_batch_images` rows of a batch (fewer rows, shorter waits and a slower "
    "job), for `interactive_window_ms` after the last interactive request; Triton orders "
    "its queue by priority level, but a running batch still runs to its end. "
    "Served settings:"
)


def report(results: dict) -> str:
    rows = results["rows"]
    first = [
        [r["label"], str(r["interactive_idle"]["p95_ms"]), str(r["interactive_during"]["p95_ms"]),
         verdict(r["p95_ratio"], IDLE_TARGET, True), str(r["job_alone"]["images_per_s"]),
         str(r["job_during"]["images_per_s"]), verdict(r["job_ratio"], JOB_TARGET, False),
         errors_cell(r)]
        for r in rows
    ]  # fmt: skip
    second = [
        [r["label"], f"{i['p50_ms']} / {i['max_ms']}", f"{d['p50_ms']} / {d['max_ms']}",
         f"{i['ok']}/{i['requests']}, {d['ok']}/{d['requests']}",
         f"{r['job_seen_running_after_s']} s",
         "yes" if r["job_outlasted_window"] else "no: the window ended without it"]
        for r in rows
        for i, d in [(r["interactive_idle"], r["interactive_during"])]
    ]  # fmt: skip
    classed = [
        [r["label"], str(r["job_alone"]["images_per_s"]),
         str(r["job_alone_unclassed"]["images_per_s"]), verdict(r["class_ratio"], 0.95, False)]
        for r in rows
        if r["job_alone_unclassed"]
    ]  # fmt: skip
    settings = "\n".join(
        f"- {r['label']}: {json.dumps(r['settings'], separators=(', ', ': '))}" for r in rows
    )
    return document(
        "Interactive requests beside a collection job (`make bench-traffic`)",
        results["provenance"],
        f"Generated by `python -m bench.traffic` on {results['machine']}: a job over "
        f"{results['photos']} generated photos ({results['mix']}), and {CLIENTS} interactive "
        f"clients each sending one distinct {INTERACTIVE_SIZE[0]}x{INTERACTIVE_SIZE[1]} JPEG "
        f"every {PERIOD_S} s for {results['seconds']:g} s (open loop: latency from the "
        "scheduled send), to the model the job embeds with, first alone and then while the "
        "job runs. The issue's targets, stated, not asserted: p95 during <= "
        f"{IDLE_TARGET}x idle, job during >= {JOB_TARGET}x alone.",
        table(FIRST, first, "lrrlrr"),
        table(SECOND, second, "lrrrr"),
        "The job alone sending its class (`bulk`, tsctl's default) and sending none "
        "(`--priority interactive`, what today's client sends):"
        if classed
        else "This checkout's `tsctl embed` has no `--priority`: the job sent no class "
        "(every request interactive), so the figures above are today's behaviour.",
        table("target | bulk img/s | no class img/s | bulk / no class", classed, "lrr")
        if classed
        else None,
        section(
            "What limits the ratio: the bulk lane and the bulk share",
            LIMITS,
            settings,
            "Stock TorchServe's job is bench's load generator (one photo per `/predictions` "
            "request at the job's concurrency): tsctl speaks v2, which the stock handler does "
            f"not. It stops sending after {STOCK_JOB_WINDOWS}x the interactive window "
            f"({STOCK_JOB_WINDOWS * results['seconds']:g} s), so its img/s is over the photos "
            "it reached by then."
            + "".join(f"\n- No {name} row: {why}" for name, why in results["skipped"].items()),
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = cli("python -m bench.traffic", __doc__, attach="ours")
    add = parser.add_argument
    add("--photos", type=int, default=Settings.photos, help="the job's folder")
    add("--seconds", type=float, default=Settings.seconds,
        help="how long the interactive clients send, alone and during the job")  # fmt: skip
    add("--targets", default=",".join(TARGETS), help=f"of {', '.join(TARGETS)} (default all)")
    args = parse(parser, argv)
    names = [t.strip() for t in args.targets.split(",") if t.strip()]
    if unknown := set(names) - set(TARGETS):
        parser.error(f"unknown targets {sorted(unknown)}: choose from {', '.join(TARGETS)}")
    settings = Settings(photos=args.photos, seconds=args.seconds)
    provenance = dated()
    folder = collection.WORK / f"photos-{args.photos}"
    log.info("generating %d photos in %s", args.photos, folder)
    photos = collection.generate(folder, args.photos)
    rows, skipped = [], {}
    makers = {"ours": lambda: OursOnTorchServe(args.attach), "triton": OursOnTriton,
              "stock": lambda: StockTorchServe(STOCK_JOB_WINDOWS * settings.seconds)}  # fmt: skip
    for name in names:
        if name == "triton" and (why := triton_missing()):
            log.warning("no Triton row: %s", why)
            skipped[name] = why
            continue
        rows.append(measure(makers[name](), settings, folder, photos))
    results = {
        "provenance": provenance,
        "machine": f"{collection.cpu_model()}, {os.cpu_count()} CPUs",
        "photos": len(photos),
        "mix": collection.mix(),
        "seconds": settings.seconds,
        "rows": rows,
        "skipped": skipped,
    }
    return publish(args.out / "traffic.md", report(results), results)


if __name__ == "__main__":
    raise SystemExit(main())
