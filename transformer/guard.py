"""The transformer's own limits and its error bodies, at the HTTP edge of KServe's server.

``Limits`` (ASGI middleware): a request body larger than ``max_request_bytes`` is a 413 before
(Content-Length) or while (chunked) it is read, and beyond ``max_inflight`` requests being
preprocessed at once a request gets 503 with ``Retry-After`` (decoded pixels are held per
request in flight: this bounds the memory). Every refusal, and every ``RequestError`` the core
raises while parsing or decoding a request, is answered as the single server answers it:
``servecore.edges.bodies.error_body`` with the error's status and headers. A predictor's
own refusal (``PredictorRefused``) goes back to the caller as it came, except Triton's answers
while the model's process is down or loading again (500 "Stub process ... is not healthy", 404
"... has no available versions"): those become the 503 + ``Retry-After`` of
``ModelUnavailable``, what a client retries.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response

from servecore.edges.bodies import error_body, headers_of, status_of
from servecore.errors import (
    ModelUnavailable,
    Overloaded,
    PayloadTooLarge,
    RequestError,
)
from serveshared.errors import triton_model_down

PASSED_HEADERS = ("retry-after", "content-type")
JSON = "application/json"


class PredictorRefused(Exception):
    """The predictor answered an error: its status, body and headers, passed on."""

    def __init__(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        super().__init__(f"the predictor answered {status}")
        self.status, self.body, self.headers = status, body, headers

    @classmethod
    def of(cls, response: httpx.Response) -> PredictorRefused:
        if triton_model_down(response.status_code, response.text):
            down = ModelUnavailable(
                f"the model's process is being started again ({response.text[:200]})"
            )
            body = json.dumps(error_body(down)).encode()
            return cls(int(status_of(down)), body, {**headers_of(down), "content-type": JSON})
        kept = {k: v for k, v in response.headers.items() if k.lower() in PASSED_HEADERS}
        return cls(response.status_code, response.content, kept)


def refusal(error: RequestError) -> Response:
    """A ``RequestError`` as the single server's response."""
    return Response(
        json.dumps(error_body(error)),
        int(status_of(error)),
        headers=headers_of(error),
        media_type=JSON,
    )


async def on_request_error(_request: Request, exc: Exception) -> Response:
    if not isinstance(exc, RequestError):  # registered for RequestError only
        raise exc
    return refusal(exc)


async def on_predictor_refused(_request: Request, exc: Exception) -> Response:
    if not isinstance(exc, PredictorRefused):
        raise exc
    return Response(exc.body, exc.status, headers=exc.headers)


class Limits:
    """ASGI middleware: ``max_request_bytes`` per body, ``max_inflight`` POSTs at once."""

    def __init__(self, app: Any, max_request_bytes: int, max_inflight: int) -> None:
        self.app = app
        self.max_request_bytes = max_request_bytes
        self.max_inflight = max_inflight
        self.inflight = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"").decode()
        if length.isdigit() and int(length) > self.max_request_bytes:
            await refusal(self._too_large(int(length)))(scope, receive, send)
            return
        if self.inflight >= self.max_inflight:
            busy = Overloaded(
                f"the transformer is preprocessing {self.inflight} requests, its limit "
                "(--max_inflight); retry after the Retry-After seconds"
            )
            await refusal(busy)(scope, receive, send)
            return
        self.inflight += 1
        try:
            await self.app(scope, self._counted(receive), send)
        finally:
            self.inflight -= 1

    def _counted(self, receive: Any) -> Any:
        seen = 0

        async def counted() -> dict:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_request_bytes:
                raise self._too_large(seen)
            return message

        return counted

    def _too_large(self, size: int) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"request body is {size} bytes or more, more than the transformer's limit of "
            f"{self.max_request_bytes} (--max_request_bytes); send fewer or smaller images"
        )
