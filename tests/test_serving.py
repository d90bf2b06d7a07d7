"""A real TorchServe (Java frontend, real workers, free ports) serving the built archives."""

from __future__ import annotations

import base64
import hashlib
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import yaml
from torchvision.models import ResNet50_Weights

from tests import imagegen
from tests.conftest import REPO
from tests.reference import rel_error, tolerance
from tests.served import handled, settled

pytestmark = pytest.mark.integration
CATEGORIES = set(ResNet50_Weights.IMAGENET1K_V2.meta["categories"])
# Served images are JPEG-decoded in draft mode when large; these are small enough (shorter side
# < 2 x 232) that draft decoding is exact, so the reference comparison stays tight.
IMAGE = imagegen.jpeg(400, 300, seed=11)
TOLERANCE = 1e-4  # batched vs single answers of one server: the same arithmetic


def served_precision(ts, model: str) -> str:
    """The arithmetic the archive really runs (describe): f32, bf16, int8+bf16, ..."""
    return ts.client().describe(model, customized=True)[0]["customizedMetadata"]["precision"]


def predict(ts, model, form, image=IMAGE, headers=None, **fields):
    """POST one image to /predictions/{model} in one of the three request forms."""
    url = f"{ts.inference_url}/predictions/{model}"
    auth = {**ts.keys.inference_headers(), **(headers or {})}
    if form == "raw":
        return requests.post(url, data=image, headers=auth, timeout=120)
    if form == "multipart":
        return requests.post(
            url,
            files={"data": ("image.jpg", image, "image/jpeg")},
            data=fields,
            headers=auth,
            timeout=120,
        )
    body = {"data": base64.b64encode(image).decode(), **fields}
    return requests.post(url, json=body, headers=auth, timeout=120)


def test_ping_needs_the_inference_token(torchserve):
    ok = requests.get(
        f"{torchserve.inference_url}/ping", headers=torchserve.keys.inference_headers(), timeout=10
    )
    assert ok.status_code == 200 and ok.json()["status"] == "Healthy"
    refused = requests.get(f"{torchserve.inference_url}/ping", timeout=10)
    assert refused.status_code == 400
    assert "Token Authorization failed" in refused.json()["message"]


def test_prediction_without_token_is_refused(torchserve):
    for headers in ({}, {"Authorization": "Bearer wrong-key"}):
        response = requests.post(
            f"{torchserve.inference_url}/predictions/resnet50-tagger",
            data=IMAGE,
            headers=headers,
            timeout=30,
        )
        assert response.status_code == 400
        assert "Token Authorization failed" in response.json()["message"]


@pytest.mark.parametrize("form", ["raw", "multipart", "json"])
def test_embedding_model_answers_every_form(torchserve, reference, form):
    response = predict(torchserve, "resnet50-embedding", form)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    vector = response.json()["embedding"]
    expected, _ = reference(IMAGE)
    assert len(vector) == 2048
    precision = served_precision(torchserve, "resnet50-embedding")
    assert rel_error(vector, expected / expected.norm()) <= tolerance(precision), precision


@pytest.mark.parametrize("form", ["raw", "multipart", "json"])
def test_tagger_answers_every_form(torchserve, reference, form):
    response = predict(torchserve, "resnet50-tagger", form)
    assert response.status_code == 200, response.text
    tags = response.json()
    _, logits = reference(IMAGE)
    top = logits.softmax(0).topk(5)
    assert all(t["label"] in CATEGORIES for t in tags)
    if served_precision(torchserve, "resnet50-tagger") != "f32":
        # bf16/int8 move logits by up to ~0.5: only the top class is stable against float32.
        assert tags[0]["index"] == top.indices[0]
        return
    assert [t["index"] for t in tags] == top.indices.tolist()
    assert [t["probability"] for t in tags] == pytest.approx(top.values.tolist(), rel=1e-4)


def test_top_k_from_field_json_and_header(torchserve):
    assert len(predict(torchserve, "resnet50-tagger", "multipart", topk="7").json()) == 7
    assert len(predict(torchserve, "resnet50-tagger", "json", topk=2).json()) == 2
    assert len(predict(torchserve, "resnet50-tagger", "raw", headers={"X-Top-K": "9"}).json()) == 9


@pytest.mark.parametrize("bad", ["0", "1001", "abc", "2.5"])
def test_bad_top_k_is_a_400(torchserve, bad):
    response = predict(torchserve, "resnet50-tagger", "multipart", topk=bad)
    assert response.status_code == 400
    assert response.json() == {
        "code": 400,
        "type": "InvalidParameter",
        "message": f"topk must be an integer from 1 to 1000 (the model's classes), got {bad}"
        if bad == "1001"
        else f"topk must be a positive integer, got {bad!r}",
    }


def test_concurrent_requests_are_batched_and_match_single_answers(torchserve):
    images = [imagegen.jpeg(400, 300, seed=100 + i) for i in range(16)]

    def seen() -> tuple[float, float]:
        return handled(torchserve, "resnet50-embedding")

    earlier = seen()
    singles = [
        predict(torchserve, "resnet50-embedding", "raw", image).json()["embedding"]
        for image in images
    ]
    before = settled(seen, lambda now: now[0] >= earlier[0] + 16)
    with ThreadPoolExecutor(max_workers=16) as pool:
        responses = list(
            pool.map(lambda im: predict(torchserve, "resnet50-embedding", "raw", im), images)
        )
    assert [r.status_code for r in responses] == [200] * 16
    batch_sizes = [int(r.headers["x-batch-size"]) for r in responses]
    assert max(batch_sizes) > 1, batch_sizes
    for single, response in zip(singles, responses):
        assert rel_error(response.json()["embedding"], single) <= TOLERANCE
    # The handler's own histogram agrees: fewer batches than requests, 16 requests in all.
    after = settled(seen, lambda now: now[0] - before[0] >= 16)
    total, batches = after[0] - before[0], after[1] - before[1]
    assert total == 16 and batches < 16


def test_describe_reports_weights_and_batch_settings(torchserve, weights_dir):
    headers = torchserve.keys.management_headers()
    checkpoint_sha = hashlib.sha256((weights_dir / "resnet50.pt").read_bytes()).hexdigest()
    for model in ("resnet50-embedding", "resnet50-tagger"):
        described = requests.get(
            f"{torchserve.management_url}/models/{model}",
            params={"customized": "true"},
            headers=headers,
            timeout=60,
        )
        assert described.status_code == 200
        info = described.json()[0]
        config = yaml.safe_load((REPO / "config" / "models" / f"{model}.yaml").read_text())
        assert info["batchSize"] == config["batchSize"] > 1
        assert info["maxBatchDelay"] == config["maxBatchDelay"]
        weights = info["customizedMetadata"]["weights"]
        assert weights["sha256"] == checkpoint_sha
        assert weights["source"] in ("imagenet", "checkpoint", "seeded-untrained")
        assert weights["trained"] == (weights["source"] != "seeded-untrained")
        if not weights["trained"]:
            assert "UNTRAINED" in weights["warning"]
        assert info["customizedMetadata"]["handler"]["task"] == model.split("-")[1].replace(
            "tagger", "tags"
        )


def test_management_api_needs_its_token(torchserve):
    response = requests.get(f"{torchserve.management_url}/models", timeout=10)
    assert response.status_code == 400
    wrong = requests.get(
        f"{torchserve.management_url}/models",
        headers=torchserve.keys.inference_headers(),
        timeout=10,
    )
    assert wrong.status_code == 400


def test_management_client_lists_describes_and_scales(torchserve):
    from serveclient.errors import ApiError

    client = torchserve.client()
    assert sorted(m["modelName"] for m in client.list_models()) == [
        "resnet50-embedding",
        "resnet50-embedding-bulk",  # its bulk lane
        "resnet50-tagger",
    ]
    assert client.describe("resnet50-tagger", customized=True)[0]["customizedMetadata"]
    try:
        client.scale("resnet50-tagger", 2)
        workers = client.describe("resnet50-tagger")[0]["workers"]
        assert len(workers) == 2 and {w["status"] for w in workers} == {"READY"}
        assert predict(torchserve, "resnet50-tagger", "raw").status_code == 200
    finally:
        client.scale("resnet50-tagger", 1)
    assert len(client.describe("resnet50-tagger")[0]["workers"]) == 1
    with pytest.raises(ApiError) as missing:
        client.describe("no-such-model")
    assert missing.value.status == 404


def test_describe_header_is_ignored(torchserve):
    # (explanations: tests/test_serving_explain.py)
    described = predict(torchserve, "resnet50-tagger", "raw", headers={"describe": "True"})
    assert described.status_code == 200 and len(described.json()) == 5
