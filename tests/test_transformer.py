"""The preprocessing server (``transformer/``, issue #44) as a pod runs it beside its predictor:
two processes here, the transformer in front of the session's real TorchServe, crops between
them as v2 binary tensors. The held-out photos are answered as the single server answers them
(the same uint8 crop, so the same arithmetic: equal, not close), and a bad upload fails at the
transformer with the single server's status and body, alone among good requests."""

from __future__ import annotations

import base64
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import requests

from devtools.transformer import LocalTransformer
from tests.corpus import bad_inputs
from transformer.guard import PredictorRefused

REPO = Path(__file__).resolve().parent.parent
PHOTOS = sorted((REPO / "build" / "heldout").glob("*.jpg"))
MODEL = "resnet50-tagger"
EMBEDDING = "resnet50-embedding"
TIMEOUT = 300


@pytest.fixture(scope="module")
def transformer(torchserve, tmp_path_factory):
    predictor = torchserve.inference_url.removeprefix("http://")
    workdir = tmp_path_factory.mktemp("transformer")
    with LocalTransformer(f"{EMBEDDING},{MODEL}", predictor, workdir) as running:
        yield running


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def v1(base: str, images: list[bytes], headers: dict, model: str = MODEL) -> requests.Response:
    body = {"instances": [{"image": {"b64": b64(i)}} for i in images], "parameters": {"topk": 3}}
    return requests.post(
        f"{base}/v1/models/{model}:predict", json=body, headers=headers, timeout=TIMEOUT
    )


def v2(base: str, images: list[bytes], headers: dict) -> requests.Response:
    body = {
        "id": "held-out",
        "inputs": [
            {
                "name": "images",
                "shape": [len(images)],
                "datatype": "BYTES",
                "data": [b64(i) for i in images],
            }
        ],
        "outputs": [{"name": "embedding"}, {"name": "tags", "parameters": {"topk": 4}}],
    }
    return requests.post(
        f"{base}/v2/models/{MODEL}/infer", json=body, headers=headers, timeout=TIMEOUT
    )


def tensors(response: requests.Response) -> dict:
    assert response.status_code == 200, response.text
    return {o["name"]: (o["shape"], o["data"]) for o in response.json()["outputs"]}


def test_the_held_out_photos_are_answered_as_the_single_server_answers_them(
    torchserve, transformer
):
    assert len(PHOTOS) >= 3, "build/heldout holds the held-out photos: run `make weights`"
    photos = [p.read_bytes() for p in PHOTOS]
    key = torchserve.keys.inference_headers()  # forwarded to the predictor by the transformer
    with ThreadPoolExecutor(4) as pool:
        single_v1 = pool.submit(v1, torchserve.inference_url, photos[:2], key)
        split_v1 = pool.submit(v1, transformer.url, photos[:2], key)
        single_vectors = pool.submit(v1, torchserve.inference_url, photos[2:], key, EMBEDDING)
        split_vectors = pool.submit(v1, transformer.url, photos[2:], key, EMBEDDING)
        single_v2 = [pool.submit(v2, torchserve.inference_url, [p], key) for p in photos]
        split_v2 = [pool.submit(v2, transformer.url, [p], key) for p in photos]
    assert split_v1.result().status_code == 200, split_v1.result().text
    assert split_v1.result().json() == single_v1.result().json()
    assert split_vectors.result().status_code == 200, split_vectors.result().text
    # The same float32 values: the single server writes each as its shortest float32 text
    # (orjson), the transformer's KServe answer the float64 of it, so read both as float32.
    split_rows = [p["embedding"] for p in split_vectors.result().json()["predictions"]]
    single_rows = [p["embedding"] for p in single_vectors.result().json()["predictions"]]
    np.testing.assert_array_equal(np.float32(split_rows), np.float32(single_rows))
    for single, split in zip(single_v2, split_v2):
        (shape, embedding), (_, tags) = tensors(single.result()).values()
        got = tensors(split.result())
        assert got["embedding"][0] == shape == [1, 2048]
        np.testing.assert_array_equal(
            np.float32(got["embedding"][1]), np.float32(embedding)
        )  # bit for bit: the same crop through the same arithmetic
        assert got["tags"] == ([1, 4], tags)
        assert split.result().json()["id"] == "held-out"


@pytest.mark.parametrize("case", ["jpeg-truncated", "random-bytes", "decompression-bomb"])
def test_a_bad_upload_fails_at_the_transformer_as_at_the_single_server(
    torchserve, transformer, case
):
    bad = bad_inputs()[case].body
    good = PHOTOS[0].read_bytes()
    key = torchserve.keys.inference_headers()
    with ThreadPoolExecutor(3) as pool:
        single = pool.submit(v1, torchserve.inference_url, [bad], key)
        split = pool.submit(v1, transformer.url, [bad], key)
        beside = pool.submit(v1, transformer.url, [good], key)
    assert split.result().status_code == single.result().status_code >= 400
    assert split.result().json() == single.result().json()
    assert beside.result().status_code == 200, beside.result().text


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (500, "Stub process 'resnet50-tagger_0_0' is not healthy."),
        (404, "Request for unknown model: 'resnet50-tagger' has no available versions"),
    ],
)
def test_a_triton_predictor_whose_model_is_down_is_passed_on_as_503_retry_after(status, message):
    """Triton has no 503 while a model's process is down or loading again; the transformer in
    front of it answers that one, with Retry-After, and passes any other refusal as it came."""
    down = PredictorRefused.of(httpx.Response(status, json={"error": message}))
    assert (down.status, down.headers["Retry-After"]) == (503, "5")
    assert json.loads(down.body)["type"] == "ModelUnavailable"
    other = PredictorRefused.of(httpx.Response(status, json={"error": "unexpected input 'x'"}))
    assert (other.status, other.body) == (status, b'{"error":"unexpected input \'x\'"}')


def test_the_transformers_own_limits(torchserve, tmp_path):
    """Its body limit is a 413 before the predictor is asked; too many images a 413 as the
    single server words it."""
    predictor = torchserve.inference_url.removeprefix("http://")
    photo = PHOTOS[0].read_bytes()
    limits = ("--max_request_bytes=50000", "--max_images_per_request=2")
    with LocalTransformer(MODEL, predictor, tmp_path, extra=limits) as small:
        key = torchserve.keys.inference_headers()
        big = v1(small.url, [photo], key)
        many = v1(small.url, [b"x"] * 3, key)
    assert big.status_code == 413 and big.json()["type"] == "PayloadTooLarge"
    assert (
        "more than the transformer's limit of 50000 (--max_request_bytes)" in big.json()["message"]
    )
    assert many.status_code == 413
    assert "carries 3 images, more than the limit of 2" in many.json()["message"]
