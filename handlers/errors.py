"""The one error hierarchy of the handler, and its one mapping to an HTTP response.

Every failure a client can cause is a ``RequestError`` subclass; ``STATUS`` below is the only
place that says which HTTP status each kind gets, and the class name is the ``type`` a client
reads in the body. The handler catches them per request, so one bad input fails only its own
request.
"""
from __future__ import annotations

from http import HTTPStatus


class RequestError(Exception):
    """A request the handler cannot serve, by the client's doing."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def status(self) -> HTTPStatus:
        """The HTTP status of this kind of error (from ``STATUS``)."""
        return next(STATUS[kind] for kind in type(self).__mro__ if kind in STATUS)

    @property
    def kind(self) -> str:
        """The ``type`` field of the error body: the class name."""
        return type(self).__name__

    @property
    def headers(self) -> dict[str, str]:
        """Response headers this kind of error adds."""
        return {}


class InvalidRequest(RequestError):
    """Empty body, bad base64, malformed or mistyped JSON (plain, KServe v1 or v2)."""


class InvalidParameter(RequestError):
    """A request parameter out of range or of the wrong type (e.g. ``topk``)."""


class InvalidImage(RequestError):
    """Bytes that are not a decodable image, or a truncated one."""


class UnsupportedMediaType(RequestError):
    """A real image, in a format this model does not accept."""


class PayloadTooLarge(RequestError):
    """More pixels or bytes than the configured limits (decompression-bomb guard)."""


class NotSupported(RequestError):
    """An endpoint TorchServe routes to every handler that this one does not implement."""


class Overloaded(RequestError):
    """The batch this request arrived in has no room left for its work; retry."""

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"}


class InternalError(RequestError):
    """An unexpected failure while handling one request: a bug on our side, answered for that
    request alone (the rest of its batch goes on)."""


# The one table: error kind -> HTTP status. A subclass not listed takes its parent's status.
STATUS: dict[type[RequestError], HTTPStatus] = {
    RequestError: HTTPStatus.BAD_REQUEST,
    InvalidRequest: HTTPStatus.BAD_REQUEST,
    InvalidParameter: HTTPStatus.BAD_REQUEST,
    InvalidImage: HTTPStatus.BAD_REQUEST,
    UnsupportedMediaType: HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
    PayloadTooLarge: HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    NotSupported: HTTPStatus.NOT_IMPLEMENTED,
    Overloaded: HTTPStatus.SERVICE_UNAVAILABLE,
    InternalError: HTTPStatus.INTERNAL_SERVER_ERROR,
}


def error_body(error: RequestError) -> dict:
    """The JSON body every error response carries: ``{"code", "type", "message"}``."""
    return {"code": int(error.status), "type": error.kind, "message": error.message}


def status_line(error: RequestError) -> tuple[int, str]:
    """``(status code, reason phrase)`` for ``context.set_response_status``."""
    return int(error.status), error.status.phrase
