"""Explanations, driven through the handler without a server: compared with Captum run directly
on torchvision's resnet50, checked to mean something on a synthetic case with a known answer,
and every bad request answered with its own 4xx."""

from __future__ import annotations

import base64
import io
import json

import pytest
import torch
import torch.nn.functional as F
from captum.attr import IntegratedGradients, LayerGradCam
from PIL import Image
from torch import nn
from torchvision.models import ResNet50_Weights

from model_files.resnet_dual import build_dual
from servecore.classes import Classes
from servecore.config import ExplainConfig, HandlerConfig
from servecore.errors import InvalidParameter
from servecore.explain import compute as explain
from servecore.explain.options import parse_explain
from servecore.explainvalues import ExplainSpec
from tests import imagegen
from tests.handler_context import make_handler, run_batch

CATEGORIES = ResNet50_Weights.IMAGENET1K_V2.meta["categories"]
EXPLAIN = {"explain": "True"}
PREDICT = {"explain": "False"}
IMAGE = imagegen.jpeg(320, 240, seed=21)
PORTRAIT = imagegen.png(200, 300, seed=22)


@pytest.fixture(scope="module")
def tagger(weights_dir):
    return make_handler(weights_dir, task="tags", draft_decode=False)


def explained(handler_context, rows, headers=None):
    handler, context = handler_context
    responses, statuses, _ = run_batch(
        handler, context, rows, headers or [dict(EXPLAIN) for _ in rows]
    )
    return [json.loads(r) for r in responses], statuses


def as_json(image: bytes = IMAGE, **fields) -> dict:
    """A JSON request as TorchServe hands it over (already parsed)."""
    return {"body": {"data": base64.b64encode(image).decode(), **fields}}


def scaled_to_max(x: torch.Tensor) -> torch.Tensor:
    return x / x.max()


# ---------------------------------------------------------------- independent reference


def test_gradcam_equals_captum_on_torchvision(tagger, reference):
    answers, statuses = explained(tagger, [{"body": IMAGE}])
    assert statuses == [(200, None)]
    (item,) = answers[0]["explanations"]
    pixels = reference.input(IMAGE)
    model = reference.model
    with torch.no_grad():
        top1 = int(model(pixels).argmax())
    expected = LayerGradCam(model, model.layer4).attribute(pixels, target=top1)[0, 0].detach()
    expected = scaled_to_max(expected.clamp(min=0))
    assert answers[0]["method"] == "gradcam"
    assert (item["index"], item["label"], item["rank"]) == (top1, CATEGORIES[top1], 1)
    assert torch.tensor(item["grid"]) == pytest.approx(expected, abs=2e-3)


def test_integrated_gradients_equals_captum_on_torchvision(tagger, reference):
    answers, statuses = explained(
        tagger, [as_json(target=281, method="ig", n_steps=4, internal_batch_size=4)]
    )
    assert statuses == [(200, None)]
    (item,) = answers[0]["explanations"]
    pixels = reference.input(IMAGE)
    attributions = (
        IntegratedGradients(reference.model)
        .attribute(pixels, baselines=torch.zeros_like(pixels), target=281, n_steps=4)
        .detach()
    )
    expected = scaled_to_max(F.avg_pool2d(attributions.abs().sum(dim=1), 8)[0])
    assert (item["index"], item["label"]) == (281, CATEGORIES[281])
    assert torch.tensor(item["grid"]).shape == (28, 28)
    assert torch.tensor(item["grid"]) == pytest.approx(expected, abs=2e-3)


# ---------------------------------------------------------------- the attribution means something

REGION = (slice(0, 112), slice(112, 224))  # top-right quadrant: a flip or transpose moves it


class OnlyRegionSeen(nn.Module):
    """The served model behind a mask: only the top-right quadrant can change any score."""

    def __init__(self, dual: nn.Module) -> None:
        super().__init__()
        self.dual = dual
        mask = torch.zeros(1, 1, 224, 224)
        mask[..., REGION[0], REGION[1]] = 1
        self.register_buffer("mask", mask)

    def forward(self, x):
        return self.dual(x * self.mask)


def mass_in_region(grid) -> float:
    """The share of a heatmap's mass (stretched over the 224x224 crop as the PNG shows it)
    inside REGION."""
    grid = torch.as_tensor(grid, dtype=torch.float32)
    up = F.interpolate(grid[None, None], size=(224, 224), mode="bilinear", align_corners=False)[
        0, 0
    ].clamp(min=0)
    return float(up[REGION].sum() / up.sum())


@pytest.mark.parametrize(("method", "share"), [("gradcam", 0.45), ("ig", 0.9)])
def test_heatmap_mass_falls_where_the_model_can_see(weights_dir, reference, method, share):
    dual = build_dual(torch.load(weights_dir / "resnet50.pt", weights_only=True))
    masked = OnlyRegionSeen(dual).eval()
    explainer = explain.Explainer(
        masked, dual.backbone.layer4, HandlerConfig().explain.png_max_side
    )
    pixels = torch.cat([reference.input(imagegen.jpeg(300, 300, seed=s)) for s in (1, 2)])
    with torch.no_grad():
        logits = masked(pixels)[1]
    spec = ExplainSpec(method, (), 1, n_steps=4, internal_batch_size=8, png=False)
    answers = explainer.explain(
        pixels,
        logits,
        [explain.ExplainJob(spec, range(2), [])],
        Classes.of([str(i) for i in range(logits.shape[1])]),
    )
    grids = [image[0].grid for image in answers[0]]
    # What a uniform, a random or a mirrored map would score: the test must fail those.
    torch.manual_seed(0)
    noise = max(mass_in_region(torch.rand(7, 7)) for _ in range(100))
    assert mass_in_region(torch.ones(7, 7)) == pytest.approx(0.25)
    assert noise < share
    for grid in grids:
        assert mass_in_region(grid) >= share
        assert mass_in_region(grid.flip(0)) < share
        assert mass_in_region(grid.T) < share


# ---------------------------------------------------------------- targets, batches, PNG


def test_mixed_batch_each_request_gets_its_own_answer(tagger, reference):
    multipart_png = {"data": PORTRAIT, "target": b"tabby", "png": b"true"}
    rows = [
        {"body": IMAGE},  # a prediction
        multipart_png,  # explain a named class, with PNG
        as_json(topk=3),  # explain the top 3
        as_json(target="no such class"),
        as_json(method="lime"),
        as_json(method="ig", n_steps=10_000),
        {
            "body": json.dumps(
                {
                    "instances": [{"data": base64.b64encode(IMAGE).decode()}] * 2,
                    "parameters": {"target": [5, "goldfish"]},
                }
            ).encode()
        },
    ]
    headers = [PREDICT] + [EXPLAIN] * 6
    answers, statuses = explained(tagger, rows, headers)
    assert statuses == [(200, None)] * 3 + [(400, "Bad Request")] * 3 + [(200, None)]
    prediction, named, top3, unknown, bad_method, too_many, v1 = answers
    _, logits = reference(IMAGE)
    assert [t["index"] for t in prediction] == logits.topk(5).indices.tolist()
    (item,) = named["explanations"]
    assert (item["index"], item["label"]) == (281, "tabby")
    picture = Image.open(io.BytesIO(base64.b64decode(item["png"])))
    assert picture.format == "PNG" and picture.size == (200, 300)  # the input's own size
    assert [e["index"] for e in top3["explanations"]] == logits.topk(3).indices.tolist()
    assert [e["rank"] for e in top3["explanations"]] == [1, 2, 3]
    probabilities = torch.softmax(logits, 0)
    for e in top3["explanations"]:
        assert e["probability"] == pytest.approx(float(probabilities[e["index"]]), rel=1e-4)
        grid = torch.tensor(e["grid"])
        assert grid.shape == (7, 7) and grid.min() >= 0 and grid.max() <= 1
        assert grid.max() == 1 or e["empty"]
    assert unknown["type"] == "InvalidParameter" and "no such class" in unknown["message"]
    assert bad_method["type"] == "InvalidParameter" and "lime" in bad_method["message"]
    assert too_many["type"] == "InvalidParameter" and "n_steps" in too_many["message"]
    assert len(v1["explanations"]) == 2
    assert [[e["index"] for e in image["explanations"]] for image in v1["explanations"]] == [
        [5, 1],
        [5, 1],
    ]


def test_png_is_bounded_and_keeps_the_aspect_ratio(tagger):
    large = imagegen.jpeg(1600, 900, seed=23)
    answers, statuses = explained(tagger, [{"data": large, "png": b"1"}])
    assert statuses == [(200, None)]
    png = base64.b64decode(answers[0]["explanations"][0]["png"])
    picture = Image.open(io.BytesIO(png))
    assert picture.size == (448, 252)
    assert len(png) < 1_000_000


def test_item_in_batch_equals_item_alone(tagger):
    alone, _ = explained(tagger, [{"data": IMAGE, "target": b"#7"}])
    batched, statuses = explained(tagger, [{"data": PORTRAIT}, {"data": IMAGE, "target": b"#7"}])
    assert statuses == [(200, None)] * 2
    assert torch.tensor(batched[1]["explanations"][0]["grid"]) == pytest.approx(
        torch.tensor(alone[0]["explanations"][0]["grid"]), abs=1e-3
    )


def test_embedding_model_explains_its_embedding_by_default(weights_dir):
    answers, statuses = explained(
        make_handler(weights_dir, task="embedding"),
        [{"body": IMAGE}, {"data": IMAGE, "target": b"tabby"}],
    )
    assert statuses == [(200, None)] * 2
    assert answers[0]["explanations"][0]["target"] == "embedding"
    assert answers[1]["explanations"][0]["label"] == "tabby"
    for answer in answers:
        grid = torch.tensor(answer["explanations"][0]["grid"])
        assert grid.shape == (7, 7) and float(grid.max()) == 1.0


def test_explanation_work_beyond_the_batch_budget_is_a_503(weights_dir):
    handler = make_handler(weights_dir, explain={"max_passes_per_batch": 2})
    answers, statuses = explained(
        handler,
        [
            {"data": IMAGE},
            {"data": IMAGE, "topk": b"2"},
            {"body": IMAGE},
            {"data": IMAGE},
            {"data": IMAGE, "method": b"ig", "n_steps": b"3"},
        ],
    )
    assert [s[0] for s in statuses] == [200, 503, 200, 503, 400]
    assert answers[1]["type"] == "Overloaded"
    assert "explain.max_passes_per_batch" in answers[4]["message"]
    responses, _, _ = run_batch(*handler, [{"body": IMAGE}], [PREDICT])
    assert len(json.loads(responses[0])) == 5


def test_an_explanation_that_could_never_fit_takes_no_share_of_the_batch(weights_dir):
    """Refused (400) when it is opened, it leaves the batch's one row to the next request."""
    handler = make_handler(
        weights_dir,
        max_batch_images=1,
        max_images_per_request=1,
        explain={"max_passes_per_batch": 2},
    )
    answers, statuses = explained(
        handler, [{"data": IMAGE, "method": b"ig", "n_steps": b"3"}, {"data": IMAGE}]
    )
    assert [s[0] for s in statuses] == [400, 200]
    assert "explain.max_passes_per_batch" in answers[0]["message"]
    assert answers[1]["explanations"]


def test_explain_parameters_on_a_prediction_are_a_400(tagger):
    answers, statuses = explained(tagger, [{"data": IMAGE, "target": b"5"}], [PREDICT])
    assert statuses == [(400, "Bad Request")]
    assert "/explanations" in answers[0]["message"]


def test_a_client_explain_header_does_not_turn_a_prediction_into_an_explanation(tagger):
    # TorchServe sets "explain" itself; a client's "Explain: True" arrives beside it.
    answers, statuses = explained(
        tagger, [{"body": IMAGE}], [{"explain": "False", "Explain": "True"}]
    )
    assert statuses == [(200, None)] and len(answers[0]) == 5


@pytest.mark.parametrize(
    ("options", "word"),
    [
        ({"target": 1000}, "1000"),
        ({"target": []}, "at least one"),
        ({"png": "maybe"}, "png"),
        ({"topk": 6}, "at most 5"),
        ({"n_steps": 0}, "n_steps"),
        ({"internal_batch_size": "x"}, "internal_batch_size"),
    ],
)
def test_bad_explain_parameters_are_400s(tagger, options, word):
    answers, statuses = explained(tagger, [as_json(**options)])
    assert statuses == [(400, "Bad Request")]
    assert word in answers[0]["message"]


STARS = ["1", "2", "3", "4", "5"]
YEARS = ["2019", "2020", "2021", "2022", "2023"]


@pytest.mark.parametrize(
    ("labels", "target", "classes"),
    [
        (STARS, b"3", (2,)),  # a form field's text: the label "3", not row 3 (label "4")
        (STARS, "3", (2,)),
        (STARS, 3, (3,)),  # a JSON integer: the index
        (STARS, "#3", (3,)),
        (STARS, ["5", "#0", 1], (4, 0, 1)),
        (YEARS, "2019", (0,)),  # 2019 named, not refused as an index
        (["ice_cream", "ice cream sandwich", "Cat"], "ice_cream", (0,)),
        (["ice_cream", "ice cream sandwich", "Cat"], "cat", (2,)),
        (CATEGORIES, "cardigan", (474,)),  # as written first: ImageNet has Cardigan and cardigan
        (CATEGORIES, "Cardigan", (264,)),
        (CATEGORIES, "#281", (281,)),
        (CATEGORIES, "embedding", (-1,)),
    ],
)
def test_a_target_is_a_label_first_an_index_only_as_an_integer_or_hash(labels, target, classes):
    spec = parse_explain({"target": target}, None, labels, ExplainConfig())
    assert spec.classes == classes


@pytest.mark.parametrize(
    ("labels", "target", "words"),
    [
        (CATEGORIES, "281", "no label 281; the class index is '#281'"),
        (STARS, "0", "no label 0; the class index is '#0'"),
        (STARS, "#5", "index 5 is not in 0..4"),
        (STARS, 7, "index 7 is not in 0..4"),
    ],
)
def test_a_target_that_names_no_label_says_how_to_give_an_index(labels, target, words):
    with pytest.raises(InvalidParameter) as refused:
        parse_explain({"target": target}, None, labels, ExplainConfig())
    assert words in refused.value.message
