"""The HTTP edge: a ``Reply``'s values as the HTTP response an engine that answers in HTTP
sends (TorchServe's handler): its status and phrase (from the error's kind,
``servecore.edges.httperrors``), its headers and its JSON body (``servecore.edges.bodies``).
The HTTP names live here and there, not in the core's values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import NamedTuple

from servecore.answers import AnswerSpec
from servecore.edges.bodies import written_answer
from servecore.edges.httperrors import error_body, headers_of, status_of
from servecore.errors import PayloadTooLarge
from servecore.parse import HttpRequest
from servecore.service import Reply
from servecore.stages import Incoming
from serveshared.v2binary import HEADER_LENGTH
from serveshared.wire import (
    BATCH_HEADER,
    CACHE_HITS_HEADER,
    DEADLINE_HEADER,
    PRECISION_HEADER,
    PRIORITY_HEADER,
)

CONTENT_TYPE = "application/json"
BINARY_CONTENT_TYPE = "application/octet-stream"  # a JSON header and then raw output bytes


@dataclass(frozen=True)
class HttpEdge:
    """The HTTP edge as one object, what an HTTP engine's adapter (TorchServe's) holds:
    ``decode`` an HTTP request into the core's ``Incoming``, ``encode`` a ``Reply`` as its
    ``HttpReply``. ``servecore.edges.tensor.TensorEdge`` is the same shape for tensors."""

    spec: AnswerSpec
    max_bytes: int  # handler.max_response_bytes

    def decode(
        self,
        request_id: str,
        request: HttpRequest,
        headers: Mapping[str, str | None],
        explain: bool,
    ) -> Incoming:
        """The request as the core takes it, with the class and deadline of its
        ``X-Priority`` and ``X-Deadline`` ``headers`` (found by the engine, whatever their
        case; None: not sent); a bad value fails this request alone. ``explain``: it came on
        an explanation route."""
        return Incoming(request_id, request, explain=explain).classified(
            headers.get(PRIORITY_HEADER), headers.get(DEADLINE_HEADER)
        )

    def encode(self, reply: Reply) -> HttpReply:
        """``reply`` as its HTTP response (``http_reply``)."""
        return http_reply(reply, self.spec, self.max_bytes)


class HttpReply(NamedTuple):
    """One request's HTTP response: ``status`` and its ``phrase``, ``headers``, its ``body``
    (UTF-8 JSON, or a JSON header and binary v2 outputs) and its ``content_type``."""

    status: int
    phrase: str
    headers: dict[str, str]
    body: bytes
    content_type: str = CONTENT_TYPE


def http_reply(reply: Reply, spec: AnswerSpec, max_bytes: int) -> HttpReply:
    """``reply`` as its HTTP response: ``X-Batch-Size``, then ``X-Precision`` (and
    ``X-Cache-Hits`` when the cache looked, ``Inference-Header-Content-Length`` before binary
    v2 outputs) on an answer, or the error's own headers (``Retry-After``). Raises
    ``PayloadTooLarge`` for an answer whose body would be longer than ``max_bytes``
    (``handler.max_response_bytes``): ``ImageModel.run`` then sends that 413."""
    headers = {BATCH_HEADER: str(reply.batch_size)}
    if reply.error is not None:
        status = status_of(reply.error)
        body = json.dumps(error_body(reply.error)).encode()
        return HttpReply(int(status), status.phrase, {**headers, **headers_of(reply.error)}, body)
    body, header_length = written_answer(reply.answer, spec)
    if len(body) > max_bytes:
        raise PayloadTooLarge(
            f"the answer would be {len(body)} bytes, more than the limit of {max_bytes} "
            "(handler.max_response_bytes); send fewer images or ask for less"
        )
    headers[PRECISION_HEADER] = reply.precision
    if reply.cached is not None:
        headers[CACHE_HITS_HEADER] = str(sum(reply.cached))
    if header_length is None:
        return HttpReply(int(HTTPStatus.OK), HTTPStatus.OK.phrase, headers, body)
    headers[HEADER_LENGTH] = str(header_length)
    return HttpReply(int(HTTPStatus.OK), HTTPStatus.OK.phrase, headers, body, BINARY_CONTENT_TYPE)
