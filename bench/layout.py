"""Where the benchmark reads its inputs and writes its build output, and the CLI plumbing
its commands share (bench, bench.sweep, bench.ingestion, bench.contention,
bench.availability); ``checked_out``: a past commit beside this tree (bench.corecost,
bench.beforeafter); ``publish``: where every tool's report goes."""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WEIGHTS = REPO / "build" / "weights"
SAMPLES = REPO / "build" / "samples"
MODEL_STORE = REPO / "model-store"
BUILD = REPO / "build" / "bench"  # exports, stock archive, server working folders
RESULTS = REPO / "results"
TAGGER = "resnet50-tagger"
EMBEDDING = "resnet50-embedding"
# written by `make samples`; the noisy one is what phone photos are like (3.3 MB, not 0.8 MB)
IMAGES = {
    "small": "chelsea.jpg",
    "12mp": "chelsea-12mp.jpg",
    "12mp-noisy": "chelsea-12mp-noisy.jpg",
}


@contextmanager
def checked_out(ref: str, folder: Path) -> Iterator[Path]:
    """``ref`` checked out (detached) in ``folder``, a git worktree of this repository,
    removed on the way out."""
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(folder), ref],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    try:
        yield folder
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(folder)], cwd=REPO, check=False)


def publish(path: Path, text: str) -> int:
    """A tool's report written to ``path`` (its folder made) and printed: stdout carries only
    the report. The tool's exit status, 0."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(text)
    return 0


def fresh_dir(path: Path) -> Path:
    """An empty folder (a server's old logs would mix into this run's log parsing)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def setup_cli(name: str, quiet: bool) -> None:
    """Progress lines on stderr (stdout carries only the report), and SIGTERM turned into an
    exception so that every ``finally`` stops its TorchServe."""
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format=f"%(asctime)s {name}: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
