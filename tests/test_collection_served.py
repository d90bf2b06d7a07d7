"""``tsctl embed``/``tag``/``similar`` over collections, against the session's real TorchServe:
one row per image file (a broken one with its error, non-images left out), vectors equal to
single requests, a SIGKILLed run resumed to the same content, shards that add up to the whole,
and a photo's flipped copy found first (on TorchServe and on Triton, with and without an
index)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import requests
from PIL import ImageOps

from serveclient.vectors import metadata, read_matrix
from tests import imagegen
from tests.reference import rel_error
from tests.served import TSCTL, tsctl

pytestmark = pytest.mark.integration
CONTENT = ["path", "size", "mtime", "sha256", "status", "error", "precision"]
N_KILLED = 64


def _album(root, n, seed=0, size=(200, 150)):
    """``n`` photos in nested folders, returned in walk order."""
    paths = []
    for i in range(n):
        folder = root / f"y{i % 3}" / f"m{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"p{i:04d}.jpg"
        path.write_bytes(imagegen.jpeg(*size, seed=seed + i))
        paths.append(str(path))
    return paths


def _frame(path):
    return pq.read_table(path).to_pandas().sort_values("path").reset_index(drop=True)


def _same_content(a, b):
    fa, fb = _frame(a), _frame(b)
    assert fa[CONTENT].equals(fb[CONTENT])
    for x, y in zip(fa["embedding"], fb["embedding"]):
        assert (x is None) == (y is None)
        if x is not None:
            assert rel_error(list(x), list(y)) <= 1e-4


def test_a_folder_gets_one_row_per_image_and_vectors_equal_single_requests(torchserve, tmp_path):
    root = tmp_path / "photos"
    photos = _album(root, 7, seed=500)
    (root / "y0" / "broken.jpg").write_bytes(b"not an image at all")
    (root / "y1" / "notes.txt").write_text("not an image file")
    out = tmp_path / "v.parquet"
    run = tsctl(torchserve, "embed", str(root), "--out", str(out), "--json")
    assert run.returncode == 7, run.stderr  # one file failed
    summary = json.loads(run.stdout)
    assert (summary["rows"], summary["done"], summary["failed"]) == (8, 7, 1)
    frame = _frame(out)
    assert sorted(frame["path"]) == sorted([*photos, str(root / "y0" / "broken.jpg")])
    broken = frame[frame["path"].str.endswith("broken.jpg")].iloc[0]
    assert broken["status"] == "error" and "InvalidImage" in broken["error"]
    assert broken["embedding"] is None and broken["sha256"] is not None
    meta = metadata(out)
    assert meta["model"] == "resnet50-embedding" and meta["model_version"] == "1.0"
    assert len(meta["weights_sha256"]) == 64 and meta["precision"]
    # Each row names the arithmetic that computed it: the X-Precision the server sends.
    served = requests.post(
        f"{torchserve.inference_url}/predictions/resnet50-embedding",
        data=Path(photos[0]).read_bytes(),
        timeout=120,
        headers=torchserve.keys.inference_headers(),
    ).headers["X-Precision"]
    assert served and set(frame["precision"].dropna()) == {served}
    assert frame["precision"].isna().tolist() == (frame["status"] == "error").tolist()
    client = torchserve.client()
    paths, matrix = read_matrix(out)
    for path, vector in zip(paths, matrix):
        single = client.predict("resnet50-embedding", Path(path).read_bytes())["embedding"]
        assert rel_error(vector.tolist(), single) <= 1e-4
    # A rerun does nothing but retry the failed file.
    again = tsctl(torchserve, "embed", str(root), "--out", str(out), "--json")
    assert again.returncode == 7
    assert (json.loads(again.stdout)["skipped"], json.loads(again.stdout)["failed"]) == (7, 1)
    # Tags, KServe v1, through --url with a bearer token from the environment.
    tags = tmp_path / "t.parquet"
    env = {**torchserve.cli_env(), "MY_TOKEN": torchserve.keys.inference}
    tagged = subprocess.run(
        [
            str(TSCTL),
            "tag",
            str(root / "y1"),
            "--out",
            str(tags),
            "--protocol",
            "v1",
            "--url",
            torchserve.inference_url,
            "--token-env",
            "MY_TOKEN",
            "--topk",
            "3",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tagged.returncode == 0, tagged.stderr
    rows = pq.read_table(tags).to_pylist()
    assert len(rows) == sum("/y1/" in p for p in photos)
    assert all(len(r["tags"]) == 3 and r["status"] == "ok" for r in rows)
    # KServe v1 says it too: the tagger's own precision (each model measures its own).
    tagger = requests.post(
        f"{torchserve.inference_url}/predictions/resnet50-tagger",
        data=Path(photos[0]).read_bytes(),
        timeout=120,
        headers=torchserve.keys.inference_headers(),
    ).headers["X-Precision"]
    assert {r["precision"] for r in rows} == {tagger}
    assert metadata(tags)["model_version"] is None  # no management API behind --url


def test_a_killed_run_resumes_to_the_same_content(torchserve, tmp_path):
    root = tmp_path / "photos"
    # A part every 8 rows: the run outlasts its first part several times over, even at int8's
    # pace (~75 img/s on 2 cores), and the kill lands mid-run.
    _album(root, N_KILLED, seed=700, size=(160, 120))
    whole = tmp_path / "whole.parquet"
    assert tsctl(torchserve, "embed", str(root), "--out", str(whole)).returncode == 0
    out = tmp_path / "killed.parquet"
    parts = tmp_path / "killed.parquet.parts"
    process = subprocess.Popen(
        [
            str(TSCTL),
            "embed",
            str(root),
            "--out",
            str(out),
            "--concurrency",
            "4",
            "--per-request",
            "2",
            "--part-rows",
            "8",
        ],
        env=torchserve.cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not (parts.is_dir() and any(parts.glob("part-*.parquet"))):
        assert process.poll() is None, "finished before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not out.exists()
    written = sum(pq.ParquetFile(p).metadata.num_rows for p in parts.glob("part-*.parquet"))
    assert 0 < written < N_KILLED
    resumed = tsctl(torchserve, "embed", str(root), "--out", str(out), "--json")
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    assert summary["skipped"] == written and summary["done"] == N_KILLED - written
    assert not parts.exists() and not list(tmp_path.glob(".*.tmp"))
    _same_content(out, whole)


def test_shards_concatenate_to_the_whole(torchserve, tmp_path):
    root = tmp_path / "photos"
    _album(root, 12, seed=900, size=(160, 120))  # 3, 3 and 6 photos by shard_of
    whole = tmp_path / "whole.parquet"
    assert tsctl(torchserve, "embed", str(root), "--out", str(whole)).returncode == 0
    shards = []
    for i in range(3):
        shard = tmp_path / f"shard-{i}.parquet"
        run = tsctl(torchserve, "embed", str(root), "--out", str(shard), "--shard", f"{i}/3")
        assert run.returncode == 0, run.stderr
        assert metadata(shard)["shard"] == f"{i}/3"
        shards.append(shard)
    merged = tmp_path / "merged.parquet"
    import pyarrow as pa

    pq.write_table(pa.concat_tables([pq.read_table(s) for s in shards]), merged)
    assert all(pq.ParquetFile(s).metadata.num_rows > 0 for s in shards)
    _same_content(merged, whole)


@pytest.mark.parametrize("engine", ["torchserve", "triton"])
def test_similar_finds_a_photos_flipped_copy_first(engine, request, tmp_path):
    """On either engine (the session's TorchServe; its Triton, by ``--url``), with and without
    ``tsctl index build``'s index, the query a file embedded by the server or (``--stored``)
    a photo of the collection."""
    server = request.getfixturevalue(engine)
    root = tmp_path / "photos"
    photos = _album(root, 12, seed=1100, size=(320, 240))
    query = photos[4]
    flipped = root / "flipped.jpg"
    flipped.write_bytes(imagegen.encode(ImageOps.mirror(imagegen.photo(320, 240, seed=1104))))
    index = tmp_path / "v.parquet"
    # Paths on stdin, as from `find`.
    listing = "\n".join([*photos, str(flipped)]) + "\n"
    run = tsctl(server, "embed", "-", "--out", str(index), stdin=listing)
    assert run.returncode == 0, run.stderr
    found = tsctl(server, "similar", query, "--index", str(index), "-k", "3", "--json")
    assert found.returncode == 0, found.stderr
    hits = json.loads(found.stdout)[query]
    assert hits[0]["path"] == str(flipped), hits
    assert query not in [h["path"] for h in hits]  # the query itself is left out
    assert hits[0]["score"] > hits[1]["score"]
    # The query as a photo of the collection: its stored vector, no server asked.
    by_path = tsctl(None, "similar", query, "--stored", "--index", str(index), "-k", "3", "--json")
    assert by_path.returncode == 0, by_path.stderr
    assert [h["path"] for h in json.loads(by_path.stdout)[query]] == [h["path"] for h in hits]
    # Untrained weights (a seeded build) put every photo close: cut between the two scores.
    threshold = (hits[0]["score"] + hits[1]["score"]) / 2
    dups = tsctl(
        None, "duplicates", "--index", str(index), "--threshold", f"{threshold:.6f}", "--json"
    )
    assert dups.returncode == 0, dups.stderr
    groups = json.loads(dups.stdout)["groups"]
    assert any({query, str(flipped)} <= set(g["paths"]) for g in groups), groups

    # The same commands through `tsctl index build`'s index answer the same; once the embed
    # output changes, the index is named stale (with its fix) and --exact still answers.
    built = tsctl(None, "index", "build", str(index), "--no-progress")
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "v.parquet.vindex" / "manifest.json").is_file()
    near, same = tmp_path / "similar.html", tmp_path / "duplicates.html"
    indexed = tsctl(
        server, "similar", query, "--index", str(index), "-k", "3", "--json", "--html", str(near)
    )
    assert indexed.returncode == 0, indexed.stderr
    assert [h["path"] for h in json.loads(indexed.stdout)[query]] == [h["path"] for h in hits]
    stored = tsctl(None, "similar", query, "--stored", "--index", str(index), "-k", "1", "--json")
    assert stored.returncode == 0, stored.stderr
    assert [h["path"] for h in json.loads(stored.stdout)[query]] == [str(flipped)]
    indexed_dups = tsctl(
        None, "duplicates", "--index", str(index), "--threshold", f"{threshold:.6f}", "--json",
        "--html", str(same),
    )  # fmt: skip
    assert [g["paths"] for g in json.loads(indexed_dups.stdout)["groups"]] == [
        g["paths"] for g in groups
    ]
    # The picture pages from the index's answers: the query beside its flipped copy.
    for page in (near, same):
        html = page.read_text()
        assert query in html and str(flipped) in html, page
    pq.write_table(pq.read_table(index).slice(1), index)
    stale = tsctl(server, "similar", query, "--index", str(index), "-k", "3", "--json")
    assert stale.returncode != 0
    assert "older than" in stale.stderr and "--exact" in stale.stderr, stale.stderr
    exact = tsctl(server, "similar", query, "--index", str(index), "--exact", "--json")
    assert exact.returncode == 0, exact.stderr
