"""A user's fine-tuned ResNet50 with its own labels (buildsteps/checkpoint.py, weights.py): the
accepted formats build; every broken variant is refused at build time with its own message,
and writes nothing."""

from __future__ import annotations

import json
import re

import pytest
import torch
from torch import nn
from torchvision.models import resnet50

from buildsteps import weights
from buildsteps.checkpoint import read_labels
from model_files.artifacts import INFO, LABELS
from model_files.resnet_dual import build_dual
from tests import imagegen
from tests.handler_context import REPO, make_handler, run_batch
from tests.reference import Reference, rel_error

CLASSES = 37
NAMES = [f"product-{i:02d}" for i in range(CLASSES)]


@pytest.fixture(scope="module")
def model() -> nn.Module:
    torch.manual_seed(37)
    return resnet50(num_classes=CLASSES).eval()


@pytest.fixture(scope="module")
def files(model, tmp_path_factory):
    """The checkpoint saved the three ways, and labels in the three formats."""
    root = tmp_path_factory.mktemp("own")
    state = model.state_dict()
    torch.save(state, root / "state.pt")
    torch.save(model, root / "whole.pt")
    torch.save({f"module.{k}": v for k, v in state.items()}, root / "prefixed.pt")
    torch.save({"epoch": 3, "state_dict": state}, root / "nested.pt")
    (root / "labels.json").write_text(json.dumps(NAMES))
    (root / "index.json").write_text(json.dumps({str(i): n for i, n in enumerate(NAMES)}))
    (root / "labels.txt").write_text("\n".join(NAMES) + "\n")
    return root


@pytest.mark.parametrize(
    ("ckpt", "labels"),
    [
        ("state.pt", "labels.json"),
        ("whole.pt", "index.json"),
        ("prefixed.pt", "labels.txt"),
        ("nested.pt", "labels.txt"),
    ],
)
def test_a_37_class_checkpoint_builds_with_its_labels(files, model, tmp_path, ckpt, labels):
    info = weights.build(str(files / ckpt), tmp_path, files / labels)
    assert info["classes"] == CLASSES
    assert info["labels"].endswith(labels)
    assert json.loads((tmp_path / LABELS).read_text()) == {str(i): n for i, n in enumerate(NAMES)}
    assert json.loads((tmp_path / INFO).read_text())["labels_sha256"] == info["labels_sha256"]
    # The built checkpoint gives torchvision's own model's answers on the same input.
    dual = build_dual(torch.load(tmp_path / "resnet50.pt", weights_only=True))
    x = torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        embedding, logits = dual(x)
        expected = model(x)
    assert embedding.shape == (2, 2048)
    assert logits.shape == (2, CLASSES)
    torch.testing.assert_close(logits, expected)


class Custom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)


def _broken(files, tmp_path, name: str):
    """(checkpoint, labels) for each broken variant."""
    state = torch.load(files / "state.pt", weights_only=True)
    if name == "wrong-count":
        (tmp_path / "l.txt").write_text("\n".join(NAMES[:-1]) + "\n")
        return files / "state.pt", tmp_path / "l.txt"
    if name == "missing-keys":
        torch.save(
            {k: v for k, v in state.items() if not k.startswith("layer4")}, tmp_path / "c.pt"
        )
        return tmp_path / "c.pt", files / "labels.json"
    if name == "duplicate-label":
        (tmp_path / "l.json").write_text(json.dumps([*NAMES[:-1], NAMES[0].upper()]))
        return files / "state.pt", tmp_path / "l.json"
    if name == "empty-label":
        (tmp_path / "l.txt").write_text("\n".join(["", *NAMES[1:]]) + "\n")
        return files / "state.pt", tmp_path / "l.txt"
    if name == "not-torch":
        (tmp_path / "c.pt").write_bytes(b"\x89PNG\r\n\x1a\n not a checkpoint")
        return tmp_path / "c.pt", files / "labels.json"
    if name == "other-globals":
        torch.save(Custom(), tmp_path / "c.pt")
        return tmp_path / "c.pt", files / "labels.json"
    assert name == "no-labels"
    return files / "state.pt", None


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("wrong-count", "has 36 labels but the checkpoint's fc has 37 classes"),
        ("missing-keys", "is not a torchvision resnet50 state dict: 6"),
        ("duplicate-label", "label 'PRODUCT-00' is repeated (classes 0 and 36"),
        ("empty-label", "label 0 is empty"),
        ("not-torch", "is not a PyTorch checkpoint"),
        ("other-globals", "needs code beyond torchvision's ResNet to load"),
        ("no-labels", "has 37 classes: give their names with LABELS="),
    ],
)
def test_a_broken_checkpoint_is_refused_at_build_time(files, tmp_path, capsys, name, message):
    """``python -m buildsteps.weights``'s own entry point, in process (no torch import per case)."""
    ckpt, labels = _broken(files, tmp_path, name)
    out = tmp_path / "out"
    argv = ["--source", str(ckpt), "--out", str(out)]
    assert weights.main(argv + ([] if labels is None else ["--labels", str(labels)])) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("bom.txt", b"\xef\xbb\xbfcat\ndog\n"),  # Notepad's UTF-8
        ("bom.json", b'\xef\xbb\xbf["cat", "dog"]'),
        ("crlf.txt", b"cat\r\ndog\r\n"),
        ("cr.txt", b"cat\rdog\r"),  # classic Mac line ends
        ("blank-end.txt", b"cat\ndog\n\n \n"),  # blank lines at the end: not classes
    ],
)
def test_a_labels_file_is_read_as_its_author_wrote_it(tmp_path, name, data):
    (tmp_path / name).write_bytes(data)
    assert read_labels(tmp_path / name) == ["cat", "dog"]


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("latin1.txt", b"caf\xe9\n", "is not UTF-8 (byte 3: b'\\xe9'): save it as UTF-8"),
        ("keys.json", '{"0": "cat", "\u00b2": "dog"}'.encode(), "keys must be the class indexes"),
        ("first-blank.txt", b"\ncat\n", "label 0 is empty"),
        ("case.txt", b"Cat\ncat\n", "label 'cat' is repeated (classes 0 and 1"),
    ],
)
def test_a_bad_labels_file_is_refused_in_the_builds_words(tmp_path, capsys, name, data, message):
    torch.manual_seed(2)
    torch.save(resnet50(num_classes=2).state_dict(), tmp_path / "two.pt")
    (tmp_path / name).write_bytes(data)
    out = tmp_path / "out"
    argv = ["--source", str(tmp_path / "two.pt"), "--labels", str(tmp_path / name)]
    assert weights.main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()


@pytest.fixture(scope="module")
def carrying(files, tmp_path_factory):
    """A checkpoint that carries its labels, as ``tsctl head train`` writes one."""
    root = tmp_path_factory.mktemp("carrying")
    state = torch.load(files / "state.pt", weights_only=True)
    torch.save({"state_dict": state, "labels": NAMES}, root / "resnet50.pt")
    return root / "resnet50.pt"


def test_a_checkpoint_that_carries_its_labels_serves_them(carrying, files, tmp_path):
    info = weights.build(str(carrying), tmp_path / "alone")  # no LABELS needed
    assert info["labels"] == "the labels resnet50.pt carries"
    assert json.loads((tmp_path / "alone" / LABELS).read_text())["36"] == NAMES[36]
    info = weights.build(str(carrying), tmp_path / "same", files / "labels.txt")
    assert info["classes"] == CLASSES


def test_labels_that_are_not_the_ones_the_checkpoint_carries_are_refused(
    carrying, tmp_path, capsys
):
    """What a head train killed between its two files would leave: new weights, old names."""
    (tmp_path / "old.txt").write_text("\n".join(reversed(NAMES)) + "\n")
    out = tmp_path / "out"
    argv = ["--source", str(carrying), "--labels", str(tmp_path / "old.txt"), "--out", str(out)]
    assert weights.main(argv) == 2
    err = capsys.readouterr().err
    assert "is not the list of labels" in err and "class 0 is 'product-00' there" in err
    assert not out.exists()


def test_labels_are_for_a_checkpoint_only(tmp_path, files):
    with pytest.raises(weights.CheckpointError, match="--labels is for your own checkpoint"):
        weights.build("seeded", tmp_path, files / "labels.txt")
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------ served through the handler


@pytest.fixture(scope="module")
def built(files, tmp_path_factory):
    """The whole-module checkpoint built as ``make weights WEIGHTS=... LABELS=...`` does."""
    out = tmp_path_factory.mktemp("built")
    weights.build(str(files / "whole.pt"), out, files / "labels.txt")
    return out


@pytest.fixture(scope="module")
def tagger(built):
    return make_handler(built, task="tags", draft_decode=False)


def test_the_tagger_answers_the_checkpoints_own_classes(tagger, built, files):
    handler, context = tagger
    image = imagegen.jpeg(320, 240, seed=5)
    responses, statuses, batch = run_batch(handler, context, [{"body": image, "topk": "5"}])
    assert statuses == [(200, None)]
    # torchvision's own model and transform, run directly on the weights the user saved.
    _, logits = Reference(files / "state.pt")(image)  # the same model's state dict
    assert batch.logits.shape == (1, CLASSES)
    assert rel_error(batch.logits[0], logits) <= 1e-4
    expected = torch.softmax(logits, 0).topk(5).indices.tolist()
    assert [t["label"] for t in json.loads(responses[0])] == [NAMES[i] for i in expected]


def test_topk_is_bounded_by_the_models_classes(tagger):
    handler, context = tagger
    image = imagegen.jpeg(64, 64, seed=6)
    rows = [{"body": image, "topk": str(CLASSES)}, {"body": image, "topk": str(CLASSES + 1)}]
    responses, statuses, _ = run_batch(handler, context, rows)
    assert statuses[0] == (200, None)
    assert sorted(t["label"] for t in json.loads(responses[0])) == sorted(NAMES)
    assert statuses[1][0] == 400
    assert json.loads(responses[1])["message"] == (
        f"topk must be an integer from 1 to {CLASSES} (the model's classes), got {CLASSES + 1}"
    )


def test_settings_over_the_class_count_serve_every_class(built, caplog):
    """``top_k`` and ``explain.max_targets`` above N (the shipped 5 with a 4-label head): all N
    classes, logged; describe shows the values served."""
    handler, context = make_handler(
        built, task="tags", top_k=CLASSES + 3, explain={"max_targets": 40}
    )
    assert f"handler.top_k is {CLASSES + 3} but the model has {CLASSES} classes" in caplog.text
    assert f"handler.explain.max_targets is 40 but the model has {CLASSES}" in caplog.text
    served = handler.model.describe()["handler"]
    assert (served["top_k"], served["explain"]["max_targets"]) == (CLASSES, CLASSES)
    responses, statuses, _ = run_batch(handler, context, [{"body": imagegen.jpeg(64, 64)}])
    assert statuses == [(200, None)]
    assert sorted(t["label"] for t in json.loads(responses[0])) == sorted(NAMES)


def test_no_imagenet_class_count_in_the_serving_path():
    """N classes everywhere: the serving code never writes 1,000 classes as a literal."""
    pattern = re.compile(r"\[N, 1000\]|\(1, 1000\)|MAX_TOP_K|num_classes=1000|1000 classes")
    found = [
        f"{path}:{n}: {line.strip()}"
        for folder in ("servecore", "handlers", "model_files", "tritonrepo", "kserve_tools")
        for path in sorted((REPO / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []
