"""Crops as a model input (issue #44): a v2 ``UINT8`` tensor ``crops`` [n, 224, 224, 3], as JSON
or in the binary tensor extension, answered exactly as the same image sent encoded; a wrong one
is a 400 for its own request. The parsing against the core, the answers on a real TorchServe
(Triton's: tests/test_triton.py)."""

from __future__ import annotations

import base64
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests

from servecore.config import HandlerConfig
from servecore.edges.http import HttpRequest, parse_http
from servecore.errors import InvalidRequest, PayloadTooLarge
from servecore.preprocessor import Preprocessor
from serveshared import v2binary
from tests import imagegen

REPO = Path(__file__).resolve().parent.parent

CONFIG = HandlerConfig()
IMAGES = [imagegen.jpeg(320, 240, seed=71), imagegen.png(300, 420, seed=72)]


def hwc(image: bytes, config: HandlerConfig = CONFIG) -> np.ndarray:
    """The served recipe's crop of ``image`` as a client holds it: uint8 [224, 224, 3]."""
    return Preprocessor(config)(image).permute(1, 2, 0).numpy()


def crops_body(crops: np.ndarray, shape: list | None = None, datatype: str = "UINT8") -> dict:
    return {
        "inputs": [
            {
                "name": "crops",
                "datatype": datatype,
                "shape": list(crops.shape) if shape is None else shape,
                "data": crops.reshape(-1).tolist(),
            }
        ]
    }


def binary_body(crops: np.ndarray, parameters: dict | None = None) -> tuple[bytes, dict]:
    """The binary tensor extension's body (JSON header, then the raw crops) and its headers."""
    header = {
        "inputs": [v2binary.binary_tensor("crops", "UINT8", crops.shape, crops.nbytes)],
        **({"parameters": parameters} if parameters else {}),
    }
    return v2binary.binary_body(header, crops.tobytes())


def test_a_v2_uint8_tensor_parses_to_each_crops_hwc_bytes():
    crops = np.stack([hwc(i) for i in IMAGES])
    parsed = parse_http(HttpRequest(body=json.dumps(crops_body(crops))), CONFIG)
    assert parsed.crops
    assert parsed.images == [crops[0].tobytes(), crops[1].tobytes()]
    body, headers = binary_body(crops)
    binary = parse_http(
        HttpRequest(body=body, header_length=headers["Inference-Header-Content-Length"]), CONFIG
    )
    assert binary.crops and binary.images == parsed.images


@pytest.mark.parametrize(
    ("shape", "datatype", "says"),
    [
        ([1, 3, 224, 224], "UINT8", "shape must be [n, 224, 224, 3]"),
        ([224, 224, 3], "UINT8", "shape must be [n, 224, 224, 3]"),
        ([2, 224, 224, 3], "UINT8", "holds 150528 values, its shape [2, 224, 224, 3] says 301056"),
        ([1, 224, 224, 3], "FP32", 'datatype must be "BYTES" (base64-encoded images) or "UINT8"'),
    ],
)
def test_a_wrong_crop_tensor_is_a_400_that_says_what_was_expected(shape, datatype, says):
    body = crops_body(hwc(IMAGES[0])[None], shape, datatype)
    with pytest.raises(InvalidRequest) as error:
        parse_http(HttpRequest(body=json.dumps(body)), CONFIG)
    assert says in str(error.value)


def test_crop_values_outside_uint8_are_a_400():
    body = crops_body(hwc(IMAGES[0])[None])
    body["inputs"][0]["data"][7] = 256
    with pytest.raises(InvalidRequest, match=r"integers 0\.\.255"):
        parse_http(HttpRequest(body=json.dumps(body)), CONFIG)


def test_crops_count_against_max_images_per_request():
    crops = np.zeros((3, 224, 224, 3), dtype=np.uint8)
    body, headers = binary_body(crops)
    with pytest.raises(PayloadTooLarge, match="carries 3 images, more than the limit of 2"):
        parse_http(
            HttpRequest(body=body, header_length=headers["Inference-Header-Content-Length"]),
            HandlerConfig(max_images_per_request=2),
        )


def test_binary_data_the_header_does_not_claim_is_a_400():
    body, headers = binary_body(np.zeros((1, 224, 224, 3), dtype=np.uint8))
    with pytest.raises(InvalidRequest, match="1 bytes after its header that no input"):
        parse_http(
            HttpRequest(body=body + b"x", header_length=headers["Inference-Header-Content-Length"]),
            CONFIG,
        )


# ------------------------------------------------------------------ on a real TorchServe


def v2(ts, model: str, **kwargs) -> requests.Response:
    headers = {**ts.keys.inference_headers(), **kwargs.pop("headers", {})}
    return requests.post(
        f"{ts.inference_url}/v2/models/{model}/infer", headers=headers, timeout=120, **kwargs
    )


def encoded_body(images: list[bytes], parameters: dict | None = None) -> dict:
    data = [base64.b64encode(i).decode() for i in images]
    tensor = {"name": "images", "datatype": "BYTES", "shape": [len(images), 1], "data": data}
    return {"inputs": [tensor], **({"parameters": parameters} if parameters else {})}


def outputs(response: requests.Response) -> dict:
    assert response.status_code == 200, response.text
    return {o["name"]: o["data"] for o in response.json()["outputs"]}


@pytest.mark.integration
@pytest.mark.parametrize("model", ["resnet50-embedding", "resnet50-tagger"])
def test_torchserve_answers_crops_bit_for_bit_as_the_encoded_images(torchserve, model):
    """The same request size (so the same batch arithmetic): JSON crops, binary crops and the
    encoded images get the same numbers, to the last bit; describe names the input."""
    crops = np.stack([hwc(i) for i in IMAGES])
    params = {"topk": 5}
    encoded = outputs(v2(torchserve, model, json=encoded_body(IMAGES, params)))
    as_json = outputs(v2(torchserve, model, json={**crops_body(crops), "parameters": params}))
    body, headers = binary_body(crops, params)
    as_binary = outputs(v2(torchserve, model, data=body, headers=headers))
    assert as_json == encoded
    assert as_binary == encoded
    described = torchserve.client().describe(model, customized=True)[0]["customizedMetadata"]
    assert described["crops_input"]["shape"] == ["n", 224, 224, 3]
    assert described["crops_input"]["recipe"] == described["preprocessing"]["input"]


@pytest.mark.integration
def test_a_wrong_crop_tensor_fails_its_own_request_in_a_batch(torchserve):
    good = crops_body(hwc(IMAGES[0])[None])
    bad = crops_body(hwc(IMAGES[0])[None].transpose(0, 3, 1, 2))  # channels first
    with ThreadPoolExecutor(4) as pool:
        answers = list(
            pool.map(
                lambda body: v2(torchserve, "resnet50-embedding", json=body),
                [good, bad, good, good],
            )
        )
    assert [a.status_code for a in answers] == [200, 400, 200, 200]
    assert "shape must be [n, 224, 224, 3]" in answers[1].text
    assert "got [1, 3, 224, 224]" in answers[1].text


# ------------------------------------------------------------- tsctl --preprocess client


@pytest.mark.integration
def test_client_side_crops_give_the_same_rows_for_20x_fewer_bytes(torchserve, tmp_path):
    """12 MP photos embedded with --preprocess client (the core's decode and crop on the
    client, crops in the binary extension) against --preprocess server (the files, base64 in
    JSON): the same rows, and the bytes the client counted itself at least 20x fewer."""
    import shutil

    from serveclient.vectors import read_matrix
    from tests.served import tsctl

    photos = tmp_path / "photos"
    photos.mkdir()
    shutil.copy(REPO / "build" / "samples" / "chelsea-12mp-noisy.jpg", photos / "a.jpg")
    (photos / "b.jpg").write_bytes(imagegen.jpeg(4000, 3000, seed=73))
    runs = {}
    for mode in ("server", "client"):
        out = tmp_path / f"{mode}.parquet"
        run = tsctl(
            torchserve, "embed", str(photos), "--out", str(out), "--preprocess", mode, "--json"
        )
        assert run.returncode == 0, run.stderr
        runs[mode] = (json.loads(run.stdout), read_matrix(out))
    (server, (names, by_server)), (client, (client_names, by_client)) = runs.values()
    assert (server["done"], client["done"]) == (2, 2)
    assert (server["preprocess"], client["preprocess"]) == ("server", "client")
    assert client_names == names
    np.testing.assert_allclose(by_client, by_server, rtol=1e-5, atol=1e-6)
    assert server["bytes_sent"] >= 20 * client["bytes_sent"], (server, client)


@pytest.mark.integration
def test_client_side_crops_are_refused_for_another_recipe(torchserve):
    from serveclient import errors
    from serveclient.preprocess import ClientCrops

    entry = torchserve.client().describe("resnet50-embedding", customized=True)[0]
    ClientCrops(entry)  # the server's recipe is ours
    entry["customizedMetadata"]["preprocessing"] = {"input": "uint8-crop-v0"}
    with pytest.raises(errors.UsageError, match="recipe is uint8-crop-v0, this client's is"):
        ClientCrops(entry)
