"""Helpers for tests that talk to a running TorchServe (``devtools.server.LocalTorchServe``):
its answers, its metrics, and ``tsctl`` pointed at it; a local Triton and the v2 body both
engines take; code run inside a runtime container (``kserve_tools.container``)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest
import requests
import yaml

from serveclient import metrics

REPO = Path(__file__).resolve().parent.parent  # as tests.conftest's (which imports this module)
TSCTL = REPO / ".venv" / "bin" / "tsctl"
T = TypeVar("T")


@contextmanager
def variant_server(
    tmp_path_factory, model_store, model: str, handler: dict | None = None, **frontend
) -> Iterator:
    """A second TorchServe serving only ``model``, archived from the shipped config with
    ``frontend`` settings (batchSize, ...) and ``handler`` settings replaced, always stopped."""
    from bench.archives import ArchiveInfo
    from devtools.server import LocalTorchServe

    config = yaml.safe_load((REPO / "config" / "models" / f"{model}.yaml").read_text())
    config.update(frontend)
    config["handler"] = {**config.get("handler", {}), **(handler or {})}
    store = tmp_path_factory.mktemp(f"{model}-variant-store")
    ArchiveInfo.read(model_store / f"{model}.mar").with_config(config, store / f"{model}.mar")
    server = LocalTorchServe(
        tmp_path_factory.mktemp(f"{model}-variant-ts"), store, load_models=[f"{model}.mar"]
    )
    server.start()
    try:
        yield server
    finally:
        server.kill()
        shutil.rmtree(store, ignore_errors=True)


@contextmanager
def local_triton(
    workdir,
    model_store,
    precision: str | None = "f32",
    key_file: Path | None = None,
    handler: dict | None = None,
    exit_timeout: int | None = None,
    only: tuple[str, ...] = (),
) -> Iterator:
    """A real Triton on a repository generated into ``workdir`` from ``model_store`` (pinned to
    ``precision``) on free loopback ports, always stopped; skips the test, saying why, when
    ``make triton-server`` could not install the wheel. A start that fails shows the log.
    ``key_file``: its restricted APIs want the keys kept there (``Triton``'s); None: all open.
    ``handler``: settings replaced in every model's ``handler:`` section. ``exit_timeout``:
    seconds Triton waits for open connections when stopped (None: the launcher's own).
    ``only``: these models of config/models/ alone ((): all)."""
    from devtools.server import free_ports
    from tritonrepo.generate import generate
    from tritonrepo.install import NotInstalled, TritonInstall
    from tritonrepo.server import running

    try:
        TritonInstall().check()
    except NotInstalled as exc:
        pytest.skip(f"no Triton server: {exc}")
    models = REPO / "config" / "models"
    if handler or only:
        models = workdir / "models"
        models.mkdir()
        for source in sorted((REPO / "config" / "models").glob("*.yaml")):
            if only and source.stem not in only:
                continue
            config = yaml.safe_load(source.read_text())
            config["handler"] = {**config.get("handler", {}), **(handler or {})}
            (models / source.name).write_text(yaml.safe_dump(config))
    generate(
        workdir / "repository", models_dir=models, model_store=model_store, precision=precision
    )
    with running(
        workdir / "repository",
        workdir / "triton.log",
        key_file=key_file,
        **({} if exit_timeout is None else {"exit_timeout": exit_timeout}),
        **free_ports(("http", "grpc", "metrics")),
    ) as server:
        yield server


def v2_body(images: list[bytes], parameters: dict) -> dict:
    """The JSON body TorchServe's v2 route takes, as Triton takes it too: base64 images in the
    ``images`` BYTES tensor, ``[n, 1]``; ``parameters`` (when any) as the request's parameters."""
    body: dict = {
        "inputs": [
            {
                "name": "images",
                "datatype": "BYTES",
                "shape": [len(images), 1],
                "data": [base64.b64encode(i).decode() for i in images],
            }
        ]
    }
    if parameters:
        body["parameters"] = parameters
    return body


def v2_infer(triton, model: str, images: list[bytes], **parameters) -> requests.Response:
    """``v2_body(images, parameters)`` to ``triton``'s v2 route, with the inference key when
    ``triton`` has keys."""
    headers = triton.keys.inference_headers() if triton.keys is not None else {}
    return requests.post(
        f"{triton.url}/v2/models/{model}/infer",
        json=v2_body(images, parameters),
        timeout=300,
        headers=headers,
    )


def inside(pod, code: str) -> str:
    """Run Python ``code`` in the runtime container ``pod`` (``RuntimeContainer``); the test
    fails with its stderr unless it exits 0; its stdout, stripped."""
    done = pod.exec(["python", "-c", code], timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def served_precision(ts, model: str) -> str:
    """The ``handler.precision`` that serves what ``model`` on ``ts`` serves (describe's
    ``int8+f32`` is ``int8``): a second server pinned to it answers with the same arithmetic,
    where its own ``auto`` could choose otherwise on a busy host (its batch sizes are another
    key of the host's stored choices)."""
    meta = ts.client().describe(model, customized=True)[0]["customizedMetadata"]
    return meta["precision"].split("+")[0]


def raw_answer(ts, model: str, image: bytes, **headers):
    response = requests.post(
        f"{ts.inference_url}/predictions/{model}",
        data=image,
        timeout=120,
        headers={**ts.keys.inference_headers(), **headers},
    )
    assert response.status_code == 200, response.text
    return response.json()


def handled(server, model: str) -> tuple[float, float]:
    """(requests, batches) ``model``'s handler has seen on ``server`` (anything with a
    ``metrics_url``): the sum and count of its ``resnet50_batch_size`` histogram on /metrics."""
    text = requests.get(f"{server.metrics_url}/metrics", timeout=30).text
    values = {
        name: value for name, labels, value in metrics.samples(text) if labels.get("model") == model
    }
    return values.get("resnet50_batch_size_sum", 0.0), values.get("resnet50_batch_size_count", 0.0)


def settled(
    read: Callable[[], T], done: Callable[[T], bool], timeout_s: float = 30.0, every_s: float = 0.2
) -> T:
    """``read()`` again (every ``every_s``, up to ``timeout_s``) until ``done`` holds for what
    it returns, and return the last value. E.g. TorchServe's frontend copies the worker's
    metric lines to ``/metrics`` from another thread, so the metrics can lag behind an answer."""
    deadline = time.monotonic() + timeout_s
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(every_s)
        value = read()
    return value


def tsctl(
    server, *argv: str, timeout: float = 300, stdin: str | None = None
) -> subprocess.CompletedProcess:
    """Run the installed ``tsctl`` against ``server``: a ``LocalTorchServe`` (its URLs and key
    file in the environment), a Triton (``--url``, this checkout's client) or None (a command
    that reaches no server), ``stdin`` its input; the test fails if ``tsctl`` is not
    installed."""
    if not TSCTL.exists():
        pytest.fail(f"{TSCTL} missing: `make setup` installs it (pip install -e .)")
    if hasattr(server, "cli_env"):
        env = server.cli_env()
    else:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        argv = argv if server is None else (*argv, "--url", server.url)
    return subprocess.run(
        [str(TSCTL), *argv], env=env, input=stdin, capture_output=True, text=True, timeout=timeout
    )


def train_head(server, photos, out, weights_dir) -> subprocess.CompletedProcess:
    """``tsctl --json head train PHOTOS --out OUT`` against ``server`` (as ``tsctl``'s), the
    backbone the session's archives were built from."""
    backbone = str(weights_dir / "resnet50.pt")
    argv = ["--json", "head", "train", str(photos), "--out", str(out), "--backbone", backbone]
    return tsctl(server, *argv)


def marker_model(folder, marker) -> str:
    """Write into ``folder`` an unpacked model (``MAR-INF/MANIFEST.json`` and a handler) whose
    handler appends a line to ``marker`` when a worker imports it; return the folder's path.
    What a management key could register by path if the server allowed it."""
    (folder / "MAR-INF").mkdir(parents=True)
    manifest = {
        "runtime": "python",
        "archiverVersion": "0.12.0",
        "model": {"modelName": "marker", "modelVersion": "1.0", "handler": "marker_handler.py"},
    }
    (folder / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))
    (folder / "marker_handler.py").write_text(
        f"open({str(marker)!r}, 'a').write('handler code ran\\n')\n\n\n"
        "def handle(data, context):\n    return ['ok'] * len(data or [])\n"
    )
    return str(folder.resolve())
