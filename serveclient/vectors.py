"""The Parquet files of a collection job: their schema, the parts written while it runs, what
is already done, and the merged output.

One row per file: ``path``, ``path_bytes``, ``size``, ``mtime`` (UTC timestamp, ns),
``sha256`` (hex of the bytes sent), ``status`` (``ok`` or ``error``), ``error`` (the server's or
the reader's message), ``precision`` (the arithmetic that computed the row, from the answer's
``X-Precision`` header: replicas measuring ``auto`` on different nodes may differ; null for a
failed file or a server that does not say), ``cached`` (whether the server's content cache
answered it: TorchServe's ``X-Cache-Hits``, Triton's ``cached`` output; false when the cache is
off; null for a failed file, or where TorchServe counted some but not all of a request's images
as hits without naming them), and the answer: ``embedding``
(``fixed_size_list<float32>[2048]``) or ``tags`` (``list<struct<label: string, index: int32,
probability: float32>>``), null when the file failed. The file's key-value metadata ``tsclient``
holds JSON naming the model, its version, precision, backend and weights fingerprint (from the
describe answer) and the schema version.
pandas, polars and DuckDB read the files as they are.

Paths: ``path`` is always a UTF-8 string (absolute, as ``serveclient.collection`` walks it). A
file name the operating system gives as bytes that are not UTF-8 keeps its exact bytes in
``path_bytes`` (binary; null for every other row), and ``path`` then writes each byte that is
not UTF-8 as ``\\xNN``: the file is still embedded, and ``os.fsdecode(path_bytes)`` opens it.
Rows are told apart by those bytes, never by the text alone (``path_key``).

Safety: rows are written as parts (``OUT.parts/part-NNNNNN.parquet``), each to a temporary name
then ``os.replace``d, so a process killed at any moment leaves only whole parts (and a stray
temporary, removed on the next run). A row that cannot be stored becomes an ``error`` row saying
why, so one bad value never loses its part; a part that cannot be written (a full disk) raises
``OutputError`` once, the parts before it kept. ``merge`` streams the previous output and the
parts into a temporary file, replaces the output, then removes the parts; a kill anywhere in
between leaves rows in both places, and the next merge keeps the newest row per path. Given the
paths a complete walk found, ``merge`` also drops the rows of every other path (a file moved,
deleted, or under a folder no longer named), so the output is exactly the collection.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from serveclient.errors import ServeError, UsageError

EMBEDDING_DIM = 2048  # ResNet50's pooled layer4
# 2: the precision column, 3: cached, 4: path_bytes (older files merge with them as null)
SCHEMA_VERSION = 4
META_KEY = b"tsclient"  # the Parquet metadata key: a file format, kept across the rename
OK, ERROR = "ok", "error"
TAG = pa.struct([("label", pa.string()), ("index", pa.int32()), ("probability", pa.float32())])
COLUMNS = [
    ("path", pa.string()),
    ("path_bytes", pa.binary()),
    ("size", pa.int64()),
    ("mtime", pa.timestamp("ns", tz="UTC")),
    ("sha256", pa.string()),
    ("status", pa.string()),
    ("error", pa.string()),
    ("precision", pa.string()),
    ("cached", pa.bool_()),
]
ANSWERS = {"embedding": pa.list_(pa.float32(), EMBEDDING_DIM), "tags": pa.list_(TAG)}
# Metadata that must agree between a run and the rows it resumes.
IDENTITY = ("task", "model", "model_version", "weights_sha256")
READ_ROWS = 8192  # rows per record batch when streaming a file


class OutputError(ServeError):
    """A part or the merged output could not be written (a full disk, a folder not writable):
    what was written before stays, and a rerun resumes from it."""


def stored_path(path: str) -> tuple[str, bytes | None]:
    """How ``path`` (a name as the operating system gave it: ``os.fsdecode``'s surrogates for
    bytes that are not UTF-8) is stored: its ``path`` text, and its exact bytes for
    ``path_bytes`` when they are not UTF-8 (else None)."""
    raw = path_key(path)
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError:
        return raw.decode("utf-8", "backslashreplace"), raw


def path_key(path: str) -> bytes:
    """The bytes that name ``path``: what rows are matched on (resume, merge, the walk)."""
    try:
        return os.fsencode(path)
    except UnicodeEncodeError:  # a lone surrogate no file system gave: kept, byte for byte
        return path.encode("utf-8", "surrogatepass")


def schema(task: str, meta: dict | None = None) -> pa.Schema:
    """The schema of a ``task`` (``embedding`` or ``tags``) output, with ``meta`` attached."""
    fields = [pa.field(name, kind) for name, kind in COLUMNS]
    fields.append(pa.field(task, ANSWERS[task]))
    out = pa.schema(fields)
    return out.with_metadata({META_KEY: json.dumps(meta or {}, sort_keys=True).encode()})


def embedding_rows(paths: list[str], matrix: np.ndarray, size: int = 1) -> pa.Table:
    """``matrix``'s float32 rows as an embed output's rows for ``paths`` (status ok, mtime 0,
    ``size`` bytes each): a collection to search without a server (tests, ``bench.search``)."""
    n = len(paths)
    flat = pa.array(np.ascontiguousarray(matrix, np.float32).ravel(), pa.float32())
    return pa.table(
        {
            "path": paths,
            "path_bytes": [None] * n,
            "size": [size] * n,
            "mtime": pa.array([0] * n, pa.timestamp("ns", tz="UTC")),
            "sha256": [None] * n,
            "status": [OK] * n,
            "error": [None] * n,
            "precision": ["fp32"] * n,
            "cached": [False] * n,
            "embedding": pa.FixedSizeListArray.from_arrays(flat, EMBEDDING_DIM).cast(
                ANSWERS["embedding"]
            ),
        },
        schema=schema("embedding"),
    )


def metadata(path: Path | str) -> dict:
    """The ``tsclient`` metadata (``META_KEY``) of a Parquet file (empty when it has none)."""
    raw = (pq.read_schema(path).metadata or {}).get(META_KEY)
    return json.loads(raw) if raw else {}


@dataclass
class Row:
    """One file's result, before it becomes a Parquet row."""

    path: str
    size: int | None
    mtime_ns: int | None
    sha256: str | None
    error: str | None = None
    answer: object = None  # a float32 vector, or a list of tag dicts
    precision: str | None = None  # the X-Precision of the answer
    cached: bool | None = False  # answered from the server's content cache

    def record(self, task: str) -> dict:
        text, raw = stored_path(self.path)
        return {
            "path": text,
            "path_bytes": raw,
            "size": self.size,
            "mtime": self.mtime_ns,
            "sha256": self.sha256,
            "status": ERROR if self.error else OK,
            "error": self.error,
            "precision": None if self.error else self.precision,
            "cached": None if self.error else self.cached,
            task: None if self.error else self.answer,
        }


class Output:
    """Where a job's rows go: the final file ``out`` and its parts folder ``out.parts``."""

    def __init__(self, out: Path | str, task: str, meta: dict) -> None:
        self.out = Path(out)
        self.parts = self.out.with_name(self.out.name + ".parts")
        self.task = task
        self.meta = {**meta, "task": task, "schema_version": SCHEMA_VERSION}
        self.schema = schema(task, self.meta)

    # ------------------------------------------------------------------ reading

    def existing(self) -> list[Path]:
        """The files holding rows already: the previous output, then the parts in the order
        they were written (a later row for a path supersedes an earlier one)."""
        files = [self.out] if self.out.is_file() else []
        if self.parts.is_dir():
            files += sorted(self.parts.glob("part-*.parquet"))
        return files

    def check_identity(self) -> None:
        """Refuse to resume rows computed by another model, version or weights: mixing them
        would make the vectors incomparable."""
        for path in self.existing():
            theirs = metadata(path)
            different = [k for k in IDENTITY if theirs.get(k) != self.meta.get(k)]
            if different:
                raise UsageError(
                    f"{path} was written by another model or weights ("
                    + ", ".join(
                        f"{k}: {theirs.get(k)!r} there, {self.meta.get(k)!r} now" for k in different
                    )
                    + ")",
                    f"write to another --out, or delete {self.out} and {self.parts}",
                )

    def done(self, with_sha256: bool = False) -> DoneIndex:
        """What needs no redoing: the files whose newest row is ``ok``."""
        return DoneIndex.read(self.existing(), with_sha256)

    # ------------------------------------------------------------------ writing

    def clean(self) -> None:
        """Remove temporaries a killed run left behind."""
        for folder in (self.parts, self.out.parent):
            if folder.is_dir():
                for stray in folder.glob(f".{self.out.name}*.tmp"):
                    stray.unlink(missing_ok=True)
                for stray in folder.glob(".part-*.tmp"):
                    stray.unlink(missing_ok=True)

    def write_part(self, rows: list[Row]) -> Path:
        """Write ``rows`` as the next part, atomically; ``OutputError`` when it cannot be."""
        table = self._table(rows)
        try:
            self.parts.mkdir(parents=True, exist_ok=True)
            numbers = [int(p.stem.split("-")[1]) for p in self.parts.glob("part-*.parquet")]
            final = self.parts / f"part-{max(numbers, default=-1) + 1:06d}.parquet"
            _atomic_write(final, lambda tmp: pq.write_table(table, tmp, **_options(self.task)))
        except OSError as exc:
            raise _unwritable(self.parts, exc, "the parts written before it are kept") from exc
        return final

    def _table(self, rows: list[Row]) -> pa.Table:
        """``rows`` as a table; a row whose values Parquet cannot hold (text that is not
        Unicode from a server, a value of the wrong type) becomes an error row saying so."""
        try:
            return pa.Table.from_pylist([r.record(self.task) for r in rows], schema=self.schema)
        except (pa.ArrowException, UnicodeError, TypeError, ValueError):
            pass
        records = []
        for row in rows:
            record = row.record(self.task)
            try:
                pa.Table.from_pylist([record], schema=self.schema)
            except (pa.ArrowException, UnicodeError, TypeError, ValueError) as exc:
                why = f"{type(exc).__name__}: {exc}".encode("utf-8", "backslashreplace").decode()
                bad = Row(row.path, row.size, row.mtime_ns, row.sha256, f"cannot be stored: {why}")
                record = bad.record(self.task)
            records.append(record)
        return pa.Table.from_pylist(records, schema=self.schema)

    def merge(self, walked: np.ndarray | None = None) -> int:
        """Stream the previous output and the parts into one file (the newest row per path,
        each path once), replace ``out`` with it, remove the parts. ``walked``: the
        ``path_hash`` of every path a complete walk found; the rows of other paths are dropped.
        Returns how many were (0 without ``walked``); ``OutputError`` when ``out`` cannot be
        written (the parts are then kept, and a rerun merges them)."""
        try:
            return self._merge(walked)
        except OSError as exc:
            raise _unwritable(self.out, exc, "the parts are kept: a rerun merges them") from exc

    def _merge(self, walked: np.ndarray | None) -> int:
        files = self.existing()
        if not files:
            _atomic_write(
                self.out,
                lambda tmp: pq.write_table(self.schema.empty_table(), tmp, **_options(self.task)),
            )
            return 0
        keep, gone = _newest(files, walked)

        def write(tmp: Path) -> None:
            with pq.ParquetWriter(tmp, self.schema, **_options(self.task)) as writer:
                for path, mask in zip(files, keep):
                    start = 0
                    for batch in pq.ParquetFile(path).iter_batches(READ_ROWS):
                        rows = pa.Table.from_batches([batch]).filter(
                            pa.array(mask[start : start + batch.num_rows])
                        )
                        start += batch.num_rows
                        if rows.num_rows:
                            writer.write_table(_conform(rows, self.schema))

        _atomic_write(self.out, write)
        for path in files[1 if files[0] == self.out else 0 :]:
            path.unlink()
        if self.parts.is_dir() and not any(self.parts.iterdir()):
            self.parts.rmdir()
        return gone


def _unwritable(where: Path, exc: OSError, kept: str) -> OutputError:
    return OutputError(
        f"cannot write {where}: {exc.strerror or exc}",
        f"free space or make the folder writable, then rerun the same command ({kept})",
    )


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` in ``schema``: columns an older schema version lacks become nulls."""
    for position, column in enumerate(schema):
        if column.name not in table.column_names:
            table = table.add_column(position, column.name, pa.nulls(table.num_rows, column.type))
    return table.select(schema.names).cast(schema)


def _options(task: str) -> dict:
    # Floats do not compress: spend no time on them; paths, tags and errors do.
    return {
        "compression": {
            "embedding": "NONE",
            "tags": "ZSTD",
            "path": "ZSTD",
            "path_bytes": "ZSTD",
            "error": "ZSTD",
            "sha256": "ZSTD",
            "status": "ZSTD",
            "size": "ZSTD",
            "mtime": "ZSTD",
        },
        "use_dictionary": ["status", "error"],
    }


def _atomic_write(final: Path, write) -> None:
    """``write(tmp)`` then fsync and rename over ``final``: readers (and a rerun after a kill)
    see the old file or the new one, never half of one."""
    tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def _stored_keys(batch: pa.RecordBatch | pa.Table) -> list[bytes]:
    """Each row's ``path_key``: its ``path_bytes``, else its ``path`` (files of schema 3 and
    before have no ``path_bytes``)."""
    names = batch.column("path").to_pylist()
    if "path_bytes" not in batch.schema.names:
        return [name.encode() for name in names]
    raw = batch.column("path_bytes").to_pylist()
    return [r if r is not None else name.encode() for name, r in zip(names, raw)]


def _path_hashes(path: Path) -> np.ndarray:
    columns = [c for c in ("path", "path_bytes") if c in pq.read_schema(path).names]
    keys = _stored_keys(pq.read_table(path, columns=columns))
    return np.fromiter((_hash(k) for k in keys), dtype=np.uint64, count=len(keys))


def _last_of_each(hashes: np.ndarray) -> np.ndarray:
    """A mask of the last occurrence of every value of ``hashes``."""
    keep = np.zeros(len(hashes), dtype=bool)
    _, first_reversed = np.unique(hashes[::-1], return_index=True)
    keep[len(hashes) - 1 - first_reversed] = True
    return keep


def _newest(files: list[Path], walked: np.ndarray | None) -> tuple[list[np.ndarray], int]:
    """Per file, a mask of its rows that are the newest row of their path and (with
    ``walked``) in it (16 bytes a row); and how many newest rows ``walked`` left out."""
    hashes = [_path_hashes(path) for path in files]
    every = np.concatenate(hashes)
    keep = _last_of_each(every)
    gone = 0
    if walked is not None:
        found = np.isin(every, walked)
        gone = int(np.count_nonzero(keep & ~found))
        keep &= found
    return np.split(keep, np.cumsum([len(h) for h in hashes])[:-1]), gone


class DoneIndex:
    """The files already done: those whose newest row is ``ok``, by path + size + mtime, kept
    as sorted 64-bit hashes (8 bytes a file: a million done files cost 8 MB); with
    ``with_sha256``, also each done path's sha256 (a changed mtime alone then does not redo a
    file whose bytes are the same)."""

    def __init__(
        self, keys: np.ndarray, paths: np.ndarray | None = None, sha: np.ndarray | None = None
    ) -> None:
        self.keys = np.sort(keys)
        order = np.argsort(paths) if paths is not None else None
        self.paths = paths[order] if paths is not None else None
        self.sha = sha[order] if sha is not None else None

    @classmethod
    def read(cls, files: list[Path], with_sha256: bool = False) -> DoneIndex:
        paths, keys, ok, sha = [], [], [], []
        for path in files:
            wanted = ["path", "path_bytes", "size", "mtime", "status"]
            wanted += ["sha256"] if with_sha256 else []
            columns = [c for c in wanted if c in pq.read_schema(path).names]
            for batch in pq.ParquetFile(path).iter_batches(READ_ROWS * 8, columns=columns):
                # Column by column: to_pydict would also build a datetime per mtime.
                names = _stored_keys(batch)
                sizes = batch.column("size").to_pylist()
                mtimes = batch.column("mtime").cast(pa.int64()).to_pylist()
                paths.append(np.fromiter((_hash(p) for p in names), np.uint64))
                keys.append(
                    np.fromiter((_key(p, s, m) for p, s, m in zip(names, sizes, mtimes)), np.uint64)
                )
                ok.append(
                    np.array([s == OK for s in batch.column("status").to_pylist()], dtype=bool)
                )
                if with_sha256:
                    sha.append(
                        np.array([s or "" for s in batch.column("sha256").to_pylist()], dtype="S64")
                    )
        if not paths:
            return cls(np.zeros(0, np.uint64))
        all_paths = np.concatenate(paths)
        newest_ok = _last_of_each(all_paths) & np.concatenate(ok)
        return cls(
            np.concatenate(keys)[newest_ok],
            all_paths[newest_ok] if with_sha256 else None,
            np.concatenate(sha)[newest_ok] if with_sha256 else None,
        )

    def __len__(self) -> int:
        return len(self.keys)

    def holds(self, path: str, size: int | None, mtime_ns: int | None) -> bool:
        return _found(self.keys, _key(path_key(path), size, mtime_ns))

    def sha256_of(self, path: str) -> str | None:
        """The sha256 of ``path``'s ok row (only with ``with_sha256``)."""
        if self.paths is None or self.sha is None:  # both or neither: with_sha256
            return None
        key = np.uint64(path_hash(path))
        at = int(np.searchsorted(self.paths, key))
        if at < len(self.paths) and self.paths[at] == key:
            return self.sha[at].decode()
        return None


def _found(sorted_keys: np.ndarray, key: int) -> bool:
    at = int(np.searchsorted(sorted_keys, np.uint64(key)))
    return at < len(sorted_keys) and int(sorted_keys[at]) == key


def _key(raw: bytes, size: int | None, mtime_ns: int | None) -> int:
    return _hash(raw + f"\0{size}\0{mtime_ns}".encode())


def path_hash(path: str) -> int:
    """A path's 64-bit hash, as the resume index and ``merge(walked=...)`` keep it."""
    return _hash(path_key(path))


def _hash(raw: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "big")


# ---------------------------------------------------------------------- reading vectors


def opened(index: Path | str) -> tuple[pq.ParquetFile, os.stat_result]:
    """The embedding file at ``index``, opened once, and its ``fstat``: everything read through
    it is this version of the file, whatever a merge renames over the name meanwhile (a
    search's scan and the paths it answers with, ``serveclient.search``)."""
    index = Path(index)
    if not index.is_file():
        raise UsageError(
            f"no embed output at {index}", f"write one with `tsctl embed FOLDER --out {index}`"
        )
    source = pa.OSFile(str(index))
    file = pq.ParquetFile(source)
    if "embedding" not in file.schema_arrow.names:
        raise UsageError(
            f"{index} holds no embeddings (columns {file.schema_arrow.names})",
            "use the output of `tsctl embed`, not `tsctl tag`",
        )
    return file, os.fstat(source.fileno())


def batches(
    index: Path | str | pq.ParquetFile, rows: int = 16384
) -> Iterator[tuple[list[str], np.ndarray]]:
    """(paths, float32 matrix [n, dim]) of the ``ok`` rows of an embedding file (a path, or one
    ``opened`` already), ``rows`` at a time: memory bounded by one batch whatever its size."""
    file = index if isinstance(index, pq.ParquetFile) else opened(index)[0]
    for batch in file.iter_batches(rows, columns=["path", "status", "embedding"]):
        batch = batch.filter(pc.equal(batch.column("status"), OK))
        if batch.num_rows == 0:
            continue
        column = batch.column("embedding")
        dim = column.type.list_size
        matrix = column.values.to_numpy(zero_copy_only=False).reshape(-1, dim)
        yield batch.column("path").to_pylist(), matrix


def read_matrix(index: Path | str) -> tuple[list[str], np.ndarray]:
    """Every ``ok`` path and its vector, in memory (for collections that fit). Each path is the
    name as the operating system gives it (``os.fsdecode`` of ``path_bytes`` where the name is
    not UTF-8), so it opens the file and equals what a walk of the folder yields."""
    file, _ = opened(index)
    columns = [
        c for c in ("path", "path_bytes", "status", "embedding") if c in file.schema_arrow.names
    ]
    paths, parts = [], []
    for batch in file.iter_batches(16384, columns=columns):
        batch = batch.filter(pc.equal(batch.column("status"), OK))
        if batch.num_rows == 0:
            continue
        column = batch.column("embedding")
        paths += [os.fsdecode(key) for key in _stored_keys(batch)]
        parts.append(
            column.values.to_numpy(zero_copy_only=False).reshape(-1, column.type.list_size)
        )
    return paths, (np.concatenate(parts) if parts else np.zeros((0, EMBEDDING_DIM), np.float32))
