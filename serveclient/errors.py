"""Every failure a client of the server can meet, each with an exit code and a hint on how to
fix it. ``from_response`` is the one place that turns an HTTP answer into one of them, from
TorchServe (``{"code", "type", "message"}``) or Triton (``{"error": text}``, the text being the
core's own error body when the model refused the request)."""

from __future__ import annotations

import json
import warnings
from typing import TYPE_CHECKING

import requests
from urllib3.exceptions import InvalidHeader
from urllib3.util import Retry

# Defined beside the key file both sides read, with Triton's wording of a model that is down
# (the transformer reads it too); re-exported as part of this hierarchy.
from serveshared.errors import TRITON_RELOADING as TRITON_RELOADING
from serveshared.errors import KeyFileError as KeyFileError
from serveshared.errors import ServeError as ServeError
from serveshared.errors import triton_model_down

if TYPE_CHECKING:
    TsError = ServeError
else:

    def __getattr__(name: str) -> type:  # TsError, ServeError's old name, for one release
        if name != "TsError":
            raise AttributeError(f"module has no attribute {name!r}", name=name)
        message = "TsError is now ServeError: catch serveclient.ServeError (TsError goes next)"
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return ServeError


class ApiError(ServeError):
    """The server answered with an error status the classes below do not cover."""

    def __init__(self, status: int, type_: str, message: str, hint: str = "") -> None:
        super().__init__(f"HTTP {status} {type_}: {message}".replace(" : ", ": "), hint)
        self.status = status
        self.type = type_
        self.server_message = message
        self.retry_after: float | None = None  # seconds, from a 503's Retry-After header


class UsageError(ServeError):
    """A bad argument caught before anything was sent (e.g. a model name no route can reach)."""

    exit_code = 2


class MetricsUnreadable(ServeError):
    """``/metrics`` answered with something that is not Prometheus' text format."""


class ServerNotRunning(ServeError):
    """Nothing answers at the URL."""

    exit_code = 3


class KeyRejected(ApiError):
    """A key was refused even after re-reading the key file and rotating it."""

    exit_code = 4


class MilvusTokenError(ServeError):
    """A Milvus token file that cannot be read or holds none, or Milvus (authentication on)
    refusing the token or its absence. The message never holds the token."""

    exit_code = 4


class NotFound(ApiError):
    """Unknown model or version."""

    exit_code = 5


class Refused(ApiError):
    """The server refused the operation: a registration outside the allowed sources, removing
    the default version, a disabled API."""

    exit_code = 6


class NotOnTriton(ServeError):
    """A TorchServe-only command (management, key rotation) pointed at Triton."""

    exit_code = 6


class Unhealthy(ServeError):
    """``health``: the server answers but a model has no READY worker; ``scale``: a worker it
    started is not READY; ``tag``/``embed``: some files failed."""

    exit_code = 7


KEY_REJECTED = "InvalidKeyException"
# Triton's answer to a missing or wrong header on a restricted API (HTTP 403).
TRITON_RESTRICTED = "This API is restricted"
TRITON_KEY_HINT = (
    "Triton's keys are the ones it was started with: point --key-file at the key "
    "file tritonrepo.server wrote (build/triton-key_file.json by default); "
    "they change only when Triton restarts with --new-keys"
)
ALLOWED_URLS_HINT = (
    "register archives by file name from the model store (model_store in "
    "config/server.properties), or add the URL's pattern to allowed_urls there "
    "and restart the server"
)

MODEL_API_HINT = (
    "registering and unregistering models is off on this server "
    "(enable_model_api=false, config/server.properties says why); restart it with "
    "`make serve MODEL_API=1` to turn it on"
)


def is_key_rejection(response: requests.Response) -> bool:
    """TorchServe's answer to a missing, wrong or expired key: 400 InvalidKeyException (a new
    key can be had: ``/token``)."""
    return response.status_code == 400 and _body(response).get("type") == KEY_REJECTED


def is_restricted(response: requests.Response) -> bool:
    """Triton's answer to a missing or wrong key on a restricted API: 403 (no rotation: its
    keys change only with a restart)."""
    return response.status_code == 403 and str(_body(response).get("message", "")).startswith(
        TRITON_RESTRICTED
    )


def from_response(response: requests.Response, what: str) -> ApiError:
    """The error for a failed answer to ``what`` (e.g. ``"describe resnet50-tagger"``)."""
    body = _body(response)
    status = response.status_code
    type_ = str(body.get("type", ""))
    message = str(body.get("message", response.text.strip() or response.reason))
    if is_restricted(response):
        return KeyRejected(status, "Forbidden", f"{what}: {message}", TRITON_KEY_HINT)
    if type_ == KEY_REJECTED:
        return KeyRejected(
            status,
            type_,
            message,
            "the key in key_file.json was refused after one rotation: point "
            "--key-file at the key_file.json of THIS server (written in the folder "
            "torchserve was started from)",
        )
    if "does not match any allowed URL" in message or "Relative path" in message:
        return Refused(status, type_, f"{what}: {message}", ALLOWED_URLS_HINT)
    if triton_model_down(status, message):
        # Triton has no 503 for a model whose process is down or loading again: read as one.
        return ApiError(
            503,
            "ModelUnavailable",
            f"{what}: {message}",
            "the model's process died and the server is loading it again: retry in seconds",
        )
    if status == 404 and type_ in ("ModelNotFoundException", "ModelVersionNotFoundException"):
        hint = (
            "`tsctl list` shows the registered models; `tsctl describe NAME` their versions"
            if "Model not found at" not in message
            else "the archive must be a file in the server's model store: copy it there first"
        )
        return NotFound(status, type_, f"{what}: {message}", hint)
    if status == 403 and type_ == "InvalidModelVersionException":
        return Refused(
            status,
            type_,
            f"{what}: {message}",
            "make another version the default first: tsctl set-default NAME OTHER_VERSION",
        )
    if status == 405:
        return Refused(status, type_, f"{what}: {message}", MODEL_API_HINT)
    if status == 503:
        error = ApiError(
            status,
            type_,
            f"{what}: {message}",
            "the model's queue is full or it has no worker: retry later, or "
            "`tsctl scale NAME --min N`"
            if "maximum queue size" not in message
            else "Triton's queue for the model is full (max_queue_size): retry "
            "later, or send fewer requests at once",
        )
        error.retry_after = _seconds(response.headers.get("Retry-After"))
        return error
    if status == 409:
        return Refused(
            status,
            type_,
            f"{what}: {message}",
            "already registered: `tsctl unregister NAME [VERSION]` first",
        )
    return ApiError(status, type_, f"{what}: {message}")


def _seconds(value: str | None) -> float | None:
    """``Retry-After`` in seconds, given as seconds or as an HTTP date (urllib3's reading of
    it); None when absent or unreadable."""
    try:
        return float(Retry().parse_retry_after(value)) if value is not None else None
    except InvalidHeader:
        return None


def _body(response: requests.Response) -> dict:
    """The JSON error body: TorchServe's and the core's ``{"code", "type", "message"}``, also
    when Triton wraps it (``{"error": "<the core's body as text>"}``: its HTTP frontend's error
    answer, which carries a model's error message); Triton's own errors as the message."""
    try:
        body = response.json()
    except ValueError:
        return {}
    body = body if isinstance(body, dict) else {}
    inner = body.get("error") if set(body) == {"error"} else None
    if not isinstance(inner, str):
        return body
    try:
        wrapped = json.loads(inner)
    except ValueError:
        return {"message": inner}
    return wrapped if isinstance(wrapped, dict) else {"message": inner}
