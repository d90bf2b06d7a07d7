"""The model's tensor interface (KServe v2 named inputs and outputs, what Triton hands over
and takes back), without the engine: a request's input arrays and parameters as a
``ParsedRequest``, and a ``Reply``'s answer as named output arrays, each output's dtype given
by the engine (Triton's model config). Triton's adapter (``tritonrepo/model.py``) reads its
tensors into these arrays and wraps the outputs in its own tensors.
"""

from __future__ import annotations

import dataclasses
import json
from http import HTTPStatus

import numpy as np

from servecore.answers import AnswerSpec, Prediction
from servecore.config import HandlerConfig, Output
from servecore.crops import CROPS
from servecore.encode import answer_body, tag_json
from servecore.errors import InvalidRequest
from servecore.explain.encode import Explained
from servecore.parse import EXPLAIN_KEYS, ParsedRequest, Protocol, parse_crops, parse_tensor
from servecore.service import Reply

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


def parse_inputs(
    images: np.ndarray | None,
    crops: np.ndarray | None,
    parameters: dict,
    request_id: str | None,
    config: HandlerConfig,
) -> ParsedRequest:
    """A request's ``images`` or ``crops`` array (exactly one) and its parameters, inside the
    core's per-request boundary: a missing input or bad ``topk`` fails this request alone. An
    explanation request is answered as TorchServe's: one image as ``/explanations`` answers
    it, several as KServe v1's ``:explain``."""
    if (images is None) == (crops is None):
        raise InvalidRequest(
            f"send one input: '{INPUT}' (BYTES [n, 1], encoded images) or '{CROPS}' "
            "(UINT8 [n, 224, 224, 3], crops; see describe's crops_input)"
        )
    asked = {"top_k": parameters.get(TOP_K), "request_id": request_id}
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


def output_arrays(reply: Reply, dtypes: dict[str, type], spec: AnswerSpec) -> dict[str, np.ndarray]:
    """An answer's outputs: a prediction's arrays as the outputs the model config declares,
    with the precision that computed them (TorchServe's ``X-Precision``) as ``precision``, one
    per image, and whether the content cache answered each image as ``cached``; or an
    explanation's JSON document as ``explanations`` ([1, 1])."""
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


# Which Triton error code the adapter sends for each HTTP status the core gives an error, and
# what a client then receives: Triton's codes are fewer than HTTP's (the docs' status table,
# python -m buildsteps.reference, reads these too).
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
