"""``tsctl head train`` refuses what it cannot do before it asks the server anything, and one run
per output at a time: every case here points it at a server that does not exist, so a run that
got past its checks would fail another way (no key file, exit 4). Impossible splits, values out
of range and folder names that are no labels are exit 2 with the tool's message; a held output
is exit 8 naming its holder, or waits with ``--wait``. Then what the training set is made of
(serveclient.head.training_set: exactly the photos under FOLDER now), and the files written
without depending on the locale."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from serveclient import head, vectors
from serveclient.cli import main
from serveclient.outputlock import hold, lock_path

NOWHERE = "http://127.0.0.1:9"  # discard: nothing listens


def photos(root: Path, counts: dict[str, int]) -> Path:
    """``root/<label>/<i>.jpg``: the walk goes by name, nothing here is decoded."""
    for label, count in counts.items():
        (root / label).mkdir(parents=True)
        for i in range(count):
            (root / label / f"{i}.jpg").write_bytes(b"not decoded before the checks")
    return root


def train(tmp_path: Path, folder: Path, *extra: str) -> int:
    (tmp_path / "backbone.pt").write_bytes(b"read after the checks")
    urls = [f"--{api}-url={NOWHERE}" for api in ("inference", "management", "metrics")]
    return main(
        [
            *urls,
            f"--key-file={tmp_path / 'no-key-file.json'}",
            "head",
            "train",
            str(folder),
            "--out",
            str(tmp_path / "out"),
            "--backbone",
            str(tmp_path / "backbone.pt"),
            *extra,
        ]
    )


def test_an_impossible_split_is_refused_before_anything_is_embedded(tmp_path, capsys):
    """40 labels of 3 photos pass the per-label minimum, but a 0.25 share holds out 30 photos,
    fewer than one per label: scikit-learn's refusal, after the whole embedding run, is said
    first, with the shares that would do."""
    folder = photos(tmp_path / "photos", {f"label-{i:02d}": 3 for i in range(40)})
    assert train(tmp_path, folder) == 2
    err = capsys.readouterr().err
    assert "40 labels, 120 photos: --test-size 0.25 holds out 30 and trains on 90" in err
    assert "give --test-size from 0.333 to 0.667" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists() and not lock_path(tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--test-size", "0"),
        ("--test-size", "1"),
        ("--test-size", "1.5"),
        ("--test-size", "nan"),
        ("--C", "0"),
        ("--C", "-1"),
        ("--C", "inf"),
        ("--C", "nan"),
        ("--seed", "-1"),
        ("--seed", str(2**32)),
    ],
)
def test_values_out_of_range_are_refused(tmp_path, capsys, flag, value):
    folder = photos(tmp_path / "photos", {"cat": 4, "dog": 4})
    assert train(tmp_path, folder, flag, value) == 2
    err = capsys.readouterr().err
    assert f"error: {flag} " in err and "hint:" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("counts", "words"),
    [
        ({"Cat": 4, "cat": 4}, "label 'cat' is repeated (classes 0 and 1, compared ignoring case)"),
        ({"cat": 4, "dog": 1}, "too few photos for a held-out split: dog (1)"),
        ({"cat": 4}, "1 label found; a tagger needs at least 2"),
    ],
)
def test_folders_that_are_no_labels_are_refused_as_make_serve_would(
    tmp_path, capsys, counts, words
):
    folder = photos(tmp_path / "photos", counts)
    assert train(tmp_path, folder) == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_photo_outside_a_label_folder_is_refused_first(tmp_path, capsys):
    folder = photos(tmp_path / "photos", {"cat": 4, "dog": 4})
    (folder / "loose.jpg").write_bytes(b"x")
    assert train(tmp_path, folder) == 2
    assert "loose.jpg is not in a label's subfolder" in capsys.readouterr().err


def test_a_second_run_on_one_output_is_refused_naming_the_first(tmp_path, capsys):
    folder = photos(tmp_path / "photos", {"cat": 4, "dog": 4})
    with hold(tmp_path / "out", what="tsctl head train photos --out out"):
        assert train(tmp_path, folder) == 8
    err = capsys.readouterr().err
    assert f"tsctl head train photos --out out (pid {os.getpid()}" in err and "--wait" in err
    assert not (tmp_path / "out").exists()


def _waiting_on(path: Path) -> bool:
    """Whether a process waits for the flock of ``path`` (``/proc/locks`` marks it ``->``)."""
    inode = str(path.stat().st_ino)
    lines = Path("/proc/locks").read_text().splitlines()
    return any("->" in line and line.split()[-3].split(":")[-1] == inode for line in lines)


def test_wait_starts_when_the_holder_lets_go(tmp_path, capsys):
    folder = photos(tmp_path / "photos", {"cat": 4, "dog": 4})
    codes: list[int] = []
    with hold(tmp_path / "out") as lock:
        run = threading.Thread(target=lambda: codes.append(train(tmp_path, folder, "--wait")))
        run.start()
        deadline = time.monotonic() + 60
        while not _waiting_on(lock) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _waiting_on(lock) and codes == []  # blocked on our lock, not refused
    run.join(60)
    assert codes == [4]  # then on to the server: here none, no key file
    assert "no key file" in capsys.readouterr().err


# ------------------------------------------------------------------ the rows trained on


def test_the_training_set_is_exactly_the_photos_under_the_folder_now(tmp_path, monkeypatch):
    """Rows of a photo moved since (its old path), of a deleted label, of another FOLDER
    embedded into the same --out, and a second spelling of one path: none is fitted on, each
    counted; every photo now is fitted once, labelled by where it is now."""
    folder = photos(tmp_path / "photos", {"cat": 2, "dog": 3})
    monkeypatch.chdir(tmp_path)
    now = head.walk("photos")  # relative, as a user types it
    stored = [
        str(tmp_path / "photos/cat/0.jpg"),  # absolute spelling
        "photos/cat/1.jpg",
        "photos/dog/0.jpg",
        "./photos/dog/0.jpg",  # the same photo under another spelling
        "photos/cat/2.jpg",  # moved to dog/2.jpg since
        "photos/dog/1.jpg",
        "photos/dog/2.jpg",
        "photos/owl/0.jpg",  # its label folder deleted
        str(tmp_path / "elsewhere/bird/0.jpg"),  # another FOLDER, the same --out
    ]
    x = np.arange(len(stored), dtype=np.float32)[:, None] * np.ones((1, 4), np.float32)
    chosen = head.training_set(stored, x, now)
    assert chosen.paths == sorted(p.path for p in now.values())
    assert chosen.labels == ["cat", "dog"]
    assert [chosen.labels[i] for i in chosen.y] == ["cat", "cat", "dog", "dog", "dog"]
    assert chosen.x[:, 0].tolist() == [0, 1, 2, 5, 6]  # the row the walk spells for dog/0
    assert chosen.left_out == {"not_under_folder": 3, "stored_twice": 1}
    assert (
        sorted(now)
        == [head.absolute(p) for p in chosen.paths]
        == sorted(str(p) for p in folder.rglob("*.jpg"))
    )


def test_a_photo_whose_name_is_not_utf8_is_matched_to_its_embedding(tmp_path):
    """A name the file system gives as bytes that are not UTF-8 is stored as ``\\xNN`` text
    beside its exact bytes; read back it is the name the walk gives, so the photo is fitted
    (before: every run refused it as "no embedding", the folder said to have changed)."""
    folder = photos(tmp_path / "photos", {"cat": 2, "dog": 2})
    os.rename(os.fsencode(folder) + b"/cat/0.jpg", os.fsencode(folder) + b"/cat/caf\xe9.jpg")
    now = head.walk(folder)
    stored = [vectors.stored_path(p) for p in sorted(now)]
    table = vectors.embedding_rows([text for text, _ in stored], np.eye(len(stored), 2048))
    raw = pa.array([exact for _, exact in stored], pa.binary())
    table = table.set_column(table.schema.get_field_index("path_bytes"), "path_bytes", raw)
    pq.write_table(table, tmp_path / "embeddings.parquet")
    chosen = head.training_set(*vectors.read_matrix(tmp_path / "embeddings.parquet"), now)
    assert os.fsencode(folder) + b"/cat/caf\xe9.jpg" in [os.fsencode(p) for p in chosen.paths]
    assert [chosen.labels[i] for i in chosen.y] == ["cat", "cat", "dog", "dog"]
    assert chosen.left_out == {"not_under_folder": 0, "stored_twice": 0}


LOCALE_FREE = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import numpy as np, torch
    from serveclient import head
    folder, out = Path(sys.argv[1]), Path(sys.argv[2])
    photos = head.walk(folder)
    x = np.random.default_rng(0).normal(size=(len(photos), 8)).astype(np.float32)
    chosen = head.training_set(sorted(photos), x, photos)
    fitted = head.fit(chosen.x, chosen.y, chosen.labels, test_size=0.5)
    torch.save({"fc.weight": torch.zeros(2, 8), "fc.bias": torch.zeros(2)}, out / "b.pt")
    backbone = {"path": str(out / "b.pt"), "sha256": "", "checked_against_server": False}
    report = head.report(out, chosen, fitted, {}, backbone)
    head.publish(out, out / "b.pt", fitted, report)
    """
)


def test_labels_are_written_as_utf8_whatever_the_locale(tmp_path):
    """Under an ASCII locale (no UTF-8 mode) a folder named ``café`` is still the label
    ``café`` and labels.txt holds it in UTF-8, as every reader reads it."""
    folder = photos(tmp_path / "photos", {"café": 2, "猫": 2})
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    run = subprocess.run(
        [sys.executable, "-c", LOCALE_FREE, os.fsencode(folder), str(out)],
        env=env,
        capture_output=True,
    )
    assert run.returncode == 0, run.stderr.decode(errors="replace")
    assert (out / "labels.txt").read_bytes() == "café\n猫\n".encode()
    import torch

    assert torch.load(out / "resnet50.pt", weights_only=True)["labels"] == ["café", "猫"]
