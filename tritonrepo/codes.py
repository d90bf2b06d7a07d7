"""Which Triton error code the adapter sends for each HTTP status the core gives an error,
and what a client then receives: Triton's codes are fewer than HTTP's. No Triton import, so
the docs' status table (``python -m buildsteps.reference``) reads it too."""

from __future__ import annotations

from http import HTTPStatus

# A pb_utils.TritonError code -> (the HTTP status, the gRPC code) Triton answers with it.
RECEIVED = {
    "UNAVAILABLE": (HTTPStatus.SERVICE_UNAVAILABLE, "UNAVAILABLE"),
    "INVALID_ARG": (HTTPStatus.BAD_REQUEST, "INVALID_ARGUMENT"),
    "INTERNAL": (HTTPStatus.INTERNAL_SERVER_ERROR, "INTERNAL"),
}


def triton_code(status: int) -> str:
    """503 stays "unavailable" (retry later), other 4xx become 400 (the core's body in the
    message still says which), 5xx internal. 504 (the caller's ``X-Deadline`` passed) has no
    code of its own: "unavailable", HTTP 503 and gRPC UNAVAILABLE, as Triton answers a request
    whose own ``timeout`` expired in its queue."""
    if status in (HTTPStatus.SERVICE_UNAVAILABLE, HTTPStatus.GATEWAY_TIMEOUT):
        return "UNAVAILABLE"
    if 400 <= status < 500:
        return "INVALID_ARG"
    return "INTERNAL"
