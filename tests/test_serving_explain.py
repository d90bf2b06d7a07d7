"""Explanations through a real TorchServe: /explanations/{model} and KServe v1 :explain, one
and several concurrent requests with their own targets, mixed with predictions."""

from __future__ import annotations

import base64
import io
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch
from PIL import Image
from torchvision.models import ResNet50_Weights

from serveclient.errors import ApiError
from tests import imagegen
from tests.served import raw_answer, tsctl

pytestmark = pytest.mark.integration
CATEGORIES = ResNet50_Weights.IMAGENET1K_V2.meta["categories"]
IMAGE = imagegen.jpeg(400, 300, seed=31)
MAX_RESPONSE_BYTES = 1_000_000  # a PNG of at most 448 px a side plus the grid


def post(ts, path, **kwargs):
    return requests.post(
        f"{ts.inference_url}{path}", headers=ts.keys.inference_headers(), timeout=300, **kwargs
    )


def top(reference, image=IMAGE, k=1) -> list[int]:
    _, logits = reference(image)
    return logits.topk(k).indices.tolist()


def served_top(ts, image=IMAGE, k=5) -> list[int]:
    """The served tagger's own top-k for ``image``, asked alone. Explanation targets are ranked
    by the served logits, whose precision (bf16 by default) can swap near-ties of these
    untrained weights against float32; the top class is checked against torchvision above."""
    return [t["index"] for t in raw_answer(ts, "resnet50-tagger", image, **{"X-Top-K": str(k)})]


def check_grid(item, side):
    grid = torch.tensor(item["grid"])
    assert grid.shape == (side, side)
    assert float(grid.min()) >= 0 and float(grid.max()) <= 1
    assert float(grid.max()) == 1 or item["empty"]


def test_explanations_route_answers_the_top_class(torchserve, reference):
    response = post(torchserve, "/explanations/resnet50-tagger", data=IMAGE)
    assert response.status_code == 200, response.text
    answer = response.json()
    (item,) = answer["explanations"]
    assert answer["method"] == "gradcam"
    assert item["index"] == top(reference)[0] and item["label"] == CATEGORIES[item["index"]]
    check_grid(item, 7)
    assert len(response.content) < MAX_RESPONSE_BYTES


def test_concurrent_explanations_and_predictions_each_get_their_own_answer(torchserve, reference):
    targets = [281, "goldfish", 7, "tench", None, 999]
    expected = [281, 1, 7, 0, top(reference)[0], 999]

    def explained(target):
        index = f"#{target}" if isinstance(target, int) else target  # a form field's text
        fields = {"png": "true"} if target is None else {"target": index, "png": "true"}
        return post(
            torchserve,
            "/explanations/resnet50-tagger",
            files={"data": ("image.jpg", IMAGE)},
            data=fields,
        )

    def predicted(_):
        return post(torchserve, "/predictions/resnet50-tagger", data=IMAGE)

    with ThreadPoolExecutor(len(targets) + 4) as pool:
        explanations = list(pool.map(explained, targets))
        predictions = pool.map(predicted, range(4))
    for response, index in zip(explanations, expected):
        assert response.status_code == 200, response.text
        assert len(response.content) < MAX_RESPONSE_BYTES
        (item,) = response.json()["explanations"]
        assert item["index"] == index and item["label"] == CATEGORIES[index]
        check_grid(item, 7)
        picture = Image.open(io.BytesIO(base64.b64decode(item["png"])))
        assert picture.format == "PNG" and picture.size == (400, 300)
    alone = served_top(torchserve, k=5)
    for response in predictions:
        assert response.status_code == 200
        assert [t["index"] for t in response.json()] == alone


def test_kserve_v1_explain_with_several_instances(torchserve, reference):
    instances = [
        {"data": base64.b64encode(IMAGE).decode()},
        {"data": base64.b64encode(imagegen.png(300, 200, seed=32)).decode()},
    ]
    body = {"instances": instances, "parameters": {"topk": 2, "method": "ig", "n_steps": 4}}
    response = post(torchserve, "/v1/models/resnet50-tagger:explain", json=body)
    assert response.status_code == 200, response.text
    first, second = response.json()["explanations"]
    assert [e["index"] for e in first["explanations"]] == served_top(torchserve, k=2)
    assert first["explanations"][0]["index"] == top(reference)[0]
    assert len(second["explanations"]) == 2 and first["method"] == "ig"
    for item in first["explanations"] + second["explanations"]:
        check_grid(item, 28)


def test_embedding_model_explains_its_embedding(torchserve):
    response = post(torchserve, "/explanations/resnet50-embedding", data=IMAGE)
    assert response.status_code == 200, response.text
    (item,) = response.json()["explanations"]
    assert item["target"] == "embedding"
    check_grid(item, 7)


@pytest.mark.parametrize(
    ("fields", "status", "kind"),
    [
        ({"target": "no such class"}, 400, "InvalidParameter"),
        ({"method": "lime"}, 400, "InvalidParameter"),
        ({"method": "ig", "n_steps": "100000"}, 400, "InvalidParameter"),
    ],
)
def test_bad_explanations_get_their_own_4xx(torchserve, fields, status, kind):
    response = post(
        torchserve,
        "/explanations/resnet50-tagger",
        files={"data": ("image.jpg", IMAGE)},
        data=fields,
    )
    assert response.status_code == status
    assert response.json()["type"] == kind


def test_v2_has_no_explain_route_of_ours(torchserve):
    body = {
        "inputs": [
            {
                "name": "image",
                "shape": [1],
                "datatype": "BYTES",
                "data": [base64.b64encode(IMAGE).decode()],
            }
        ]
    }
    response = post(torchserve, "/v2/models/resnet50-tagger/explain", json=body)
    assert response.status_code == 501 and response.json()["type"] == "NotSupported"


def test_tsctl_saves_the_heatmap_and_the_client_reports_refusals(torchserve, tmp_path):
    image = tmp_path / "photo.jpg"
    image.write_bytes(IMAGE)
    out = tmp_path / "heatmap.png"
    run = tsctl(torchserve, "--json", "explain", str(image), "--target", "tabby", "--out", str(out))
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["explanations"][0]["index"] == 281
    assert Image.open(out).size == (400, 300)
    with pytest.raises(ApiError) as refused:
        torchserve.client().explain("resnet50-tagger", IMAGE, target="no such class")
    assert refused.value.status == 400
