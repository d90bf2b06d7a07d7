"""KServe v2 outputs as raw bytes (the binary tensor extension's ``binary_data_output`` and an
output's ``binary_data``), as TorchServe answers them through our HTTP edge: read back by
NVIDIA's own client (``tritonclient.http.InferResult``), they equal the JSON answer's values,
float32 for float32; a bad flag fails its request alone."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from serveshared.v2binary import read_outputs
from tests import imagegen
from tests.handler_context import make_handler, run_batch

PHOTOS = [imagegen.jpeg(320 + 16 * i, 240, seed=40 + i) for i in range(3)]
HEADER = "Inference-Header-Content-Length"


def body(parameters: dict | None = None, outputs: list | None = None) -> dict:
    document: dict = {
        "id": "req-7",
        "inputs": [
            {
                "name": "images",
                "datatype": "BYTES",
                "shape": [len(PHOTOS), 1],
                "data": [base64.b64encode(p).decode() for p in PHOTOS],
            }
        ],
    }
    if parameters is not None:
        document["parameters"] = parameters
    if outputs is not None:
        document["outputs"] = outputs
    return document


def json_outputs(text: bytes | str) -> dict[str, np.ndarray]:
    outputs = json.loads(text)["outputs"]
    return {
        o["name"]: np.array(
            o["data"], dtype=object if o["datatype"] == "BYTES" else np.float32
        ).reshape(o["shape"])
        for o in outputs
    }


def without_binary(output: dict) -> dict:
    parameters = {k: v for k, v in output.get("parameters", {}).items() if k != "binary_data"}
    return {"name": output["name"], "parameters": parameters}


def read_binary(content: bytes, header_length: str) -> httpclient.InferResult:
    return httpclient.InferResult.from_response_body(content, header_length=int(header_length))


@pytest.fixture(scope="module")
def handler(weights_dir):
    return make_handler(weights_dir, task="embedding")


BOTH = [{"name": "embedding"}, {"name": "tags", "parameters": {"topk": 4}}]


@pytest.mark.parametrize(
    ("parameters", "outputs", "binary"),
    [
        ({"binary_data_output": True}, BOTH, {"embedding", "tags"}),
        ({"binary_data_output": True}, None, {"embedding"}),  # the model's own output
        (
            None,
            [{"name": "embedding", "parameters": {"binary_data": True}}, BOTH[1]],
            {"embedding"},
        ),
        (
            {"binary_data_output": True},
            [BOTH[0], {"name": "tags", "parameters": {"binary_data": False}}],
            {"embedding"},
        ),
    ],
)
def test_binary_outputs_read_back_as_the_json_answer(handler, parameters, outputs, binary):
    model, context = handler
    plain = body(outputs=None if outputs is None else [without_binary(o) for o in outputs])
    asked = body(parameters, outputs)
    # Each in a batch of its own: the same rows of the same forward, so the same bits.
    (text,), ((status, _),), _ = run_batch(model, context, [{"body": plain}])
    assert status == 200 and context.get_response_content_type(0) == "application/json"
    expected = json_outputs(text)
    (raw,), ((status, _),), _ = run_batch(model, context, [{"body": asked}])
    assert status == 200 and context.get_response_content_type(0) == "application/octet-stream"
    result = read_binary(raw, context.get_response_headers(0)[HEADER])
    assert result.get_response()["id"] == "req-7"
    for name, values in expected.items():
        got = result.as_numpy(name)
        entry = result.get_output(name)
        assert ("binary_data_size" in entry.get("parameters", {})) == (name in binary)
        if name == "embedding":
            assert got.dtype == np.float32 and got.shape == (len(PHOTOS), 2048)
            np.testing.assert_array_equal(got, values)  # the same float32 values
        else:
            decoded = [[json.loads(t) for t in row] for row in got]
            assert decoded == [[json.loads(t) for t in row] for row in values]


def test_a_bad_flag_fails_its_request_alone(handler):
    model, context = handler
    rows = [
        {"body": body({"binary_data_output": "yes"})},
        {"body": body({"binary_data_output": True})},
    ]
    responses, statuses, _ = run_batch(model, context, rows)
    assert statuses[0][0] == 400 and statuses[1][0] == 200
    error = json.loads(responses[0])
    assert error["type"] == "InvalidParameter"
    assert "binary_data_output must be true or false, got 'yes'" in error["message"]


def test_the_answer_limit_counts_the_binary_body(weights_dir):
    model, context = make_handler(weights_dir, task="embedding", max_response_bytes=4 * 2048)
    responses, statuses, _ = run_batch(
        model, context, [{"body": body({"binary_data_output": True})}]
    )
    assert statuses[0][0] == 413
    assert "more than the limit of 8192" in json.loads(responses[0])["message"]


@pytest.mark.integration
def test_torchserve_answers_binary_outputs_tritons_client_reads(torchserve):
    url = f"{torchserve.inference_url}/v2/models/resnet50-embedding/infer"
    headers = torchserve.keys.inference_headers()
    plain = requests.post(url, json=body(outputs=BOTH), headers=headers, timeout=300)
    asked = requests.post(
        url, json=body({"binary_data_output": True}, BOTH), headers=headers, timeout=300
    )
    assert plain.status_code == 200 and asked.status_code == 200, asked.text
    assert asked.headers["Content-Type"].startswith("application/octet-stream")
    result = read_binary(asked.content, asked.headers[HEADER])
    expected = json_outputs(plain.content)
    np.testing.assert_array_equal(result.as_numpy("embedding"), expected["embedding"])
    assert [[json.loads(t) for t in row] for row in result.as_numpy("tags")] == [
        [json.loads(t) for t in row] for row in expected["tags"]
    ]
    assert len(asked.content) < len(plain.content) / 2  # 4 bytes a float instead of ~11
    # tsctl's own reader (no numpy in the client) reads what tritonclient reads.
    ours = {o["name"]: o for o in read_outputs(asked.content, int(asked.headers[HEADER]))}
    assert ours["embedding"]["data"] == result.as_numpy("embedding").reshape(-1).tolist()
    assert ours["tags"]["data"] == [t.decode() for t in result.as_numpy("tags").reshape(-1)]


@pytest.mark.parametrize(
    ("body", "length", "message"),
    [
        (b"{}", "99", "Inference-Header-Content-Length must be the length of the body's JSON"),
        (
            b'{"inputs": [{"name": "images", "datatype": "BYTES", "shape": [1, 1], '
            b'"parameters": {"binary_data_size": 6}}]}\x05\x00\x00\x00ab',
            None,
            "'s binary data is cut short at byte 0",
        ),
        (
            b'{"inputs": [{"name": "images", "datatype": "BYTES", "shape": [1, 1], '
            b'"parameters": {"binary_data_size": 2}}]}abcd',
            None,
            "the body holds 2 bytes after its header that no input's binary_data_size claims",
        ),
    ],
)
def test_a_malformed_binary_body_is_a_400_for_its_request_alone(handler, body, length, message):
    """serveshared.v2binary reads the body; what it cannot read fails its own request, 400."""
    header_length = length or str(body.index(b"}]}") + 3)
    rows = [{"body": body}, {"body": imagegen.jpeg(64, 64)}]
    headers = [{"Inference-Header-Content-Length": header_length}, {}]
    responses, statuses, _ = run_batch(*handler, rows, headers)
    assert statuses[0][0] == 400 and statuses[1] == (200, None)
    assert message in json.loads(responses[0])["message"]
