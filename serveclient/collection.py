"""A photo collection as a stream of files: walked from files, folders and a list of paths on
stdin, split into shards, and read (``read_file``).

    collection = Collection(["photos/", "extra.jpg"])     # or Collection(["-"], stdin=sys.stdin)
    for entry in collection.entries(Shard.parse("2/8")):   # Entry(path, key, size, mtime_ns)
        ...

Walking: folders recursively, in sorted order (so two walks of the same tree agree), keeping
files with an image extension (``IMAGE_EXTENSIONS``); files named on the command line or on
stdin are kept whatever their extension (the user chose them). Symbolic links are followed; a
folder reached twice (a symlink loop, or two links to one folder) is walked once. Nothing is
collected in memory but the set of folders seen: the stream is as long as the collection, the
memory is not.

Paths: each source is made absolute first (``~`` expanded, ``.`` and ``..`` resolved as the
shell's ``cd`` does, by the name: ``os.path.abspath``), so ``photos``, ``./photos/`` and
``~/photos`` walk to the same paths, and a rerun matches its rows whatever the working folder.
Symbolic links are kept as named, not resolved: a linked album stays where the user sees it
(its label folder, its place in a page), and paths stay the same when the target behind a
stable link moves. File names are kept as the operating system gives them (bytes that are not
UTF-8 as ``os.fsdecode``'s surrogates; ``serveclient.vectors`` stores them byte for byte).

Sharding: a file belongs to shard ``i`` of ``n`` when a stable hash of its ``key`` (its path
relative to the folder it was found under, or the path as given) is ``i`` modulo ``n``. So n
machines given the same sources split them without talking to each other, the shards are
disjoint, and together they are the whole collection, wherever each machine mounts it.

Reading: only a regular file of at most ``MAX_FILE_BYTES`` (the most a request can carry), never
a FIFO, a device, a folder or a socket, and never more than that into memory: every file a
command sends or shows (``embed``, ``tag``, ``similar QUERY``, ``explain``, a page's thumbnails)
is read by ``read_file``, so no path can hang a run or fill its memory.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
import threading
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO

from serveclient.errors import UsageError

# What the handler decodes (docs/api.md#images), by file name.
IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff", ".mpo"}
)
STDIN = "-"
MAX_FILE_BYTES = 32 << 20  # one file read: the most a request may carry (max_request_size)
NOT_REGULAR = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
    (stat.S_ISSOCK, "a socket"),
)
TOO_LARGE = f"over the {MAX_FILE_BYTES >> 20} MiB a request can carry"


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (0 <= index < count); ``Shard(0, 1)`` is everything."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str | None) -> Shard:
        """``"i/n"`` (as ``--shard`` takes it; a Kubernetes Indexed Job passes
        ``$(JOB_COMPLETION_INDEX)/<completions>``), or None for the whole collection."""
        if text is None:
            return cls()
        try:
            index, count = (int(part) for part in text.split("/"))
        except ValueError:
            index, count = -1, 0
        if not 0 <= index < count:
            raise UsageError(
                f"--shard {text!r} is not i/n with 0 <= i < n",
                "e.g. --shard 0/4 ... --shard 3/4 for four machines",
            )
        return cls(index, count)

    def holds(self, key: str) -> bool:
        return self.count == 1 or shard_of(key, self.count) == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def shard_of(key: str, count: int) -> int:
    """The shard (0..count-1) of a file's key: blake2b, so the same on every machine and
    Python version (``hash()`` is salted per process)."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


@dataclass(frozen=True)
class Entry:
    """One file of the collection. ``path``: as walked (the absolute source joined with the
    names below it); ``key``: what shards it (relative to its source folder); ``size`` and
    ``mtime_ns`` from ``stat`` (what a rerun compares), or None when it could not be read
    (``error`` says why). ``unlisted``: a folder or source that could not be read, so the walk
    cannot say which files lie under it."""

    path: str
    key: str
    size: int | None
    mtime_ns: int | None
    error: str | None = None
    unlisted: bool = False


class Collection:
    """The files of ``sources`` (files, folders, or ``-`` for newline-separated paths read from
    ``stdin``), re-iterable: stdin is spooled to a temporary file on first use, so a second
    pass (counting for the progress bar, then working) reads the same list."""

    def __init__(self, sources: Iterable[str], stdin: IO[str] | None = None) -> None:
        self.sources = list(sources)
        if not self.sources:
            raise UsageError(
                "no files, folders or '-' given",
                "name image files or folders, or pipe paths: find ... | tsctl embed -",
            )
        self._stdin = stdin
        self._spool: str | None = None  # the temporary file holding stdin's paths
        self._lock = threading.Lock()

    def entries(self, shard: Shard = Shard()) -> Iterator[Entry]:
        """Every file of the collection in ``shard``, in walk order."""
        for entry in self._walk():
            if shard.holds(entry.key):
                yield entry

    def _walk(self) -> Iterator[Entry]:
        seen: set[tuple[int, int]] = set()  # (device, inode) of every folder walked
        for source in self.sources:
            if source == STDIN:
                for line in self._stdin_lines():
                    yield from _source(line, seen)
            else:
                yield from _source(source, seen)

    def _stdin_lines(self) -> Iterator[str]:
        with self._lock:  # two walks (the job and its progress count) may start together
            if self._spool is None:
                if self._stdin is None:
                    raise UsageError("'-' given but no stdin to read paths from")
                handle, self._spool = tempfile.mkstemp(prefix="tsctl-paths-")
                weakref.finalize(self, os.unlink, self._spool)
                with open(handle, "w", encoding="utf-8", errors="surrogateescape") as spool:
                    for line in self._stdin:
                        spool.write(line if line.endswith("\n") else line + "\n")
        # Each walk opens the spool itself, so it reads at its own position.
        with open(self._spool, encoding="utf-8", errors="surrogateescape") as own:
            for line in own:
                path = line.rstrip("\n")
                if path.strip():
                    yield path


def _source(given: str, seen: set[tuple[int, int]]) -> Iterator[Entry]:
    """A folder walked, or a file (any extension) as it is, keyed by the path as given; a path
    that cannot be read is one failed entry (its row says why)."""
    path = os.path.abspath(os.path.expanduser(given))
    try:
        info = os.stat(path)
    except OSError as exc:
        yield Entry(path, given, None, None, _reason(exc), unlisted=True)
        return
    if stat.S_ISDIR(info.st_mode):
        yield from _walk_folder(path, seen)
    else:
        yield Entry(path, given, info.st_size, info.st_mtime_ns)


def _walk_folder(root: str, seen: set[tuple[int, int]]) -> Iterator[Entry]:
    """Depth-first, names sorted, symlinks followed, each folder once."""
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            info = os.stat(folder)
            if (info.st_dev, info.st_ino) in seen:
                continue  # a symlink loop, or a second link to a folder already walked
            seen.add((info.st_dev, info.st_ino))
            with os.scandir(folder) as listing:
                items = sorted(listing, key=lambda item: item.name)
        except OSError as exc:
            key = os.path.relpath(folder, root)
            yield Entry(folder, key, None, None, _reason(exc), unlisted=True)
            continue
        folders = []
        for item in items:
            try:
                is_dir = item.is_dir()  # follows symlinks
            except OSError:
                is_dir = False
            if is_dir:
                folders.append(item.path)
            elif os.path.splitext(item.name)[1].lower() in IMAGE_EXTENSIONS:
                key = os.path.relpath(item.path, root)
                try:
                    info = item.stat()
                except OSError as exc:  # e.g. a dangling symlink
                    yield Entry(item.path, key, None, None, _reason(exc))
                    continue
                yield Entry(item.path, key, info.st_size, info.st_mtime_ns)
        stack.extend(reversed(folders))  # popped in sorted order


def _reason(exc: OSError) -> str:
    return f"cannot read: {exc.strerror or exc}"


def read_file(path: str | os.PathLike[str]) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file at ``path`` and its ``fstat``; ValueError naming what it
    is instead (a FIFO, a device, a folder, a socket) or that it is over ``MAX_FILE_BYTES``,
    OSError when it cannot be read. Checked by ``stat`` before it is opened (nothing else is
    opened), opened without blocking (a FIFO swapped in meanwhile has no writer to wait for)
    and checked again on the descriptor it is read from; at most ``MAX_FILE_BYTES + 1`` bytes
    are read, so a file that grows meanwhile is refused, not read whole."""
    _readable(os.stat(path))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        info = _readable(os.fstat(fd))
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"grown {TOO_LARGE} while read")
    return data, info


def _readable(info: os.stat_result) -> os.stat_result:
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in NOT_REGULAR if test(info.st_mode)), "a special file")
        raise ValueError(f"{kind}, not a regular file")
    if info.st_size > MAX_FILE_BYTES:
        raise ValueError(f"{info.st_size:,} bytes, {TOO_LARGE}")
    return info
