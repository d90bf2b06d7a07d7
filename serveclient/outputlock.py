"""One writer per output: the lock that ``tsctl embed``, ``tsctl index build`` and
``tsctl head train`` hold on what they write.

The lock is a file beside the output (``OUT.lock`` for ``OUT`` a file or a folder), never
inside it, so a folder that is built elsewhere and swapped in does not take its lock with it.
It is an advisory ``flock``: the kernel releases it when its holder exits, ``kill -9``
included, so a crashed run never leaves a stale lock to delete by hand. The standard library's
``fcntl`` is enough for that; the lock file also says who holds it (pid, command, since when),
which a second run prints when it is refused (a library lock such as ``filelock`` truncates
the file it locks and could not say).

A second run on the same output either waits for the first (``wait=True``: ``--wait`` on the
command line) or is refused at once with ``OutputBusy``, naming the holder.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from serveclient.errors import ServeError

__all__ = ["OutputBusy", "hold", "lock_path"]


class OutputBusy(ServeError):
    """Another run holds the lock of the output this one would write."""

    exit_code = 8


def lock_path(output: Path | str) -> Path:
    """The lock file of ``output``: beside it, named ``<name>.lock``."""
    out = Path(output).expanduser().absolute()
    return out.with_name(out.name + ".lock")


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return "another run"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("since", 0)))
    return f"{info.get('command', 'another run')} (pid {info.get('pid', '?')}, since {since})"


@contextmanager
def hold(output: Path | str, *, wait: bool = False, what: str = "") -> Iterator[Path]:
    """Hold ``output``'s lock for the body of the ``with``; yields the lock file's path.

    ``wait``: block until the holder lets go (a signal such as Ctrl-C still interrupts);
    otherwise raise ``OutputBusy`` at once, naming the holder and the flag that waits.
    ``what`` names this run in the lock file (default: the command line)."""
    path = lock_path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError as err:
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise OutputBusy(
                f"{_holder(path)} is writing {Path(output)} (its lock: {path})",
                "wait for it to finish, or run again with --wait to start when it does",
            ) from None
        command = what or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
        info = {"pid": os.getpid(), "command": command, "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        yield path
    finally:
        os.close(fd)  # closing the descriptor releases the flock
