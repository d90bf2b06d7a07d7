"""How often a model's worker was started again in its slot, under the same server process.

A worker process that dies (the kernel's OOM killer, a crash in a native library) is started
again by its engine in the same slot: TorchServe's frontend retries the same worker thread on
the same socket (``--sock-name``/``--port``); Triton's instance keeps its name
(``<model>_<group>_<n>``) when ``tritonrepo/watchdog.py`` loads the model again. The new
process cannot ask the dead one, so each start leaves a mark in a folder named for the server
process (its pid and start time: a server started afresh counts from 0), and ``mark_start``
says how many starts came before this one: the worker's restarts, which the core exports as
``resnet50_worker_restarts`` (``servecore.metrics``). Another slot's worker (a scale-up, a
model registered again) is a new slot, not a restart; an operator loading a loaded Triton
model again restarts its instances and counts.

Marks are a few bytes in the temp folder; folders of servers that have exited are removed when
a worker starts. Counting never stops a model from loading: a temp folder it cannot write
counts 0, with a warning.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from urllib.parse import quote

import psutil

logger = logging.getLogger(__name__)

FOLDER = "resnet50-serve-starts"  # under the temp folder the server's workers share


def server_key(process: psutil.Process) -> str:
    """``<pid>-<start time>``: one server process, never a later one given the same pid."""
    return f"{process.pid}-{int(process.create_time())}"


def mark_start(
    model: str, slot: str, root: Path | None = None, server: psutil.Process | None = None
) -> int:
    """Record that ``model``'s worker in ``slot`` starts now under ``server`` (default: this
    process's parent, the engine that started it); returns the starts recorded before, 0 the
    first time. One slot runs one process at a time, so its mark has one writer."""
    base = root or Path(tempfile.gettempdir()) / FOLDER
    try:
        owner = server or psutil.Process().parent()
        if owner is None:
            return 0
        folder = base / server_key(owner)
        folder.mkdir(parents=True, exist_ok=True)
        mark = folder / quote(f"{model}@{slot}", safe="")
        before = int(mark.read_text() or 0) if mark.exists() else 0
        mark.write_text(str(before + 1))
        _forget_exited(base, keep=folder.name)
    except (OSError, ValueError, psutil.Error) as exc:
        logger.warning("%s: restarts not counted (%s)", model, exc)
        return 0
    return before


def _forget_exited(base: Path, keep: str) -> None:
    """Remove the folders of servers no longer running (best effort: another worker may be
    removing the same one)."""
    for folder in base.iterdir():
        pid, _, started = folder.name.partition("-")
        if folder.name == keep or not pid.isdigit():
            continue
        try:
            alive = server_key(psutil.Process(int(pid))) == folder.name
        except psutil.Error:
            alive = False
        if not alive and started:
            shutil.rmtree(folder, ignore_errors=True)
