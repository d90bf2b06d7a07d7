"""The tensor edge as one object, what a tensor engine's adapter (Triton's) holds: ``decode``
a request read into a ``TensorRequest`` (its arrays and parameters) into the core's
``Incoming``, and ``encode`` a ``Reply`` as a ``TensorReply``: named output arrays, or the
error's JSON body with the Triton error code its HTTP status maps to. The adapter only wraps
these in its engine's own objects; ``servecore.edges.http.HttpEdge`` is the same shape for HTTP.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from servecore.answers import AnswerSpec
from servecore.edges.httperrors import error_body, status_of
from servecore.edges.tensorinput import EXPLAIN, TensorRequest
from servecore.edges.tensoroutput import output_arrays, triton_code
from servecore.service import Reply
from servecore.stages import Incoming
from serveshared.wire import DEADLINE_HEADER, PRIORITY_HEADER


class TensorReply(NamedTuple):
    """One request's answer as a tensor engine sends it: its ``outputs`` by name, or its
    ``error`` message (the error's JSON body) and ``code`` (a Triton error code's name)."""

    outputs: dict[str, np.ndarray] | None = None
    error: str | None = None
    code: str | None = None


@dataclass(frozen=True)
class TensorEdge:
    """``decode``/``encode`` for one model: its answers' ``spec`` and each declared output's
    numpy dtype (from the engine's model config)."""

    spec: AnswerSpec
    dtypes: dict[str, type]

    def decode(self, request_id: str, request: TensorRequest) -> Incoming:
        """The request as the core takes it: an explanation when its ``explain`` parameter is
        true, with the class and deadline of its forwarded ``X-Priority`` and ``X-Deadline``
        headers (Triton hands a header over under the name as sent over HTTP, lower-case over
        gRPC); a bad value fails this request alone."""
        headers = {k.lower(): v for k, v in request.parameters.items()}
        return Incoming(
            request_id, request, explain=request.parameters.get(EXPLAIN) is True
        ).classified(headers.get(PRIORITY_HEADER.lower()), headers.get(DEADLINE_HEADER.lower()))

    def encode(self, reply: Reply, wanted: frozenset[str] = frozenset()) -> TensorReply:
        """``reply`` as its outputs (``servecore.edges.tensoroutput``; ``wanted``: the outputs the
        request asked for, empty for all), or its error's body and the nearest code Triton can
        send. It never refuses a reply (no ``RequestError``): the core writes each once."""
        if reply.error is not None:
            status = status_of(reply.error)
            return TensorReply(error=json.dumps(error_body(reply.error)), code=triton_code(status))
        return TensorReply(outputs=output_arrays(reply, self.dtypes, self.spec, wanted))
