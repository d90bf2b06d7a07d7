"""The tensor edge's way in: a request as Triton hands it over (KServe v2 named inputs and
parameters), read by its adapter into arrays before the core runs (``TensorRequest``), and what
the core makes of it (``parse_inputs``), with the names of the inputs, outputs and parameters
the model's tensor interface declares. The way out is ``servecore.edges.tensoroutput``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from servecore.config import HandlerConfig
from servecore.crops import CROPS
from servecore.errors import InvalidRequest
from servecore.parse import EXPLAIN_KEYS, ParsedRequest, Protocol, parse_crops, parse_tensor

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
