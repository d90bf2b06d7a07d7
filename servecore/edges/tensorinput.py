"""The tensor edge's way in: a request as Triton hands it over (KServe v2 named inputs and
parameters), read by its adapter into arrays before the core runs (``TensorRequest``), and what
the core makes of it (``parse_inputs``), with the names of the inputs, outputs and parameters
the model's tensor interface declares. The way out is ``servecore.edges.tensoroutput``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servecore.config import HandlerConfig
from servecore.crops import CROPS, crop_count, crops_of
from servecore.errors import InvalidRequest
from servecore.request import (
    EXPLAIN_KEYS,
    ParsedRequest,
    Protocol,
    count_images,
    decode_base64,
    parse_top_k,
)

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
    (encoded images or their base64 text) or ``crops`` array (the other None), its parameters
    and its id (None: the client sent none)."""

    images: np.ndarray | None = None
    crops: np.ndarray | None = None
    parameters: dict = field(default_factory=dict)
    request_id: str | None = None

    def parse(self, config: HandlerConfig) -> ParsedRequest:
        """This request as the core's ``ParsedRequest`` (``parse_inputs``)."""
        return parse_inputs(self, config)


def parse_inputs(request: TensorRequest, config: HandlerConfig) -> ParsedRequest:
    """A request's ``images`` or ``crops`` array (exactly one) and its parameters, inside the
    core's per-request boundary: a missing input or bad ``topk`` fails this request alone. An
    explanation request is answered as TorchServe's: one image as ``/explanations`` answers
    it, several as KServe v1's ``:explain``."""
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
        return dataclasses.replace(parsed, options=options) if options else parsed
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
