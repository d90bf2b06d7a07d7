"""The tensor edge (Triton's): a request as Triton hands it over (KServe v2 named inputs and
parameters), read by its adapter into arrays before the core runs (``TensorRequest``), in, as
the core's ``Incoming``; a ``Reply`` out, as a ``TensorReply``: named output arrays, each
output's dtype given by the engine (Triton's model config), or the error's JSON body with the
Triton error code of its kind. The adapter (``tritonrepo/model.py``) only reads its tensors into
those arrays and wraps the outputs in its own tensors; ``servecore.edges.http.HttpEdge`` is the
same shape for HTTP.

An explanation's answer (``servecore.explainvalues.Explained``) is the ``explanations`` output,
its JSON document as ``bodies`` writes it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from servecore.answers import AnswerSpec, Prediction
from servecore.config import HandlerConfig, Output
from servecore.crops import CROPS, crop_count, crops_of
from servecore.edges.bodies import answer_body, error_body, tag_json
from servecore.errors import (
    ClientError,
    DeadlineExceeded,
    InvalidRequest,
    ModelUnavailable,
    NotSupported,
    Overloaded,
    RequestError,
)
from servecore.explainvalues import Explained
from servecore.request import (
    EXPLAIN_KEYS,
    OutputSpec,
    ParsedRequest,
    Protocol,
    count_images,
    decode_base64,
    parse_top_k,
)
from servecore.service import Reply
from servecore.stages import Incoming
from serveshared.wire import DEADLINE_HEADER, PRIORITY_HEADER

INPUT = "images"  # BYTES [n, 1]: encoded images, or their base64 text; or CROPS, UINT8 crops
TOP_K = "topk"  # request parameter
# BYTES [n, 1] beside each prediction: the arithmetic that computed each answer (TorchServe's
# X-Precision; the 2.51 stub has no response parameters).
PRECISION = "precision"
# BOOL [n, 1] beside each prediction: the content cache answered that image (TorchServe's
# X-Cache-Hits; False everywhere when handler.cache_bytes is 0).
CACHED = "cached"
# Request parameter ``describe: true`` (its ``images`` are not read): the answer is the output
# of the same name, one JSON text, what TorchServe's describe carries.
DESCRIBE = "describe"
# Request parameter ``explain: true``: the request goes through the core's explanation stage
# (as TorchServe's /explanations), its answer is the ``explanations`` output, one JSON text;
# the explanation parameters (target, method, ...) ride beside it as request parameters.
EXPLAIN, EXPLANATIONS = "explain", "explanations"


@dataclass(frozen=True)
class TensorRequest:
    """One request as a tensor engine hands it over, read into values: its ``images``
    (encoded images or their base64 text) or ``crops`` array (the other None), its parameters,
    its id (None: the client sent none) and the ``outputs`` it named (empty: none named)."""

    images: np.ndarray | None = None
    crops: np.ndarray | None = None
    parameters: dict = field(default_factory=dict)
    request_id: str | None = None
    outputs: frozenset[str] = frozenset()

    def parse(self, config: HandlerConfig) -> ParsedRequest:
        """This request as the core's ``ParsedRequest`` (``parse_inputs``)."""
        return parse_inputs(self, config)


def parse_inputs(request: TensorRequest, config: HandlerConfig) -> ParsedRequest:
    """A request's ``images`` or ``crops`` array (exactly one) and its parameters, inside the
    core's per-request boundary: a missing input or bad ``topk`` fails this request alone. An
    explanation request is answered as TorchServe's: one image as ``/explanations`` answers
    it, several as KServe v1's ``:explain``. The answer outputs the request named go with it
    (``ParsedRequest.outputs``), so the core computes only those."""
    images, crops, parameters = request.images, request.crops, request.parameters
    if (images is None) == (crops is None):
        raise InvalidRequest(
            f"send one input: '{INPUT}' (BYTES [n, 1], encoded images) or '{CROPS}' "
            "(UINT8 [n, 224, 224, 3], crops; see describe's crops_input)"
        )
    asked = {"top_k": parameters.get(TOP_K), "request_id": request.request_id}
    parsed = (
        parse_crops(crops, **asked, config=config)
        if crops is not None
        else parse_tensor(np.asarray(images).reshape(-1).tolist(), **asked, config=config)
    )
    # Explanation parameters on a prediction are the core's 400, not silently ignored.
    options = {k: parameters[k] for k in EXPLAIN_KEYS if k in parameters}
    if parameters.get(EXPLAIN) is not True:
        named = tuple(OutputSpec(o) for o in Output if o.value in request.outputs)
        return dataclasses.replace(parsed, options=options, outputs=named)
    protocol = Protocol.PLAIN if len(parsed.images) == 1 else Protocol.V1
    return dataclasses.replace(parsed, protocol=protocol, options=options)


def parse_tensor(
    elements: Sequence[bytes],
    *,
    top_k: Any = None,
    request_id: str | None = None,
    config: HandlerConfig,
) -> ParsedRequest:
    """A KServe v2 request an engine has already read (Triton's Python backend): the elements
    of its BYTES input tensor and its ``topk`` request parameter, as a ``ParsedRequest`` or a
    ``RequestError``. An element is an encoded image (the binary tensor extension) or, as a JSON
    body carries it, the image's base64 text; the answer goes out as v2 named tensors."""
    count_images(len(elements), config)
    if not elements:
        raise InvalidRequest("input 'images' is empty: send at least one image")
    images = [_tensor_image(bytes(item), f"images[{i}]") for i, item in enumerate(elements)]
    return ParsedRequest(
        Protocol.V2,
        images,
        top_k=None if top_k is None else parse_top_k(top_k),
        request_id=request_id,
    )


def parse_crops(
    crops: Any, *, top_k: Any = None, request_id: str | None = None, config: HandlerConfig
) -> ParsedRequest:
    """A KServe v2 request an engine has already read whose input is the ``crops`` tensor
    (an array, ``servecore.crops``), as a ``ParsedRequest`` or a ``RequestError``."""
    count = crop_count(list(getattr(crops, "shape", ())), "input 'crops'")
    count_images(count, config)
    return ParsedRequest(
        Protocol.V2,
        crops_of(crops, count, "input 'crops'"),
        top_k=None if top_k is None else parse_top_k(top_k),
        request_id=request_id,
        crops=True,
    )


def _tensor_image(item: bytes, where: str) -> bytes:
    """Raw image bytes as they are; base64 text (only ASCII base64 characters, an optional
    ``data:`` prefix) decoded. No image format starts that way: JPEG, PNG, GIF, WebP and TIFF
    headers all hold bytes outside it."""
    if _BASE64_TEXT.fullmatch(item):
        return decode_base64(item.decode("ascii"), where)
    return item


_BASE64_TEXT = re.compile(rb"(data:[\w/+.-]*;base64,)?[A-Za-z0-9+/=_\s-]+")


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

    def encode(self, reply: Reply) -> tuple[Reply, TensorReply]:
        """``reply`` as sent and its response: its outputs (``output_arrays``), or its error's
        body and the code of its kind. It never refuses a reply."""
        if reply.error is not None:
            body = json.dumps(error_body(reply.error))
            return reply, TensorReply(error=body, code=triton_code(reply.error))
        return reply, TensorReply(outputs=output_arrays(reply, self.dtypes, self.spec))


def output_arrays(reply: Reply, dtypes: dict[str, type], spec: AnswerSpec) -> dict[str, np.ndarray]:
    """An answer's outputs: a prediction's arrays as the outputs the model config declares,
    with the precision that computed them (TorchServe's ``X-Precision``) as ``precision``, one
    per image, and whether the content cache answered each image as ``cached``; or an
    explanation's JSON document as ``explanations`` ([1, 1]). A prediction holds only the
    outputs its request named (``TensorRequest.outputs``); ``precision`` and ``cached`` are
    always built (a few bytes), and the adapter sends only those requested."""
    if isinstance(reply.answer, Explained):
        text = json.dumps(answer_body(reply.answer, spec))
        return {EXPLANATIONS: np.array([[text]], dtype=np.object_)}
    if not isinstance(reply.answer, Prediction):
        raise TypeError(f"a reply without an error carries an answer, got {reply.answer!r}")
    answer, outputs = reply.answer, dict[str, np.ndarray]()
    embedding, tags = Output.EMBEDDING.value, Output.TAGS.value
    if answer.embeddings is not None and embedding in dtypes:
        outputs[embedding] = answer.embeddings.astype(dtypes[embedding], copy=False)
    if answer.tags is not None and tags in dtypes:
        rows = [[tag_json(tag) for tag in row] for row in answer.tags]
        outputs[tags] = np.array(rows, dtype=dtypes[tags])
    images = len(answer.embeddings if answer.embeddings is not None else answer.tags or [])
    if PRECISION in dtypes:
        outputs[PRECISION] = np.full((images, 1), reply.precision, dtype=dtypes[PRECISION])
    if CACHED in dtypes:
        hits: np.ndarray = np.array(reply.cached or [False] * images, dtype=dtypes[CACHED])
        outputs[CACHED] = hits.reshape(images, 1)
    return outputs


# What Triton error code the edge sends for each error kind (a subclass not listed takes its
# parent's), and what a client then receives: Triton's codes are fewer than the kinds. 504
# (the caller's ``X-Deadline`` passed) has no code of its own: "unavailable", as Triton answers
# a request whose own ``timeout`` expired in its queue. A client error is "invalid argument"
# (the core's body in the message still says which); the docs' status table reads these too.
CODES: dict[type[RequestError], str] = {
    RequestError: "INTERNAL",
    ClientError: "INVALID_ARG",
    NotSupported: "INTERNAL",
    Overloaded: "UNAVAILABLE",
    ModelUnavailable: "UNAVAILABLE",
    DeadlineExceeded: "UNAVAILABLE",
}
# A pb_utils.TritonError code -> (the HTTP status, the gRPC code) Triton answers with it.
RECEIVED = {
    "UNAVAILABLE": (503, "UNAVAILABLE"),
    "INVALID_ARG": (400, "INVALID_ARGUMENT"),
    "INTERNAL": (500, "INTERNAL"),
}


def triton_code(error: RequestError) -> str:
    """The Triton error code of ``error``'s kind (its nearest kind in ``CODES``)."""
    return next(CODES[kind] for kind in type(error).__mro__ if kind in CODES)
