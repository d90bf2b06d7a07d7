"""``make bench-gpu-served``: TorchServe's frontend with GPU workers and Triton with ``KIND_GPU``
instances on one GPU host, each driven from that host by the project's load generator, beside
the raw forward, the pipeline limit and the core in process from the same run.

    bash bench/gpuserved.sh [--quick]        # a bare GPU host: the stage installed, then this
    .venv/bin/python -m bench.gpuserved      # where .venv and build/triton-venv are

In order, each optional step only while the time left (``--budget-s``, from ``--started``:
8 minutes, the stage's install included) still holds it, what was left out said in the report:

1. the GPU deployment from seeded weights (``buildsteps.weights``, ``buildsteps.gpu``: eager
   archives with each model's ``gpu:`` section), and the tagger again with ``batchSize`` 8
   for 8-image requests (``X8``: TorchServe counts requests, and a batch of more than
   ``max_batch_images`` / 8 such requests has the rest refused with 503; Triton's batch
   counts images, so one model serves both forms there);
2. ``bench.gpu``'s raw forward, pipeline limit and core (``measure_all``), written to
   results/gpu.md too on a GPU;
3. TorchServe (the staged Java runtime) with the tagger's ``workersPerGpu`` workers: 1-image
   raw requests, 8-image v2 binary requests (raw bytes in, tags out as binary); then the other
   counts of ``Plan.counts`` (the management API's scale);
4. Triton with ``KIND_GPU`` instances, ``workersPerGpu`` of them (``KIND_CPU`` on a CPU, where
   Triton refuses a GPU group), the same two rows; then the other counts (a restart each).

Each row: a closed loop of 2 batches of 64 images a worker in flight (``clients``), split over
``Plan.processes`` client processes (one Python client process sends a few thousand requests
a second at most), warmed up under load first; queues of ``QUEUE`` requests (the ceiling, not
the shipped bound). Measured: img/s, p50/p99, the images per batch the engine formed
(TorchServe's ``X-Batch-Size`` x images, Triton's statistics), the GPU's busy share (NVML,
sampled every 0.2 s), each worker's GPU memory (NVML, by process) and CPU cores, the
frontend's and the clients' cores. The report goes to results/gpu-served.md on a GPU
(build/gpu-served.md on a CPU or with ``--quick``: a CPU run never overwrites GPU figures),
every figure also in the ``.json`` beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
import torch
import yaml

from bench.archives import ArchiveInfo
from bench.gpu import jpegs, measure_all
from bench.gpureport import Findings
from bench.gpureport import report as gpu_report
from bench.layout import BUILD, REPO, RESULTS, TAGGER, WEIGHTS, cli, fresh_dir, parse
from bench.loadgen import Endpoint, closed_loop, v2_binary, warm
from bench.machine import code_version, dated
from bench.markdown import bullets, document, figure, section, table
from bench.memory import Cpu
from bench.stats import Sample, summarize
from bench.triton import batch_meter, stubs_of, triton_serving
from buildsteps import gpu, weights
from buildsteps.configgen import MODELS_DIR
from devtools.server import LocalTorchServe
from model_files.artifacts import CHECKPOINT
from tritonrepo.generate import write_model

log = logging.getLogger("bench.gpuserved")
REPORT = RESULTS / "gpu-served.md"
CPU_REPORT = REPO / "build" / "gpu-served.md"
JAVA_HOME = REPO / "build" / "host" / "java"  # `stage install`'s runtime; else the system's
STAGE_MANIFEST = REPO / "build" / "stage" / "load-1" / "manifest.json"
WORK = BUILD / "gpuserved"
X8 = f"{TAGGER}-x8"
BATCH_IMAGES = 64  # handler.max_batch_images: the images one batch runs
QUEUE = 1024  # requests an engine may hold queued in the benchmark (every client's)
MAX_REQUESTS = 1_000_000  # a bound on a client process's row besides its time
BUDGET_S = 480.0  # the 8 minutes
FORMS = {1: "1 image, raw", 8: "8 images, v2 binary"}


@dataclass(frozen=True)
class Plan:
    """Seconds per row (``warmup_s`` under load first), client processes, images in flight a
    worker, the workers per GPU tried after the shipped count, and what a step costs beyond
    its rows (s), for the budget."""

    seconds: float
    warmup_s: float
    warmup_requests: int  # one after another first, each must answer 200
    processes: int
    in_flight: int
    counts: tuple[int, ...]
    scale_s: float
    start_s: float

    @property
    def row_s(self) -> float:
        return self.warmup_s + self.seconds + 3


# A GPU: 2 batches of 64 images a worker; a CPU, a rehearsal: what it answers within seconds.
GPU_PLAN = Plan(10.0, 3.0, 10, 6, 2 * BATCH_IMAGES, counts=(1, 2, 3), scale_s=25, start_s=45)
CPU_PLAN = Plan(3.0, 1.0, 2, 2, 8, counts=(1, 2), scale_s=40, start_s=60)


@dataclass
class Row:
    """One engine at one worker count and request form, as measured."""

    engine: str
    workers: int
    images: int  # per request
    clients: int
    batch_size: int  # what the served model's batch holds: requests (TorchServe), images
    requests: int
    errors: int
    error_kinds: dict
    images_per_s: float
    p50_ms: float
    p99_ms: float
    batch_images: float  # mean images per batch the engine formed
    gpu_busy: float  # mean share of the GPU busy (NVML); NaN without NVML
    worker_gpu_mb: list[float]  # each worker process's GPU memory (NVML); empty without
    worker_cores: list[float]  # each worker process's CPU over the row
    frontend_cores: float
    client_cores: float


class Budget:
    """The time left of ``budget_s`` from ``started`` (epoch seconds), and what it left out."""

    def __init__(self, started: float, budget_s: float) -> None:
        self.deadline, self.skipped = started + budget_s, []

    def left(self) -> float:
        return self.deadline - time.time()

    def fits(self, what: str, cost_s: float) -> bool:
        if self.left() >= cost_s:
            return True
        self.skipped.append(
            f"{what}: {max(self.left(), 0):.0f} s left, about {cost_s:.0f} s needed"
        )
        log.warning("skipped %s", self.skipped[-1])
        return False


class Nvml:
    """GPU 0 through NVML (nvidia-ml-py), or nothing where there is no driver or package
    (``why`` says which): its busy share sampled while a row runs, memory by process."""

    def __init__(self) -> None:
        self.why, self.nvml, self.handle = "", None, None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handle, self.nvml = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml
        except Exception as error:  # noqa: BLE001 - a CPU host, or no package: figures n/a
            self.why = f"no NVML ({type(error).__name__}: {error})"

    def memory_mb(self, pids: list[int]) -> list[float]:
        """Each of ``pids``' GPU memory, MiB, as NVML lists the GPU's processes (0: none)."""
        if self.nvml is None:
            return []
        used = {
            p.pid: (p.usedGpuMemory or 0) / 2**20
            for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
        }
        return [used.get(pid, 0.0) for pid in pids]

    @contextmanager
    def sampled(self, every_s: float = 0.2) -> Iterator[list[float]]:
        """The GPU's busy share every ``every_s`` while the block runs (none without NVML)."""
        readings: list[float] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(every_s):
                readings.append(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu / 100)

        thread = threading.Thread(target=sample, daemon=True) if self.nvml else None
        if thread:
            thread.start()
        try:
            yield readings
        finally:
            stop.set()
            if thread:
                thread.join()


@dataclass
class Served:
    """One engine serving the tagger: for a row of ``images`` per request, what to POST, its
    worker processes, a batch meter started now (mean images per batch since; NaN: from the
    answers' ``X-Batch-Size``) and its batch's size; the frontend's processes."""

    engine: str
    endpoint: Callable[[int], Endpoint]
    workers: Callable[[int], list[psutil.Process]]
    meter: Callable[[int], Callable[[], float]]
    batch_size: Callable[[int], int]
    frontend: Callable[[], list[psutil.Process]]
    scale: Callable[[int], None] | None = None  # workers per GPU, without a restart
    facts: dict = field(default_factory=dict)


def _client(endpoint: Endpoint, clients: int, seconds: float) -> tuple[list[Sample], float]:
    """One client process's share of a row: its samples and the CPU seconds it spent."""
    started = time.process_time()
    samples = closed_loop(endpoint, clients, seconds, MAX_REQUESTS)
    return samples, time.process_time() - started


def drive(pool, processes: int, endpoint: Endpoint, clients: int, seconds: float):
    """``clients`` closed-loop clients over ``processes`` processes of ``pool`` for
    ``seconds``: every sample, and the cores the clients took."""
    shares = [clients // processes + (i < clients % processes) for i in range(processes)]
    done = pool.starmap(_client, [(endpoint, n, seconds) for n in shares if n])
    return [s for samples, _ in done for s in samples], sum(c for _, c in done) / seconds


def measure(served: Served, images: int, workers: int, plan: Plan, pool, nvml: Nvml) -> Row:
    """One closed-loop row (module docstring)."""
    what = f"{served.engine}, {workers} worker(s) a GPU, {FORMS[images]}"
    endpoint = served.endpoint(images)
    warm(endpoint, plan.warmup_requests, what)
    clients = max(1, plan.in_flight * workers // images)
    drive(pool, plan.processes, endpoint, clients, plan.warmup_s)
    procs = served.workers(images)
    frontend = Cpu(served.frontend)
    each = [Cpu(lambda p=p: [p]) for p in procs]
    meter = served.meter(images)
    for cpu in (frontend, *each):
        cpu.start()
    with nvml.sampled() as busy:
        samples, client_cores = drive(pool, plan.processes, endpoint, clients, plan.seconds)
    stats = summarize(samples)
    wall = max(stats.duration_s, 1e-9)
    batch = meter()
    if math.isnan(batch):
        batch = stats.batch_mean * images
    row = Row(
        served.engine, workers, images, clients, served.batch_size(images), stats.requests,
        stats.errors, stats.error_kinds, stats.throughput * images, stats.p50_ms,
        stats.p99_ms, batch, sum(busy) / len(busy) if busy else math.nan,
        nvml.memory_mb([p.pid for p in procs]), [c.spent() / wall for c in each],
        frontend.spent() / wall, client_cores,
    )  # fmt: skip
    log.info(
        "%s: %.0f img/s, p99 %.1f ms, %d errors", what, row.images_per_s, row.p99_ms, row.errors
    )
    return row


def deployment() -> Path:
    """The GPU deployment for one GPU (``buildsteps.gpu``) from the weights built here,
    seeded where there are none, and ``X8`` beside the tagger in its model store."""
    source = None if (WEIGHTS / CHECKPOINT).is_file() else "seeded"  # no network on the host
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the report only
        weights.build(source, WEIGHTS)
        gpu.build(gpu.OUT, 1, WEIGHTS)
    store = gpu.OUT / "model-store"
    tagger = ArchiveInfo.read(store / f"{TAGGER}.mar")
    tagger.with_config({**tagger.model_config, "batchSize": BATCH_IMAGES // 8}, store / f"{X8}.mar")
    return gpu.OUT


def shipped_count() -> int:
    return gpu.gpu_section(MODELS_DIR / f"{TAGGER}.yaml")["workersPerGpu"]


@contextmanager
def torchserve(deployment_dir: Path, image: bytes) -> Iterator[Served]:
    """TorchServe on the GPU deployment's config.properties and store (the staged Java
    runtime where ``stage install`` laid it out), the tagger loaded with its shipped workers
    and ``X8`` registered with as many."""
    java = JAVA_HOME / "bin" / "java"
    server = LocalTorchServe(
        fresh_dir(WORK / "torchserve"),
        deployment_dir / "model-store",
        config=deployment_dir / "config.properties",
        load_models=[f"{TAGGER}.mar"],
        model_api=True,
        env={"JAVA_HOME": str(JAVA_HOME)} if java.is_file() else {},
        properties={"job_queue_size": str(QUEUE)},
    )
    with server:
        client = server.client()
        client.register(f"{X8}.mar", name=X8, workers=shipped_count(), batch_size=BATCH_IMAGES // 8)
        models = {1: TAGGER, 8: X8}
        auth = server.keys.inference_headers()

        def endpoint(images: int) -> Endpoint:
            if images == 1:
                return Endpoint(f"{server.inference_url}/predictions/{TAGGER}", auth, image)
            body, headers = v2_binary([image] * images, ["tags"])
            return Endpoint(
                f"{server.inference_url}/v2/models/{X8}/infer", {**auth, **headers}, body
            )

        def described(images: int) -> dict:
            return client.describe(models[images], customized=True)[0]

        def workers(images: int) -> list[psutil.Process]:
            return [psutil.Process(w["pid"]) for w in described(images)["workers"]]

        def scale(count: int) -> None:
            for model in models.values():
                client.scale(model, count)

        meta = described(1).get("customizedMetadata") or {}
        facts = {key: meta.get(key) for key in ("precision", "device", "decode")}
        facts["gpu memory of a worker"] = held((meta.get("gpu") or {}).get("memory"))
        facts["java"] = server.processes()[0].exe()
        yield Served(
            "torchserve", endpoint, workers, lambda _: lambda: math.nan,
            lambda images: int(described(images)["batchSize"]),
            lambda: server.processes()[:1], scale, facts,
        )  # fmt: skip


def held(memory: dict | None) -> str:
    """describe's ``gpu.memory`` in a line (``-`` on a CPU)."""
    if not memory:
        return "-"
    mib = {k: v / 2**20 for k, v in memory.items() if k.endswith("_bytes")}
    return (
        f"reserved {mib['reserved_bytes']:,.0f} MiB, allocated {mib['allocated_bytes']:,.0f} "
        f"MiB (pid {memory['pid']}); the device {mib['device_total_bytes'] / 1024:,.0f} GiB, "
        f"{mib['device_free_bytes'] / 1024:,.0f} GiB free"
    )


@contextmanager
def triton(count: int, store: Path, image: bytes, cuda: bool) -> Iterator[Served]:
    """Triton serving the tagger of ``store`` with ``count`` instances: ``KIND_GPU`` on GPU 0
    (``tritonrepo.generate --gpus 1`` of a YAML whose ``workersPerGpu`` is ``count``), or
    ``KIND_CPU`` without CUDA."""
    models = fresh_dir(WORK / "models")
    config = yaml.safe_load((MODELS_DIR / f"{TAGGER}.yaml").read_text())
    config["gpu"]["workersPerGpu"] = count
    config.update(minWorkers=count, maxWorkers=count)  # KIND_CPU's count
    (models / f"{TAGGER}.yaml").write_text(yaml.safe_dump(config))
    repository = fresh_dir(WORK / "triton")
    write_model(TAGGER, repository, models_dir=models, model_store=store, queue_size=QUEUE,
                lanes=False, gpus=1 if cuda else None)  # fmt: skip
    batch = gpu.gpu_settings(models / f"{TAGGER}.yaml", 1)["batchSize"]
    with triton_serving(repository, WORK / "triton.log") as server:
        root = psutil.Process(server.process.pid)

        def endpoint(images: int) -> Endpoint:
            body, headers = v2_binary([image] * images, ["tags"], binary_out=images > 1)
            return Endpoint(f"{server.url}/v2/models/{TAGGER}/infer", headers, body)

        kind = "KIND_GPU" if cuda else "KIND_CPU"
        yield Served("triton", endpoint, lambda _: stubs_of(root, TAGGER),
                     lambda _: batch_meter(server.url, TAGGER), lambda _: batch, lambda: [root],
                     facts={"instances": f"{count} {kind}"})  # fmt: skip


def forms(served: Served, workers: int, plan: Plan, pool, nvml: Nvml) -> list[Row]:
    return [measure(served, images, workers, plan, pool, nvml) for images in FORMS]


def engine_rows(
    engine: str, start: Callable[[int], object], plan: Plan, budget: Budget, pool, nvml: Nvml
) -> tuple[list[Row], dict]:
    """The engine's rows at the shipped count, then at each other count of ``plan`` the budget
    still holds: by scaling where the engine can (TorchServe), else by starting it again."""
    shipped = shipped_count()
    rows: list[Row] = []
    with start(shipped) as served:
        facts = served.facts
        rows += forms(served, shipped, plan, pool, nvml)
        for count in (c for c in plan.counts if c != shipped and served.scale):
            if budget.fits(f"{engine}, {count} worker(s) a GPU", plan.scale_s + 2 * plan.row_s):
                served.scale(count)
                rows += forms(served, count, plan, pool, nvml)
    if served.scale is None:
        for count in (c for c in plan.counts if c != shipped):
            if budget.fits(f"{engine}, {count} instance(s) a GPU", plan.start_s + 2 * plan.row_s):
                with start(count) as again:
                    rows += forms(again, count, plan, pool, nvml)
    return rows, facts


def _share(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.0f}%"


def in_process(f: Findings) -> tuple[str, float]:
    """The report's table of ``bench.gpu``'s figures, and the core's small-JPEG img/s."""
    core, limit = f.core.get("small"), f.limit.get("small")
    raw = sorted(((b, r) for (s, b), r in f.raw.items() if s == f.best), key=lambda br: br[0])
    rows = [[f"raw forward, {f.best.precision} {f.best.layout}, batch {b}", figure(r.images_per_s)]
            for b, r in raw]  # fmt: skip
    rows.append(
        [f"pipeline limit, batch {f.batches['small']}", figure(limit and limit.images_per_s)]
    )
    rows.append([f"the core, `ImageModel.run`, batch {f.batches['small']} ({f.chose})",
                 figure(core.images_per_s) if core else f.chose])  # fmt: skip
    rate = core.images_per_s if core else math.nan
    return table(["in process, small JPEGs", "img/s"], rows, "lr"), rate


def served_table(rows: list[Row], core: float) -> str:
    header = ("engine | workers a GPU | request | clients | batch | img/s | x core | p50 ms | "
              "p99 ms | images/batch | GPU busy | GPU MiB a worker | worker cores | frontend "
              "cores | client cores | errors")  # fmt: skip
    cells = [
        [r.engine, str(r.workers), FORMS[r.images], str(r.clients), str(r.batch_size),
         figure(r.images_per_s), figure(r.images_per_s / core, 2) if core else "n/a",
         figure(r.p50_ms, 1), figure(r.p99_ms, 1), figure(r.batch_images, 1), _share(r.gpu_busy),
         ", ".join(figure(m) for m in r.worker_gpu_mb) or "n/a",
         ", ".join(figure(c, 2) for c in r.worker_cores), figure(r.frontend_cores, 2),
         figure(r.client_cores, 2), f"{r.errors} {r.error_kinds}" if r.errors else "0"]
        for r in rows
    ]  # fmt: skip
    return table(header, cells, "llrrrrrrrrrlrrrl")


def best_rows(rows: list[Row]) -> dict[tuple[str, int], Row]:
    """Each engine and request form's fastest row: the best workers per GPU."""
    best: dict[tuple[str, int], Row] = {}
    for row in rows:
        key = (row.engine, row.images)
        if key not in best or row.images_per_s > best[key].images_per_s:
            best[key] = row
    return best


def planning(rows: list[Row], core: float) -> str:
    """Workers per GPU and the CPU they take, per engine and request form, from its best row;
    how each compares with the core in process (the issue's bar: 0.8)."""
    cells = []
    for (engine, images), r in sorted(best_rows(rows).items()):
        per_k = r.images_per_s / 1000
        counts = sorted({x.workers: x.images_per_s for x in rows
                         if (x.engine, x.images) == (engine, images)}.items())  # fmt: skip
        cells.append([
            engine, FORMS[images], ", ".join(f"{w}: {figure(v)}" for w, v in counts),
            str(r.workers),
            figure((sum(r.worker_cores) + r.frontend_cores) / per_k, 2) if per_k else "n/a",
            figure(r.frontend_cores / per_k, 2) if per_k else "n/a",
            figure(r.client_cores / per_k, 2) if per_k else "n/a",
            figure(r.images_per_s / core, 2) if core else "n/a",
        ])  # fmt: skip
    header = ("engine | request | img/s by workers a GPU | best | CPU cores / 1,000 img/s | "
              "frontend cores / 1,000 img/s | client cores / 1,000 img/s | x core")  # fmt: skip
    return table(header, cells, "llllrrrr")


def report(rows: list[Row], findings: Findings, facts: dict, notes: list[str], plan: Plan) -> str:
    from bench.gpureport import device_line

    lines, core = in_process(findings)
    return document(
        "Both engines serving one GPU (`make bench-gpu-served`)",
        "Generated by `bash bench/gpuserved.sh` (`python -m bench.gpuserved`); "
        "bench/gpuserved.py says what each row measures.",
        bullets([
            dated(), f"Device: **{device_line(findings.device)}**",
            f"torch {torch.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} cores",
            *notes,
            *(f"{name}: " + ", ".join(f"{k} {v}" for k, v in f.items())
              for name, f in facts.items()),
        ]),
        section("In process, the same run (`bench.gpu`)", lines),
        section(
            "Served",
            f"Each row: a closed loop of {plan.in_flight} images a worker in flight (clients) for "
            f"{plan.seconds:g} s, queues of {QUEUE} requests; batch: what the served model's batch "
            "holds (TorchServe counts requests: the 8-image rows go to the tagger registered again "
            f"with batchSize 8, `{X8}`; Triton counts images). x core: img/s over the core's in "
            "process.",
            served_table(rows, core),
        ),
        section(
            "Workers per GPU and planning figures",
            "Each engine and request form at its fastest workers per GPU: CPU cores its workers "
            "and frontend take per 1,000 img/s, the frontend's alone, and the load generator's.",
            planning(rows, core),
        ),
    )  # fmt: skip


def write(paths: list[Path], rows: list[Row], findings: Findings, facts: dict, notes: list[str],
          plan: Plan) -> str:  # fmt: skip
    """The report and its JSON at each of ``paths``, from what was measured so far (after
    each engine: a run cut short still leaves its rows); the report."""
    text = report(rows, findings, facts, notes, plan)
    figures = json.dumps({"rows": [asdict(r) for r in rows], "facts": facts, "notes": notes})
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.with_suffix(".json").write_text(figures + "\n")
    return text


def measured(args: argparse.Namespace, paths: list[Path], pool, plan: Plan) -> str:
    """Every step of the module docstring, the report written after each engine's rows."""
    budget, cuda = Budget(args.started, args.budget_s), torch.cuda.is_available()
    store = deployment()
    images = jpegs()
    device = torch.device("cuda:0" if cuda else "cpu")
    options = argparse.Namespace(quick=plan is CPU_PLAN, compile=False, weights=WEIGHTS, handler=[])
    findings = measure_all(device, images, options)
    if plan is GPU_PLAN:  # bench.gpu's own report of the same run, beside ours
        for folder in {RESULTS, *(p.parent for p in paths)}:
            (folder / "gpu.md").write_text(gpu_report(findings))
        torch.cuda.empty_cache()
    rows, facts, nvml, image = [], {}, Nvml(), images["small"][0]
    starts = {
        "torchserve": lambda _count: torchserve(store, image),
        "triton": lambda count: triton(count, store / "model-store", image, cuda),
    }

    def notes() -> list[str]:
        return [f"{time.time() - args.started:.0f} s from the start (the stage's install "
                f"included), budget {args.budget_s:.0f} s",
                *(["GPU readings: " + nvml.why] if nvml.why else []),
                *(f"left out: {s}" for s in budget.skipped), *staged_from()]  # fmt: skip

    for engine in args.engine or ("torchserve", "triton"):
        try:
            found, facts[engine] = engine_rows(engine, starts[engine], plan, budget, pool, nvml)
            rows += found
        except Exception as error:  # the other engine's rows still count
            log.exception("%s failed", engine)
            budget.skipped.append(f"{engine} failed: {type(error).__name__}: {error}"[:400])
        text = write(paths, rows, findings, facts, notes(), plan)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = cli("python -m bench.gpuserved", __doc__, out=None)
    parser.add_argument("--quick", action="store_true", help="the CPU plan's short rows anywhere")
    parser.add_argument("--started", type=float, help="when the run began (epoch s; now)")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="seconds in all (480)")
    parser.add_argument("--engine", choices=("torchserve", "triton"), action="append")
    parser.add_argument("--out", type=Path, help="results/gpu-served.md on a GPU, else build/")
    parser.add_argument(
        "--also-to", type=Path, metavar="DIR", help="the reports (and gpu.md) there too"
    )
    args = parse(parser, argv)
    args.started = args.started or time.time()
    full = torch.cuda.is_available() and not args.quick
    plan, out = (GPU_PLAN, REPORT) if full else (CPU_PLAN, CPU_REPORT)
    paths = [args.out or out, *([args.also_to / (args.out or out).name] if args.also_to else [])]
    # The client processes, forked before this process starts CUDA.
    with multiprocessing.get_context("fork").Pool(plan.processes) as pool:
        text = measured(args, paths, pool, plan)
    print(text)
    return 0


def staged_from() -> list[str]:
    """The stage's commit, where ``stage install`` ran here (a host without git says
    ``unknown`` for the code)."""
    if not STAGE_MANIFEST.is_file():
        return []
    manifest = json.loads(STAGE_MANIFEST.read_text())
    return [f"stage: made from `{manifest['commit']}`, code here `{code_version()}`"]


if __name__ == "__main__":
    raise SystemExit(main())
