"""The one error hierarchy of the core, as values: each kind, its message and, for the kinds
a client retries, after how many seconds (``retry_after_s``).

A ``RequestError`` fails one request and nothing else: ``ClientError`` for what the client
sent, ``Overloaded`` when the batch has no room, ``DeadlineExceeded`` when the caller's
deadline passed first and ``InternalError`` for a bug of ours. The class name is the ``type``
a client reads in the body. ``servecore.intake`` catches them at one per-request boundary, so
one bad input fails only its own request. What each kind becomes on the wire lives in the
edges: its HTTP status, headers and body in ``servecore.edges.bodies`` (the one table), its
Triton error code in ``servecore.edges.tensor``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from serveshared.quote import echo

MESSAGE_CHARS = 1000  # of any error message: an error body never grows with the request
E = TypeVar("E", bound=BaseException)


def echo_all(values: Iterable[Any], at_most: int = 5) -> str:
    """Several client values (field names, say), each ``echo``ed, the first ``at_most``."""
    values = list(values)
    shown = ", ".join(echo(v) for v in values[:at_most])
    more = f", and {len(values) - at_most} more" if len(values) > at_most else ""
    return f"[{shown}{more}]"


def detached(exc: E) -> E:
    """``exc`` with the tracebacks of it and its whole cause/context chain dropped, for an
    error that is kept (in a request's ``Failed``, in a future or an image's slot). A
    traceback holds the frames the error passed through, and those hold the batch (its
    images, slots and tensors): a kept error would keep them alive, and where one of those
    frames refers to the keeper (a slot filled by ``intake._decode_share``) only a full
    garbage collection frees the cycle, so failed requests kept their batches' images for
    minutes (the worker's RSS rose under bad inputs, #16)."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    return exc


class RequestError(Exception):
    """One request the handler cannot serve; the rest of its batch is answered.
    ``retry_after_s``: for a kind that is nobody's fault, when the same request should be
    sent again (None: retrying it as it is will not help)."""

    retry_after_s: int | None = None

    def __init__(self, message: str) -> None:
        if len(message) > MESSAGE_CHARS:
            message = f"{message[:MESSAGE_CHARS]}... (message cut at {MESSAGE_CHARS} chars)"
        super().__init__(message)
        self.message = message

    @property
    def kind(self) -> str:
        """The ``type`` field of the error body: the class name."""
        return type(self).__name__

    def of_image(self, k: int, count: int) -> RequestError:
        """The same error, saying which image of a several-image request it is about."""
        return self if count == 1 else type(self)(f"image {k} of {count}: {self.message}")


class ClientError(RequestError):
    """What the client sent cannot be served as it is: change the request, not the timing."""


class InvalidRequest(ClientError):
    """Empty body, bad base64, malformed or mistyped JSON (plain, KServe v1 or v2)."""


class InvalidParameter(ClientError):
    """A request parameter out of range or of the wrong type (e.g. ``topk``)."""


class InvalidImage(ClientError):
    """Bytes that are not a decodable image, or a truncated one."""


class UnsupportedMediaType(ClientError):
    """A real image, in a format this model does not accept."""


class PayloadTooLarge(ClientError):
    """More pixels or bytes than the configured limits (decompression-bomb guard)."""


class NotSupported(ClientError):
    """An endpoint or protocol feature this model does not implement (501)."""


class Overloaded(RequestError):
    """The batch this request arrived in has no room left for its work: nobody's fault, the
    same request alone or in a lighter batch fits; retry."""

    retry_after_s = 1


class ModelUnavailable(RequestError):
    """The model's process is down and being started again: what the transformer
    (``transformer/guard.py``) answers for a Triton whose stub died (Triton itself says 500,
    then 404, while ``tritonrepo/watchdog.py`` reloads it); the same request succeeds in
    seconds. The model never raises it (it is not running)."""

    retry_after_s = 5  # a reload takes 8-25 s: a few tries, not a flood


class DeadlineExceeded(RequestError):
    """The caller's deadline (``X-Deadline``) passed before the request's batch ran: answered
    without decoding or computing it; retrying the same request is pointless."""


class InternalError(RequestError):
    """An unexpected failure while handling one request: a bug on our side, answered for that
    request alone (the rest of its batch goes on)."""
