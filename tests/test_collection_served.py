"""``tsctl embed``/``tag``/``similar`` over collections, against the session's real TorchServe:
one row per image file (a broken one with its error, non-images left out), vectors equal to
single requests, a SIGKILLed run and one stopped by Ctrl-C resumed to the same content, shards
that add up to the whole, and a photo's flipped copy found first (on TorchServe and on Triton,
with and without an index)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import random
import re
import select
import signal
import struct
import subprocess
import termios
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
CONTENT = ["path", "path_bytes", "size", "mtime", "sha256", "status", "error", "precision"]
N_KILLED = 36  # photos of the kill trials and the Ctrl-C run
KILL_TRIALS = 3


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


def _parts(out: Path) -> list[Path]:
    return sorted(out.with_name(out.name + ".parts").glob("part-*.parquet"))


def _killed(server, root: Path, out: Path, rng: random.Random) -> str:
    """Start the real ``tsctl embed ROOT --out OUT`` (a part every 2 rows) and SIGKILL it at a
    random point of its own progress: once a random number of new parts are on disk, or as its
    merge begins; what it was killed at (``finished``: it ended first)."""
    before = len(_parts(out))
    stamp = out.stat().st_mtime_ns if out.exists() else None
    target = rng.choice([None, *range(1, N_KILLED // 2)])  # None: at the merge
    argv = [str(TSCTL), "embed", str(root), "--out", str(out), "--part-rows", "2"]
    argv += ["--concurrency", "2", "--per-request", "1"]
    process = subprocess.Popen(
        argv, env=server.cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 120
        while process.poll() is None:
            merging = any(out.parent.glob(f".{out.name}.*.tmp")) or (
                out.exists() and out.stat().st_mtime_ns != stamp
            )
            written = len(_parts(out)) - before
            if merging if target is None else written >= target:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
                return "merge" if target is None else f"{written} parts"
            assert time.monotonic() < deadline, "the run neither ended nor reached its kill point"
            time.sleep(0.01)  # polls the files; the kill point is the job's, not a time
        return "finished"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def interrupted_album(torchserve, tmp_path_factory):
    """The photos the interrupted runs embed (``N_KILLED`` and a broken file: an error row
    among them), and an uninterrupted run's output of them."""
    root = tmp_path_factory.mktemp("interrupted") / "photos"
    _album(root, N_KILLED, seed=700, size=(160, 120))
    (root / "y0" / "broken.jpg").write_bytes(b"not an image")
    whole = root.with_name("whole.parquet")
    assert tsctl(torchserve, "embed", str(root), "--out", str(whole)).returncode == 7
    return root, whole


def test_runs_killed_at_random_points_resume_to_the_uninterrupted_output(
    torchserve, interrupted_album, tmp_path
):
    """``KILL_TRIALS`` seeded trials, each killing the real ``tsctl embed`` with SIGKILL once
    or twice at a random point (after a random number of parts, or at its merge) and then
    rerunning it: whatever the kill left is whole (each visible part and output a readable
    Parquet), and the rerun's output equals an uninterrupted run's: the same paths, one row
    each, the same statuses and errors, the same vectors."""
    root, whole = interrupted_album
    rng = random.Random(68)
    kills = []
    for trial in range(KILL_TRIALS):
        out = tmp_path / f"killed-{trial}.parquet"
        for _ in range(rng.randint(1, 2)):
            kills.append(_killed(torchserve, root, out, rng))
            for visible in [*_parts(out), *([out] if out.exists() else [])]:
                pq.read_metadata(visible)  # whole, or it would not be there by this name
        resumed = tsctl(torchserve, "embed", str(root), "--out", str(out), "--json")
        assert resumed.returncode == 7, resumed.stderr  # broken.jpg, not a refused lock
        assert not _parts(out) and not list(tmp_path.glob(".*.tmp"))
        assert _frame(out)["path"].is_unique
        _same_content(out, whole)
    assert sum(k != "finished" for k in kills) >= KILL_TRIALS, kills  # the kills did land


def test_ctrl_c_at_a_progress_line_exits_130_and_the_rerun_gives_the_uninterrupted_output(
    torchserve, interrupted_album, tmp_path
):
    """The real ``tsctl embed`` on a terminal (a pty: its progress bar drawn), sent SIGINT (what
    Ctrl-C sends) once its bar counts two photos done: exit 130 saying to rerun, what it had
    answered kept (the rerun skips it), and the rerun's output equals an uninterrupted run's."""
    root, whole = interrupted_album
    out = tmp_path / "v.parquet"
    argv = [str(TSCTL), "embed", str(root), "--out", str(out), "--part-rows", "2"]
    argv += ["--concurrency", "2", "--per-request", "1"]
    # two photos counted: at least one answered, whatever broken.jpg (a fast failure, counted
    # by the bar too, tried again by the rerun) did
    screen, counted = b"", re.compile(rb"\| *([2-9]|[1-9]\d+)/%d \[" % (N_KILLED + 1))
    master, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # 120 columns
    process = subprocess.Popen(
        argv,
        env=torchserve.cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=terminal,
        # as a shell starts a foreground command: a test run in the background (a non-interactive
        # shell's `&`) inherits SIGINT ignored, and tsctl would never see the Ctrl-C
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    os.close(terminal)

    def shown() -> bytes:
        """What the terminal shows next (b"" once tsctl has closed it: EIO)."""
        if not select.select([master], [], [], 0.5)[0]:
            return b""
        try:
            return os.read(master, 4096)
        except OSError:
            return b""

    try:
        deadline = time.monotonic() + 120
        while not (done := counted.findall(screen)):
            assert process.poll() is None and time.monotonic() < deadline, screen
            screen += shown()
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=120)
        while more := shown():
            screen += more
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
    assert code == 130, screen
    assert (
        b"tsctl embed: interrupted; what was answered is kept, rerun the same command to resume"
        in screen
    )
    resumed = tsctl(torchserve, "embed", str(root), "--out", str(out), "--json")
    assert resumed.returncode == 7, resumed.stderr  # broken.jpg
    summary = json.loads(resumed.stdout)
    assert summary["skipped"] >= int(done[-1]) - 1 and summary["done"] > 0  # interrupted mid-run
    assert summary["skipped"] + summary["done"] + summary["failed"] == N_KILLED + 1
    assert not _parts(out)
    _same_content(out, whole)


def test_names_that_are_not_utf8_and_every_spelling_of_a_folder_give_one_row_each(
    torchserve, tmp_path
):
    """The real ``tsctl`` from a working folder: ``photos``, ``~/photos`` (expanded by tsctl,
    as a quoted tilde is) and ``find``'s list on stdin, its bytes as the file system has them,
    all land on the same rows; a Latin-1 name is embedded and kept byte for byte; a photo
    moved is stored once, at its new path. Before: ``photos`` and ``~/photos`` stored each
    file twice, and the Latin-1 name stopped every run with a traceback."""
    home = tmp_path / "home"
    photos = _album(home / "photos", 4, seed=1300, size=(160, 120))
    latin1 = os.fsencode(home / "photos") + b"/caf\xe9.jpg"
    with open(latin1, "wb") as handle:
        handle.write(imagegen.jpeg(160, 120, seed=1304))
    env = {**torchserve.cli_env(), "HOME": str(home)}

    def embed(*sources: str, stdin: bytes | None = None) -> dict:
        argv = [str(TSCTL), "--json", "embed", *sources, "--out", "v.parquet"]
        run = subprocess.run(argv, cwd=home, env=env, input=stdin, capture_output=True, timeout=300)
        assert run.returncode == 0, run.stderr.decode(errors="replace")
        return json.loads(run.stdout)

    assert (embed("photos")["rows"], embed("~/photos")["skipped"]) == (5, 5)
    listing = b"\n".join([latin1, *(os.fsencode(p) for p in photos)]) + b"\n"
    assert embed("-", stdin=listing)["skipped"] == 5
    Path(photos[0]).rename(home / "photos" / "moved.jpg")
    moved = embed("./photos/")
    assert (moved["rows"], moved["done"], moved["gone"]) == (5, 1, 1)
    frame = _frame(home / "v.parquet")
    text = f"{home}/photos/caf\\xe9.jpg"
    assert sorted(frame["path"]) == sorted([*photos[1:], str(home / "photos" / "moved.jpg"), text])
    assert frame.set_index("path")["path_bytes"].dropna().to_dict() == {text: latin1}
    assert (frame["status"] == "ok").all()


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
    found = tsctl(server, "similar", query, "--embeddings", str(index), "-k", "3", "--json")
    assert found.returncode == 0, found.stderr
    hits = json.loads(found.stdout)[query]
    assert hits[0]["path"] == str(flipped), hits
    assert query not in [h["path"] for h in hits]  # the query itself is left out
    assert hits[0]["score"] > hits[1]["score"]
    # The query as a photo of the collection: its stored vector, no server asked.
    by_path = tsctl(
        None, "similar", query, "--stored", "--embeddings", str(index), "-k", "3", "--json"
    )
    assert by_path.returncode == 0, by_path.stderr
    assert [h["path"] for h in json.loads(by_path.stdout)[query]] == [h["path"] for h in hits]
    # Untrained weights (a seeded build) put every photo close: cut between the two scores.
    threshold = (hits[0]["score"] + hits[1]["score"]) / 2
    dups = tsctl(
        None, "duplicates", "--embeddings", str(index), "--threshold", f"{threshold:.6f}", "--json"
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
        server,
        "similar",
        query,
        "--embeddings",
        str(index),
        "-k",
        "3",
        "--json",
        "--html",
        str(near),
    )
    assert indexed.returncode == 0, indexed.stderr
    assert [h["path"] for h in json.loads(indexed.stdout)[query]] == [h["path"] for h in hits]
    stored = tsctl(
        None, "similar", query, "--stored", "--embeddings", str(index), "-k", "1", "--json"
    )
    assert stored.returncode == 0, stored.stderr
    assert [h["path"] for h in json.loads(stored.stdout)[query]] == [str(flipped)]
    indexed_dups = tsctl(
        None, "duplicates", "--embeddings", str(index), "--threshold", f"{threshold:.6f}", "--json",
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
    stale = tsctl(server, "similar", query, "--embeddings", str(index), "-k", "3", "--json")
    assert stale.returncode != 0
    assert "older than" in stale.stderr and "--exact" in stale.stderr, stale.stderr
    exact = tsctl(server, "similar", query, "--embeddings", str(index), "--exact", "--json")
    assert exact.returncode == 0, exact.stderr
