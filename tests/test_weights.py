"""Where the weights come from, and that an offline fallback says so."""

from __future__ import annotations

import hashlib
import json
import urllib.error
from pathlib import Path

import pytest
import torch

from buildsteps import weights as build_weights
from buildsteps.checkpoint import CheckpointError
from model_files.resnet_dual import WEIGHTS


def test_offline_auto_falls_back_to_seeded_weights_loudly(tmp_path, monkeypatch, capsys):
    def no_network():
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(build_weights, "_imagenet_state_dict", no_network)
    info = build_weights.build("auto", tmp_path)
    assert info["source"] == "seeded-untrained" and info["trained"] is False
    assert "UNTRAINED WEIGHTS" in info["warning"]
    assert "could not be downloaded" in capsys.readouterr().err
    written = json.loads((tmp_path / "weights_info.json").read_text())
    assert written["sha256"] == hashlib.sha256((tmp_path / "resnet50.pt").read_bytes()).hexdigest()
    labels = json.loads((tmp_path / "index_to_name.json").read_text())
    assert [labels[str(i)] for i in range(1000)] == WEIGHTS.meta["categories"]


def test_checkpoint_source_is_recorded(tmp_path):
    torch.manual_seed(5)
    from torchvision.models import resnet50

    state = {f"module.{k}": v for k, v in resnet50(weights=None).state_dict().items()}
    checkpoint = tmp_path / "mine.pt"
    torch.save({"state_dict": state}, checkpoint)
    info = build_weights.build(str(checkpoint), tmp_path / "out")
    assert info["source"] == "checkpoint" and info["trained"] is True
    assert hashlib.sha256(checkpoint.read_bytes()).hexdigest() in info["detail"]
    loaded = torch.load(tmp_path / "out" / "resnet50.pt", weights_only=True)
    assert torch.equal(loaded["fc.weight"], state["module.fc.weight"])
    # Without --source the weights already built are kept, whatever they came from.
    assert build_weights.build(None, tmp_path / "out")["source"] == "checkpoint"


def test_wrong_checkpoint_is_refused_with_a_message(tmp_path):
    checkpoint = tmp_path / "other.pt"
    torch.save({"conv.weight": torch.zeros(1)}, checkpoint)
    with pytest.raises(CheckpointError) as refused:
        build_weights.build(str(checkpoint), tmp_path / "out")
    assert "is not a torchvision resnet50 state dict" in str(refused.value)
    assert not (tmp_path / "out").exists()  # refused before anything is written
    with pytest.raises(CheckpointError) as missing:
        build_weights.build(str(tmp_path / "absent.pt"), tmp_path / "out")
    assert "does not exist" in str(missing.value)


def test_changed_checkpoint_is_rebuilt(tmp_path):
    from torchvision.models import resnet50

    checkpoint = tmp_path / "mine.pt"
    for seed in (1, 2):
        torch.manual_seed(seed)
        torch.save(resnet50(weights=None).state_dict(), checkpoint)
        info = build_weights.build(str(checkpoint), tmp_path / "out")
        assert hashlib.sha256(checkpoint.read_bytes()).hexdigest() in info["detail"]


def test_imagenet_weights_offline_from_torchvisions_cache(tmp_path, monkeypatch):
    """``WEIGHTS=imagenet`` as users with a network run it, minus the download: torchvision
    finds the checkpoint where it would have downloaded it
    (``$TORCH_HOME/hub/checkpoints/<file name of WEIGHTS.url>``) and loads it, with every
    network connection refused. A seeded state dict stands in for the ImageNet file, so this
    covers our code and torchvision's cache lookup, not the values, and not the hash check
    (torchvision applies ``check_hash`` only to a file it downloads)."""
    import socket
    from urllib.parse import urlparse

    from torchvision.models import resnet50

    def no_network(*args, **kwargs):
        raise OSError("network disabled by the test")

    monkeypatch.setattr(socket, "create_connection", no_network)
    torch.manual_seed(7)
    state = resnet50(weights=None).state_dict()
    cache = tmp_path / "torch" / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    torch.save(state, cache / urlparse(WEIGHTS.url).path.rsplit("/", 1)[-1])
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    for source in ("imagenet", "auto"):
        out = tmp_path / source
        info = build_weights.build(source, out)
        assert info["source"] == "imagenet" and info["trained"] is True
        assert WEIGHTS.url in info["detail"] and "warning" not in info
        loaded = torch.load(out / "resnet50.pt", weights_only=True)
        assert torch.equal(loaded["fc.weight"], state["fc.weight"])
        labels = json.loads((out / "index_to_name.json").read_text())
        assert [labels[str(i)] for i in range(1000)] == WEIGHTS.meta["categories"]


def test_a_checkpoint_that_does_not_match_its_hash_is_rebuilt(tmp_path):
    """An interrupted or damaged ``resnet50.pt`` is not taken for built weights: the skip
    check verifies the recorded sha256 and rebuilds from the recorded source."""
    out = tmp_path / "out"
    first = build_weights.build("seeded", out)
    ckpt = out / "resnet50.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:1000])  # what a build killed mid-write used to leave
    again = build_weights.build(None, out)
    assert again["sha256"] == first["sha256"] == hashlib.sha256(ckpt.read_bytes()).hexdigest()
    assert not list(out.glob(".*partial"))


def test_the_checkpoint_is_renamed_into_place(tmp_path, monkeypatch):
    """A save that fails half-way leaves no file under the checkpoint's name."""
    out = tmp_path / "out"
    out.mkdir()

    def interrupted(state, path):
        Path(path).write_bytes(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_weights.build("seeded", out)
    assert not (out / "resnet50.pt").exists() and not (out / "weights_info.json").exists()


def test_the_info_every_archive_carries_names_no_path_of_the_build_machine(tmp_path, capsys):
    """``weights_info.json`` is packed into every archive and reported by describe: files by
    name and sha256 only. What was asked (the paths, to know when to rebuild) stays beside it,
    in ``.request.json``, which no archive carries; a build from before it is rebuilt once."""
    from torchvision.models import resnet50

    torch.manual_seed(3)
    state = resnet50(num_classes=3).state_dict()
    mine = tmp_path / "mine"
    mine.mkdir()
    torch.save(state, mine / "shop.pt")
    torch.save({**state, "fc.weight": state["fc.weight"] * 2}, mine / "extra.pt")
    for name in ("shop.txt", "extra.txt"):
        (mine / name).write_text("a\nb\nc\n")
    heads = [build_weights.AddedHead("extra", mine / "extra.pt", mine / "extra.txt")]
    out = tmp_path / "out"
    info = build_weights.build(str(mine / "shop.pt"), out, mine / "shop.txt", heads, "shop")
    text = (out / "weights_info.json").read_text()
    assert str(tmp_path) not in text and "/" not in text.replace("https://", "")
    sha = hashlib.sha256((mine / "shop.pt").read_bytes()).hexdigest()
    assert info["detail"] == f"local checkpoint shop.pt (sha256 {sha})"
    assert info["labels"] == "labels file shop.txt"
    assert [h["labels"] for h in info["heads"]] == ["labels file shop.txt", "labels file extra.txt"]
    assert "fc of extra.pt (sha256 " in info["heads"][1]["detail"]
    assert json.loads((out / ".request.json").read_text())["requested"] == str(mine / "shop.pt")
    # The request still decides: the same one is up to date, another label file rebuilds.
    build_weights.build(str(mine / "shop.pt"), out, mine / "shop.txt", heads, "shop")
    assert "weights up to date" in capsys.readouterr().out
    # A build of an older version kept the request, with its paths, in the info: rebuilt as
    # it was asked (labels and heads too), the paths leave the info.
    request = json.loads((out / ".request.json").read_text())
    (out / ".request.json").unlink()
    (out / "weights_info.json").write_text(json.dumps({**info, **request}))
    again = build_weights.build(None, out)
    assert "rebuilding" in capsys.readouterr().err
    assert again["heads"] == info["heads"] and again["sha256"] == info["sha256"]
    assert str(tmp_path) not in (out / "weights_info.json").read_text()
