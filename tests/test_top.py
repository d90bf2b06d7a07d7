"""``tsctl top``: its frame from two reads of the metrics (numbers worked out by hand), one
frame against the session's real TorchServe under load, and the live view in a real 80-column
terminal (tmux) that quits on ``q``."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import threading
import uuid
from datetime import datetime

import pytest
import requests

from serveclient import top
from tests.conftest import REPO
from tests.served import TSCTL, settled

TAGGER = "resnet50-tagger"


def _metrics(
    requests_: int,
    latency_us: float,
    queue_us: float,
    images: int,
    sizes: dict[int, int],
    errors: dict[str, int],
    statuses: tuple[int, int, int],
) -> str:
    labels = f'model_name="{TAGGER}",model_version="default",hostname="h"'
    handler = f'model="{TAGGER}",engine="torchserve",Hostname="h"'
    lines = [
        f"ts_inference_requests_total{{{labels},}} {requests_}.0",
        f"ts_inference_latency_microseconds{{{labels},}} {latency_us}",
        f"ts_queue_latency_microseconds{{{labels},}} {queue_us}",
        f"resnet50_images_total{{{handler},}} {images}.0",
        f"resnet50_batches_total{{{handler},}} {sum(sizes.values())}.0",
        f"resnet50_requests_total{{{handler},}} {sum(s * n for s, n in sizes.items())}.0",
        f'resnet50_precision{{model="{TAGGER}",engine="torchserve",precision="int8+f32",'
        'Hostname="h",} 1.0',
        f'resnet50_worker_rss_mb{{model="{TAGGER}",engine="torchserve",worker_pid="4242",'
        'Hostname="h",} 1024.4',
    ]
    lines += [
        f'resnet50_batches_by_size_total{{model="{TAGGER}",engine="torchserve",batch_size="{s}",'
        f'Hostname="h",}} {n}.0'
        for s, n in sizes.items()
    ]
    lines += [
        f'resnet50_errors_total{{model="{TAGGER}",engine="torchserve",error_type="{kind}",'
        f'Hostname="h",}} {n}.0'
        for kind, n in errors.items()
    ]
    lines += [
        f'Requests{code}{{Level="Host",Hostname="h",}} {n}.0'
        for code, n in zip(("2XX", "4XX", "5XX"), statuses)
    ]
    return "\n".join(lines) + "\n"


def test_frame_shows_what_happened_between_two_reads():
    workers = {
        TAGGER: [
            {"id": "9001", "status": "READY", "pid": 4242, "memoryUsage": 0},
            {"id": "9002", "status": "READY", "pid": 4243, "memoryUsage": 900 * 2**20},
        ]
    }
    old = top.parse(
        _metrics(10, 500_000, 100_000, 10, {1: 10}, {"InvalidImage": 1}, (10, 1, 0)),
        workers,
        at=100.0,
    )
    # In 2 s: 20 requests (18 images) answered in 50 ms after 5 ms queued, in 6 batches of
    # sizes 2, 2, 3, 3, 4, 6; 2 refused by the handler (Overloaded), 1 more invalid image.
    new = top.parse(
        _metrics(
            30,
            1_500_000,
            200_000,
            28,
            {1: 10, 2: 2, 3: 2, 4: 1, 6: 1},
            {"InvalidImage": 2, "Overloaded": 2},
            (28, 2, 2),
        ),
        workers,
        at=102.0,
    )
    screen = top.frame(old, new, url="127.0.0.1:8082")
    lines = screen.splitlines()
    assert all(len(line) <= 80 for line in lines), screen
    assert "2XX 9.0  4XX 0.5  5XX 1.0" in lines[1]
    row = next(line.split() for line in lines if line.startswith(TAGGER))
    # model, req/s, img/s, mean ms, queue ms, batch mean, p50/p95
    assert row == [TAGGER, "10.0", "9.0", "50.0", "5.0", "3.3", "3/6"]
    assert f"  {TAGGER}: InvalidImage 0.5/s, Overloaded (503) 1.0/s" in lines
    # RSS: the handler's report for its pid, else the management API's
    workers_shown = [line.split() for line in lines if line.startswith(TAGGER) and "READY" in line]
    assert workers_shown == [
        [TAGGER, "9001", "READY", "4242", "1024", "int8+f32"],
        [TAGGER, "9002", "READY", "4243", "900", "int8+f32"],
    ]


def test_an_idle_model_shows_dashes_not_zero_latency():
    workers = {TAGGER: []}
    text = _metrics(10, 500_000, 100_000, 10, {1: 10}, {}, (10, 0, 0))
    screen = top.frame(top.parse(text, workers, 0.0), top.parse(text, workers, 1.0))
    row = next(line.split() for line in screen.splitlines() if line.startswith(TAGGER))
    assert row == [TAGGER, "0.0", "0.0", "-", "-", "-", "-"]


def test_a_model_that_goes_down_shows_since_when_and_its_restarts():
    """A model found with no worker ready is DOWN since the first read that found it so, kept
    across frames; one down already at top's first read says "at least since"; the restarts
    are the slots' sum of resnet50_worker_restarts."""
    embedding = "resnet50-embedding"
    restarts = (
        f'resnet50_worker_restarts{{model="{TAGGER}",engine="triton",slot="{TAGGER}_0_0"}} 1\n'
        f'resnet50_worker_restarts{{model="{TAGGER}",engine="triton",slot="{TAGGER}_0_1"}} 2\n'
    )

    def read(at: float, workers: dict, down: list[str]) -> top.Read:
        return top.parse(restarts, workers, at, down, wall=1_800_000_000.0 + at)

    first = read(0.0, {TAGGER: []}, [embedding])
    went_down = top.carry(first, read(2.0, {}, [TAGGER, embedding]))
    later = top.carry(went_down, read(9.0, {}, [TAGGER, embedding]))

    def state(old, new, model):
        return next(line for line in top.frame(old, new).splitlines() if f"  {model}: " in line)

    assert state(first, first, TAGGER) == f"  {TAGGER}: up, 3 restart(s)"
    at = datetime.fromtimestamp(first.wall)
    assert (
        state(went_down, later, embedding) == f"  {embedding}: DOWN, at least since {at:%H:%M:%S}"
    )
    since = datetime.fromtimestamp(first.wall + 2)
    assert later.down_since[TAGGER] == first.wall + 2
    assert (
        state(went_down, later, TAGGER)
        == f"  {TAGGER}: DOWN since {since:%H:%M:%S} (7 s), 3 restart(s)"
    )
    back = top.carry(later, read(11.0, {TAGGER: []}, [embedding]))
    assert TAGGER not in back.down_since and state(later, back, TAGGER).endswith(
        ": up, 3 restart(s)"
    )


def test_take_finds_a_model_with_no_worker_ready_down_and_asks_only_the_others_workers():
    """A model Triton unloaded for its reload is in model_rows (not among the loaded models)
    with no instance ready; describing it would fail, so only the others are described."""

    class Server:
        def __init__(self) -> None:
            self.described: list[str] = []

        def model_rows(self):
            return [
                {"model": TAGGER, "version": "1", "ready": 0},
                {"model": "resnet50-embedding", "version": "1", "ready": 1},
            ]

        def describe(self, model):
            self.described.append(model)
            return [{"workers": [{"id": "0", "status": "READY"}]}]

        def metrics_text(self):
            return ""

    server = Server()
    read = top.take(server)  # type: ignore[arg-type]
    assert read.down == {TAGGER} and server.described == ["resnet50-embedding"]
    assert set(read.down_since) == {TAGGER}


def test_take_uses_the_workers_the_rows_carry_without_describing_again():
    """TorchServe's rows come from describe already (``workerList``): no second describe."""
    worker = {"id": "9000", "status": "READY", "pid": 42}

    class Server:
        def model_rows(self):
            return [{"model": TAGGER, "version": "1.0", "ready": 1, "workerList": [worker]}]

        def describe(self, model):
            raise AssertionError(f"described {model} again")

        def metrics_text(self):
            return ""

    read = top.take(Server())  # type: ignore[arg-type]
    assert read.workers == {TAGGER: [worker]} and read.down == frozenset()


def _triton_metrics(
    success: int,
    failure: int,
    duration_us: float,
    queue_us: float,
    images: int,
    sizes: dict[int, int],
    errors: dict[str, int],
) -> str:
    """Triton's metrics port: its own nv_* under "model", the core's as on TorchServe."""
    model = f'model="{TAGGER}",version="1"'
    handler = f'Hostname="h",engine="triton",model="{TAGGER}"'
    lines = [
        f"nv_inference_request_success{{{model}}} {success}",
        f'nv_inference_request_failure{{{model},reason="REJECTED"}} {failure}',
        f"nv_inference_request_duration_us{{{model}}} {duration_us}",
        f"nv_inference_queue_duration_us{{{model}}} {queue_us}",
        f"nv_inference_count{{{model}}} {images}",
        f"resnet50_images_total{{{handler}}} {images}",
        f"resnet50_batches_total{{{handler}}} {sum(sizes.values())}",
        f"resnet50_requests_total{{{handler}}} {sum(s * n for s, n in sizes.items())}",
        f'resnet50_precision{{{handler},precision="f32"}} 1',
        f'resnet50_worker_rss_mb{{{handler},worker_pid="777"}} 1200.4',
    ]
    lines += [
        f'resnet50_batches_by_size_total{{batch_size="{s}",{handler}}} {n}'
        for s, n in sizes.items()
    ]
    lines += [
        f'resnet50_errors_total{{error_type="{kind}",{handler}}} {n}' for kind, n in errors.items()
    ]
    return "\n".join(lines) + "\n"


def test_a_triton_frame_reads_its_own_series_beside_the_cores():
    """Requests, latency and queue time from Triton's nv_* series; batches, errors, precision
    and the stub's RSS from the core's; no status classes (Triton has none)."""
    workers = {TAGGER: [{"id": "0", "status": "READY"}]}  # Triton's instances: no pid
    old = top.parse(_triton_metrics(10, 0, 500_000, 50_000, 10, {1: 10}, {}), workers, at=10.0)
    # In 4 s: 16 requests answered (2 of them the core's 400s) and 4 refused by Triton, in
    # 200 ms each after 40 ms queued; 18 images in batches of 2, 4, 4 and 4.
    new = top.parse(
        _triton_metrics(26, 4, 3_700_000, 690_000, 28, {1: 10, 2: 1, 4: 3}, {"InvalidImage": 2}),
        workers,
        at=14.0,
    )
    lines = top.frame(old, new, url="127.0.0.1:8002").splitlines()
    assert lines[1].startswith("answers/s  - (no status classes on Triton")
    row = next(line.split() for line in lines if line.startswith(TAGGER))
    # model, req/s (16 + 4 in 4 s), img/s, mean and queue ms (over the 16 answered: Triton
    # times no failure), batch, p50/p95
    assert row == [TAGGER, "5.0", "4.5", "200.0", "40.0", "3.5", "4/4"]
    assert f"  {TAGGER}: InvalidImage 0.5/s" in lines
    worker = next(line.split() for line in lines if line.startswith(TAGGER) and "READY" in line)
    assert worker == [TAGGER, "0", "READY", "777", "1200", "f32"]


def _cache(hits: int, misses: int, engine: str) -> str:
    handler = f'model="{TAGGER}",engine="{engine}",Hostname="h"'
    return (
        f"resnet50_cache_hits_total{{{handler}}} {hits}\n"
        f"resnet50_cache_misses_total{{{handler}}} {misses}\n"
        f"resnet50_cache_bytes{{{handler}}} 1048576\n"
    )


def _deadlines_line(lines: list[str]) -> str:
    return lines[lines.index("deadlines and cache") + 1]


@pytest.mark.parametrize("engine", ["torchserve", "triton"])
def test_expired_requests_and_the_cache_hit_ratio_per_model(engine):
    """In 2 s: 4 more requests expired (504 DeadlineExceeded) and 40 images looked up in the
    content cache, 30 of them hits: 2.0/s and 75%."""

    def text(expired: int, hits: int, misses: int) -> str:
        errors = {"DeadlineExceeded": expired}
        if engine == "torchserve":
            base = _metrics(10, 500_000, 100_000, 10, {1: 10}, errors, (10, 0, 0))
        else:
            base = _triton_metrics(10, 0, 500_000, 50_000, 10, {1: 10}, errors)
        return base + _cache(hits, misses, engine)

    workers = {TAGGER: []}
    old = top.parse(text(1, 10, 30), workers, at=50.0)
    new = top.parse(text(5, 40, 40), workers, at=52.0)
    lines = top.frame(old, new).splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert _deadlines_line(lines) == f"  {TAGGER}: expired 2.0/s (504), cache hits 75% of 40 img"


def test_a_model_without_cache_series_shows_the_cache_off():
    text = _metrics(10, 500_000, 100_000, 10, {1: 10}, {}, (10, 0, 0))
    workers = {TAGGER: []}
    lines = top.frame(top.parse(text, workers, 0.0), top.parse(text, workers, 1.0)).splitlines()
    assert _deadlines_line(lines) == f"  {TAGGER}: expired 0.0/s (504), cache off"


def _tsctl_env(server) -> dict[str, str]:
    # This checkout's serveclient, whichever checkout the shared .venv was installed from.
    return {**server.cli_env(), "PYTHONPATH": str(REPO)}


class _Load:
    """Photos to the tagger, 2 in flight, until stopped (a bounded, steady load)."""

    def __init__(self, server) -> None:
        self.server, self.stop, self.sent = server, threading.Event(), 0
        photo = (REPO / "build" / "samples" / "chelsea.jpg").read_bytes()
        self.threads = [threading.Thread(target=self._send, args=(photo,)) for _ in range(2)]

    def _send(self, photo: bytes) -> None:
        headers = self.server.keys.inference_headers()
        while not self.stop.is_set():
            requests.post(
                f"{self.server.inference_url}/predictions/{TAGGER}",
                data=photo,
                headers=headers,
                timeout=120,
            )
            self.sent += 1

    def __enter__(self) -> _Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=150)


@pytest.mark.integration
def test_once_under_load(torchserve):
    with _Load(torchserve) as load:
        settled(lambda: load.sent, lambda n: n >= 2)  # the load is flowing before the frame
        result = subprocess.run(
            [str(TSCTL), "top", "--once", "--interval", "2"],
            env=_tsctl_env(torchserve),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), result.stdout
    row = next(line.split() for line in lines if line.startswith(TAGGER))
    requests_per_s, mean_ms, batch = float(row[1]), float(row[3]), float(row[5])
    assert requests_per_s > 0 and mean_ms > 0 and batch >= 1, result.stdout
    workers = [line.split() for line in lines if line.startswith(TAGGER) and "READY" in line]
    assert workers and all(int(w[4]) > 100 for w in workers), result.stdout  # RSS MB


@pytest.mark.integration
def test_live_view_in_an_80_column_terminal_quits_on_q(torchserve, tmp_path):
    tmux = shutil.which("tmux")
    if tmux is None:
        pytest.fail("tmux missing: make setup installs it (devtools/ensure_prometheus.sh)")
    socket = f"tsctl-top-{uuid.uuid4().hex[:8]}"  # a private tmux server, killed at the end
    base = [tmux, "-L", socket, "-f", os.devnull]
    env = _tsctl_env(torchserve)
    command = " ".join(
        f"{k}={shlex.quote(v)}"
        for k, v in env.items()
        if k.startswith("TSCTL_") or k == "PYTHONPATH"
    )
    command += f" {shlex.quote(str(TSCTL))} top --interval 1; echo EXITED $?; sleep 30"

    def screen() -> str:
        return subprocess.run(
            [*base, "capture-pane", "-p", "-t", "top"], capture_output=True, text=True, timeout=10
        ).stdout

    try:
        subprocess.run(
            [*base, "new-session", "-d", "-s", "top", "-x", "80", "-y", "30", command],
            check=True,
            timeout=10,
            env={**os.environ, "TERM": "xterm"},
        )
        with _Load(torchserve):
            shown = settled(screen, lambda s: "q quits" in s and "READY" in s, timeout_s=60)
        lines = shown.splitlines()
        assert "q quits" in shown, shown
        # The table's header and rows are whole lines: nothing wrapped past 80 columns.
        header = next((ln for ln in lines if ln.startswith("model") and "p50/p95" in ln), None)
        assert header is not None, shown
        assert header.split() == [
            "model",
            "req/s",
            "img/s",
            "mean",
            "ms",
            "queue",
            "ms",
            "batch",
            "p50/p95",
        ]
        assert any(line.startswith(TAGGER) and len(line.split()) == 7 for line in lines), shown
        subprocess.run([*base, "send-keys", "-t", "top", "q"], check=True, timeout=10)
        after = settled(screen, lambda s: "EXITED" in s, timeout_s=15)
        assert "EXITED 0" in after, after
    finally:
        subprocess.run([*base, "kill-server"], capture_output=True, timeout=10)


# TorchServe 0.12's GPU series as its Prometheus exporter writes them (config/metrics.yaml's
# dimensions Level, DeviceId, Hostname): percent and MiB, sampled every minute.
TORCHSERVE_GPUS = """\
# HELP GPUUtilization Torchserve prometheus gauge metric with unit: Percent
# TYPE GPUUtilization gauge
GPUUtilization{Level="Host",DeviceId="0",Hostname="h",} 75.0
GPUUtilization{Level="Host",DeviceId="1",Hostname="h",} 5.0
# HELP GPUMemoryUtilization Torchserve prometheus gauge metric with unit: Percent
# TYPE GPUMemoryUtilization gauge
GPUMemoryUtilization{Level="Host",DeviceId="0",Hostname="h",} 50.0
GPUMemoryUtilization{Level="Host",DeviceId="1",Hostname="h",} 1.25
# HELP GPUMemoryUsed Torchserve prometheus gauge metric with unit: Megabytes
# TYPE GPUMemoryUsed gauge
GPUMemoryUsed{Level="Host",DeviceId="0",Hostname="h",} 40960.0
GPUMemoryUsed{Level="Host",DeviceId="1",Hostname="h",} 1024.0
"""
# Triton 2.51's: a fraction and bytes per gpu_uuid, every second.
TRITON_GPUS = """\
# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-c06bbf33-c250-ca45-579b-19134b518844"} 0.600000
# HELP nv_gpu_memory_total_bytes GPU total memory, in bytes
# TYPE nv_gpu_memory_total_bytes gauge
nv_gpu_memory_total_bytes{gpu_uuid="GPU-c06bbf33-c250-ca45-579b-19134b518844"} 85899345920.000000
# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{gpu_uuid="GPU-c06bbf33-c250-ca45-579b-19134b518844"} 21474836480.000000
"""


def _gpu_rows(screen: str) -> list[list[str]]:
    lines = screen.splitlines()
    header = next((i for i, line in enumerate(lines) if line.split()[:2] == ["gpu", "busy"]), None)
    if header is None:
        return []
    return [line.split() for line in lines[header + 1 :] if line.strip()]


@pytest.mark.parametrize(
    ("engine", "gpus", "rows"),
    [
        # 40960 MiB at 50%: an 80 GiB card; the second GPU nearly idle.
        (
            "torchserve",
            TORCHSERVE_GPUS,
            [["0", "75%", "40960", "50%"], ["1", "5%", "1024", "1%"]],
        ),
        # 20 GiB of 80 GiB; the uuid shortened to its first 12 characters.
        ("triton", TRITON_GPUS, [["GPU-c06bbf33", "60%", "20480", "25%"]]),
    ],
)
def test_a_frame_shows_each_gpu_busy_and_its_memory(engine, gpus, rows):
    if engine == "torchserve":
        base = _metrics(10, 500_000, 100_000, 10, {1: 10}, {}, (10, 0, 0))
    else:
        base = _triton_metrics(10, 0, 500_000, 50_000, 10, {1: 10}, {})
    workers = {TAGGER: []}
    screen = top.frame(top.parse(base + gpus, workers, 0.0), top.parse(base + gpus, workers, 2.0))
    assert _gpu_rows(screen) == rows
    assert all(len(line) <= 80 for line in screen.splitlines()), screen


def test_a_cpu_host_shows_no_gpu_lines():
    """No GPU series, no GPU table: the frame is what it was before GPUs existed."""
    text = _metrics(10, 500_000, 100_000, 10, {1: 10}, {}, (10, 0, 0))
    workers = {TAGGER: []}
    screen = top.frame(top.parse(text, workers, 0.0), top.parse(text, workers, 1.0))
    assert _gpu_rows(screen) == []
    assert "gpu" not in screen.lower()


def test_each_gpu_worker_shows_the_gpu_memory_it_holds():
    """The core's resnet50_worker_gpu_mb of each worker's pid in its row (what its PyTorch
    reserved, every batch), beside its RSS; a worker that reported none shows a dash."""
    base = _metrics(10, 500_000, 100_000, 10, {1: 10}, {}, (10, 0, 0))
    held = (
        f'resnet50_worker_gpu_mb{{model="{TAGGER}",engine="torchserve",worker_pid="4242",'
        'Hostname="h",} 2310.0\n'
    )
    workers = {
        TAGGER: [
            {"id": "9000", "status": "READY", "pid": 4242},
            {"id": "9001", "status": "READY", "pid": 4243},
        ]
    }
    old, new = top.parse(base + held, workers, 0.0), top.parse(base + held, workers, 2.0)
    lines = top.frame(old, new).splitlines()
    header = next(line.split() for line in lines if line.startswith("model") and "pid" in line)
    assert header == ["model", "worker", "status", "pid", "RSS", "MB", "GPU", "MB", "precision"]
    rows = [line.split() for line in lines if line.startswith(TAGGER) and "READY" in line]
    assert rows == [
        [TAGGER, "9000", "READY", "4242", "1024", "2310", "int8+f32"],
        [TAGGER, "9001", "READY", "4243", "-", "-", "int8+f32"],
    ]
    assert all(len(line) <= 80 for line in lines)
