"""``tsctl head train`` against the session's real TorchServe: a labelled set made here (four kinds
of synthetic scene, devtools/scenes.py), a head trained through the served embedding model, and
what the user checks: the report's split, accuracy, per-label precision/recall and confusion
table agree with each other and with the held-out photos; the mistakes page exists; the
checkpoint is a full torchvision resnet50 whose backbone, run by torchvision directly on the
held-out photos, gives the served embeddings and whose fc tags them as the report says; a rerun
embeds nothing again; a backbone that is not the served one is refused. tests/test_own_served.py
serves the result from a fresh archive on both engines."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.models import ResNet50_Weights, resnet50

from devtools.scenes import SCENES
from serveclient.vectors import read_matrix
from tests.conftest import HEAD_PER_LABEL
from tests.served import train_head, tsctl

pytestmark = pytest.mark.integration
EMBEDDING_COSINE = 0.99  # f32 against the served precision (int8/bf16 measure 0.9998 here)


def test_the_report_is_a_stratified_held_out_measure_that_adds_up(trained_head):
    _, out, answer = trained_head
    report = json.loads((out / "report.json").read_text())
    labels = list(SCENES)
    assert report["labels"] == labels
    assert answer["held_out_accuracy"] == report["held_out_accuracy"]
    split = report["split"]
    assert (split["train"], split["held_out"]) == (36, 12)
    assert all(n == {"train": 9, "held_out": 3} for n in split["per_label"].values())
    # The confusion table's counts add up: to the held-out photos, per true label.
    counts = np.array(report["confusion"]["counts"])
    assert counts.shape == (4, 4) and counts.sum() == 12
    assert counts.sum(axis=1).tolist() == [3, 3, 3, 3]
    held_out = report["held_out"]
    assert len(held_out) == 12
    correct = sum(h["label"] == h["predicted"] for h in held_out)
    assert report["held_out_accuracy"] == correct / 12 == np.trace(counts) / 12
    for i, label in enumerate(labels):
        column = counts[:, i].sum()
        m = report["per_label"][label]
        assert m["recall"] == pytest.approx(counts[i, i] / 3)
        assert m["precision"] == pytest.approx(counts[i, i] / column if column else 0.0)
    # The four scenes are distinct enough for a linear probe on the untrained backbone.
    assert report["held_out_accuracy"] >= 0.75, report["per_label"]
    ece = report["calibration"]["expected_calibration_error"]
    assert 0.0 <= ece <= 1.0
    assert report["backbone"]["checked_against_server"] is True
    # Every held-out photo sits in its label's folder.
    assert all(f"/{h['label']}/" in h["path"] for h in held_out)


def test_the_mistakes_page_shows_every_mistake(trained_head):
    _, out, _ = trained_head
    report = json.loads((out / "report.json").read_text())
    page = (out / "report.html").read_text()
    assert "Confusion" in page and f"Mistakes ({len(report['mistakes'])})" in page
    assert report["mistakes"] == [h for h in report["held_out"] if h["label"] != h["predicted"]]
    for mistake in report["mistakes"]:
        assert mistake["path"] in page
    assert page.count("<img ") == len(report["mistakes"])


def test_the_checkpoint_is_a_resnet50_tagging_as_the_report_says(trained_head, weights_dir):
    _, out, _ = trained_head
    report = json.loads((out / "report.json").read_text())
    labels = (out / "labels.txt").read_text().splitlines()
    assert labels == report["labels"]
    checkpoint = torch.load(out / "resnet50.pt", map_location="cpu", weights_only=True)
    assert checkpoint["labels"] == labels  # the pair in one file: labels.txt is its copy
    assert (out / "labels.txt").read_bytes() == "".join(f"{n}\n" for n in labels).encode()
    state = checkpoint["state_dict"]
    backbone = torch.load(weights_dir / "resnet50.pt", map_location="cpu", weights_only=True)
    assert state.keys() == backbone.keys()
    assert all(torch.equal(state[k], backbone[k]) for k in backbone if not k.startswith("fc."))
    model = resnet50(num_classes=len(labels))
    model.load_state_dict(state)  # strict: every key, fc [4, 2048]
    model.eval()
    pooled = {}
    model.fc.register_forward_hook(lambda _, inputs, __: pooled.update(x=inputs[0]))
    transform = ResNet50_Weights.IMAGENET1K_V2.transforms()
    held_out = report["held_out"]
    batch = torch.stack([transform(Image.open(h["path"]).convert("RGB")) for h in held_out])
    with torch.inference_mode():
        top = model(batch).argmax(dim=1)
    ours = torch.nn.functional.normalize(pooled["x"], dim=1)
    paths, matrix = read_matrix(out / "embeddings.parquet")
    row = {p: i for i, p in enumerate(paths)}
    served = torch.from_numpy(np.stack([matrix[row[h["path"]]] for h in held_out]))
    # The checkpoint's backbone is the served one: torchvision's pooled vector is the served
    # embedding (the server may compute in reduced precision: close, not equal).
    assert (ours * served).sum(dim=1).min() >= EMBEDDING_COSINE
    # Its fc is the report's head: on the embeddings the report was computed from, every
    # held-out photo's top tag is the report's; and torchvision's own fc ranks its own pooled
    # vector as that fc does (the fold is exact whatever the vector's norm).
    fc = state["fc.weight"]
    assert [labels[i] for i in (served @ fc.T).argmax(dim=1).tolist()] == [
        h["predicted"] for h in held_out
    ]
    assert torch.equal(top, (ours @ fc.T).argmax(dim=1))


def test_a_rerun_embeds_nothing_again_and_reports_the_same(trained_head, torchserve, weights_dir):
    photos, out, answer = trained_head
    run = train_head(torchserve, photos, out, weights_dir)
    assert run.returncode == 0, run.stderr
    again = json.loads(run.stdout)
    assert again["embedding_job"]["done"] == 0
    assert again["embedding_job"]["skipped"] == 4 * HEAD_PER_LABEL
    assert again["held_out"] == answer["held_out"]


def test_a_backbone_that_is_not_the_served_one_is_refused(trained_head, torchserve, tmp_path):
    photos, _, _ = trained_head
    other = tmp_path / "other.pt"
    torch.save({"fc.weight": torch.zeros(3, 2048)}, other)
    out = tmp_path / "never"
    run = tsctl(
        torchserve, "head", "train", str(photos), "--out", str(out), "--backbone", str(other)
    )
    assert run.returncode == 2
    assert "is not the served backbone" in run.stderr
    assert not out.exists()
