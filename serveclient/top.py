"""``tsctl top``: a live view of a running TorchServe or Triton (``--url``), one frame every
second or two.

Each frame compares two reads of ``/metrics`` (and the management API's workers) taken
``interval`` seconds apart, so every number is what happened in that interval:

- per model: requests/s and images/s; mean latency and queue time in ms (TorchServe exports
  sums of microseconds, no histogram: a mean is all that can be derived, no percentile); batch
  size, mean and p50/p95 (from ``resnet50_batches_by_size_total``, a real distribution); errors/s
  by kind, ``Overloaded`` being its 503 refusals; requests expired unstarted per second
  (``DeadlineExceeded``, answered 504) and the content cache's hit ratio
  (``resnet50_cache_hits_total`` over hits and ``resnet50_cache_misses_total``, images; "off"
  when the model exports neither);
- for the server: answers/s by status class (``Requests2XX/4XX/5XX``, the frontend's own 503
  refusals included);
- per model, whether it can answer: "up", or "DOWN since" the first read that found no
  worker/instance of it ready (a model Triton is reloading, a TorchServe model whose only
  worker is being started again: the server keeps no such time, so a model already down when
  ``top`` started says "at least since"), and its workers' restarts under this server
  (``resnet50_worker_restarts``, summed over its slots);
- per worker: status, pid, resident memory (``resnet50_worker_rss_mb`` of its pid, else the
  management API's), on a GPU the GPU memory it holds (``resnet50_worker_gpu_mb``: what its
  PyTorch reserved; the column is left out where no worker reports one) and the precision it
  serves;
- per GPU, where the server reports GPUs: how busy it is and its memory in use, at the last
  sample (``serveclient/gpus.py``: TorchServe's ``GPUUtilization``/``GPUMemory*``, Triton's
  ``nv_gpu_*``); nothing on a CPU host.

On Triton the core's series are the same (``tritonrepo/metrics.py``); Triton's own take the
place of TorchServe's frontend counters: requests from ``nv_inference_request_success`` and
``_failure``, latency and queue time from ``nv_inference_request_duration_us`` and
``nv_inference_queue_duration_us`` (sums of microseconds too). Triton has no status classes
(it counts the model's 4xx answers as successes), so that line says so; its instances have no
pid in its API, so each shows a stub process the core's ``resnet50_worker_rss_mb`` reported.

Lines fit 80 columns. ``run`` redraws until ``q`` or Ctrl-C; ``--once`` prints one frame.
"""

from __future__ import annotations

import math
import os
import select
import shutil
import sys
import termios
import time
import tty
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TextIO

from tabulate import tabulate

from serveclient import gpus as gpu_metrics
from serveclient import metrics
from serveclient.client import Client

WIDTH = 80
FRONTEND_STATUSES = ("Requests2XX", "Requests4XX", "Requests5XX")
# Per-model counters a frame turns into rates: metric -> key.
COUNTERS = {
    "ts_inference_requests": "requests",
    "ts_inference_latency_microseconds": "latency_us",
    "ts_queue_latency_microseconds": "queue_us",
    # Triton's own, under its label "model": every request answered or failed.
    "nv_inference_request_success": "requests",
    "nv_inference_request_failure": "requests",
    "nv_inference_request_duration_us": "latency_us",
    "nv_inference_queue_duration_us": "queue_us",
    "resnet50_images": "images",
    "resnet50_batches": "batches",
    "resnet50_requests": "batched_requests",
}
# The content cache's counters (images), present only on servers that export them.
CACHE = {"resnet50_cache_hits": "cache_hits", "resnet50_cache_misses": "cache_misses"}
EXPIRED = "DeadlineExceeded"  # the core's error kind for a request past its X-Deadline (504)
# Triton times only the requests it answered (a failure's time is not in its duration sums):
# its means divide by these.
ANSWERED = {"nv_inference_request_success": "answered"}


@dataclass
class Read:
    """One look at the server: when, its per-model counters, batches by size, errors by kind,
    answers by status class, precision and workers."""

    at: float
    counters: dict[str, dict[str, float]] = field(default_factory=dict)
    batch_sizes: dict[str, dict[int, float]] = field(default_factory=dict)
    errors: dict[str, dict[str, float]] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)
    precision: dict[str, str] = field(default_factory=dict)
    rss_mb: dict[str, float] = field(default_factory=dict)  # by worker pid
    pids: dict[str, list[str]] = field(default_factory=dict)  # by model, as the core reported
    workers: dict[str, list[dict]] = field(default_factory=dict)
    gpus: dict[str, gpu_metrics.Gpu] = field(default_factory=dict)  # empty on a CPU host
    gpu_mb: dict[str, float] = field(default_factory=dict)  # by worker pid; empty on a CPU
    down: frozenset[str] = frozenset()  # models with no worker ready
    restarts: dict[str, float] = field(default_factory=dict)  # by model, over its slots
    wall: float = field(default_factory=time.time)  # when, on the clock
    first: float = 0.0  # ``wall`` of this ``top``'s first read (``carry``): 0, this one
    down_since: dict[str, float] = field(default_factory=dict)  # model -> first read it was down


def parse(
    text: str,
    workers: dict[str, list[dict]],
    at: float,
    down: Iterable[str] = (),
    wall: float | None = None,
) -> Read:
    """A ``Read`` from a ``/metrics`` text, ``{model: describe()'s workers}`` and the models
    found with no worker ready, taken at ``at`` (``monotonic``) and ``wall`` (``time.time``,
    the default)."""
    samples = metrics.samples(text)
    # No Requests2XX... at all: not TorchServe (Triton), no status classes to show.
    classes = any(s.name in FRONTEND_STATUSES for s in samples)
    read = Read(
        at=at,
        statuses=metrics.frontend_statuses(text) if classes else {},
        workers=workers,
        gpus=gpu_metrics.read(samples),
        gpu_mb=gpu_metrics.worker_mb(samples),
        down=frozenset(down),
        wall=time.time() if wall is None else wall,
    )
    read.first = read.wall
    read.down_since = dict.fromkeys(read.down, read.wall)
    for name, labels, value in samples:
        model = labels.get("model") or labels.get("model_name")
        if model is None:
            continue
        if name in COUNTERS or name in CACHE:
            counters = read.counters.setdefault(model, dict.fromkeys(COUNTERS.values(), 0.0))
            for key in (COUNTERS.get(name), ANSWERED.get(name), CACHE.get(name)):
                if key is not None:
                    counters[key] = counters.get(key, 0.0) + value
        elif name == "resnet50_batches_by_size" and labels.get("batch_size", "").isdigit():
            sizes = read.batch_sizes.setdefault(model, {})
            size = int(labels["batch_size"])
            sizes[size] = sizes.get(size, 0.0) + value
        elif name == "resnet50_errors":
            kinds = read.errors.setdefault(model, {})
            kind = labels.get("error_type", "?")
            kinds[kind] = kinds.get(kind, 0.0) + value
        elif name == "resnet50_precision" and value == 1:
            read.precision[model] = labels.get("precision", "?")
        elif name == "resnet50_worker_restarts":
            read.restarts[model] = read.restarts.get(model, 0.0) + value
        elif name == "resnet50_worker_rss_mb":
            read.rss_mb[labels.get("worker_pid", "?")] = value
            read.pids.setdefault(model, []).append(labels.get("worker_pid", "?"))
    return read


def take(client: Client) -> Read:
    """Read the server now: which models have a worker ready (``model_rows``: a model Triton
    has unloaded is listed there, not among its loaded models), the workers of those that
    have (from the rows where they carry them, ``workerList``, else described), and the
    metrics."""
    ready: dict[str, int] = {}
    listed: dict[str, list[dict]] = {}
    for row in client.model_rows():
        ready[row["model"]] = ready.get(row["model"], 0) + (row.get("ready") or 0)
        if "workerList" in row:
            listed.setdefault(row["model"], []).extend(row["workerList"])
    workers = {
        model: listed[model]
        if model in listed
        else [w for entry in client.describe(model) for w in entry.get("workers", [])]
        for model, count in ready.items()
        if count
    }
    down = [model for model, count in ready.items() if not count]
    return parse(client.metrics_text(), workers, time.monotonic(), down)


def carry(old: Read, new: Read) -> Read:
    """``new`` as the read after ``old``: each down model's ``down_since`` kept from ``old``
    when it was down there too (else ``new``'s: it went down between the reads)."""
    new.first = old.first
    new.down_since = {model: old.down_since.get(model, new.wall) for model in new.down}
    return new


def percentile(counts: dict[int, float], q: float) -> int | None:
    """The smallest batch size with at least ``q`` of the batches at or below it."""
    total = sum(counts.values())
    if total <= 0:
        return None
    seen = 0.0
    for size in sorted(counts):
        seen += counts[size]
        if seen >= q * total - 1e-9:
            return size
    return max(counts)


def _delta(new: dict, old: dict) -> dict:
    return {k: v - old.get(k, 0.0) for k, v in new.items() if v - old.get(k, 0.0) > 0}


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def frame(old: Read, new: Read, *, url: str = "", width: int = WIDTH) -> str:
    """The screen for what happened between ``old`` and ``new``, each line cut to ``width``."""
    seconds = max(new.at - old.at, 1e-9)
    answers = "  ".join(
        f"{code} {_num((new.statuses.get(code, 0) - old.statuses.get(code, 0)) / seconds)}"
        for code in ("2XX", "4XX", "5XX")
    )
    lines = [
        f"tsctl top  {url}  {datetime.now():%H:%M:%S}  every {seconds:.1f}s",
        f"answers/s  {answers}  (5XX: 503 queue full, 507 no worker)"
        if new.statuses
        else "answers/s  - (no status classes on Triton: errors/s by kind below)",
        *_states(new),
        "",
    ]
    rows, error_lines, traffic_lines = [], [], []
    for model in sorted(set(new.counters) | set(new.workers)):
        d = _delta(new.counters.get(model, {}), old.counters.get(model, {}))
        requests = d.get("requests", 0.0)
        timed = d.get("answered", requests)  # the requests the latency sums cover
        sizes = _delta(new.batch_sizes.get(model, {}), old.batch_sizes.get(model, {}))
        batches = d.get("batches", 0.0)
        p50, p95 = percentile(sizes, 0.5), percentile(sizes, 0.95)
        rows.append(
            [
                model,
                _num(requests / seconds),
                _num(d.get("images", 0.0) / seconds),
                _num(d["latency_us"] / 1000 / timed if timed and "latency_us" in d else None),
                _num(d["queue_us"] / 1000 / timed if timed and "queue_us" in d else None),
                _num(d.get("batched_requests", 0.0) / batches if batches else None),
                f"{p50}/{p95}" if p50 is not None else "-",
            ]
        )
        errors = _delta(new.errors.get(model, {}), old.errors.get(model, {}))
        error_lines.append(
            f"  {model}: "
            + (
                ", ".join(
                    f"{kind}{' (503)' if kind == 'Overloaded' else ''} {n / seconds:.1f}/s"
                    for kind, n in sorted(errors.items())
                )
                or "none"
            )
        )
        traffic_lines.append(f"  {model}: {_traffic(d, errors, seconds, new, model)}")
    # The headers as a first row: tabulate pads a `headers=` row by 2 more per column, which
    # pushed p50/p95 past 80 columns beside a lane's longer name (resnet50-embedding-bulk).
    lines += tabulate(
        [["model", "req/s", "img/s", "mean ms", "queue ms", "batch", "p50/p95"], *rows],
        tablefmt="plain",
        disable_numparse=True,
        colalign=("left",) + ("right",) * 6,
    ).splitlines()
    lines += ["", "errors/s by kind (handler; Overloaded = its 503 refusals)", *error_lines]
    lines += ["", "deadlines and cache", *traffic_lines, ""]
    gpu = ["GPU MB"] if new.gpu_mb else []  # a CPU host's frame as it was
    worker_rows = [
        [
            model,
            w.get("id", "?"),
            w.get("status", "?"),
            w.get("pid", "-"),
            _num(_rss_mb(new, w), 0),
            *([_num(new.gpu_mb.get(str(w.get("pid"))), 0)] if gpu else []),
            new.precision.get(model, "-"),
        ]
        for model, workers in sorted(new.workers.items())
        for w in _with_pids(workers, new.pids.get(model, []))
    ]
    lines += tabulate(
        [["model", "worker", "status", "pid", "RSS MB", *gpu, "precision"], *worker_rows],
        tablefmt="plain",
        disable_numparse=True,
    ).splitlines()
    lines += gpu_metrics.lines(new.gpus)
    return "\n".join(line[:width].rstrip() for line in lines)


def _states(new: Read) -> list[str]:
    """One line per model: up or down (since when), and its workers' restarts."""
    lines = []
    for model in sorted(set(new.workers) | new.down):
        restarts = new.restarts.get(model)
        counted = f", {restarts:.0f} restart(s)" if restarts is not None else ""
        since = new.down_since.get(model, new.wall)
        if model not in new.down:
            state = "up"
        elif since <= new.first:  # down already when this top began: no earlier time known
            state = f"DOWN, at least since {datetime.fromtimestamp(since):%H:%M:%S}"
        else:
            state = (
                f"DOWN since {datetime.fromtimestamp(since):%H:%M:%S} ({new.wall - since:.0f} s)"
            )
        lines.append(f"  {model}: {state}{counted}")
    return ["", "models", *lines] if lines else []


def _traffic(delta: dict, errors: dict, seconds: float, new: Read, model: str) -> str:
    """Expired requests per second and the cache's hit ratio over the interval."""
    expired = f"expired {errors.get(EXPIRED, 0.0) / seconds:.1f}/s (504)"
    counters = new.counters.get(model, {})
    if "cache_hits" not in counters and "cache_misses" not in counters:
        return f"{expired}, cache off"
    hits, misses = delta.get("cache_hits", 0.0), delta.get("cache_misses", 0.0)
    if hits + misses <= 0:
        return f"{expired}, cache hits - (no images)"
    return f"{expired}, cache hits {100 * hits / (hits + misses):.0f}% of {hits + misses:.0f} img"


def _with_pids(workers: list[dict], pids: list[str]) -> list[dict]:
    """Workers without a pid (Triton's instances) take the pids the core reported for their
    model, in order: one row per stub process."""
    if all("pid" in w for w in workers):
        return workers
    return [
        w if "pid" in w or i >= len(pids) else {**w, "pid": pids[i]} for i, w in enumerate(workers)
    ]


def _rss_mb(read: Read, worker: dict) -> float | None:
    """The worker's resident MB as its handler last reported it (every batch), else the
    management API's (TorchServe samples that only every minute: 0 until then)."""
    reported = read.rss_mb.get(str(worker.get("pid")))
    if reported is not None:
        return reported
    memory = worker.get("memoryUsage")
    return memory / 2**20 if isinstance(memory, (int, float)) and memory > 0 else None


def first_frame(
    client: Client, interval: float, take_read: Callable[[Client], Read] = take
) -> tuple[Read, Read]:
    """Two reads ``interval`` seconds apart: a frame is a difference."""
    old = take_read(client)
    time.sleep(interval)
    return old, carry(old, take_read(client))


def once(client: Client, interval: float = 2.0) -> str:
    """One frame (``tsctl top --once``), 80 columns wide."""
    old, new = first_frame(client, interval)
    return frame(old, new, url=client.urls["metrics"].removeprefix("http://"))


def run(
    client: Client,
    *,
    interval: float = 2.0,
    out: TextIO = sys.stdout,
    take_read: Callable[[Client], Read] = take,
) -> int:
    """Redraw a frame every ``interval`` seconds until ``q`` (a terminal on stdin) or Ctrl-C;
    lines are cut to the terminal's width. Returns the exit code (0)."""
    url = client.urls["metrics"].removeprefix("http://")
    try:
        old, new = first_frame(client, interval, take_read)
        with _Keys() as keys:
            while True:
                width = shutil.get_terminal_size((WIDTH, 24)).columns
                out.write("\x1b[H\x1b[2J" + frame(old, new, url=url, width=width) + "\n\nq quits\n")
                out.flush()
                if keys.quit_within(interval):
                    return 0
                old, new = new, carry(new, take_read(client))
    except KeyboardInterrupt:
        return 0


class _Keys:
    """Single keys from a terminal on stdin (no Enter needed); nothing when stdin is not one."""

    def __init__(self) -> None:
        self.fd = sys.stdin.fileno() if sys.stdin.isatty() else None
        self._saved: list | None = None

    def __enter__(self) -> _Keys:
        if self.fd is not None:
            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None and self._saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)

    def quit_within(self, seconds: float) -> bool:
        """Wait up to ``seconds``; True if ``q`` was pressed."""
        if self.fd is None:
            time.sleep(seconds)
            return False
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready and os.read(self.fd, 1) in (b"q", b"Q"):
                return True
        return False
