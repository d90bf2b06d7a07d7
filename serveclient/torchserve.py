"""TorchServe's client: its management API (register, scale, set-default, unregister,
describe), ``/predictions``, ``/explanations``, key rotation and its metrics, as ``Client``.

    from serveclient import TorchServeClient

    client = TorchServeClient()                      # serveshared.ports' defaults, ./key_file.json
    client.list_models()
    client.register("resnet50-tagger-2.0.mar", batch_size=16)
    client.predict("resnet50-tagger", open("cat.jpg", "rb").read(), topk=3)

Keys: when TorchServe refuses a key (400 ``InvalidKeyException``, e.g. after
``token_expiration_min``), the client re-reads the file (someone may have rotated it), else
rotates the key with the file's API key, and retries the call once.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from pathlib import Path
from typing import Any

import requests
from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

from serveclient import errors, metrics
from serveclient.base import TIMEOUT_S, URL_SCHEMES, Client, Report, check_name, version_row
from serveclient.engine import NOT_ON_TRITON, Engine, detect, not_on_triton
from serveclient.traffic import INTERACTIVE, Traffic
from serveshared import ports
from serveshared.keys import KEY_FILE, KINDS, Keys, bearer
from serveshared.wire import TOP_K_HEADER

# How long scale waits for describe to agree with TorchServe's answer (_await_ready), and how often
# it asks.
READY_WAIT_S = 30.0
READY_POLL_S = 0.05


def check_archive(archive: str) -> str:
    """An archive to register: a file name in the server's model store, or a URL (the server
    checks it against ``allowed_urls``). Paths are refused here: TorchServe would load a
    directory from anywhere on disk, which ``allowed_urls`` does not cover."""
    if archive.lower().startswith(URL_SCHEMES):
        return archive
    if "/" in archive or "\\" in archive:
        raise errors.UsageError(
            f"archive {archive!r} is a path; only archives in the model store can be registered",
            f"copy it into the server's model store (model-store/) and run "
            f"`tsctl register {Path(archive).name}`",
        )
    return check_name(archive, "archive file name")


class TorchServeClient(Client):
    """One TorchServe's inference, management and metrics APIs.

    ``key_file``: TorchServe's ``key_file.json`` (re-read on every call, so rotations by other
    clients are picked up; its API key rotates expired keys). ``keys``: fixed keys instead (no
    rotation). ``timeout``: seconds per call; registration and scaling wait for workers, so
    keep it generous. ``engine``: accepted for older callers; only TorchServe's is taken.
    """

    engine = Engine.TORCHSERVE
    NAME = "TorchServe"
    START_HINT = (
        "start it with `make serve` (or `torchserve --start --ts-config "
        "config/config.properties`), or point --inference-url/--management-url/"
        "--metrics-url (or TSCTL_INFERENCE_URL, ...) at it"
    )

    def __init__(
        self,
        inference_url: str = ports.INFERENCE_URL,
        management_url: str = ports.MANAGEMENT_URL,
        metrics_url: str = ports.METRICS_URL,
        *,
        key_file: Path | str | None = KEY_FILE,
        keys: Keys | None = None,
        timeout: float = TIMEOUT_S,
        engine: Engine | None = None,
    ) -> None:
        if engine not in (None, Engine.TORCHSERVE):
            raise errors.UsageError(f"TorchServeClient speaks to TorchServe, not {engine}")
        urls = {"inference": inference_url, "management": management_url, "metrics": metrics_url}
        super().__init__(urls, key_file=key_file, keys=keys, timeout=timeout)
        self.rotations = 0  # how many keys this client rotated (for `tsctl keys` and tests)
        # Concurrent calls that meet the same expired key rotate it once: each rotation
        # invalidates the previous key, so the others must pick up the new one instead.
        self._rotating = threading.Lock()

    @classmethod
    def at(
        cls,
        url: str,
        metrics_url: str | None = None,
        *,
        key_file: Path | str | None = None,
        keys: Keys | None = None,
        timeout: float = TIMEOUT_S,
    ) -> TorchServeClient:
        """A TorchServe (behind KServe) known by one URL: its inference API there (the
        management and metrics calls go there too, and mostly find nothing)."""
        client = cls(url, url, metrics_url or url, key_file=key_file, keys=keys, timeout=timeout)
        client.reaches_management = False
        return client

    # ------------------------------------------------------------------ keys

    def rotate(self, kind: str) -> Keys:
        """Ask the server for a new ``inference`` or ``management`` key (with the API key from
        the key file; the server rewrites the file) and return the new keys."""
        if kind not in KINDS:
            raise errors.UsageError(f"no key kind {kind!r}", f"one of {KINDS}")
        keys = self.keys
        if self.key_file is None or not keys.api:
            raise errors.KeyFileError(
                f"cannot rotate the {kind} key: no API key at hand",
                'rotation needs the server\'s key_file.json (its "API" key): pass --key-file',
            )
        response = self._send("POST", "management", "/token", {"type": kind}, bearer(keys.api))
        if response.status_code != 200:
            raise errors.from_response(response, f"rotate the {kind} key")
        self.rotations += 1
        return self.keys

    def refusal(self, command: str, exc: errors.ApiError) -> errors.ServeError:
        """``NotOnTriton`` when a TorchServe-only command got a 4xx because Triton answered
        (``--management-url`` pointed at it), else ``exc``: asked only after a 4xx, so a
        working TorchServe is asked nothing more."""
        if command not in NOT_ON_TRITON or not 400 <= exc.status < 500:
            return exc
        try:
            triton = detect(self.urls["management"], self._sessions["management"]) is Engine.TRITON
        except errors.ServeError:
            return exc
        return not_on_triton(command) if triton else exc

    def _retry_key(self, response: requests.Response, kind: str, used: str) -> str | None:
        """A refused key (``InvalidKeyException``): the key file's, when someone rotated it
        since, else a new one (rotated here, once for all the calls that met it)."""
        if not errors.is_key_rejection(response):
            return None
        with self._rotating:
            current = self.keys.key(kind)
            if current == used:  # nobody rotated it yet: expired (or wrong)
                current = self.rotate(kind).key(kind)
        return current

    # ------------------------------------------------------------------ management

    def list_models(self) -> list[dict]:
        """Every registered model: ``[{"modelName", "modelUrl"}]``."""
        return self._call(
            "GET", "management", "/models", "list models", params={"limit": 1000}
        ).json()["models"]

    def describe(
        self, model: str, version: str | None = None, customized: bool = False
    ) -> list[dict]:
        """One entry per version: every version when none is named, each with ``default``
        added (whether ``/predictions/MODEL`` serves it: TorchServe's describe does not say).
        With ``customized``, only the named (else the default) version, with the handler's
        ``customizedMetadata`` (weights, settings, backend) parsed from JSON."""
        every = version is None and not customized
        path = _model_path(model, "all" if every else version)
        entries = self._call(
            "GET",
            "management",
            path,
            f"describe {_label(model, version)}",
            params={"customized": "true" if customized else None},
        ).json()
        if every:
            default = self.default_version(model)
            for entry in entries:
                entry["default"] = entry.get("modelVersion") == default
        for entry in entries:
            meta = entry.get("customizedMetadata")
            if isinstance(meta, str):
                with contextlib.suppress(ValueError):
                    entry["customizedMetadata"] = json.loads(meta)
        return entries

    def default_version(self, model: str) -> str:
        """The version ``/predictions/MODEL`` serves."""
        return self._call(
            "GET", "management", _model_path(model, None), f"describe {model}"
        ).json()[0]["modelVersion"]

    def register(
        self,
        archive: str,
        *,
        name: str | None = None,
        workers: int | None = None,
        batch_size: int | None = None,
        max_batch_delay: int | None = None,
        response_timeout: int | None = None,
    ) -> dict:
        """Register ``archive`` (a file name in the model store, or an allowed URL) and wait
        until its workers are up.

        ``batch_size``/``max_batch_delay`` are sent to TorchServe (they win over the archive's
        YAML in 0.12). ``workers``: TorchServe 0.12 ignores ``initial_workers`` when the
        archive's YAML sets ``minWorkers``, so the registered version is scaled to exactly
        ``workers`` after registration; without it, this waits until describe shows the
        version's ``minWorkers`` READY (``_await_ready``). Returns TorchServe's answer with
        ``model``, the registered name."""
        check_archive(archive)
        if name is not None:
            check_name(name)
        answer = self._call(
            "POST",
            "management",
            "/models",
            f"register {archive}",
            params={
                "url": archive,
                "model_name": name,
                "initial_workers": workers or 1,
                "batch_size": batch_size,
                "max_batch_delay": max_batch_delay,
                "response_timeout": response_timeout,
                "synchronous": "true",
            },
        ).json()
        registered, version = _registered(answer.get("status", ""))
        registered = registered or name
        if registered is None:
            return answer
        if workers is not None:  # the registered version: another may be the default
            self.scale(registered, workers, workers, version)
        else:
            self._await_ready(registered, version, None)
        return answer | {"model": registered}

    def scale(
        self, model: str, min_worker: int, max_worker: int | None = None, version: str | None = None
    ) -> dict:
        """Set the worker count and wait until it is reached. Not kept across a restart of a
        server started with ``--ncs`` (``make serve``): edit config/models/NAME.yaml for that."""
        path = _model_path(model, version)  # checks the names first
        if min_worker < 0 or (max_worker is not None and max_worker < min_worker):
            raise errors.UsageError(
                f"bad worker counts min={min_worker} max={max_worker}", "use 0 <= --min <= --max"
            )
        answer = self._call(
            "PUT",
            "management",
            path,
            f"scale {_label(model, version)}",
            params={
                "min_worker": min_worker,
                "max_worker": max_worker if max_worker is not None else min_worker,
                "synchronous": "true",
            },
        ).json()
        self._await_ready(model, version, min_worker)
        return answer

    def _await_ready(self, model: str, version: str | None, count: int | None) -> None:
        """Wait until describe shows ``count`` READY workers of the version (None: its
        ``minWorkers``, as the same describe gives it).

        TorchServe 0.12 answers a synchronous scale as soon as the last worker reports its
        model loaded, but ``WorkerThread.setState`` tells the waiting request before it records
        the state, so a describe right after the answer can still show that worker UNLOADING
        (seen on a busy host). The gap is one thread switch: ``READY_WAIT_S`` bounds it, and a
        worker not READY by then (it died just after loading) is an ``Unhealthy`` error."""
        if count == 0:
            return
        path, what = _model_path(model, version), f"describe {_label(model, version)}"

        def ready() -> tuple[int, int]:
            """(READY workers, workers wanted)."""
            entry = self._call("GET", "management", path, what).json()[0]
            wanted = entry.get("minWorkers", 0) if count is None else count
            return sum(w.get("status") == "READY" for w in entry.get("workers", [])), wanted

        found, wanted = Retrying(
            stop=stop_after_delay(READY_WAIT_S),
            wait=wait_fixed(READY_POLL_S),
            retry=retry_if_result(lambda seen: seen[0] < seen[1]),
            retry_error_callback=lambda state: state.outcome.result() if state.outcome else (0, 1),
        )(ready)
        if found < wanted:
            raise errors.Unhealthy(
                f"{_label(model, version)}: {found} of {wanted} workers READY "
                f"{READY_WAIT_S:.0f} s after TorchServe said they had loaded",
                "see logs/model_log.log for why a worker stopped",
            )

    def set_default(self, model: str, version: str) -> dict:
        """Make ``version`` what ``/predictions/MODEL`` serves."""
        return self._call(
            "PUT",
            "management",
            _model_path(model, version) + "/set-default",
            f"set-default {_label(model, version)}",
        ).json()

    def unregister(self, model: str, version: str | None = None) -> dict:
        """Remove a model (its default version when none is named). TorchServe refuses (403)
        to remove the default version while other versions exist."""
        return self._call(
            "DELETE",
            "management",
            _model_path(model, version),
            f"unregister {_label(model, version)}",
        ).json()

    def model_rows(self) -> list[dict]:
        """One row per registered model version (``version_row``)."""
        return [
            version_row(entry)
            for model in self.list_models()
            for entry in self.describe(model["modelName"])
        ]

    # ------------------------------------------------------------------ health and metrics

    def health(self) -> dict:
        """``/ping``: ``{"status": "Healthy"}`` when the frontend is up."""
        return self._call("GET", "inference", "/ping", "ping").json()

    def health_report(self) -> Report:
        """``/ping`` and each model version's READY workers."""
        ping = self.health()
        models = {f"{row['model']}/{row['version']}": row["ready"] for row in self.model_rows()}
        unready = [m for m, ready in models.items() if ready == 0]
        healthy = ping.get("status") == "Healthy" and not unready
        lines = [f"server: {ping.get('status')}"]
        lines += [f"{m}: {ready} READY worker(s)" for m, ready in models.items()]
        if unready:
            lines.append(
                f"unhealthy: no READY worker for {', '.join(unready)} "
                "(a worker may be restarting: retry in a few seconds, or `tsctl scale`)"
            )
        return (
            {"status": ping.get("status"), "ready_workers": models, "healthy": healthy},
            lines,
            0 if healthy else errors.Unhealthy.exit_code,
        )

    def metrics_report(self) -> Report:
        """The handler's series per model (``serveclient.metrics``) and the frontend's statuses."""
        text = self.metrics_text()
        summary = metrics.summarise(text)
        statuses = metrics.frontend_statuses(text)
        lines = [
            "all requests by status: "
            + ", ".join(f"{k} {v}" for k, v in statuses.items())
            + " (including those refused before the handler: 503 queue full, 507 worker died)"
        ]
        for model, m in summary.items():
            lines.append(f"{model}:")
            lines.append(f"  requests {m['requests']}, mean latency {m['mean_latency_ms']} ms")
            lines.append(
                f"  batches {m['batches']} holding {m['requests_in_batches']} requests, "
                f"{m['images']} images; mean batch size {m['mean_batch_size']}"
            )
            if m["batch_sizes"]:
                lines.append(
                    "  batch sizes: "
                    + ", ".join(f"{size}x{count}" for size, count in m["batch_sizes"].items())
                )
            lines.append(
                "  errors: " + (", ".join(f"{k} {v}" for k, v in m["errors"].items()) or "none")
            )
            lines.append(
                f"  decode {m['decode_ms_per_image']} ms/image, forward "
                f"{m['forward_ms_per_batch']} ms/batch"
            )
        return {"statuses": statuses, "models": summary}, lines, 0

    # ------------------------------------------------------------------ inference

    def predict(
        self,
        model: str,
        image: bytes,
        *,
        version: str | None = None,
        topk: int | None = None,
        traffic: Traffic = INTERACTIVE,
    ) -> Any:
        """One image to ``/predictions/MODEL[/VERSION]``: tags (a list) or ``{"embedding"}``.
        ``traffic``: its class and deadline (``serveclient.traffic``)."""
        headers = {TOP_K_HEADER: str(topk)} if topk is not None else {}
        headers |= traffic.headers()
        return self._call(
            "POST",
            "inference",
            "/predictions" + _route(model, version),
            f"predict {_label(model, version)}",
            data=image,
            headers=headers,
        ).json()

    def _v2_outputs(self, model: str, output: str) -> list[str]:
        """TorchServe says the precision and cache hits in headers: the one output."""
        return [output]

    def _explain(self, model: str, image: bytes, filename: str, options: dict[str, Any]) -> dict:
        """``/explanations/MODEL``: ``options`` as form fields beside the image."""
        return self._call(
            "POST",
            "inference",
            "/explanations" + _route(model, None),
            f"explain {model}",
            files={"data": (filename, image)},
            data={k: "true" if k == "png" else str(v) for k, v in options.items()},
        ).json()


def _route(model: str, version: str | None) -> str:
    """``/NAME`` or ``/NAME/VERSION`` (``all`` is the management API's every-version word)."""
    check_name(model)
    if version is None:
        return f"/{model}"
    if version != "all":
        check_name(version, "version")
    return f"/{model}/{version}"


def _model_path(model: str, version: str | None) -> str:
    return "/models" + _route(model, version)


def _label(model: str, version: str | None) -> str:
    return f"{model} {version}" if version else model


def _registered(status: str) -> tuple[str | None, str | None]:
    """``Model "resnet50-tagger" Version: 2.0 registered with 1 initial workers`` -> (name,
    version); None for what the status does not say."""
    match = re.search(r'Model "([^"]+)"(?: Version: (\S+))?', status)
    return (match.group(1), match.group(2)) if match else (None, None)
