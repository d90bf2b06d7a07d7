"""Bring back a model whose Python-backend stub died, through Triton's repository API.

Triton 2.51's Python backend (r24.10) does not restart a dead stub: the restart its earlier
releases had on the next request is gone ("TODO: Implement restart on decoupled"), every
request to the model then fails with 500 ``Stub process '<model>_0_0' is not healthy.`` and
the model stays READY, so neither ``/v2/health/ready`` nor ``/v2/models/M/ready`` notices.

``Watchdog`` looks at the server's children every ``every_s`` seconds (``psutil``: a stub is a
``triton_python_backend_stub`` child whose 9th argument is its instance, ``<model>_<group>_<n>``)
and, when a stub it saw running is gone or a zombie, unloads its model at once and loads it
again. While the model is unloaded and loading, Triton itself tells the truth: requests get
404 ``Request for unknown model: 'M' has no available versions`` (Triton sends no
``Retry-After`` and has no 503 for it; ``serveclient`` retries it as a 503), and with
``--strict-readiness=true`` ``/v2/health/ready`` and ``/v2/models/M/ready`` answer 400. The
other models keep answering. A model that does not come back after ``attempts`` loads makes
the watchdog stop Triton (``give_up``): the launcher then exits 1 and its supervisor (the
kubelet, a person) starts it afresh, the liveness a pod needs.

Needs ``--model-control-mode=explicit`` (``tritonrepo.server`` starts Triton so).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil
import requests

logger = logging.getLogger(__name__)

STUB = "triton_python_backend_stub"
INSTANCE_ARG = 8  # the stub's argv[8]: its instance name (python_backend's stub_launcher.cc)
LOAD_TIMEOUT = 300.0  # seconds a load may take (the launcher's own start limit)


def stub_instances(server_pid: int) -> dict[int, str]:
    """The running (not zombie) Python-backend stubs under ``server_pid``: pid -> instance."""
    stubs = {}
    try:
        children = psutil.Process(server_pid).children()
    except psutil.NoSuchProcess:
        return {}
    for child in children:
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            argv = child.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if argv and argv[0].endswith(STUB) and len(argv) > INSTANCE_ARG:
            stubs[child.pid] = argv[INSTANCE_ARG]
    return stubs


def model_of(instance: str) -> str:
    """``resnet50-tagger_0_0`` -> ``resnet50-tagger`` (Triton names instances
    ``<model>_<group>_<index>``)."""
    return instance.rsplit("_", 2)[0]


@dataclass
class Restarts:
    """What the watchdog did, per model: restarts begun, and since when (``time.time()``) a
    model is down (absent when it answers)."""

    count: dict[str, int] = field(default_factory=dict)
    down_since: dict[str, float] = field(default_factory=dict)


class Watchdog:
    """One thread watching ``server_pid``'s stubs; ``start``/``stop``. ``url``: Triton's HTTP
    endpoint; ``headers``: the key its model-repository API wants."""

    def __init__(
        self,
        server_pid: int,
        url: str,
        headers: dict[str, str],
        give_up: Callable[[str], None],
        every_s: float = 1.0,
        attempts: int = 3,
    ) -> None:
        self.server_pid = server_pid
        self.url = url
        self.headers = headers
        self.give_up = give_up
        self.every_s = every_s
        self.attempts = attempts
        self.restarts = Restarts()
        self._known: dict[int, str] = {}  # pid -> instance, as last seen running
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stub-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._known = stub_instances(self.server_pid)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Before Triton is told to stop: its stubs exiting then is no death."""
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(1.0)  # a load under way fails as Triton stops

    def dead_models(self) -> list[str]:
        """Models one of whose stubs, seen running before, is gone or a zombie now; the pids
        seen now are remembered for the next look."""
        now = stub_instances(self.server_pid)
        dead = sorted({model_of(i) for pid, i in self._known.items() if pid not in now})
        self._known = now
        return dead

    def _run(self) -> None:
        while not self._stopping.wait(self.every_s):
            for model in self.dead_models():
                if self._stopping.is_set():
                    return
                if not self.recover(model):
                    self.give_up(model)
                    return
            # A reload's new stubs are seen at the next look.

    def recover(self, model: str) -> bool:
        """Unload ``model`` (its requests get Triton's "no available versions" at once, not
        500) and load it again, up to ``attempts`` times; True once it is READY."""
        self.restarts.count[model] = self.restarts.count.get(model, 0) + 1
        self.restarts.down_since[model] = time.time()
        logger.error("model %s: its stub died; unloading and loading it again", model)
        began = time.monotonic()
        for attempt in range(1, self.attempts + 1):
            try:
                self._post(f"/v2/repository/models/{model}/unload", 60)
                self._post(f"/v2/repository/models/{model}/load", LOAD_TIMEOUT)
            except requests.RequestException as exc:
                logger.error(
                    "model %s: load %d of %d failed: %s", model, attempt, self.attempts, exc
                )
                if self._stopping.wait(2.0 * attempt):
                    return True  # stopping anyway
                continue
            del self.restarts.down_since[model]
            logger.error("model %s: back after %.1f s", model, time.monotonic() - began)
            return True
        return False

    def _post(self, path: str, timeout: float) -> None:
        response = requests.post(self.url + path, json={}, headers=self.headers, timeout=timeout)
        if response.status_code != 200:
            raise requests.HTTPError(f"{path}: {response.status_code} {response.text[:300]}")
