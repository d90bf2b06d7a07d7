"""``tsctl head train`` as a user's folders change under it and as it is killed, against the
session's real TorchServe (the embedding rows of ``trained_head`` reused, so little is embedded
again): the training set is exactly the photos under FOLDER now (another FOLDER's rows in the
same --out, a photo moved between labels, a deleted label, a second spelling of the folder: none
trained on, the report counts what it left out), and a run killed with SIGKILL at seeded random
points, then rerun, writes what the uninterrupted run wrote, every file whole in between."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import time

import pytest
import torch

from devtools.scenes import labelled_set
from serveclient.vectors import read_matrix
from tests.served import TSCTL, train_head

pytestmark = pytest.mark.integration
OUTPUTS = ("resnet50.pt", "labels.txt", "report.json", "report.html")  # in the order written
KILLS = 3  # one after each of head train's progress lines, in a seeded order
SEED = 68


def test_the_training_set_is_the_folder_as_it_is_now(
    torchserve, weights_dir, trained_head, tmp_path
):
    _, trained, _ = trained_head
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(trained / "embeddings.parquet", out)  # 48 rows of another FOLDER, same --out
    mine = tmp_path / "mine"
    labelled_set(mine, 4, seed=SEED)
    (mine / "checks").rename(mine / "café")
    (mine / "gradient").rename(mine / "猫")
    shutil.rmtree(mine / "stripes")
    first = train_head(torchserve, mine, out, weights_dir)
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert report["labels"] == ["café", "noise", "猫"] and report["photos"] == 12
    assert report["left_out"]["not_under_folder"] == 48  # never the label ".."

    shutil.rmtree(mine / "noise")  # a label given up
    (mine / "café" / "000.jpg").rename(mine / "猫" / "moved.jpg")  # the fix a mistake invites
    again = train_head(torchserve, os.path.relpath(mine), out, weights_dir)  # another spelling
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["labels"] == ["café", "猫"] and report["photos"] == 8
    per_label = report["split"]["per_label"]
    assert {k: v["train"] + v["held_out"] for k, v in per_label.items()} == {"café": 3, "猫": 5}
    for photo in report["held_out"]:  # each held-out photo is where its label says, now
        assert os.path.isfile(photo["path"])
        assert os.path.basename(os.path.dirname(photo["path"])) == photo["label"]
    rows = len(read_matrix(out / "embeddings.parquet")[0])
    assert sum(report["left_out"].values()) == rows - 8
    assert (out / "labels.txt").read_bytes() == "café\n猫\n".encode()


def _killed(server, photos, out, weights_dir, line: int, delay: float) -> None:
    """``tsctl head train`` killed with SIGKILL ``delay`` seconds after its ``line``-th
    progress line (or left to finish, when it finishes first)."""
    argv = ["head", "train", str(photos), "--out", str(out)]
    run = subprocess.Popen(
        [str(TSCTL), *argv, "--backbone", str(weights_dir / "resnet50.pt")],
        env=server.cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = 0
    for text in run.stderr:
        seen += text.startswith("head train: ")
        if seen == line:
            break
    time.sleep(delay)
    run.kill()
    run.wait()
    run.stderr.close()


def _as_written(folder, name: str):
    """What a reader of ``name`` gets: the checkpoint's tensors and labels, the report without
    its own paths (the folder differs), the other files' bytes."""
    path = folder / name
    if name == "resnet50.pt":
        return torch.load(path, weights_only=True)
    if name == "report.json":
        return {k: v for k, v in json.loads(path.read_text()).items() if k != "outputs"}
    return path.read_bytes()


def _same(ours, theirs) -> bool:
    if isinstance(ours, dict) and "state_dict" in ours:
        state, reference = ours["state_dict"], theirs["state_dict"]
        return ours["labels"] == theirs["labels"] and all(
            torch.equal(state[k], reference[k]) for k in reference
        )
    return ours == theirs


def test_killed_at_random_points_then_rerun_it_writes_what_one_run_wrote(
    torchserve, weights_dir, trained_head, tmp_path
):
    photos, reference, _ = trained_head
    expected = {name: _as_written(reference, name) for name in OUTPUTS}
    out = tmp_path / "tagger"
    out.mkdir()
    shutil.copy(reference / "embeddings.parquet", out)  # kill the head's work, not the embedding's
    rng = random.Random(SEED)
    for line in rng.sample(range(1, KILLS + 1), KILLS):
        _killed(torchserve, photos, out, weights_dir, line, rng.uniform(0.0, 1.0))
        visible = [name for name in OUTPUTS if (out / name).exists()]
        assert visible == list(OUTPUTS[: len(visible)])  # in order, each one whole:
        assert all(_same(_as_written(out, name), expected[name]) for name in visible)
    run = train_head(torchserve, photos, out, weights_dir)
    assert run.returncode == 0, run.stderr
    assert all(_same(_as_written(out, name), expected[name]) for name in OUTPUTS)
    assert sorted(p.name for p in out.iterdir()) == sorted(["embeddings.parquet", *OUTPUTS])
    paths, x = read_matrix(out / "embeddings.parquet")
    theirs, y = read_matrix(reference / "embeddings.parquet")
    assert paths == theirs and (x == y).all()
