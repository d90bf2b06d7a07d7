"""Where the benchmark reads its inputs and writes its build output, and the CLI plumbing
every tool shares: ``cli`` (its parser, with the one ``--attach`` option), ``parse`` and
``torchserve`` (the server a tool measures: the attached one or its own);
``checked_out``: a past commit beside this tree (bench.corecost, bench.beforeafter)."""

from __future__ import annotations

import argparse
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


def fresh_dir(path: Path) -> Path:
    """An empty folder (a server's old logs would mix into this run's log parsing)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def cli(prog: str, doc: str, out: Path | None = RESULTS, attach: str = ""):
    """A tool's parser (described by ``doc``'s first paragraph) with the options every tool
    shares: ``--out`` (default ``out``; None: the tool has none), ``--quiet`` and, where
    ``attach`` names what it measures there, ``--attach DIR``."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    if out is not None:
        parser.add_argument("--out", type=Path, default=out, help=f"the report (default {out})")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    if attach:
        parser.add_argument(
            "--attach",
            type=Path,
            metavar="DIR",
            help=f"{attach}: the TorchServe devtools.server started in DIR (the shipped "
            "settings), measured and left running",
        )
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser``'s arguments, with ``setup_cli`` done for the tool."""
    args = parser.parse_args(argv)
    setup_cli(parser.prog.removeprefix("python -m "), args.quiet)
    return args


def torchserve(attach: Path | None, workdir: Path, store: Path = MODEL_STORE, **options):
    """The TorchServe a tool measures: the one ``--attach`` named (measured and left running),
    else a fresh one in ``workdir`` on ``store`` with ``LocalTorchServe``'s ``options``."""
    from devtools.server import LocalTorchServe

    if attach:
        return LocalTorchServe.attach(attach)
    return LocalTorchServe(fresh_dir(workdir), store, **options)


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
