"""The Python API over a running TorchServe: management, predictions, health, keys, metrics.

    from tsclient import TorchServeClient

    client = TorchServeClient()                      # serveshared.ports' defaults, ./key_file.json
    client.list_models()
    client.register("resnet50-tagger-2.0.mar", batch_size=16)
    client.predict("resnet50-tagger", open("cat.jpg", "rb").read(), topk=3)

Keys: every call carries the key its port wants, read from ``key_file.json``. When the server
refuses a key (TorchServe answers 400 ``InvalidKeyException``, e.g. after
``token_expiration_min``), the client re-reads the file (someone may have rotated it), else
rotates the key with the file's API key, and retries the call once.

Proxies: calls to a loopback server ignore ``HTTP(S)_PROXY`` and the rest of the environment
(``trust_env=False``), so keys never reach a proxy; other hosts keep requests' defaults.

Names: model names and versions are checked before anything is sent (``check_name``):
TorchServe 0.12 registers names it can never route again (``a/b``, ``..``), which then hold a
worker until a restart.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

from serveshared import ports
from serveshared.keys import KEY_FILE, KINDS, Keys, bearer
from tsclient import errors
from tsclient.engine import Engine, detect
from tsclient.traffic import INTERACTIVE, Traffic

TIMEOUT_S = 300.0  # registration and scaling wait for workers
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-.]*")
MAX_NAME = 128  # far below Netty's 4096-byte request line, room for /predictions/NAME/VERSION
URL_SCHEMES = ("http://", "https://", "file://")
# The arithmetic that computed an answer (servecore.service.PRECISION_HEADER); the client does
# not import the server's package, so the name is written here too. Triton's Python backend
# sets no headers: it answers the same as an output tensor (tritonrepo/model.py).
PRECISION_HEADER = "X-Precision"
PRECISION_OUTPUT = "precision"
# Which images were answered from the server's content cache: TorchServe says how many of a
# request's images (a header, sent only while the cache is on), Triton which ones (a BOOL
# output [n, 1], asked for when the model has it).
CACHE_HITS_HEADER = "X-Cache-Hits"
CACHED_OUTPUT = "cached"


@dataclass(frozen=True)
class Answers:
    """One answer per image, in order, the precision that computed them (``None`` from a
    server that does not say), and per image whether the server's content cache answered it
    (``None`` where it cannot be told: TorchServe counts a request's hits, ``cache_hits``,
    without naming them when some but not all were)."""

    values: list
    precision: str | None
    cached: tuple[bool | None, ...] = ()
    cache_hits: int = 0


def is_loopback(url: str) -> bool:
    """Whether ``url``'s host is this machine's loopback (``localhost``, 127.0.0.0/8, ``::1``)."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_name(value: str, what: str = "model name") -> str:
    """Return ``value`` if TorchServe can route it (``/predictions/NAME/VERSION``), else raise
    ``UsageError``: letters, digits, ``_ - .``, starting with a letter or digit, no ``..``, at
    most ``MAX_NAME`` characters (the rule torch-model-archiver applies to names)."""
    if not value or len(value) > MAX_NAME or ".." in value or not NAME_PATTERN.fullmatch(value):
        raise errors.UsageError(
            f"{what} {value!r} cannot be routed by TorchServe",
            f"use 1-{MAX_NAME} letters, digits, '_', '-' or '.', starting with a letter or "
            "digit, without '..' or '/'",
        )
    return value


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


class TorchServeClient:
    """One server's inference, management and metrics APIs.

    ``key_file``: TorchServe's ``key_file.json`` (re-read on every call, so rotations by other
    clients are picked up; its API key rotates expired keys). ``keys``: fixed keys instead (no
    rotation). ``timeout``: seconds per call; registration and scaling wait for workers, so
    keep it generous. ``engine``: the engine at these URLs when known (else asked once, when
    it matters: ``engine``).
    """

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
        self.urls = {
            "inference": inference_url.rstrip("/"),
            "management": management_url.rstrip("/"),
            "metrics": metrics_url.rstrip("/"),
        }
        self.key_file = Path(key_file) if key_file is not None and keys is None else None
        self._keys = keys
        self.timeout = timeout
        # Keys never travel through HTTP(S)_PROXY to a loopback server (requests would send
        # them to a proxy unless NO_PROXY names the host); remote URLs keep the environment.
        self.session = requests.Session()
        self.loopback_session = requests.Session()
        self.loopback_session.trust_env = False
        self.rotations = 0  # how many keys this client rotated (for `tsctl keys` and tests)
        self._engine = engine
        # Concurrent calls that meet the same expired key rotate it once: each rotation
        # invalidates the previous key, so the others must pick up the new one instead.
        self._rotating = threading.Lock()
        self._output_names: dict[str, frozenset[str]] = {}
        self.bytes_sent = 0  # request bodies this client sent (what a job reports)
        self._counting = threading.Lock()

    @property
    def engine(self) -> Engine:
        """Which engine serves the inference URL (asked once: ``tsclient.engine.detect``)."""
        if self._engine is None:
            url = self.urls["inference"]
            self._engine = detect(url, self.loopback_session if is_loopback(url) else self.session)
        return self._engine

    # ------------------------------------------------------------------ keys

    @property
    def keys(self) -> Keys:
        """The current keys (re-read from the key file on every call: cheap, and it picks up
        rotations by other clients)."""
        if self.key_file is not None:
            return Keys.read(self.key_file)
        if self._keys is None:
            raise errors.KeyFileError("no keys given", "pass key_file= or keys=")
        return self._keys

    def use_key_file(self, path: Path) -> None:
        """Read the keys from ``path`` from now on (a key file chosen once the engine is
        known)."""
        self.key_file, self._keys = path, None

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

    def _call(
        self,
        method: str,
        port: str,
        path: str,
        what: str,
        *,
        params: dict | None = None,
        **kwargs: Any,
    ) -> requests.Response:
        """Send with the right key; on a refused key re-read the file or rotate, retry once.
        Any error status becomes the matching ``TsError``."""
        kind = "inference" if port == "inference" else "management"
        params = {k: v for k, v in (params or {}).items() if v is not None}
        used = self.keys.key(kind) if port != "metrics" else None
        response = self._send(method, port, path, params, bearer(used), **kwargs)
        if used is not None and errors.is_key_rejection(response):
            with self._rotating:
                current = self.keys.key(kind)
                if current == used:  # nobody rotated it yet: expired (or wrong)
                    current = self.rotate(kind).key(kind)
            response = self._send(method, port, path, params, bearer(current), **kwargs)
        elif used is not None and errors.is_restricted(response):  # Triton: no rotation
            current = self.keys.key(kind)
            if current != used:  # restarted with new keys since this call read the file
                response = self._send(method, port, path, params, bearer(current), **kwargs)
        if response.status_code >= 400:
            raise errors.from_response(response, what)
        return response

    def _send(
        self,
        method: str,
        port: str,
        path: str,
        params: dict,
        auth: dict,
        headers: dict | None = None,
        **kwargs: Any,
    ) -> requests.Response:
        url = self.urls[port] + path
        kwargs.setdefault("timeout", self.timeout)
        body = kwargs.get("data")
        if isinstance(body, (str, bytes, bytearray)):
            with self._counting:
                self.bytes_sent += len(body.encode() if isinstance(body, str) else body)
        try:
            session = self.loopback_session if is_loopback(url) else self.session
            return session.request(
                method, url, params=params, headers={**(headers or {}), **auth}, **kwargs
            )
        except requests.ConnectionError:
            raise errors.ServerNotRunning(
                f"no TorchServe answers at {self.urls[port]}",
                "start it with `make serve` (or `torchserve --start --ts-config "
                "config/config.properties`), or point --inference-url/--management-url/"
                "--metrics-url (or TSCTL_INFERENCE_URL, ...) at it",
            ) from None

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
        archive's YAML sets ``minWorkers``, so the model is scaled to exactly ``workers``
        after registration. Returns the describe entry of the registered version."""
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
        registered = _registered_name(answer.get("status", "")) or name
        if registered is None:
            return answer
        if workers is not None:
            self.scale(registered, workers, workers)
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
        return self._call(
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

    # ------------------------------------------------------------------ inference

    def health(self) -> dict:
        """``/ping``: ``{"status": "Healthy"}`` when the frontend is up."""
        return self._call("GET", "inference", "/ping", "ping").json()

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
        ``traffic``: its class and deadline (``tsclient.traffic``)."""
        headers = {"X-Top-K": str(topk)} if topk is not None else {}
        headers |= traffic.headers()
        return self._call(
            "POST",
            "inference",
            "/predictions" + _route(model, version),
            f"predict {_label(model, version)}",
            data=image,
            headers=headers,
        ).json()

    def infer(
        self,
        model: str,
        images: list[bytes],
        *,
        output: str = "embedding",
        protocol: str = "v2",
        topk: int | None = None,
        traffic: Traffic = INTERACTIVE,
    ) -> list[Any]:
        """Several images in one KServe request: ``infer_answers(...).values``."""
        return self.infer_answers(
            model, images, output=output, protocol=protocol, topk=topk, traffic=traffic
        ).values

    def infer_answers(
        self,
        model: str,
        images: list[bytes],
        *,
        output: str = "embedding",
        protocol: str = "v2",
        topk: int | None = None,
        traffic: Traffic = INTERACTIVE,
    ) -> Answers:
        """Several images in one KServe request (``protocol`` v2, the Open Inference Protocol,
        or v1): one answer per image, in order: an embedding (a list of floats) for
        ``output="embedding"``, a list of ``{"label", "index", "probability"}`` for ``"tags"``,
        with the precision that computed them (the ``X-Precision`` header; from Triton, its
        ``precision`` output, asked for beside ``output``), and which the server's content cache
        answered (``X-Cache-Hits``; Triton's ``cached`` output). ``traffic``: the request's
        class and deadline, in the engine's form (``tsclient.traffic``).
        The handler answers a request with a bad image as a whole (400 naming the image);
        send that request's images one by one to learn which. A 503's ``ApiError`` carries
        ``retry_after``."""
        import base64

        data = [base64.b64encode(image).decode("ascii") for image in images]
        what = f"{protocol} infer {model} ({len(images)} images)"
        if protocol == "v1":
            params = {"topk": topk} if topk is not None and output == "tags" else {}
            body = {"instances": [{"data": item} for item in data], "parameters": params}
            response = self._call(
                "POST",
                "inference",
                f"/v1/models/{check_name(model)}:predict",
                what,
                data=json.dumps(body),
                headers={"Content-Type": "application/json", **traffic.headers()},
            )
            predictions = response.json()["predictions"]
            hits = _cache_hits(response.headers.get(CACHE_HITS_HEADER))
            return Answers(
                [p["embedding"] if output == "embedding" else p for p in predictions],
                response.headers.get(PRECISION_HEADER),
                _counted(len(predictions), hits),
                hits,
            )
        if protocol != "v2":
            raise errors.UsageError(f"no protocol {protocol!r}", "use v1 or v2")
        # [n, 1] and a request-level topk: what both TorchServe's handler and Triton's
        # batching take (Triton wants a batch dimension first and reads no output parameters).
        tensor = {"name": "images", "shape": [len(data), 1], "datatype": "BYTES", "data": data}
        body = self._v2_body(model, tensor, output, topk, traffic)
        response = self._call(
            "POST",
            "inference",
            f"/v2/models/{check_name(model)}/infer",
            what,
            data=json.dumps(body),
            headers={"Content-Type": "application/json", **traffic.headers()},
        )
        return _v2_answers(response, output)

    def infer_crops(
        self,
        model: str,
        crops: Any,
        *,
        output: str = "embedding",
        topk: int | None = None,
        traffic: Traffic = INTERACTIVE,
    ) -> Answers:
        """``infer_answers`` for images preprocessed here (``tsclient.preprocess``): ``crops``
        a uint8 array [n, 224, 224, 3], sent as the model's ``crops`` input in the v2 binary
        tensor extension (a JSON header, then the raw pixels: 150 KB an image)."""
        tensor = {
            "name": "crops",
            "shape": list(crops.shape),
            "datatype": "UINT8",
            "parameters": {"binary_data_size": crops.nbytes},
        }
        header = json.dumps(self._v2_body(model, tensor, output, topk, traffic)).encode()
        response = self._call(
            "POST",
            "inference",
            f"/v2/models/{check_name(model)}/infer",
            f"v2 infer {model} ({len(crops)} crops)",
            data=header + crops.tobytes(),
            headers={
                "Content-Type": "application/octet-stream",
                "Inference-Header-Content-Length": str(len(header)),
                **traffic.headers(),
            },
        )
        return _v2_answers(response, output)

    def _v2_body(
        self, model: str, tensor: dict, output: str, topk: int | None, traffic: Traffic
    ) -> dict:
        """A v2 request for ``output`` of one input ``tensor``."""
        outputs = [{"name": output}]
        if self.engine is Engine.TRITON:
            outputs.append({"name": PRECISION_OUTPUT})
            if CACHED_OUTPUT in self._outputs(model):
                outputs.append({"name": CACHED_OUTPUT})
        body: dict[str, Any] = {"inputs": [tensor], "outputs": outputs}
        parameters: dict[str, Any] = traffic.parameters(self.engine)
        if output == "tags" and topk is not None:
            parameters["topk"] = topk
        if parameters:
            body["parameters"] = parameters
        return body

    def _outputs(self, model: str) -> frozenset[str]:
        """The output names of ``model``'s v2 metadata (asked once per model)."""
        known = self._output_names.get(model)
        if known is None:
            path = f"/v2/models/{check_name(model)}"
            metadata = self._call("GET", "inference", path, f"read {model}'s metadata").json()
            known = frozenset(o.get("name") for o in metadata.get("outputs") or [])
            self._output_names[model] = known
        return known

    def explain(
        self,
        model: str,
        image: bytes,
        *,
        filename: str = "image",
        target: int | str | None = None,
        topk: int | None = None,
        method: str | None = None,
        n_steps: int | None = None,
        png: bool = False,
    ) -> dict:
        """One image to ``/explanations/MODEL``: ``{"method", "explanations": [{"label",
        "index", "probability", "rank", "grid", "png"?}]}``, where the model looked for each
        target (top-1 by default; a class ``target`` by index or label; ``topk`` targets)."""
        options = {
            "target": target,
            "topk": topk,
            "method": method,
            "n_steps": n_steps,
            "png": png or None,
        }
        return self._explain(
            model, image, filename, {k: v for k, v in options.items() if v is not None}
        )

    def _explain(self, model: str, image: bytes, filename: str, options: dict[str, Any]) -> dict:
        """``explain``'s request, ``options`` the ones set (``png`` only when True): form
        fields of ``/explanations/MODEL`` beside the image."""
        return self._call(
            "POST",
            "inference",
            "/explanations" + _route(model, None),
            f"explain {model}",
            files={"data": (filename, image)},
            data={k: "true" if k == "png" else str(v) for k, v in options.items()},
        ).json()

    # ------------------------------------------------------------------ metrics

    def metrics_text(self) -> str:
        """The Prometheus text of the metrics port (no key needed)."""
        return self._call("GET", "metrics", "/metrics", "read metrics").text


def _v2_answers(response: requests.Response, output: str) -> Answers:
    """A v2 JSON answer as ``Answers``: ``output``'s rows, precision and cache hits."""
    answered = {o["name"]: o for o in response.json()["outputs"]}
    tensor = answered[output]
    rows = tensor["shape"][0]
    if output == "embedding":
        flat, dim = tensor["data"], tensor["shape"][1]
        values = [flat[i * dim : (i + 1) * dim] for i in range(rows)]
    else:
        k = tensor["shape"][1]
        values = [[json.loads(t) for t in tensor["data"][i * k : (i + 1) * k]] for i in range(rows)]
    named = (answered.get(PRECISION_OUTPUT) or {}).get("data") or [None]
    precision = response.headers.get(PRECISION_HEADER) or named[0]
    if CACHED_OUTPUT in answered:
        cached = tuple(bool(c) for c in answered[CACHED_OUTPUT]["data"])
        return Answers(values, precision, cached, sum(cached))
    hits = _cache_hits(response.headers.get(CACHE_HITS_HEADER))
    return Answers(values, precision, _counted(rows, hits), hits)


def _cache_hits(header: str | None) -> int:
    """``X-Cache-Hits``: how many of the request's images the cache answered (absent: the cache
    is off, none)."""
    try:
        return max(0, int(header)) if header is not None else 0
    except ValueError:
        return 0


def _counted(images: int, hits: int) -> tuple[bool | None, ...]:
    """Per image, whether the cache answered it, from a request's count: all or none are
    known; some of several are not told apart (None)."""
    if hits == 0 or hits >= images:
        return (hits > 0,) * images
    return (None,) * images


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


def _registered_name(status: str) -> str | None:
    """``Model "resnet50-tagger" Version: 2.0 registered with 1 initial workers`` -> name."""
    match = re.search(r'Model "([^"]+)"', status)
    return match.group(1) if match else None
