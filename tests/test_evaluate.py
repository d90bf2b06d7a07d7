"""``python -m buildsteps.evaluate`` (issue #27): accuracy on a labelled folder must be what the
labels say, for a model whose answers are known independently (torchvision's own resnet50 on
the same weights picks the labels); every precision the weights folder can run is reported
against float32."""

from __future__ import annotations

import json

import pytest
from torchvision.models import ResNet50_Weights

from buildsteps import evaluate
from tests import imagegen

CATEGORIES = ResNet50_Weights.IMAGENET1K_V2.meta["categories"]
CLEAR_MARGIN = 1e-3  # of the top logit over the next: no rounding can swap them at f32


@pytest.fixture(scope="module")
def labelled(tmp_path_factory, reference):
    """Six photos whose reference top-1 is clear: four filed under their reference class
    (by name, by name with underscores, by index), two under a wrong one; one unlabelled
    photo at the top. Returns the folder and the expected top-1 / top-5 accuracy."""
    folder = tmp_path_factory.mktemp("labelled")
    filed, top1_hits, top5_hits = 0, 0, 0
    for seed in range(40):
        data = imagegen.jpeg(160, 120, seed=seed)
        _, logits = reference(data)
        top = logits.topk(5)
        if float(top.values[0] - top.values[1]) < CLEAR_MARGIN * float(top.values[0].abs()):
            continue
        truth = int(top.indices[0])
        wrong = filed >= 4
        label = (truth + 1) % len(CATEGORIES) if wrong else truth
        name = [
            CATEGORIES[label],
            CATEGORIES[label].replace(" ", "_").upper(),
            str(label),
            CATEGORIES[label],
            str(label),
            CATEGORIES[label],
        ][filed]
        (folder / name).mkdir(exist_ok=True)
        (folder / name / f"photo-{seed}.jpg").write_bytes(data)
        top1_hits += not wrong
        top5_hits += label in top.indices.tolist()
        filed += 1
        if filed == 6:
            break
    assert filed == 6, "fewer than six generated photos with a clear top-1"
    (folder / "unlabelled.png").write_bytes(imagegen.png(90, 60, seed=99))
    (folder / "not-an-image.jpg").write_bytes(b"not a jpeg")
    return folder, top1_hits / 6, top5_hits / 6


def test_accuracy_is_what_the_labels_say(labelled, weights_dir):
    folder, top1, top5 = labelled
    report = evaluate.evaluate(folder, weights_dir, "resnet50_dual.xml", batch=4, progress=False)
    assert (report["photos"], report["labelled"]) == (7, 6)
    assert [s["path"].endswith("not-an-image.jpg") for s in report["skipped"]] == [True]
    rows = {r["precision"]: r for r in report["precisions"]}
    assert report["reference"] == "f32" and next(iter(rows)) == "f32"
    f32 = rows["f32"]
    assert (f32["top1_accuracy"], f32["top5_accuracy"]) == (
        pytest.approx(top1),
        pytest.approx(top5),
    )
    assert f32["top1_agreement_vs_f32"] == 1.0 and f32["embedding_cosine_min"] > 0.99999
    for row in rows.values():  # every precision this host runs, each timed
        assert row["ms_per_image"] > 0 and row["labelled"] == 6
        assert 0.0 <= row["top1_accuracy"] <= 1.0


def test_the_command_prints_a_table_or_json(labelled, weights_dir, capsys):
    folder, top1, _ = labelled
    assert evaluate.main([str(folder), "--weights", str(weights_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["precisions"][0]["top1_accuracy"] == pytest.approx(top1)
    assert evaluate.main([str(folder), "--weights", str(weights_dir)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == [
        "precision",
        "top-1",
        "top-5",
        "agrees",
        "f32",
        "cos",
        "mean",
        "cos",
        "min",
        "ms/img",
    ]
    assert f"{100 * top1:.1f}%" in out.splitlines()[2]


def test_an_unlabelled_folder_gives_agreement_only(tmp_path, weights_dir):
    (tmp_path / "holiday").mkdir()
    (tmp_path / "holiday" / "a.png").write_bytes(imagegen.png(64, 64, seed=1))
    report = evaluate.evaluate(tmp_path, weights_dir, "resnet50_dual.xml", progress=False)
    assert report["labelled"] == 0
    assert all(r["top1_accuracy"] is None for r in report["precisions"])
    assert "agreement only" in evaluate.table(report)


@pytest.mark.parametrize(
    ("name", "index"),
    [
        ("tabby", 281),
        ("TABBY", 281),
        ("tiger_cat", 282),
        ("281", 281),
        ("1000", None),
        ("holiday", None),
        ("cardigan", 474),  # as written first: ImageNet has the dog Cardigan and the cardigan
        ("Cardigan", 264),
        ("CARDIGAN", None),  # loosely, both: neither
    ],
)
def test_folder_names_as_classes(name, index):
    assert evaluate.class_index(name, CATEGORIES) == index


STARS = ["1", "2", "3", "4", "5"]


@pytest.mark.parametrize(
    ("labels", "name", "index"),
    [
        (STARS, "3", 2),  # a digit folder is a label of a model whose labels are numbers
        (STARS, "0", None),  # never an index there: row 0 is the label "1"
        (["2019", "2020"], "2019", 0),
        (["ice_cream", "pizza"], "ice_cream", 0),  # a head's own label, as its folder names it
        (["ice cream", "ice_cream"], "ice_cream", 1),
        (["ice cream", "pizza"], "Ice_Cream", 0),  # the loose match, where only one label fits
        (["ice cream", "ice_cream"], "ICE_CREAM", None),
        (["cat", "dog"], "1", 1),  # no label is a number: an index
    ],
)
def test_folder_names_as_your_own_labels(labels, name, index):
    assert evaluate.class_index(name, labels) == index
