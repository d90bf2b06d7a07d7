"""The two edges of the core, one table of cases: each request goes through the HTTP edge
(``servecore.edges.http.HttpEdge``, TorchServe's) and the tensor edge
(``servecore.edges.tensor.TensorEdge``, Triton's) into the same loaded model, and comes back as
each engine sends it. A good photo gets the same tags on both; a bad request the same error
``type`` and message on both, with the HTTP status and the Triton error code the table says
(Triton has fewer codes: every 4xx is INVALID_ARG, 503 and 504 UNAVAILABLE)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from servecore.edges.http import HttpEdge, HttpRequest
from servecore.edges.tensor import TensorEdge, TensorRequest
from tests import imagegen
from tests.corpus import bad_inputs
from tests.handler_context import make_handler

PHOTO = imagegen.jpeg(320, 240, seed=50)

# name: (image, request parameters, forwarded headers) and what both edges must answer:
# None for tags, else (error type, HTTP status, Triton code).
BAD = ("InvalidParameter", 400, "INVALID_ARG")
CASES = {
    "a photo": (PHOTO, {"topk": 3}, {}, None),
    "corrupt bytes": (b"\xff\xd8\xff not a jpeg", {}, {}, ("InvalidImage", 400, "INVALID_ARG")),
    "topk above the classes": (PHOTO, {"topk": 1001}, {}, BAD),
    "a bad priority": (PHOTO, {}, {"X-Priority": "urgent"}, BAD),
    "a decompression bomb": (
        bad_inputs()["decompression-bomb"].body, {}, {}, ("PayloadTooLarge", 413, "INVALID_ARG")
    ),
    "a deadline passed": (PHOTO, {}, {"X-Deadline": "1"}, ("DeadlineExceeded", 504, "UNAVAILABLE")),
}  # fmt: skip


@pytest.fixture(scope="module")
def edges(weights_dir):
    """One tagger (TorchServe's handler in process: the model and its HTTP edge) and a tensor
    edge on the same model, with the outputs a generated Triton config declares."""
    handler, _ = make_handler(weights_dir, task="tags", precision="f32", draft_decode=False)
    tensor = TensorEdge(handler.model.answers, {"tags": np.object_, "precision": np.object_})
    return handler.model, handler.edge, tensor


@pytest.mark.parametrize("case", list(CASES))
def test_both_edges_answer_a_case_alike(edges, case):
    model, http, tensor = edges
    image, parameters, headers, expected = CASES[case]
    topk = parameters.get("topk")
    sent = HttpRequest(body=image, top_k_header=None if topk is None else str(topk))
    (over_http,) = model.run([http.decode(case, sent, headers, explain=False)], http.encode)
    array = np.array([[image]], dtype=np.object_)
    # Triton forwards the client's headers as request parameters (tritonrepo/server.py).
    given = TensorRequest(images=array, parameters={**parameters, **headers}, request_id=case)
    (over_tensors,) = model.run([tensor.decode(case, given)], tensor.encode)
    if expected is None:
        assert over_http.status == 200 and over_tensors.error is None
        tags = json.loads(over_http.body)
        assert len(tags) == 3
        assert [json.loads(t) for t in over_tensors.outputs["tags"][0]] == tags
        return
    kind, status, code = expected
    body = json.loads(over_http.body)
    assert (over_http.status, body["type"], body["code"]) == (status, kind, status)
    assert " at 0x" not in body["message"]  # no object's address: the same text every time
    assert over_tensors.outputs is None and over_tensors.code == code
    theirs = json.loads(over_tensors.error)  # the same error body, word for word (a deadline's
    # message also says how long ago it passed, at each edge's own moment)
    assert {**theirs, "message": theirs["message"].split(" passed ")[0]} == {
        **body,
        "message": body["message"].split(" passed ")[0],
    }


def test_each_reply_is_encoded_once_with_the_outputs_its_request_named(edges):
    """One ``encode`` call per reply, in and out, even when the HTTP edge refuses an answer too
    large to send (the same call writes its 413); a tensor request's named outputs travel with
    it into the core, which computes those: a tagger asked for ``embedding`` answers that."""
    model = edges[0]
    small, calls = HttpEdge(model.answers, max_bytes=64), []
    counted = lambda reply: calls.append(reply) or small.encode(reply)  # noqa: E731
    (refused,) = model.run([small.decode("big", HttpRequest(body=PHOTO), {}, False)], counted)
    assert (refused.status, json.loads(refused.body)["type"], len(calls)) == (
        413,
        "PayloadTooLarge",
        1,
    )
    dtypes = {"embedding": np.float32, "tags": np.object_, "precision": np.object_}
    tensor, array = TensorEdge(model.answers, dtypes), np.array([[PHOTO]], dtype=np.object_)
    named, plain = (
        model.run([tensor.decode(f"r{i}", TensorRequest(array, outputs=names))], tensor.encode)[0]
        for i, names in enumerate((frozenset({"embedding"}), frozenset()))
    )
    assert sorted(named.outputs) == ["embedding", "precision"]
    assert named.outputs["embedding"].shape == (1, 2048)
    assert sorted(plain.outputs) == ["precision", "tags"]
