"""The one error hierarchy of the handler, and its one mapping to an HTTP response.

Every failure a client can cause is a ``RequestError`` subclass carrying its HTTP status; the
handler catches them per request, so one bad input fails only its own request. Anything else is
a server bug and fails the batch through TorchServe's own 5xx path.
"""
from __future__ import annotations

from http import HTTPStatus


class RequestError(Exception):
    """A request the handler cannot serve, by the client's doing. ``status`` is its HTTP code."""

    status: int = HTTPStatus.BAD_REQUEST
    kind: str = "InvalidRequest"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(RequestError):
    """Empty body, bad base64, malformed or mistyped JSON (plain, KServe v1 or v2)."""


class InvalidParameter(RequestError):
    """A request parameter out of range or of the wrong type (e.g. ``topk``)."""

    kind = "InvalidParameter"


class InvalidImage(RequestError):
    """Bytes that are not a decodable image, or a truncated one."""

    kind = "InvalidImage"


class UnsupportedMediaType(RequestError):
    """A real image, in a format this model does not accept."""

    status = HTTPStatus.UNSUPPORTED_MEDIA_TYPE
    kind = "UnsupportedMediaType"


class PayloadTooLarge(RequestError):
    """More pixels or bytes than the configured limits (decompression-bomb guard)."""

    status = HTTPStatus.REQUEST_ENTITY_TOO_LARGE
    kind = "PayloadTooLarge"


class NotSupported(RequestError):
    """An endpoint TorchServe routes to every handler that this one does not implement."""

    status = HTTPStatus.NOT_IMPLEMENTED
    kind = "NotImplemented"


def error_body(error: RequestError) -> dict:
    """The JSON body every error response carries: ``{"code", "type", "message"}``."""
    return {"code": int(error.status), "type": error.kind, "message": error.message}


def status_line(error: RequestError) -> tuple[int, str]:
    """``(status code, reason phrase)`` for ``context.set_response_status``."""
    return int(error.status), HTTPStatus(error.status).phrase
