"""Exact cosine search over an embedding Parquet file (``tsctl embed``'s output), with numpy,
a chunk of rows at a time: memory stays at one chunk (16,384 x 2048 float32 = 128 MB) however
many vectors the file holds.

Decoding Parquet's list column costs far more than the arithmetic (some 3 s per 100,000
vectors against 0.1 s for the dot products), so the first search writes the unit vectors
beside the index as a plain ``.npy`` matrix (``INDEX.search.npy``, with ``INDEX.search.json``
naming the index's inode, size and mtime it was made from, and the matrix file's) and later
searches memory-map it. A changed index is read again; a folder that cannot be written is
searched from the Parquet.

One version: a search opens the Parquet once (``vectors.opened``) and reads its scan, its
cache's key and the paths it answers with through that open file, so an ``embed`` merge that
renames a new file over the name meanwhile changes nothing it answers; a cache that another
search replaced meanwhile (another version's vectors) is not used: that search scans the
Parquet.

``nearest``: the k most similar stored vectors to each query, O(n) per query. ``duplicates``:
groups of vectors at least ``threshold`` apart by cosine, O(n^2): fine up to some 100,000
vectors on a laptop; beyond, or for many queries a second, move to a vector index (FAISS,
or a vector database), which trades exactness for sub-linear search.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from serveclient.search import VectorSearch, normalised, require_stored
from serveclient.vectors import EMBEDDING_DIM, OK, batches, opened

CHUNK_ROWS = 16384
BLOCK_ROWS = 2048  # duplicates: rows of a chunk scored at once (2048 x 16384 float32, 128 MB)
NAMED_PAIRS = 65_536  # pairs found before their paths are read (a pass over the paths each)
log = logging.getLogger("serveclient.search")
Version = tuple[pq.ParquetFile, os.stat_result]  # an embed output opened once (vectors.opened)


def _cache_paths(index: Path) -> tuple[Path, Path]:
    return index.with_name(index.name + ".search.npy"), index.with_name(index.name + ".search.json")


def _key(info: os.stat_result) -> list[int]:
    """A file's version: a merge's rename gives a new inode even at the same size and mtime."""
    return [info.st_ino, info.st_size, info.st_mtime_ns]


def _write_cache(version: Version, matrix_path: Path, key_path: Path) -> dict:
    """The unit vectors of the ``ok`` rows, in file order, to ``matrix_path``; then the key
    (``index``: the version's, ``matrix``: the matrix file's), returned. Both are written to
    temporary names and replaced, the key last: a kill in between leaves a key that no longer
    matches, so the next search rebuilds."""
    file, info = version
    status = file.read(columns=["status"]).column("status")
    ok_rows = int(pc.sum(pc.equal(status, OK)).as_py() or 0)
    tag = f".tmp-{uuid.uuid4().hex[:8]}"
    tmp_matrix = matrix_path.with_name(matrix_path.name + tag)
    tmp_key = key_path.with_name(key_path.name + tag)
    try:
        out = np.lib.format.open_memmap(
            tmp_matrix, mode="w+", dtype=np.float32, shape=(ok_rows, EMBEDDING_DIM)
        )
        start = 0
        for _, matrix in batches(file, CHUNK_ROWS):
            out[start : start + len(matrix)] = normalised(matrix)
            start += len(matrix)
        out.flush()
        del out
        key = {"index": _key(info), "matrix": _key(os.stat(tmp_matrix))}
        os.replace(tmp_matrix, matrix_path)
        tmp_key.write_text(json.dumps(key))
        os.replace(tmp_key, key_path)
    finally:
        tmp_matrix.unlink(missing_ok=True)
        tmp_key.unlink(missing_ok=True)
    return key


def _cached_matrix(index: Path, version: Version) -> np.ndarray | None:
    """The unit vectors of ``version`` (``index`` opened) memory-mapped from the cache (written
    first when missing or another version's), or None when the cache cannot be written or
    another search replaced its matrix meanwhile (checked after mapping it)."""
    matrix_path, key_path = _cache_paths(index)
    try:
        key = json.loads(key_path.read_text())
        fresh = key["index"] == _key(version[1]) and key["matrix"] == _key(matrix_path.stat())
    except (OSError, ValueError, KeyError, TypeError):
        fresh = False
    try:
        if not fresh:
            key = _write_cache(version, matrix_path, key_path)
        matrix = np.load(matrix_path, mmap_mode="r")
        if key["matrix"] != _key(matrix_path.stat()):
            raise OSError(f"another search replaced {matrix_path.name} meanwhile")
        return matrix
    except (OSError, ValueError) as exc:
        log.warning("searching %s without a cache (%s)", index, exc)
        return None


def unit_chunks(
    index: Path | str, version: Version, rows: int = CHUNK_ROWS
) -> Iterator[tuple[int, np.ndarray]]:
    """(number of the chunk's first ``ok`` row, unit vectors [n, dim]) over the whole of
    ``version`` (``index`` opened), ``rows`` at a time, from the cache when it can be used."""
    cached = _cached_matrix(Path(index), version)
    if cached is not None:
        for start in range(0, len(cached), rows):
            yield start, np.asarray(cached[start : start + rows])
        return
    start = 0
    for _, matrix in batches(version[0], rows):
        yield start, normalised(matrix)
        start += len(matrix)


@dataclass(frozen=True)
class ExactSearch(VectorSearch):
    """Exact cosine over the embed output at ``path``, ``rows`` vectors a chunk."""

    path: Path
    rows: int = CHUNK_ROWS

    @property
    def where(self) -> str:
        return str(self.path)

    def stored(self, paths: list[str]) -> np.ndarray:
        """Read in one pass; a path's last ``ok`` row (its newest, the one an index keeps)."""
        found: dict[str, np.ndarray] = {}
        wanted = set(paths)
        for names, matrix in batches(self.path):
            for name, row in zip(names, matrix):
                if name in wanted:
                    found[name] = row
        require_stored(paths, found, self.path)
        return normalised(np.stack([found[p] for p in paths]))

    def nearest(
        self, queries: np.ndarray, k: int = 10, exclude: list[str | None] | None = None
    ) -> list[list[tuple[str, float]]]:
        """O(n) per query, a chunk at a time; the paths read from the file scanned."""
        queries = normalised(np.atleast_2d(queries))
        exclude = [os.path.abspath(p) if p else None for p in (exclude or [None] * len(queries))]
        keep = k + 1  # one spare per query: an index holds each path once, so one exclusion
        best: list[list[tuple[float, int]]] = [[] for _ in queries]  # min-heaps of (score, row)
        version = opened(self.path)
        for start, matrix in unit_chunks(self.path, version, self.rows):
            scores = matrix @ queries.T  # [rows, queries]
            take = min(keep, len(matrix))
            top = np.argpartition(-scores, take - 1, axis=0)[:take]
            for j in range(len(queries)):
                for i in top[:, j]:
                    item = (float(scores[i, j]), start + int(i))
                    if len(best[j]) < keep:
                        heapq.heappush(best[j], item)
                    elif item > best[j][0]:
                        heapq.heapreplace(best[j], item)
        names = _paths_at(version[0], {row for heap in best for _, row in heap})
        found = []
        for j, heap in enumerate(best):
            hits = [
                (names[row], score)
                for score, row in sorted(heap, reverse=True)
                if exclude[j] is None or os.path.abspath(names[row]) != exclude[j]
            ]
            found.append(hits[:k])
        return found

    def pairs(self, threshold: float) -> Iterator[tuple[str, str, float]]:
        """Every chunk compared with itself and every later chunk, ``BLOCK_ROWS`` rows at a
        time: memory two chunks, one block's scores and ``NAMED_PAIRS`` pairs; time quadratic.
        Named from the file scanned, ``NAMED_PAIRS`` at a time (a pass over its paths each)."""
        version = opened(self.path)
        found = _pairs(self.path, version, threshold, self.rows)
        while block := list(itertools.islice(found, NAMED_PAIRS)):
            names = _paths_at(version[0], {i for pair in block for i in pair[:2]})
            yield from ((names[i], names[j], score) for i, j, score in block)


def _pairs(
    index: Path | str, version: Version, threshold: float, rows: int
) -> Iterator[tuple[int, int, float]]:
    """(row, later row, cosine) of every pair at cosine >= ``threshold``, a row at a time."""
    for offset_a, a in unit_chunks(index, version, rows):
        for offset_b, b in unit_chunks(index, version, rows):
            if offset_b + len(b) <= offset_a:
                continue
            for start in range(0, len(a), BLOCK_ROWS):
                scores = a[start : start + BLOCK_ROWS] @ b.T
                for i, row in enumerate(scores):
                    gi = offset_a + start + i
                    for j in np.flatnonzero(row >= threshold).tolist():
                        if offset_b + j > gi:
                            yield gi, offset_b + j, float(row[j])


def _paths_at(file: pq.ParquetFile, wanted: set[int]) -> dict[int, str]:
    """The paths of the ``ok`` rows numbered ``wanted`` (in file order) of the file the scan
    read."""
    found: dict[int, str] = {}
    number = 0
    for batch in file.iter_batches(CHUNK_ROWS * 4, columns=["path", "status"]):
        for path, status in zip(
            batch.column("path").to_pylist(), batch.column("status").to_pylist()
        ):
            if status == OK:
                if number in wanted:
                    found[number] = path
                number += 1
    return found
