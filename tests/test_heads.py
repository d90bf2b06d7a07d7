"""Several tagger heads from one forward (``buildsteps.weights --add-head``): ImageNet's head and
a user's 37-class head on the same backbone, built into one checkpoint and served through the
TorchServe handler in process. Each head's tags are what torchvision's own model, loaded from
that head's own checkpoint, answers (its own softmax and top k), each tag names its head; the
``topk`` bound is the largest head's; explanations and the content cache keep the heads; a head
on another backbone, a taken name or labels that do not match are refused at build time and
build nothing."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import torch
from torchvision.models import ResNet50_Weights

from buildsteps import weights
from buildsteps.evaluate import accuracy
from buildsteps.weights import AddedHead
from model_files.artifacts import INFO, LABELS
from servecore.classes import Classes
from servecore.precision import agreement
from tests import imagegen
from tests.handler_context import make_handler, run_batch
from tests.reference import Reference, rel_error

CLASSES = 37
NAMES = [f"product-{i:02d}" for i in range(CLASSES)]
IMAGENET = list(ResNet50_Weights.IMAGENET1K_V2.meta["categories"])


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """The seeded ImageNet-shaped weights, and a 37-class head's checkpoint on their backbone
    (what ``tsctl head train`` writes: the same backbone, another fc), with its labels."""
    root = tmp_path_factory.mktemp("heads")
    weights.build("seeded", root / "imagenet")
    state = torch.load(root / "imagenet" / "resnet50.pt", weights_only=True)
    generator = torch.Generator().manual_seed(37)
    head = {
        **state,
        "fc.weight": torch.randn(CLASSES, 2048, generator=generator) * 0.05,
        "fc.bias": torch.randn(CLASSES, generator=generator) * 0.1,
    }
    torch.save(head, root / "products.pt")
    (root / "products.txt").write_text("\n".join(NAMES) + "\n")
    return root


@pytest.fixture(scope="module")
def built(sources, tmp_path_factory):
    out = tmp_path_factory.mktemp("two-heads")
    weights.build(
        "seeded",
        out,
        heads=[AddedHead("products", sources / "products.pt", sources / "products.txt")],
    )
    return out


@pytest.fixture(scope="module")
def tagger(built):
    return make_handler(built, task="tags", draft_decode=False, cache_bytes=1 << 20)


def test_the_build_appends_the_heads_rows_and_labels(built, sources):
    info = json.loads((built / INFO).read_text())
    assert [(h["name"], h["classes"]) for h in info["heads"]] == [
        ("imagenet", 1000),
        ("products", CLASSES),
    ]
    assert info["classes"] == 1000 + CLASSES
    labels = json.loads((built / LABELS).read_text())
    assert [labels[str(i)] for i in range(len(labels))] == IMAGENET + NAMES
    state = torch.load(built / "resnet50.pt", weights_only=True)
    theirs = torch.load(sources / "products.pt", weights_only=True)
    assert torch.equal(state["fc.weight"][1000:], theirs["fc.weight"])
    assert torch.equal(state["fc.bias"][1000:], theirs["fc.bias"])
    # Built again with the same sources: nothing to do.
    again = weights.build(
        "seeded",
        built,
        heads=[AddedHead("products", sources / "products.pt", sources / "products.txt")],
    )
    assert again["sha256"] == info["sha256"]


def test_each_head_answers_as_its_own_torchvision_model(tagger, sources):
    handler, context = tagger
    image = imagegen.jpeg(320, 240, seed=11)
    responses, statuses, batch = run_batch(handler, context, [{"body": image, "topk": "5"}])
    assert statuses == [(200, None)]
    # One forward: the batch's logits hold both heads' rows.
    assert batch.logits.shape == (1, 1000 + CLASSES)
    tags = json.loads(responses[0])
    assert [t["head"] for t in tags] == ["imagenet"] * 5 + ["products"] * 5
    for (name, checkpoint, labels, first), got in (
        (("imagenet", sources / "imagenet" / "resnet50.pt", IMAGENET, 0), tags[:5]),
        (("products", sources / "products.pt", NAMES, 1000), tags[5:]),
    ):
        _, logits = Reference(checkpoint)(image)  # torchvision's model and transform
        top = torch.softmax(logits, 0).topk(5)
        assert [t["label"] for t in got] == [labels[i] for i in top.indices.tolist()], name
        assert [t["index"] for t in got] == [first + i for i in top.indices.tolist()]
        assert rel_error(torch.tensor([t["probability"] for t in got]), top.values) <= 1e-3


def test_topk_is_bounded_by_the_largest_head(tagger):
    handler, context = tagger
    image = imagegen.jpeg(64, 64, seed=6)
    rows = [{"body": image, "topk": "40"}, {"body": image, "topk": "1001"}]
    responses, statuses, _ = run_batch(handler, context, rows)
    assert statuses[0] == (200, None)
    tags = json.loads(responses[0])
    # 40 of ImageNet's, and all 37 of the products head: a head answers at most its classes.
    assert [t["head"] for t in tags] == ["imagenet"] * 40 + ["products"] * CLASSES
    assert sorted(t["label"] for t in tags[40:]) == NAMES
    assert statuses[1][0] == 400
    assert json.loads(responses[1])["message"] == (
        "topk must be an integer from 1 to 1000 (the classes of the model's largest head), got 1001"
    )


def test_a_v2_answer_and_a_cached_one_keep_the_heads(tagger):
    handler, context = tagger
    image = imagegen.jpeg(96, 80, seed=12)
    body = {
        "inputs": [
            {
                "name": "images",
                "datatype": "BYTES",
                "shape": [1],
                "data": [base64.b64encode(image).decode()],
                "parameters": {"content_type": "base64"},
            }
        ],
        "parameters": {"topk": 2},
    }
    first, statuses, _ = run_batch(handler, context, [{"body": json.dumps(body).encode()}])
    assert statuses == [(200, None)]
    (output,) = json.loads(first[0])["outputs"]
    assert output["shape"] == [1, 4]
    assert [json.loads(t)["head"] for t in output["data"]] == ["imagenet"] * 2 + ["products"] * 2
    again, _, batch = run_batch(handler, context, [{"body": json.dumps(body).encode()}])
    assert batch is None or batch.logits is None  # the cache answered: no forward
    assert json.loads(again[0]) == json.loads(first[0])


def test_an_explanation_names_the_head_of_its_class(tagger):
    handler, context = tagger
    image = imagegen.jpeg(128, 128, seed=13)
    rows = [{"body": image, "target": NAMES[3], "method": "gradcam"}]
    # TorchServe's /explanations route sets the request's "explain" property.
    responses, statuses, _ = run_batch(handler, context, rows, [{"explain": "True"}])
    assert statuses == [(200, None)], responses
    (explained,) = json.loads(responses[0])["explanations"]
    assert (explained["label"], explained["index"], explained["head"]) == (
        NAMES[3],
        1003,
        "products",
    )
    assert 1 <= explained["rank"] <= CLASSES  # its rank within its own head


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("other-backbone", "its backbone is not the one of --source"),
        ("taken-name", "head name 'imagenet' is empty or already taken"),
        ("wrong-count", "has 36 labels but the checkpoint's fc has 37 classes"),
    ],
)
def test_a_head_that_cannot_join_is_refused_and_builds_nothing(
    sources, tmp_path, capsys, case, message
):
    checkpoint, labels, name = sources / "products.pt", sources / "products.txt", "products"
    if case == "other-backbone":
        state = torch.load(checkpoint, weights_only=True)
        state["layer4.2.conv3.weight"] = state["layer4.2.conv3.weight"] + 0.01
        checkpoint = tmp_path / "other.pt"
        torch.save(state, checkpoint)
    elif case == "taken-name":
        name = "imagenet"
    else:
        labels = tmp_path / "short.txt"
        labels.write_text("\n".join(NAMES[:-1]) + "\n")
    out = tmp_path / "out"
    argv = ["--source", "seeded", "--out", str(out), "--add-head", name, str(checkpoint)]
    assert weights.main([*argv, str(labels)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_the_int8_gate_judges_every_head_on_its_own():
    """A candidate that keeps the large head and scrambles the small one fails top-1 there,
    which one ranking over all the rows would hide."""
    classes = Classes.of([str(i) for i in range(1004)], [{"name": "a", "classes": 1000},
                                                         {"name": "b", "classes": 4}])  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    embedding = torch.randn(32, 8, generator=generator).numpy()
    logits = torch.randn(32, 1004, generator=generator)
    logits[:, :1000] *= 10  # the large head dominates a ranking over every row
    scrambled = logits.clone()
    scrambled[:, 1000:] = scrambled[:, 1000:].flip(1)
    pooled = agreement((embedding, logits.numpy()), (embedding, scrambled.numpy()))
    per_head = agreement((embedding, logits.numpy()), (embedding, scrambled.numpy()), classes.rows)
    assert pooled["top1_agreement"] == 1.0
    assert per_head["top1_agreement"] < 0.5


def test_make_eval_ranks_a_photo_within_its_labels_head():
    classes = Classes.of(
        list("abcde"), [{"name": "one", "classes": 3}, {"name": "two", "classes": 2}]
    )
    logits = np.array([[5.0, 0.0, 0.0, 1.0, 2.0]])  # class 4 leads its head, not the row
    assert accuracy(logits, [4], classes)["top1_accuracy"] == 1.0
    assert accuracy(logits, [4])["top1_accuracy"] == 0.0
