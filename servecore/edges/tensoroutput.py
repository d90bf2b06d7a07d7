"""The tensor edge's way out (KServe v2 named outputs, what Triton takes back), without the
engine: a ``Reply``'s answer as named output arrays, each output's dtype given by the engine
(Triton's model config), and the Triton error code for each error. The way in, a request's
input arrays and parameters as the core's value, is ``servecore.edges.tensorinput``.
Triton's adapter (``tritonrepo/model.py``) reads its tensors into those arrays and wraps the
outputs in its own tensors.
"""

from __future__ import annotations

import json
from http import HTTPStatus

import numpy as np

from servecore.answers import AnswerSpec, Prediction
from servecore.config import Output
from servecore.edges.bodies import answer_body, tag_json
from servecore.edges.tensorinput import CACHED, EXPLANATIONS, PRECISION
from servecore.explain.document import Explained
from servecore.service import Reply


def output_arrays(
    reply: Reply, dtypes: dict[str, type], spec: AnswerSpec, wanted: frozenset[str] = frozenset()
) -> dict[str, np.ndarray]:
    """An answer's outputs: a prediction's arrays as the outputs the model config declares,
    with the precision that computed them (TorchServe's ``X-Precision``) as ``precision``, one
    per image, and whether the content cache answered each image as ``cached``; or an
    explanation's JSON document as ``explanations`` ([1, 1]). ``wanted``: the outputs the
    client asked for (empty: all); a prediction's others are not built, since the engine would
    drop them (Triton passes on only the requested outputs)."""
    if isinstance(reply.answer, Explained):
        text = json.dumps(answer_body(reply.answer, spec))
        return {EXPLANATIONS: np.array([[text]], dtype=np.object_)}
    if not isinstance(reply.answer, Prediction):
        raise TypeError(f"a reply without an error carries an answer, got {reply.answer!r}")
    if wanted:
        dtypes = {name: dtype for name, dtype in dtypes.items() if name in wanted}
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
