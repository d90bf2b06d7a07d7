"""Helpers for tests that talk to a running TorchServe (``devtools.server.LocalTorchServe``):
its answers, its metrics, and ``tsctl`` pointed at it."""
from __future__ import annotations

import base64
import re
import subprocess
import time
from typing import Callable, TypeVar

import pytest
import requests

from tests.conftest import REPO

TSCTL = REPO / ".venv" / "bin" / "tsctl"
T = TypeVar("T")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def raw_answer(ts, model: str, image: bytes, **headers):
    response = requests.post(f"{ts.inference_url}/predictions/{model}", data=image, timeout=120,
                             headers={**ts.keys.inference_headers(), **headers})
    assert response.status_code == 200, response.text
    return response.json()


def histogram(metrics_text: str, name: str, model: str) -> tuple[float, float]:
    """(sum, count) of one of our batch histograms on the Prometheus endpoint."""
    values = {}
    for kind in ("sum", "count"):
        match = re.search(rf'^{name}_{kind}{{ModelName="{model}"[^}}]*}} ([0-9.eE+-]+)$',
                          metrics_text, re.MULTILINE)
        values[kind] = float(match.group(1)) if match else 0.0
    return values["sum"], values["count"]


def settled(read: Callable[[], T], done: Callable[[T], bool], timeout_s: float = 30.0) -> T:
    """``read()`` again (every 0.2 s, up to ``timeout_s``) until ``done`` holds for what it
    returns, and return the last value: TorchServe's frontend copies the worker's metric lines
    to ``/metrics`` from another thread, so the metrics can lag behind an answer."""
    deadline = time.monotonic() + timeout_s
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.2)
        value = read()
    return value


def tsctl(server, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the installed ``tsctl`` against ``server``; the test fails if it is not installed."""
    if not TSCTL.exists():
        pytest.fail(f"{TSCTL} missing: `make setup` installs it (pip install -e .)")
    return subprocess.run([str(TSCTL), *argv], env=server.cli_env(), capture_output=True,
                          text=True, timeout=timeout)
