"""``tsctl index build`` under kill -9 and concurrency, as real subprocesses on synthetic
vectors (serveclient/search/faissindex.py, serveclient/outputlock.py):

- killed at seeded random points (a progress line of its own, then a random share of the time
  to its next line in an uninterrupted run), the folder holds the index it started from or the
  finished one, whole, and a rerun leaves exactly what an uninterrupted build leaves;
- a second build of the same folder is refused naming the first, one with ``--wait`` builds
  after it, and ``tsctl similar`` meanwhile answers from the old index, whole;
- a reader that opened the index keeps answering from it while a rebuild replaces it (no
  SIGBUS from a truncated ``rescore.f16``, no rows rewritten under it).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("faiss")

from serveclient.search import faissindex as index
from tests.served import REPO, TSCTL, tsctl
from tests.test_index import files_of, vectors, write

ENV = dict(os.environ, PYTHONPATH=str(REPO))
TRIALS = 3
QUERIES = vectors(3, 99)


def build_argv(folder: Path, sources: list[Path], *extra: str) -> list[str]:
    return [str(TSCTL), "index", "build", *map(str, sources), "--out", str(folder), *extra]


def start(folder: Path, sources: list[Path], *extra: str) -> subprocess.Popen:
    """A ``tsctl index build`` showing its progress on stderr, one line per event."""
    return subprocess.Popen(
        build_argv(folder, sources, *extra),
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,  # universal newlines: each of tqdm's "\r" redraws is a line too
    )


def events(proc: subprocess.Popen) -> list[tuple[float, str]]:
    """(seconds since now, line) of each progress line until the build exits."""
    start_s = time.monotonic()
    return [(time.monotonic() - start_s, line.strip()) for line in proc.stderr if line.strip()]


def state(folder: Path) -> tuple[dict, list, list]:
    """What a reader finds in ``folder``: the sha256 of each file of the index it opens, its
    answers to QUERIES and the stored vectors of those answers (each row checked)."""
    opened = index.open_index(folder, check_sources=False)
    answers = opened.nearest(QUERIES, 5)
    rows = opened.stored([path for hits in answers for path, _ in hits])
    files = files_of(folder)
    hashes = {
        name: hashlib.sha256((files / name).read_bytes()).hexdigest()
        for name in (index.VECTORS, index.PATHS, index.RESCORE)
    }
    return hashes, answers, rows.round(4).tolist()


def leftovers(parent: Path, folder: Path) -> list[str]:
    """Whatever the builds left beside the manifest and the one build folder it names."""
    generation = json.loads((folder / index.MANIFEST).read_text())["generation"]
    inside = sorted(p.name for p in folder.iterdir() if p.name not in {index.MANIFEST, generation})
    beside = sorted(p.name for p in parent.iterdir() if p.name not in {folder.name, "v.lock"})
    return inside + beside


@pytest.fixture(scope="module")
def collections(tmp_path_factory):
    """A (1,500 photos in a.parquet, indexed into a template folder) and B (A, b.parquet's
    1,500 more, and newer.parquet's 50 of A's at a newer size), and what an uninterrupted
    build of B over A leaves: (template, sources of B, A's state, B's state, its progress)."""
    root = tmp_path_factory.mktemp("faults")
    names = [f"p{i:04d}.jpg" for i in range(3000)]
    matrix = vectors(3000, 68)
    a = write(root / "a.parquet", names[:1500], matrix[:1500])
    b = write(root / "b.parquet", names[1500:], matrix[1500:])
    newer = write(root / "newer.parquet", names[:50], vectors(50, 7), size=2)
    template = root / "template" / "v"
    index.build([a], template, progress=False)
    sources = [a, b, newer]
    reference = root / "reference" / "v"
    shutil.copytree(template, reference)
    proc = start(reference, sources)
    seen = events(proc)
    assert proc.wait() == 0, proc.stderr
    return template, sources, state(template), state(reference), seen


def test_a_build_killed_at_random_points_leaves_a_whole_index_and_a_rerun_finishes_it(
    tmp_path, collections
):
    template, sources, before, after, seen = collections
    assert before[0] != after[0]  # the build changes the index
    rng = random.Random(68)
    hit = []
    for trial in range(TRIALS):
        parent = tmp_path / f"trial{trial}"
        folder = parent / "v"
        shutil.copytree(template, folder)
        # a progress line in the trial's share of them (each trial a third of the build),
        # then a random share of the time to the next one
        k = rng.randrange(trial * len(seen) // TRIALS, (trial + 1) * len(seen) // TRIALS)
        gap = (seen[k + 1][0] if k + 1 < len(seen) else seen[k][0] + 0.5) - seen[k][0]
        delay = rng.random() * gap
        proc = start(folder, sources)
        lines = (line for line in proc.stderr if line.strip())
        for _ in range(k + 1):
            next(lines, None)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        code = proc.returncode
        hit.append((seen[k][1][:40], round(delay, 3), code))
        # what a reader sees now: the index it started from or the finished one, whole
        assert state(folder) in (before, after), hit[-1]
        rerun = subprocess.run(
            build_argv(folder, sources, "--no-progress"), env=ENV, capture_output=True, text=True
        )
        assert rerun.returncode == 0, rerun.stderr
        assert state(folder) == after, hit[-1]
        assert leftovers(parent, folder) == [], hit[-1]
    print("kill points (line, delay s, exit code):", hit, "of", [line for _, line in seen])
    assert sum(code == -signal.SIGKILL for *_, code in hit) >= TRIALS // 2  # most killed


def test_a_second_build_is_refused_or_waits_and_searches_meanwhile_answer_whole(
    tmp_path, collections
):
    template, sources, _, after, _ = collections
    folder = tmp_path / "v"
    shutil.copytree(template, folder)
    similar = ["--json", "similar", "p0007.jpg", "--stored", "--embeddings", str(sources[0])]
    similar += ["--index", str(folder), "-k", "5"]
    first = start(folder, sources)
    waiting = None
    try:
        first.stderr.readline()  # its first progress line: it holds the lock, and is stopped
        first.send_signal(signal.SIGSTOP)
        second = subprocess.run(
            build_argv(folder, sources), env=ENV, capture_output=True, text=True, timeout=120
        )
        assert second.returncode == 8, second.stderr
        assert f"pid {first.pid}" in second.stderr and "--wait" in second.stderr
        meanwhile = tsctl(None, *similar)  # a.parquet is unchanged: the old index answers
        assert meanwhile.returncode == 0, meanwhile.stderr
        old = index.open_index(template)
        want = old.nearest(old.stored(["p0007.jpg"]), 5, ["p0007.jpg"])[0]
        assert [h["path"] for h in json.loads(meanwhile.stdout)["p0007.jpg"]] == [
            p for p, _ in want
        ]
        waiting = start(folder, sources, "--wait")
        first.send_signal(signal.SIGCONT)
        assert first.wait(120) == 0
        out, err = waiting.communicate(timeout=120)
        assert waiting.returncode == 0, err
        assert "0 added, 0 removed" in out  # it built after the first, on what that built
    finally:
        for proc in (first, waiting):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()
    assert state(folder) == after
    assert leftovers(tmp_path, folder) == []


READER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from serveclient.search import faissindex as index
    opened = index.open_index(Path(sys.argv[1]))
    paths = sorted(opened.names.values())
    def answers():
        rows = opened.stored(paths)
        return [rows.sum(axis=1).round(3).tolist(), opened.nearest(rows[:20], 3)]
    first = answers()
    print("opened", flush=True)
    sys.stdin.readline()
    print(json.dumps(first == answers()), flush=True)
    """
)


def test_a_reader_keeps_its_index_whole_while_a_rebuild_replaces_it(tmp_path):
    """Rebuilt from scratch and smaller (its manifest damaged): the reader that opened it
    before reads every row of its own ``rescore.f16`` after, and gets the same answers."""
    a = write(tmp_path / "a.parquet", [f"a{i}" for i in range(600)], vectors(600, 1))
    b = write(tmp_path / "b.parquet", [f"b{i}" for i in range(300)], vectors(300, 2))
    folder = tmp_path / "v"
    index.build([a], folder, progress=False)
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(folder)],
        env=ENV,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout.readline().strip() == "opened"
        (folder / index.MANIFEST).write_text(json.dumps({"format": 99}))
        rebuilt = subprocess.run(
            build_argv(folder, [b], "--no-progress"), env=ENV, capture_output=True, text=True
        )
        assert rebuilt.returncode == 0, rebuilt.stderr
        assert "300 vectors" in rebuilt.stdout
        out, _ = reader.communicate("go\n", timeout=120)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    assert reader.returncode == 0, f"the reader died: {signal.Signals(-reader.returncode).name}"
    assert out.strip() == "true"
    assert sorted(index.open_index(folder).names.values()) == sorted(f"b{i}" for i in range(300))
