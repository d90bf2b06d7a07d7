"""The user's own tagger served from a fresh archive on TorchServe and on Triton: a head
``tsctl head train`` fitted on the session Triton's embeddings (pinned to f32: the arithmetic the
tagger is served in here, so the report's predictions are the ones to expect; the photos are
tests/conftest.py's ``head_photos``, four labels of synthetic scenes), built as ``make
archives WEIGHTS=out/resnet50.pt LABELS=out/labels.txt GATE_PHOTOS=photos`` builds it (its int8
judged on the user's photos), served pinned to f32. What the user checks: the answers name their
labels and tag the held-out photos as the training report said (the same accuracy), ``topk``
above N is a 400 that says N, explanations name their classes, and describe says N, where the
labels came from and what the int8 gate decided."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from bench.archives import ArchiveInfo, build_variant
from buildsteps import weights
from model_files.artifacts import fidelity_record
from serveclient.base import Client
from serveclient.errors import ApiError
from tests.conftest import REPO
from tests.served import local_triton, train_head

pytestmark = pytest.mark.integration
TAGGER, EMBEDDING = "resnet50-tagger", "resnet50-embedding"
PER_REQUEST = 4  # images: under the shipped handler.max_images_per_request
INT8 = "resnet50_dual_int8.xml"  # what buildsteps/quantize.py writes when its gate passes


def _step(*argv: str) -> None:
    run = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]


@dataclass(frozen=True)
class OwnBuild:
    store: Path  # the fresh tagger archive, and the shipped embedding model beside it
    weights: Path  # what the build steps wrote
    labels: list[str]
    report: dict  # the training's report.json


@pytest.fixture(scope="module")
def f32_head(head_photos, triton, weights_dir, tmp_path_factory) -> Path:
    """The training's output folder: ``tsctl head train --url`` on the session's Triton, whose
    repository is pinned to f32. (The session's TorchServe serves ``auto``: int8 or bf16 where
    the host measures them faster, and a photo near a boundary may then tag otherwise at f32.)"""
    out = tmp_path_factory.mktemp("head-f32") / "tagger"
    run = train_head(triton, head_photos, out, weights_dir)
    assert run.returncode == 0, run.stderr
    assert json.loads((out / "report.json").read_text())["embedded_by"]["precision"] == "f32"
    return out


@pytest.fixture(scope="module")
def own(head_photos, f32_head, model_store, tmp_path_factory) -> OwnBuild:
    """``make archives WEIGHTS=... LABELS=... GATE_PHOTOS=...``'s steps, into folders of this
    module's (the shipped archives' backend; calibration on 16 tensors, not 200, and the gate
    on one label's photos, to keep it short: the gate's verdict is what is checked, not int8's
    quality)."""
    photos, out = head_photos, f32_head
    work = tmp_path_factory.mktemp("own-build")
    built = work / "weights"
    weights.build(str(out / "resnet50.pt"), built, out / "labels.txt")
    shipped = ArchiveInfo.read(model_store / f"{TAGGER}.mar")
    _step("-m", "buildsteps.export", "--backend", shipped.backend, "--weights", str(built))
    if shipped.backend == "openvino":
        # One label's folder of the user's photos: the gate runs both models on each photo
        # (and its mirror), and its verdict, not its statistics, is what is checked here.
        label_folder = min(p for p in photos.iterdir() if p.is_dir())
        gate = ["--gate-photos", str(label_folder), "--size", "16", "--allow-refusal"]
        _step("-m", "buildsteps.quantize", "--weights", str(built), *gate)
    config = yaml.safe_load((REPO / "config" / "models" / f"{TAGGER}.yaml").read_text())
    config["handler"] = {**config.get("handler", {}), "precision": "f32"}
    store = work / "store"
    build_variant(
        TAGGER,
        config,
        shipped.backend,
        work / "archive",
        store / f"{TAGGER}.mar",
        quantize=shipped.quantize,
        weights_dir=built,
    )
    (store / f"{EMBEDDING}.mar").symlink_to(model_store / f"{EMBEDDING}.mar")
    labels = (out / "labels.txt").read_text().splitlines()
    return OwnBuild(store, built, labels, json.loads((out / "report.json").read_text()))


@pytest.fixture(scope="module", params=["torchserve", "triton"])
def client(request, own, tmp_path_factory):
    """A client of a server of this module's serving the fresh archive, always stopped."""
    if request.param == "torchserve":
        from devtools.server import LocalTorchServe

        server = LocalTorchServe(
            tmp_path_factory.mktemp("own-ts"), own.store, load_models=[f"{TAGGER}.mar"]
        )
        server.start()
        try:
            yield server.client()
        finally:
            server.kill()
        return
    from serveclient.triton import TritonClient

    with local_triton(tmp_path_factory.mktemp("own-triton"), own.store, exit_timeout=2) as server:
        yield TritonClient(server.url)


def test_the_answers_name_the_users_labels_and_tag_as_the_report_said(client: Client, own):
    held_out = own.report["held_out"]
    images = [Path(h["path"]).read_bytes() for h in held_out]
    answered = []
    for i in range(0, len(images), PER_REQUEST):
        answers = client.infer_answers(
            TAGGER, images[i : i + PER_REQUEST], output="tags", topk=len(own.labels)
        )
        assert answers.precision == "f32"
        answered += answers.values
    for tags in answered:
        assert sorted(t["label"] for t in tags) == sorted(own.labels)
        assert sum(t["probability"] for t in tags) == pytest.approx(1.0, abs=1e-4)
    predicted = [tags[0]["label"] for tags in answered]
    # The head was fitted with no intercept on the normalised embedding: the served logits are
    # the report's scaled by the embedding's norm, so the top tag is the same photo by photo.
    assert predicted == [h["predicted"] for h in held_out]
    accuracy = sum(p == h["label"] for p, h in zip(predicted, held_out)) / len(held_out)
    assert accuracy == own.report["held_out_accuracy"]


def test_topk_above_the_users_classes_is_a_400_that_says_how_many(client: Client, own):
    image = Path(own.report["held_out"][0]["path"]).read_bytes()
    n = len(own.labels)
    with pytest.raises(ApiError) as refused:
        client.infer_answers(TAGGER, [image], output="tags", topk=n + 1)
    assert refused.value.status == 400
    assert f"topk must be an integer from 1 to {n} (the model's classes), got {n + 1}" in str(
        refused.value
    )


def test_explanations_name_the_users_classes(client: Client, own):
    image = Path(own.report["held_out"][0]["path"]).read_bytes()
    explained = client.explain(TAGGER, image, topk=2, method="gradcam")
    assert [e["label"] for e in explained["explanations"]] != []
    assert {e["label"] for e in explained["explanations"]} <= set(own.labels)
    last = own.labels[-1]
    (one,) = client.explain(TAGGER, image, target=last, method="gradcam")["explanations"]
    assert (one["label"], one["index"]) == (last, len(own.labels) - 1)


def test_describe_says_the_class_count_the_labels_and_the_int8_verdict(client: Client, own):
    described = client.describe(TAGGER, customized=True)[0]["customizedMetadata"]
    assert described["classes"] == len(own.labels)
    info = json.loads((own.weights / "weights_info.json").read_text())
    assert described["weights"] == info
    assert info["classes"] == len(own.labels) and info["labels"].endswith("labels.txt")
    # The gate's verdict on the user's photos, as buildsteps/quantize.py wrote it: its record
    # served when int8 passed, no int8 at all when it was refused (Triton's describe says
    # null; TorchServe's frontend leaves a null value out of customizedMetadata).
    passed = own.weights / fidelity_record(INT8)
    if passed.is_file():
        assert described["quantization"] == json.loads(passed.read_text())
    else:
        assert (own.weights / "resnet50_dual_int8.refused.json").is_file()
        assert described.get("quantization") is None
