"""``Client``: what every engine's client offers (``serveclient.torchserve``,
``serveclient.triton``), and the HTTP, key and naming rules they share.

Keys: every call carries the key its port wants (``serveshared.keys``). When the server
refuses a key, the engine's client says what to retry with (``_retry_key``): TorchServe's
re-reads the key file or rotates the key, Triton's re-reads the file (its keys change only
when it restarts). One retry.

Proxies: calls to a loopback server ignore ``HTTP(S)_PROXY`` and the rest of the environment
(``trust_env=False``), so keys never reach a proxy; other hosts keep requests' defaults.

Names: model names and versions are checked before anything is sent (``check_name``):
TorchServe 0.12 registers names it can never route again (``a/b``, ``..``), which then hold a
worker until a restart; Triton's model names follow the same rule here.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import re
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

import requests

from serveclient import errors
from serveclient.engine import Engine
from serveclient.traffic import INTERACTIVE, Traffic
from serveshared.keys import Keys, bearer
from serveshared.v2binary import (
    BINARY_DATA,
    HEADER_LENGTH,
    binary_body,
    binary_tensor,
    bytes_elements,
    read_outputs,
)
from serveshared.wire import CACHE_HITS_HEADER, PRECISION_HEADER

TIMEOUT_S = 300.0  # registration and scaling wait for workers
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-.]*")
MAX_NAME = 128  # far below Netty's 4096-byte request line, room for /predictions/NAME/VERSION
URL_SCHEMES = ("http://", "https://", "file://")
# The arithmetic that computed an answer: TorchServe says it in serveshared.wire's
# PRECISION_HEADER; Triton's Python backend sets no headers: it answers the same as an output
# tensor (tritonrepo/model.py).
PRECISION_OUTPUT = "precision"
# Which images were answered from the server's content cache: TorchServe says how many of a
# request's images (CACHE_HITS_HEADER, sent only while the cache is on), Triton which ones (a
# BOOL output [n, 1], asked for when the model has it).
CACHED_OUTPUT = "cached"
PORTS = ("inference", "management", "metrics")
Report = tuple[Any, list[str], int]  # (data for --json, lines for people, exit code)


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


TRACE_VARIABLES = ("TRACEPARENT", "TRACESTATE")  # as the W3C headers of the same names


def new_session(loopback: bool, verify: bool | str = True) -> requests.Session:
    """A session for calls to a loopback server (``loopback``: no proxy, nothing else from
    the environment) or to another host (requests' defaults), verifying TLS against
    ``verify`` (a CA bundle's path, or True), sending the trace context the environment holds."""
    session = requests.Session()
    session.trust_env = not loopback
    session.verify = verify
    # W3C trace context: TRACEPARENT / TRACESTATE continue the caller's trace (tsctl sets a new
    # one per command when unset: serveclient.cli.main), each request a child of it.
    session.headers.update({k.lower(): v for k in TRACE_VARIABLES if (v := os.environ.get(k))})
    return session


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


class Client(ABC):
    """One server's inference, management and metrics APIs, whichever engine serves them.

    ``urls``: the base URL of each port (``PORTS``). ``key_file``: the server's key file
    (re-read on every call, so rotations and restarts are picked up); ``keys``: fixed keys
    instead. ``timeout``: seconds per call. Each implementation names the engine it speaks to
    in its class attribute ``engine``.
    """

    engine: ClassVar[Engine]
    NAME: ClassVar[str]  # the engine as people write it
    START_HINT: ClassVar[str]  # how to start this engine's server, for "nothing answers"
    # Whether the server expires a v2 request by its ``timeout`` parameter (``Traffic``).
    SENDS_TIMEOUT: ClassVar[bool] = False

    def __init__(
        self,
        urls: dict[str, str],
        *,
        key_file: Path | str | None,
        keys: Keys | None,
        timeout: float,
    ) -> None:
        self.urls = {port: urls[port].rstrip("/") for port in PORTS}
        self.key_file = Path(key_file) if key_file is not None and keys is None else None
        self._keys = keys
        self.timeout = timeout
        # Keys never travel through HTTP(S)_PROXY to a loopback server (requests would send
        # them to a proxy unless NO_PROXY names the host); remote URLs keep the environment.
        # Each port's session is chosen once, here.
        self.session = new_session(loopback=False)
        self.loopback_session = new_session(loopback=True)
        self._sessions = {
            port: self.loopback_session if is_loopback(url) else self.session
            for port, url in self.urls.items()
        }
        self.bytes_sent = 0  # request bodies this client sent (what a job reports)
        self._counting = threading.Lock()
        # Whether describe and the metrics port are reachable (not on a TorchServe known by
        # one URL: its management API is on another port, or not exposed at all).
        self.reaches_management = True

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

    @abstractmethod
    def _retry_key(self, response: requests.Response, kind: str, used: str) -> str | None:
        """The key to send again with when ``response`` refused ``used`` (the ``kind`` key),
        else None: the response stands."""

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
        """Send with the right key; on a refused key retry once with the key ``_retry_key``
        gives. Any error status becomes the matching ``ServeError``."""
        kind = "inference" if port == "inference" else "management"
        params = {k: v for k, v in (params or {}).items() if v is not None}
        used = self.keys.key(kind) if port != "metrics" else None
        response = self._send(method, port, path, params, bearer(used), **kwargs)
        if used is not None:
            current = self._retry_key(response, kind, used)
            if current is not None:
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
            return self._sessions[port].request(
                method, url, params=params, headers={**(headers or {}), **auth}, **kwargs
            )
        except requests.ConnectionError:
            raise errors.ServerNotRunning(
                f"no {self.NAME} answers at {self.urls[port]}", self.START_HINT
            ) from None

    # ------------------------------------------------------------------ models

    @abstractmethod
    def list_models(self) -> list[dict]:
        """Every served model: ``[{"modelName", "modelUrl"}]``."""

    @abstractmethod
    def describe(
        self, model: str, version: str | None = None, customized: bool = False
    ) -> list[dict]:
        """TorchServe's describe entries of ``model`` (one per version), ``default`` added;
        with ``customized``, the handler's ``customizedMetadata`` parsed."""

    @abstractmethod
    def model_rows(self) -> list[dict]:
        """One row per model version: ``model``, ``version``, ``default``, ``workers``,
        ``ready``, ``batchSize``, ``maxBatchDelay`` (what ``tsctl list`` prints); where the
        listing described them, ``workerList``, the workers as ``describe`` gives them."""

    def verify(self, verify: bool | str) -> None:
        """Verify TLS against ``verify`` (a CA bundle's path, or True) on every port."""
        self.session.verify = self.loopback_session.verify = verify

    def refusal(self, command: str, exc: errors.ApiError) -> errors.ServeError:
        """What to report when the server refused ``command`` (a tsctl command) with ``exc``:
        ``exc`` itself, unless this engine's client can say better."""
        return exc

    # ------------------------------------------------------------------ health and metrics

    @abstractmethod
    def health_report(self) -> Report:
        """Whether the server is up and every model ready: data, lines, exit code."""

    @abstractmethod
    def metrics_report(self) -> Report:
        """The server's metrics summarised per model: data, lines, exit code."""

    def metrics_text(self) -> str:
        """The Prometheus text of the metrics port (no key needed)."""
        return self._call("GET", "metrics", "/metrics", "read metrics").text

    # ------------------------------------------------------------------ inference

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
        class and deadline, in the engine's form (``serveclient.traffic``).
        The handler answers a request with a bad image as a whole (400 naming the image);
        send that request's images one by one to learn which. A 503's ``ApiError`` carries
        ``retry_after``."""
        what = f"{protocol} infer {model} ({len(images)} images)"
        if protocol == "v1":
            params = {"topk": topk} if topk is not None and output == "tags" else {}
            data = [base64.b64encode(image).decode("ascii") for image in images]
            document = {"instances": [{"data": item} for item in data], "parameters": params}
            response = self._call(
                "POST",
                "inference",
                f"/v1/models/{check_name(model)}:predict",
                what,
                data=json.dumps(document),
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
        # The images' raw bytes in the binary tensor extension (no base64), the answer's too.
        element = bytes_elements(images)
        tensor = binary_tensor("images", "BYTES", [len(images), 1], len(element))
        body, headers = binary_body(self._v2_body(model, tensor, output, topk, traffic), element)
        response = self._call(
            "POST",
            "inference",
            f"/v2/models/{check_name(model)}/infer",
            what,
            data=body,
            headers={**headers, **traffic.headers()},
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
        """``infer_answers`` for images preprocessed here (``serveclient.preprocess``): ``crops``
        a uint8 array [n, 224, 224, 3], sent as the model's ``crops`` input in the v2 binary
        tensor extension (a JSON header, then the raw pixels: 150 KB an image)."""
        tensor = binary_tensor("crops", "UINT8", crops.shape, crops.nbytes)
        body, headers = binary_body(
            self._v2_body(model, tensor, output, topk, traffic), crops.tobytes()
        )
        response = self._call(
            "POST",
            "inference",
            f"/v2/models/{check_name(model)}/infer",
            f"v2 infer {model} ({len(crops)} crops)",
            data=body,
            headers={**headers, **traffic.headers()},
        )
        return _v2_answers(response, output)

    def _v2_body(
        self, model: str, tensor: dict, output: str, topk: int | None, traffic: Traffic
    ) -> dict:
        """A v2 request for ``output`` of one input ``tensor``, its outputs as raw bytes (the
        binary tensor extension: 4 bytes an embedding value instead of its text); a server
        that does not write them answers JSON, which ``_v2_answers`` reads as well."""
        outputs = [
            {"name": name, "parameters": {BINARY_DATA: True}}
            for name in self._v2_outputs(model, output)
        ]
        body: dict[str, Any] = {"inputs": [tensor], "outputs": outputs}
        parameters: dict[str, Any] = traffic.parameters(timeout=self.SENDS_TIMEOUT)
        if output == "tags" and topk is not None:
            parameters["topk"] = topk
        if parameters:
            body["parameters"] = parameters
        return body

    @abstractmethod
    def _v2_outputs(self, model: str, output: str) -> list[str]:
        """The outputs a v2 request for ``output`` asks for (the engine's precision and cache
        outputs beside it where it answers them as outputs)."""

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
        """Where the model looked for each target of one image (top-1 by default; a class
        ``target`` by label, or by index as an int; ``topk`` targets): ``{"method",
        "explanations": [{"label", "index", "probability", "rank", "grid", "png"?}]}``."""
        options = {
            "target": f"#{target}" if type(target) is int else target,  # text is a label
            "topk": topk,
            "method": method,
            "n_steps": n_steps,
            "png": png or None,
        }
        return self._explain(
            model, image, filename, {k: v for k, v in options.items() if v is not None}
        )

    @abstractmethod
    def _explain(self, model: str, image: bytes, filename: str, options: dict[str, Any]) -> dict:
        """``explain``'s request, ``options`` the ones set (``png`` only when True)."""


def version_row(entry: dict) -> dict:
    """A TorchServe describe entry as the row ``tsctl list`` prints (Triton's rows have the same
    keys), with its workers as described (``workerList``, not in Triton's: ``tsctl top`` need
    not describe again)."""
    workers = entry.get("workers", [])
    return {
        "model": entry.get("modelName"),
        "version": entry.get("modelVersion"),
        "default": entry.get("default"),
        "workers": len(workers),
        "ready": sum(w.get("status") == "READY" for w in workers),
        "batchSize": entry.get("batchSize"),
        "maxBatchDelay": entry.get("maxBatchDelay"),
        "workerList": workers,
    }


def _v2_answers(response: requests.Response, output: str) -> Answers:
    """A v2 answer (JSON, or binary outputs after a JSON header) as ``Answers``: ``output``'s
    rows, precision and cache hits."""
    length = response.headers.get(HEADER_LENGTH)
    outputs = read_outputs(response.content, None if length is None else int(length))
    answered = {o["name"]: o for o in outputs}
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
