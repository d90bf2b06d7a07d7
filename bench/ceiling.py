"""The serving engines' own ceilings: requests/s and images/s through TorchServe and through
Triton with models that do no work (``bench.null``), so a GPU server can be planned on paper.

    python -m bench.ceiling            # make bench-ceiling -> results/ceiling.md (~10 minutes)
    python -m bench.ceiling --quick    # one short row per engine (the suite's smoke test)
    python -m bench.ceiling --tracing  # the core rows, tracing off and on -> ceiling-tracing.md

Rows: each engine x {bare: the engine alone, a fixed answer; core: our adapter and core with
decode and forward no-ops} x {1 image per request: the raw body on TorchServe, Triton's binary
tensor extension; 8 images: a KServe v2 JSON body of 8 base64 images answered in JSON; 8 images
in the v2 binary tensor extension both ways (raw image bytes in, the embedding's float32 bytes
out, as ``tsctl embed`` sends them)}. Each row is a closed loop of twice a full batch of
clients (a batch is 64 images: 64 one-image or 8 eight-image requests) on 127.0.0.1, bounded
in time and count. Besides the rates, each row gives the CPU time the server spent per
request, split into the frontend (TorchServe's Java process, ``tritonserver``) and the model's
worker (a Python process: one core at most), and the cores the load generator took: on a
shared host the CPU per request is the steadier figure, and what the plan
(``docs/backends.md``) scales. Each row runs three times (``--rounds``), interleaved, and its
median round is reported: one run of a row moved by 15% and more on this shared host.

``--tracing``: the core rows only, each served twice at once, by a server started as shipped
(every ``OTEL_*`` variable removed: tracing off) and by one started with tracing on at ratio
1.0 (``OTEL_TRACES_SAMPLER=always_on``, ``OTEL_EXPORTER_OTLP_ENDPOINT`` at a
``devtools.otlp.Receiver`` in this process, answering 200), their rows interleaved round by
round; beside them what tracing off costs in-process (``off_path_us``). Its report is
results/ceiling-tracing.md, so the full run's ceiling.md stays.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import time
import timeit
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from unittest import mock

import psutil

from bench.layout import IMAGES, SAMPLES, cli, fresh_dir, parse
from bench.loadgen import Endpoint, closed_loop, v2_binary, v2_json, warm
from bench.machine import dated, describe_machine
from bench.markdown import bullets, document, figure, publish, section, table
from bench.memory import Cpu
from bench.null import package
from bench.null.package import BATCH_IMAGES, KINDS, model_name
from bench.stats import summarize
from bench.triton import batch_meter, missing, triton_serving
from devtools.otlp import Receiver
from devtools.server import LocalTorchServe
from servecore.stages import Incoming
from servecore.tracing import untraced

logger = logging.getLogger("bench.ceiling")

# What a row's requests carry: (images per request, form); "raw" is one image as the raw body
# (TorchServe) or in the binary extension (Triton); "json" and "binary" are KServe v2 bodies.
REQUESTS = ((1, "raw"), (8, "json"), (8, "binary"))
FORMS = {"raw": "raw image", "json": "v2 JSON", "binary": "v2 binary in and out"}
ENGINES = ("torchserve", "triton")
MAX_REQUESTS = 500_000  # a bound on every row besides its time
WARMUP = 20  # requests per row before measuring, each must answer 200
# The H100 figures (issue #41, measured on landed main db71e10): what the plan feeds.
GPU_FIGURES = (
    ("plain nvJPEG + f16 loop, small JPEGs, b64", 4794),
    ("raw forward f16 channels_last, b64", 10167),
    ("raw forward f16 channels_last, b256", 13697),
    ("plain nvJPEG + f16 loop, 12 MP photos, b16", 295),
)
H100_HOST_CORES = 16  # the H100 machine
# Tracing on at ratio 1.0 (servecore.tracing), towards the bench's receiver (its endpoint added).
TRACING_ON = {"OTEL_TRACES_SAMPLER": "always_on", "OTEL_SERVICE_NAME": "bench-ceiling"}


@dataclass(frozen=True)
class Row:
    """One measured load: ``engine``, ``kind`` (bare or core), ``images`` per request."""

    engine: str
    kind: str
    images: int
    form: str  # raw, json or binary (REQUESTS)
    clients: int
    requests: int
    errors: int
    error_kinds: dict
    requests_per_s: float
    images_per_s: float
    p50_ms: float
    p99_ms: float
    batch_images: float  # mean images per model execution (NaN: unknown)
    frontend_ms: float  # server CPU ms per request, frontend
    worker_ms: float  # ... the model's worker
    client_cores: float  # the load generator's CPU over the run
    worker_ms_runs: tuple[float, ...] = ()  # every round's worker_ms (this row: the median's)
    traced: bool = False  # served with tracing on at ratio 1.0 (TRACING_ON)


@dataclass
class Target:
    """One engine serving the null models: where each row's requests go and its processes."""

    engine: str
    endpoint: Callable[[str, int, str], Endpoint]  # (kind, images, form) -> what to POST
    frontend: Callable[[], list[psutil.Process]]
    workers: Callable[[], list[psutil.Process]]
    batch_images: Callable[[str, int], Callable[[], float]]  # (kind, images) -> a meter


def v2_request(form: str, images: int, image: bytes, outputs: list[str]):
    """A v2 body of ``images`` copies of ``image`` in ``form`` (json: base64 in JSON, as
    ``TorchServeClient.infer`` sends it; binary: the raw bytes both ways, as ``tsctl embed``),
    and its headers."""
    return (v2_binary if form == "binary" else v2_json)([image] * images, outputs)


@contextmanager
def torchserve(work: Path, image: bytes, models: list[tuple[str, int]]) -> Iterator[Target]:
    """A TorchServe serving each (kind, images) null model."""
    store = package.torchserve_store(work, models)
    with LocalTorchServe(
        work / "server",
        store,
        load_models=[f"{model_name(*m)}.mar" for m in models],
        properties={"job_queue_size": str(package.QUEUE)},
    ) as server:

        def endpoint(kind: str, images: int, form: str) -> Endpoint:
            name, auth = model_name(kind, images), server.keys.inference_headers()
            if form == "raw":
                url, body, headers = f"{server.inference_url}/predictions/{name}", image, {}
            else:
                url = f"{server.inference_url}/v2/models/{name}/infer"
                body, headers = v2_request(form, images, image, ["embedding"])
            return Endpoint(url, {**auth, **headers}, body)

        # The batch meter: NaN, the rows' X-Batch-Size says it.
        frontend, workers = (lambda: server.processes()[:1]), (lambda: server.processes()[1:])
        yield Target("torchserve", endpoint, frontend, workers, lambda *_: lambda: math.nan)


@contextmanager
def triton(work: Path, image: bytes, kinds: list[str]) -> Iterator[Target]:
    """A Triton serving each kind's null model (both request sizes)."""
    repository = package.triton_repository(work, kinds)
    with triton_serving(repository, work / "triton.log") as server:
        root = psutil.Process(server.process.pid)

        def endpoint(kind: str, images: int, form: str) -> Endpoint:
            url = f"{server.url}/v2/models/{model_name(kind)}/infer"
            if form == "raw":
                body, headers = v2_binary([image], ["embedding"], binary_out=False)
            else:  # what serveclient asks Triton for: the embedding and its precision
                body, headers = v2_request(form, images, image, ["embedding", "precision"])
            return Endpoint(url, headers, body)

        def batch_images(kind: str, _images: int) -> Callable[[], float]:
            return batch_meter(server.url, model_name(kind))

        workers = partial(root.children, recursive=True)
        yield Target("triton", endpoint, lambda: [root], workers, batch_images)


def measure(target: Target, kind: str, images: int, form: str, seconds: float) -> Row:
    """One closed-loop row after a warm-up whose every request must answer 200."""
    endpoint = target.endpoint(kind, images, form)
    warm(endpoint, WARMUP, f"{target.engine} {kind} x{images} {form}")
    clients = 2 * BATCH_IMAGES // images
    batches = target.batch_images(kind, images)
    frontend, workers = Cpu(target.frontend).start(), Cpu(target.workers).start()
    client_started, started = time.process_time(), time.monotonic()
    samples = closed_loop(endpoint, clients, seconds, MAX_REQUESTS)
    wall = time.monotonic() - started
    client_cpu = time.process_time() - client_started
    front_s, work_s = frontend.spent(), workers.spent()
    stats = summarize(samples)
    served = max(stats.ok, 1)
    batch = batches()
    if math.isnan(batch) and not math.isnan(stats.batch_mean):
        batch = stats.batch_mean * images  # X-Batch-Size counts requests
    return Row(
        target.engine, kind, images, form, clients, stats.requests, stats.errors,
        stats.error_kinds, stats.throughput, stats.throughput * images, stats.p50_ms,
        stats.p99_ms, batch, 1000 * front_s / served, 1000 * work_s / served, client_cpu / wall,
    )  # fmt: skip


@dataclass(frozen=True)
class Need:
    """What one GPU figure asks of an engine at one request size, from a core row."""

    engine: str
    gpu: str
    images_per_s: float
    images: int
    form: str  # the request form of the row it scales (REQUESTS)
    requests_per_s: float
    workers: int  # worker processes, each at most one core
    worker_cores: float
    frontend_cores: float


def plan(rows: list[Row]) -> list[Need]:
    """For each engine's core rows and each GPU figure: the requests/s that feed it, the
    worker processes and frontend cores that takes at the CPU per request measured here."""
    needs = []
    for row in (r for r in rows if r.kind == "core" and not r.traced):
        for gpu, rate in GPU_FIGURES:
            wanted = rate / row.images
            worker_cores = wanted * row.worker_ms / 1000
            needs.append(
                Need(
                    row.engine,
                    gpu,
                    rate,
                    row.images,
                    row.form,
                    wanted,
                    max(1, math.ceil(worker_cores)),
                    worker_cores,
                    wanted * row.frontend_ms / 1000,
                )
            )
    return needs


ROWS = ("engine | model | images/request | request | clients | requests | errors | requests/s | "
        "images/s | p50 ms | p99 ms | images/batch | frontend CPU ms/request | worker CPU "
        "ms/request | load generator cores | worker CPU ms/request, each round")  # fmt: skip
NEEDS = ("engine | GPU figure | img/s | images/request | request | requests/s | worker cores | "
         "workers | frontend cores")  # fmt: skip


def report(
    rows: list[Row], machine: dict, seconds: float, rounds: int = 1, tracing: dict | None = None
) -> str:
    """results/ceiling.md: the rows, then the plan for one H100 from them; with ``tracing``
    (``--tracing``'s figures) the tracing section first."""
    cells = [
        [r.engine, f"{r.kind}, traced" if r.traced else r.kind, r.images, FORMS[r.form],
         r.clients, f"{r.requests:,}", r.errors,
         figure(r.requests_per_s), figure(r.images_per_s),
         *(figure(v, 1) for v in (r.p50_ms, r.p99_ms, r.batch_images)),
         *(figure(v, 2) for v in (r.frontend_ms, r.worker_ms, r.client_cores)),
         ", ".join(figure(w, 2) for w in r.worker_ms_runs)]
        for r in rows
    ]  # fmt: skip
    needs = [
        [n.engine, n.gpu, f"{n.images_per_s:,.0f}", n.images, FORMS[n.form],
         f"{n.requests_per_s:,.0f}", f"{n.worker_cores:.1f}", n.workers, f"{n.frontend_cores:.1f}"]
        for n in plan(rows)
    ]  # fmt: skip
    return document(
        "Engine ceilings: models that do no work",
        f"Generated by `python -m bench.ceiling{' --tracing' * bool(tracing)}` (`make "
        f"bench-ceiling{'-tracing' * bool(tracing)}`); bench/ceiling.py says what each row "
        "measures.",
        bullets([
            dated(),
            f"Host: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gb']} GiB; "
            f"{machine['cpu_busy_percent_before']:.0f}% busy in the second before the run (a "
            "shared host: other work makes every rate lower and every latency longer; the CPU "
            "per request is the steadier figure)",
            f"Each row: a closed loop of 2 batches of clients (a batch is {BATCH_IMAGES} images), "
            f"{seconds:g} s after {WARMUP} warm-up requests, on 127.0.0.1; one worker (instance); "
            f"queues of {package.QUEUE} requests (the ceiling, not the shipped bound); bare: the "
            "engine alone, a fixed answer; core: our adapter and core, decode and forward no-ops",
            f"Rounds: each row ran {rounds} time(s), an engine's rows in turn; the row shown is "
            "its median round by worker CPU per request, every round's figure in the last column",
        ]),
        tracing_section(rows, tracing) if tracing else None,
        section("Rows", table(ROWS, cells, "llrlrrrrrrrrrrr")),
        section(
            "Planning one H100",
            "The H100 figures are issue #41's, measured on landed main db71e10 (one NVIDIA H100 "
            f"80GB, {H100_HOST_CORES} CPU cores): "
            + "; ".join(f"{name} {rate:,} img/s" for name, rate in GPU_FIGURES)
            + ". For each, the requests/s that carry it at each request size, and what the core "
            "rows above say that costs in CPU of this host: worker processes (a Python worker "
            "uses one core at most) and frontend cores. A floor: the real model's per-image work "
            "(decode, transform, copies) comes on top.",
            table(NEEDS, needs, "llrrlrrrr"),
        ),
    )  # fmt: skip


def off_path_us(repeat: int) -> dict[str, float]:
    """What tracing off costs the core in-process (servecore.tracing), in µs, the best of five
    runs of ``repeat`` each: a batch's ``untraced`` call and its no-op trace's two steps, and a
    request's ``traceparent`` lookup among an engine's usual headers (``Incoming.traced``)."""
    incoming = Incoming("r", payload=None)  # type: ignore[arg-type]
    headers = {"content-type": "image/jpeg", "content-length": "24576", "x-request-id": "r"}

    def batch() -> None:
        trace = untraced((incoming,))
        trace.answered(None, 0.0, ())  # type: ignore[arg-type]
        trace.end()

    def best(step: Callable[[], object]) -> float:
        return 1e6 * min(timeit.repeat(step, number=repeat, repeat=5)) / repeat

    return {"batch_us": best(batch), "request_us": best(lambda: incoming.traced(headers))}


TRACED = (
    "engine | images/request | request | worker CPU ms/request, off | on | on/off | "
    "frontend CPU ms/request, off | on | p50 ms, off | on | requests/s, off | on"
)


def tracing_section(rows: list[Row], tracing: dict) -> str:
    """``--tracing``'s comparison: each core row off beside on, and what off costs in-process."""
    off = {(r.engine, r.images, r.form): r for r in rows if r.kind == "core" and not r.traced}
    cells = []
    for r in (r for r in rows if r.traced and (r.engine, r.images, r.form) in off):
        o = off[(r.engine, r.images, r.form)]
        cells.append([r.engine, r.images, FORMS[r.form],
                      *(figure(v, 2) for v in (o.worker_ms, r.worker_ms, r.worker_ms / o.worker_ms,
                                               o.frontend_ms, r.frontend_ms)),
                      *(figure(v, 1) for v in (o.p50_ms, r.p50_ms)),
                      figure(o.requests_per_s), figure(r.requests_per_s)])  # fmt: skip
    return section(
        "Tracing off and on",
        "Each core row served twice at once: by a server started as shipped (no `OTEL_*` "
        "variable: tracing off) and by one with tracing on at ratio 1.0 (`OTEL_TRACES_SAMPLER="
        "always_on`, spans posted over OTLP/HTTP to a receiver in the benchmark's process, "
        f"answering 200: {tracing['spans']:,} spans in {tracing['exports']:,} posts), rows "
        "interleaved round by round; the figures are the rows' medians below. In-process, "
        f"tracing off costs a batch {tracing['batch_us']:.2f} µs (the `untraced` call and its "
        f"no-op trace) and a request {tracing['request_us']:.2f} µs (its `traceparent` lookup).",
        table(TRACED, cells, "lrlrrrrrrrrr"),
    )


def median_row(runs: list[Row]) -> Row:
    """The round whose worker CPU per request is the median (the lower middle of an even
    count), carrying every round's figure."""
    ordered = sorted(runs, key=lambda r: r.worker_ms)
    middle = ordered[(len(ordered) - 1) // 2]
    return replace(middle, worker_ms_runs=tuple(r.worker_ms for r in runs))


@contextmanager
def environment(receiver: Receiver | None) -> Iterator[None]:
    """The environment a server starts in: every ``OTEL_*`` variable removed (tracing off, as
    shipped) and, with ``receiver``, tracing on at ratio 1.0 towards it (TRACING_ON). Only for
    the start: TorchServe's frontend and Triton keep the environment they started with, and
    their workers read it as the model loads (servecore.tracing)."""
    on = {} if receiver is None else {**TRACING_ON, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}
    with mock.patch.dict(os.environ):
        for name in [n for n in os.environ if n.startswith("OTEL_")]:
            del os.environ[name]
        os.environ.update(on)
        yield


def serving(
    engine: str, work: Path, image: bytes, wanted: list[tuple[str, int]]
) -> AbstractContextManager[Target]:
    """``engine`` serving each (kind, images) null model, in a fresh ``work``."""
    if engine == "triton":
        return triton(fresh_dir(work), image, sorted({k for k, _ in wanted}))
    return torchserve(fresh_dir(work), image, wanted)


def run(
    rows: list[tuple[str, str, int, str, bool]], seconds: float, work: Path, rounds: int = 1,
    receiver: Receiver | None = None,
) -> list[Row]:  # fmt: skip
    """Each (engine, kind, images, form, traced) row, engine by engine; an engine not installed
    is left out, saying why. Traced rows go to a second server of the engine, started beside
    the first with tracing on towards ``receiver`` (``environment``). With ``rounds`` > 1 the
    engine's rows run in turn that many times (bare and core, off and on interleaved, so that a
    busy spell of a shared host falls on both) and each row is its median round
    (``median_row``)."""
    image = (SAMPLES / IMAGES["small"]).read_bytes()
    measured = []
    for engine in ENGINES:
        requests = [r[1:] for r in rows if r[0] == engine]
        if not requests:
            continue
        if engine == "triton" and (why := missing()):
            logger.warning("no Triton rows: %s", why)
            continue
        logger.info("starting %s", engine)
        with ExitStack() as servers:
            targets = {}
            for traced in sorted({r[3] for r in requests}):
                wanted = sorted({(kind, n) for kind, n, _, t in requests if t == traced})
                with environment(receiver if traced else None):
                    where = work / f"{engine}-{'traced' if traced else 'plain'}"
                    targets[traced] = servers.enter_context(serving(engine, where, image, wanted))
            runs: dict[tuple[str, int, str, bool], list[Row]] = {}
            for kind, images, form, traced in [r for _ in range(rounds) for r in requests]:
                row = measure(targets[traced], kind, images, form, seconds)
                runs.setdefault((kind, images, form, traced), []).append(
                    replace(row, traced=traced)
                )
                logger.info("%s %s x%d %s%s: %.0f requests/s, %.0f images/s, p50 %.1f ms, "
                            "%d errors", engine, kind, images, form, ", traced" * traced,
                            row.requests_per_s, row.images_per_s, row.p50_ms,
                            row.errors)  # fmt: skip
            measured += [median_row(found) for found in runs.values()]
    return measured


def main(argv: list[str] | None = None) -> int:
    parser = cli("python -m bench.ceiling", __doc__)
    parser.add_argument("--seconds", type=float, default=12.0, help="measured time per row")
    parser.add_argument(
        "--rounds", type=int, default=3, help="times each row runs; the median is reported"
    )
    parser.add_argument(
        "--quick", action="store_true", help="one 2 s row per engine (core, 8 images, v2 binary)"
    )
    parser.add_argument(
        "--tracing", action="store_true",
        help="the core rows with tracing off and on at ratio 1.0 -> ceiling-tracing.md",
    )  # fmt: skip
    parser.add_argument(
        "--engine", choices=ENGINES, action="append", help="only this engine (repeatable)"
    )
    args = parse(parser, argv)
    if args.quick:
        plan_rows, seconds, rounds = [(e, "core", 8, "binary") for e in ENGINES], 2.0, 1
    else:
        kinds = ("core",) if args.tracing else KINDS
        plan_rows = [(e, k, n, f) for e in ENGINES for k in kinds for n, f in REQUESTS]
        seconds, rounds = args.seconds, max(1, args.rounds)
    traced = (False, True) if args.tracing else (False,)
    rows_wanted = [(*r, t) for r in plan_rows if r[0] in (args.engine or ENGINES) for t in traced]
    machine = describe_machine()
    # Not under build/: the staged copies of our packages would count as more modules.
    with tempfile.TemporaryDirectory(prefix="bench-ceiling-") as work, Receiver(False) as otlp:
        rows = run(rows_wanted, seconds, Path(work), rounds, otlp)
        received = {"spans": otlp.spans_received, "exports": otlp.exports}
    off_path = off_path_us(20_000 if args.quick else 200_000) if args.tracing else {}
    tracing = {**received, **off_path} if args.tracing else None
    figures = {"machine": machine, "rows": [asdict(r) for r in rows], "tracing": tracing}
    text = report(rows, machine, seconds, rounds, tracing)
    return publish(args.out / f"ceiling{'-tracing' * args.tracing}.md", text, figures)


if __name__ == "__main__":
    raise SystemExit(main())
