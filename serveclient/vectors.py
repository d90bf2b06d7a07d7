"""The Parquet files of a collection job: their schema, the parts written while it runs, what
is already done, and the merged output.

One row per file: ``path``, ``size``, ``mtime`` (UTC timestamp, ns), ``sha256`` (hex of the
bytes sent), ``status`` (``ok`` or ``error``), ``error`` (the server's or the reader's
message), ``precision`` (the arithmetic that computed the row, from the answer's
``X-Precision`` header: replicas measuring ``auto`` on different nodes may differ; null for a
failed file or a server that does not say), ``cached`` (whether the server's content cache
answered it: TorchServe's ``X-Cache-Hits``, Triton's ``cached`` output; false when the cache is
off; null for a failed file, or where TorchServe counted some but not all of a request's images
as hits without naming them), and the answer: ``embedding``
(``fixed_size_list<float32>[2048]``) or ``tags`` (``list<struct<label: string, index: int32,
probability: float32>>``), null when the file failed. The file's key-value metadata ``serveclient``
holds JSON naming the model, its version, precision, backend and weights fingerprint (from the
describe answer) and the schema version.
pandas, polars and DuckDB read the files as they are.

Safety: rows are written as parts (``OUT.parts/part-NNNNNN.parquet``), each to a temporary name
then ``os.replace``d, so a process killed at any moment leaves only whole parts (and a stray
temporary, removed on the next run). ``merge`` streams the previous output and the parts into
a temporary file, replaces the output, then removes the parts; a kill anywhere in between
leaves rows in both places, and the next merge keeps the newest row per path.
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

from serveclient.errors import UsageError

EMBEDDING_DIM = 2048  # ResNet50's pooled layer4
# 2: the precision column, 3: cached (files of older versions merge with them as null)
SCHEMA_VERSION = 3
META_KEY = b"tsclient"  # the Parquet metadata key: a file format, kept across the rename
OK, ERROR = "ok", "error"
TAG = pa.struct([("label", pa.string()), ("index", pa.int32()), ("probability", pa.float32())])
COLUMNS = [
    ("path", pa.string()),
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
        return {
            "path": self.path,
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
        """Write ``rows`` as the next part, atomically."""
        self.parts.mkdir(parents=True, exist_ok=True)
        numbers = [int(p.stem.split("-")[1]) for p in self.parts.glob("part-*.parquet")]
        final = self.parts / f"part-{max(numbers, default=-1) + 1:06d}.parquet"
        table = pa.Table.from_pylist([r.record(self.task) for r in rows], schema=self.schema)
        _atomic_write(final, lambda tmp: pq.write_table(table, tmp, **_options(self.task)))
        return final

    def merge(self) -> Path:
        """Stream the previous output and the parts into one file (the newest row per path,
        each path once), replace ``out`` with it, remove the parts."""
        files = self.existing()
        if not files:
            _atomic_write(
                self.out,
                lambda tmp: pq.write_table(self.schema.empty_table(), tmp, **_options(self.task)),
            )
            return self.out
        keep = _newest(files)

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
        return self.out


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


def _path_hashes(path: Path) -> np.ndarray:
    column = pq.read_table(path, columns=["path"]).column("path").to_pylist()
    return np.fromiter((_hash(p) for p in column), dtype=np.uint64, count=len(column))


def _last_of_each(hashes: np.ndarray) -> np.ndarray:
    """A mask of the last occurrence of every value of ``hashes``."""
    keep = np.zeros(len(hashes), dtype=bool)
    _, first_reversed = np.unique(hashes[::-1], return_index=True)
    keep[len(hashes) - 1 - first_reversed] = True
    return keep


def _newest(files: list[Path]) -> list[np.ndarray]:
    """Per file, a mask of its rows that are the newest row of their path (16 bytes a row)."""
    hashes = [_path_hashes(path) for path in files]
    keep = _last_of_each(np.concatenate(hashes))
    return np.split(keep, np.cumsum([len(h) for h in hashes])[:-1])


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
        columns = ["path", "size", "mtime", "status"] + (["sha256"] if with_sha256 else [])
        for path in files:
            for batch in pq.ParquetFile(path).iter_batches(READ_ROWS * 8, columns=columns):
                # Column by column: to_pydict would also build a datetime per mtime.
                names = batch.column("path").to_pylist()
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
        return _found(self.keys, _key(path, size, mtime_ns))

    def sha256_of(self, path: str) -> str | None:
        """The sha256 of ``path``'s ok row (only with ``with_sha256``)."""
        if self.paths is None or self.sha is None:  # both or neither: with_sha256
            return None
        key = np.uint64(_hash(path))
        at = int(np.searchsorted(self.paths, key))
        if at < len(self.paths) and self.paths[at] == key:
            return self.sha[at].decode()
        return None


def _found(sorted_keys: np.ndarray, key: int) -> bool:
    at = int(np.searchsorted(sorted_keys, np.uint64(key)))
    return at < len(sorted_keys) and int(sorted_keys[at]) == key


def _key(path: str, size: int | None, mtime_ns: int | None) -> int:
    return _hash(f"{path}\0{size}\0{mtime_ns}")


def _hash(text: str) -> int:
    return int.from_bytes(
        hashlib.blake2b(text.encode("utf-8", "surrogateescape"), digest_size=8).digest(), "big"
    )


# ---------------------------------------------------------------------- reading vectors


def batches(index: Path | str, rows: int = 16384) -> Iterator[tuple[list[str], np.ndarray]]:
    """(paths, float32 matrix [n, dim]) of the ``ok`` rows of an embedding file, ``rows`` at a
    time: memory bounded by one batch whatever the file's size."""
    index = Path(index)
    if not index.is_file():
        raise UsageError(
            f"no index at {index}", f"write one with `tsctl embed FOLDER --out {index}`"
        )
    table_schema = pq.read_schema(index)
    if "embedding" not in table_schema.names:
        raise UsageError(
            f"{index} holds no embeddings (columns {table_schema.names})",
            "use the output of `tsctl embed`, not `tsctl tag`",
        )
    for batch in pq.ParquetFile(index).iter_batches(rows, columns=["path", "status", "embedding"]):
        batch = batch.filter(pc.equal(batch.column("status"), OK))
        if batch.num_rows == 0:
            continue
        column = batch.column("embedding")
        dim = column.type.list_size
        matrix = column.values.to_numpy(zero_copy_only=False).reshape(-1, dim)
        yield batch.column("path").to_pylist(), matrix


def read_matrix(index: Path | str) -> tuple[list[str], np.ndarray]:
    """Every ``ok`` path and its vector, in memory (for collections that fit)."""
    paths, parts = [], []
    for names, matrix in batches(index):
        paths += names
        parts.append(matrix)
    return paths, (np.concatenate(parts) if parts else np.zeros((0, EMBEDDING_DIM), np.float32))
