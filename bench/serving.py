"""Measure one model on one running TorchServe: closed-loop runs per image and client count,
then an open-loop Poisson rate sweep, each with the server's peak memory; and serve a variant
archive of the tagger for one measurement (``registered_variant``: the sweep, the
availability study)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.archives import ArchiveInfo
from bench.batchlog import with_logged_batches
from bench.layout import TAGGER
from bench.loadgen import Endpoint, closed_loop, open_loop
from bench.memory import PeakRss
from bench.stats import Sample, summarize
from devtools.server import LocalTorchServe
from serveclient.errors import ApiError


@dataclass(frozen=True)
class LoadPlan:
    """Durations and bounds of every load run (the defaults fit ``python -m bench`` in 10 min).

    Closed loop: ``warmup_s`` discarded, then ``closed_s`` measured, at most
    ``closed_max_requests`` requests. Open loop: each rate for ``open_s``, at most
    ``open_max_requests`` arrivals and ``open_max_in_flight`` requests in flight.
    """

    warmup_s: float = 3.0
    closed_s: float = 12.0
    closed_max_requests: int = 3000
    clients: tuple[int, ...] = (1, 16)
    rates: tuple[float, ...] = (5.0, 10.0, 20.0, 30.0)
    open_s: float = 10.0
    open_max_requests: int = 1000
    open_max_in_flight: int = 64
    open_image: str = "small"
    timeout_s: float = 60.0


def served_settings(info: dict) -> dict:
    """The frontend settings a describe entry reports, as the benchmark tables show them."""
    workers = info.get("workers", [])
    return {
        "batchSize": info.get("batchSize"),
        "maxBatchDelay": info.get("maxBatchDelay"),
        "workers": len(workers),
        "ready": sum(1 for w in workers if w.get("status") == "READY"),
        "worker_pids": [w.get("pid") for w in workers],
    }


class ModelUnderTest:
    """One model on one started server: how to call it and how to read its batch sizes."""

    def __init__(
        self, server: LocalTorchServe, model: str, *, batches_from_log: bool, plan: LoadPlan
    ) -> None:
        self.server = server
        self.model = model
        self.batches_from_log = batches_from_log
        self.plan = plan

    def endpoint(self, body: bytes) -> Endpoint:
        url = f"{self.server.inference_url}/predictions/{self.model}"
        return Endpoint(url, self.server.keys.inference_headers(), body, self.plan.timeout_s)

    def _measured(self, run: Callable[[], list[Sample]], watch: dict[str, int]) -> dict:
        with PeakRss(self.server.processes, watch) as peak:
            samples = run()
        if self.batches_from_log:
            samples = with_logged_batches(
                samples, self.server.workdir / "logs" / "ts_log.log", self.model
            )
        stats = summarize(samples).to_dict()
        stats["rss_server_mb"] = peak.total_mb
        stats["rss_worker_mb"] = max(peak.watched_mb.values(), default=0.0)
        return stats

    def closed(self, image: str, body: bytes, clients: int, watch: dict[str, int]) -> dict:
        """Warm up, then one measured closed-loop run."""
        endpoint, plan = self.endpoint(body), self.plan
        closed_loop(endpoint, clients, plan.warmup_s, plan.closed_max_requests)
        stats = self._measured(
            lambda: closed_loop(endpoint, clients, plan.closed_s, plan.closed_max_requests), watch
        )
        return {"image": image, "clients": clients, **stats}

    def open(self, image: str, body: bytes, rate: float, watch: dict[str, int]) -> dict:
        """One open-loop run at ``rate`` requests/s (same seeded arrivals for every server)."""
        endpoint, plan = self.endpoint(body), self.plan
        bounds = (plan.open_s, plan.open_max_requests, plan.open_max_in_flight)
        stats = self._measured(lambda: open_loop(endpoint, rate, *bounds, int(rate * 1000)), watch)
        return {"image": image, "rate": rate, **stats}


def measure_model(
    server: LocalTorchServe,
    model: str,
    images: dict[str, bytes],
    plan: LoadPlan,
    *,
    batches_from_log: bool,
    progress: Callable[[str], None] = lambda _: None,
) -> dict:
    """Every closed-loop run (each image x each client count), then the open-loop sweep on
    ``plan.open_image``. Returns ``{"settings": ..., "closed": [...], "open": [...]}``."""
    mut = ModelUnderTest(server, model, batches_from_log=batches_from_log, plan=plan)
    settings = served_settings(server.client().describe(model)[0])
    watch = {f"worker {pid}": pid for pid in settings["worker_pids"] if pid}
    return {"settings": settings, **run_plan(mut, images, plan, watch, model, progress)}


def run_plan(
    mut,
    images: dict[str, bytes],
    plan: LoadPlan,
    watch: dict[str, int],
    label: str,
    progress: Callable[[str], None] = lambda _: None,
) -> dict:
    """``plan`` against one model under test (``closed`` and ``open`` like ModelUnderTest's,
    whatever the server): each image at each client count, then the open-loop sweep.
    ``watch``: the processes whose RSS is sampled. Returns ``{"closed": [...], "open": [...]}``."""
    closed = []
    for image, body in images.items():
        for clients in plan.clients:
            progress(f"{label}: {image}, {clients} client(s), closed loop")
            closed.append(mut.closed(image, body, clients, watch))
    opened = []
    for rate in plan.rates:
        progress(f"{label}: {plan.open_image}, Poisson {rate:g} req/s, open loop")
        opened.append(mut.open(plan.open_image, images[plan.open_image], rate, watch))
    return {"closed": closed, "open": opened}


class SettingNotApplied(RuntimeError):
    """The registered variant does not run with the settings its archive asked for."""


def wait_for_setting(
    server: LocalTorchServe, batch_size: int, delay: int, workers: int, timeout_s: float = 120.0
) -> dict:
    """Poll the describe API until the tagger has ``workers`` READY workers; then insist that
    batchSize and maxBatchDelay are the asked ones. Returns the frontend settings."""
    deadline = time.monotonic() + timeout_s
    settings: dict = {}
    while time.monotonic() < deadline:
        settings = served_settings(server.client().describe(TAGGER)[0])
        if settings["ready"] == workers and settings["workers"] == workers:
            break
        time.sleep(0.5)
    wanted = {"batchSize": batch_size, "maxBatchDelay": delay, "workers": workers, "ready": workers}
    got = {k: settings.get(k) for k in wanted}
    if got != wanted:
        raise SettingNotApplied(f"wanted {wanted}, the describe API says {got}")
    return settings


def unregister_all(server: LocalTorchServe, timeout_s: float = 120.0) -> None:
    """Unregister every model and wait until the list is empty (its workers are gone)."""
    client = server.client()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        models = client.list_models()
        if not models:
            return
        for model in models:
            try:
                client.unregister(model["modelName"])
            except ApiError as exc:
                if exc.status != 404:  # 404: already gone between list and delete
                    raise
        time.sleep(0.5)
    raise RuntimeError(f"models still registered after {timeout_s:.0f}s")


@contextmanager
def registered_variant(
    server: LocalTorchServe, archive: ArchiveInfo, config: dict, name: str, work: Path
) -> Iterator[dict]:
    """``archive`` (the tagger's) with ``config`` as its model-config.yaml, at
    ``work/store/name``, register it, and yield its describe settings once
    batchSize, maxBatchDelay and the READY workers are the config's (``SettingNotApplied``
    otherwise). Afterwards every model is unregistered and the archive deleted."""
    batch_size, delay, workers = config["batchSize"], config["maxBatchDelay"], config["minWorkers"]
    mar = archive.with_config(config, work / "store" / name)
    try:
        server.client().register(
            name, workers=workers, batch_size=batch_size, max_batch_delay=delay
        )
        yield wait_for_setting(server, batch_size, delay, workers)
    finally:
        unregister_all(server)
        mar.unlink(missing_ok=True)
