"""The JSON bodies the edges write: an answer's values as the JSON document of the protocol
its request came in (plain, KServe v1, KServe v2 JSON), and an error's body with the HTTP
status of its kind (``STATUS``, the one table; ``Retry-After`` from the kind's
``retry_after_s``). Pure functions: the HTTP edge (``servecore.edges.http``, the transformer)
sends them with the status and headers; the tensor edge (``servecore.edges.tensor``) builds a
prediction's tensors itself, using only ``tag_json`` for its BYTES tags, ``answer_body`` for an
explanation's document and ``error_body`` for an error's message (a Triton client reads the
same JSON as an HTTP one). The parsing of the same protocols is ``servecore.edges.http``.

``answer_json`` writes a prediction with orjson: an embedding's 2,048 float32 values are most
of an answer, and the standard ``json`` module spent ~1 ms an image formatting them (the core's
largest cost, results/core-cost.md). orjson writes each float32 as the shortest text that
parses back to the same float32, so a client reads the same values from a shorter text. It has
no ``NaN``: an answer holding one is written by ``json.dumps`` as before. A KServe v2 request
may ask for its outputs as raw bytes (the binary tensor extension's ``binary_data_output``, or
an output's ``binary_data``, as Triton's clients do): ``written_answer`` then puts each such
output's bytes after the JSON header, as Triton's HTTP frontend does.

Imports explanations: an explanation's answer is written here too (``servecore.explain.document``).
"""

from __future__ import annotations

import json
import math
from http import HTTPStatus
from json.encoder import encode_basestring_ascii
from typing import NamedTuple

import numpy as np
import orjson

from servecore.answers import AnswerSpec, Prediction, Tag
from servecore.config import Output
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
from servecore.explain.document import encode_explanations
from servecore.explainvalues import Explained
from servecore.request import Protocol
from serveshared.v2binary import bytes_elements


class WrittenAnswer(NamedTuple):
    """An answer as the bytes of its HTTP body: the JSON document, or with binary v2 outputs
    its JSON header (``header_length`` bytes) followed by their raw bytes."""

    body: bytes
    header_length: int | None = None  # None: the body is all JSON


def written_answer(answer: Prediction | Explained | None, spec: AnswerSpec) -> WrittenAnswer:
    """``answer`` as its body: ``answer_json``, or for a v2 prediction asking for binary
    outputs, the JSON header of ``answer_body`` (those outputs' ``binary_data_size`` in place
    of their ``data``) and then their bytes in output order: an ``embedding`` as little-endian
    float32, ``tags`` as ``BYTES`` elements (each its 4-byte length, then its JSON text)."""
    if (
        not isinstance(answer, Prediction)
        or not answer.binary
        or answer.protocol is not Protocol.V2
    ):
        return WrittenAnswer(answer_json(answer, spec))
    header = answer_body(answer, spec)
    assert isinstance(header, dict)  # a v2 answer is one document
    raw = []
    for output in header["outputs"]:
        if Output(output["name"]) not in answer.binary:
            continue
        data = output.pop("data")
        if isinstance(data, np.ndarray):
            chunk = np.ascontiguousarray(data, dtype="<f4").tobytes()
        else:
            chunk = bytes_elements([text.encode() for text in data])
        output["parameters"] = {"binary_data_size": len(chunk)}
        raw.append(chunk)
    text = answer_json_document(header, answer)
    return WrittenAnswer(b"".join([text, *raw]), len(text))


def answer_body(answer: Prediction | Explained | None, spec: AnswerSpec) -> dict | list:
    """An answer as the JSON document of its protocol."""
    if isinstance(answer, Explained):
        return encode_explanations(answer, spec.classes)
    if answer is None:
        raise ValueError("a reply without an error carries an answer")
    embeddings = answer.embeddings  # float32 rows: each writer formats them itself
    tags = None if answer.tags is None else [[_tag(t) for t in row] for row in answer.tags]
    if answer.protocol is Protocol.V2:
        return _v2_response(spec, answer.request_id, embeddings, answer.tags)
    answers = tags if embeddings is None else [{"embedding": e} for e in embeddings]
    if answers is None:
        raise ValueError("a prediction carries embeddings or tags")
    return {"predictions": answers} if answer.protocol is Protocol.V1 else answers[0]


def answer_json(answer: Prediction | Explained | None, spec: AnswerSpec) -> bytes:
    """``answer_body(answer, spec)`` as UTF-8 JSON: orjson for a prediction whose floats are
    all finite, ``json.dumps`` (ASCII, ``NaN`` and ``Infinity`` as it writes them) otherwise and
    for explanations, so every answer parses to the values it held before."""
    return answer_json_document(answer_body(answer, spec), answer)


def answer_json_document(body: dict | list, answer: Prediction | Explained | None) -> bytes:
    """``answer``'s document ``body`` as UTF-8 JSON (``answer_json``'s choice of writer)."""
    if isinstance(answer, Prediction) and _finite(answer):
        return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    return json.dumps(body, default=_array_list).encode()


def _finite(answer: Prediction) -> bool:
    embeddings, tags = answer.embeddings, answer.tags or []
    return (embeddings is None or bool(np.isfinite(embeddings).all())) and all(
        math.isfinite(t.probability) for row in tags for t in row
    )


def _array_list(value: object) -> list:
    """``json.dumps``'s ``default`` for the embedding arrays ``answer_body`` leaves as they are."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def tag_json(tag: Tag) -> str:
    """A tag as one KServe v2 BYTES element: the JSON text ``json.dumps`` writes for
    ``{"label", "index", "probability"}`` (and ``"head"`` when the model has several),
    written without building the dict."""
    head = f', "head": {encode_basestring_ascii(tag.head)}' if tag.head else ""
    return (
        f'{{"label": {encode_basestring_ascii(tag.label)}, "index": {tag.index}, '
        f'"probability": {_float_json(tag.probability)}{head}}}'
    )


def _float_json(value: float) -> str:
    """A float as ``json.dumps`` writes it (``NaN`` and ``Infinity`` included)."""
    if math.isfinite(value):
        return float.__repr__(value)
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _tag(tag: Tag) -> dict:
    written = {"label": tag.label, "index": tag.index, "probability": tag.probability}
    if tag.head:
        written["head"] = tag.head
    return written


def _v2_response(
    spec: AnswerSpec,
    request_id: str | None,
    embeddings: np.ndarray | None,
    tags: list[list[Tag]] | None,
) -> dict:
    """An Open Inference Protocol response; ``tags`` elements are JSON-encoded strings."""
    outputs: list[dict] = []
    if embeddings is not None:
        outputs.append(
            {
                "name": Output.EMBEDDING.value,
                "datatype": "FP32",
                "shape": list(embeddings.shape),
                "data": embeddings.reshape(-1),
            }
        )
    if tags is not None:
        outputs.append(
            {
                "name": Output.TAGS.value,
                "datatype": "BYTES",
                "shape": [len(tags), len(tags[0])],
                "data": [tag_json(t) for row in tags for t in row],
            }
        )
    response = {
        "model_name": spec.model_name,
        "model_version": spec.model_version,
        "outputs": outputs,
    }
    if request_id is not None:
        response["id"] = request_id
    return response


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
