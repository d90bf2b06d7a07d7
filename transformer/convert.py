"""A transformer's request and answer conversions, pure functions of the core's values (no
KServe here): an incoming v1/v2 body as the core's ``ParsedRequest``, its images as one
``crops`` array, and the predictor's v2 outputs as a v1 answer."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from servecore.boundary import each_image
from servecore.config import HandlerConfig, Output
from servecore.crops import CROP_SHAPE
from servecore.edges.http import HttpRequest, parse_http
from servecore.edges.jsonguard import JsonDocument
from servecore.preprocessor import Preprocessor
from servecore.request import ParsedRequest


def parse(body: Mapping[str, Any], top_k_header: Any, config: HandlerConfig) -> ParsedRequest:
    """A v1 body (``instances``) or a v2 one (``inputs``, already read into a mapping) parsed
    as the single server parses it: the same checks, limits and messages."""
    return parse_http(HttpRequest(body=JsonDocument(dict(body)), top_k_header=top_k_header), config)


def crops(request: ParsedRequest, preprocessor: Preprocessor, request_id: str) -> np.ndarray:
    """The request's images as ``uint8 [n, 224, 224, 3]`` (HWC, as ``servecore.crops`` takes
    them): opened (limits, header) for all first, as the server's intake does, then decoded
    and cropped; crops the request carried pass as they are. The first bad image raises its
    ``RequestError`` ("image k of n" when there are several)."""
    opened = preprocessor.read(request_id, request)
    made = each_image(request_id, "decoding", opened, preprocessor.decode)
    out = np.empty((len(made), *CROP_SHAPE), dtype=np.uint8)
    for row, crop in zip(out, made):
        row[...] = crop.permute(1, 2, 0).numpy()
    return out


def v1_answer(outputs: Mapping[str, np.ndarray]) -> dict:
    """The predictor's v2 outputs (by name, as arrays) as the single server's v1 answer: one
    ``{"embedding": [...]}`` per image when the embedding came, else each image's tags."""
    embedding = outputs.get(Output.EMBEDDING.value)
    if embedding is not None:
        rows = np.asarray(embedding, dtype=np.float32).tolist()
        return {"predictions": [{"embedding": row} for row in rows]}
    tags = np.asarray(outputs[Output.TAGS.value], dtype=object)
    return {"predictions": [[json.loads(_text(t)) for t in row] for row in tags]}


def _text(element: Any) -> str:
    return element.decode() if isinstance(element, (bytes, bytearray)) else str(element)
