"""The HTTP edge's reading of the core's errors: each kind's HTTP status (``STATUS``, the one
table), the headers it adds (``Retry-After`` from the kind's ``retry_after_s``) and the JSON
body every error response carries. Every engine's edge that speaks HTTP (TorchServe's handler,
the transformer) or quotes an HTTP status (Triton's error messages) reads them here.
"""

from __future__ import annotations

from http import HTTPStatus

from servecore.errors import (
    ClientError,
    DeadlineExceeded,
    InternalError,
    InvalidImage,
    InvalidParameter,
    InvalidRequest,
    ModelUnavailable,
    NotSupported,
    Overloaded,
    PayloadTooLarge,
    RequestError,
    UnsupportedMediaType,
)

RETRY_AFTER = "Retry-After"

# The one table: error kind -> HTTP status. A subclass not listed takes its parent's status.
STATUS: dict[type[RequestError], HTTPStatus] = {
    RequestError: HTTPStatus.INTERNAL_SERVER_ERROR,
    ClientError: HTTPStatus.BAD_REQUEST,
    InvalidRequest: HTTPStatus.BAD_REQUEST,
    InvalidParameter: HTTPStatus.BAD_REQUEST,
    InvalidImage: HTTPStatus.BAD_REQUEST,
    UnsupportedMediaType: HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
    PayloadTooLarge: HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    NotSupported: HTTPStatus.NOT_IMPLEMENTED,
    Overloaded: HTTPStatus.SERVICE_UNAVAILABLE,
    ModelUnavailable: HTTPStatus.SERVICE_UNAVAILABLE,
    DeadlineExceeded: HTTPStatus.GATEWAY_TIMEOUT,
    InternalError: HTTPStatus.INTERNAL_SERVER_ERROR,
}


def status_of(error: RequestError) -> HTTPStatus:
    """The HTTP status of ``error``'s kind (its nearest kind in ``STATUS``)."""
    return next(STATUS[kind] for kind in type(error).__mro__ if kind in STATUS)


def headers_of(error: RequestError) -> dict[str, str]:
    """The response headers ``error``'s kind adds: ``Retry-After`` for a kind to retry."""
    return {} if error.retry_after_s is None else {RETRY_AFTER: str(error.retry_after_s)}


def error_body(error: RequestError) -> dict:
    """The JSON body every error response carries: ``{"code", "type", "message"}``."""
    return {"code": int(status_of(error)), "type": error.kind, "message": error.message}
