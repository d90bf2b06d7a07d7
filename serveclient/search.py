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

Bounds, whatever answers (this scan, the FAISS index, Milvus): ``k`` from 1 to ``MAX_K``; a
``threshold`` above 0 and at most 1; ``group`` stops at ``MAX_PAIRS`` pairs (or the caller's
``most``) and says so, so a low threshold over a large collection (every pair of post-ReLU
embeddings has a positive cosine) costs that many pairs of memory, not n^2.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import os
import uuid
from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from serveclient.errors import UsageError
from serveclient.vectors import EMBEDDING_DIM, OK, batches, opened

CHUNK_ROWS = 16384
BLOCK_ROWS = 2048  # duplicates: rows of a chunk scored at once (2048 x 16384 float32, 128 MB)
MAX_K = 1000  # neighbours a query may ask for
MAX_PAIRS = 100_000  # pairs ``duplicates`` groups at most, unless told (--max-pairs)
MOST_PAIRS = 1_000_000  # the most --max-pairs may ask for (some 300 MB of pairs and groups)
log = logging.getLogger("serveclient.search")
Version = tuple[pq.ParquetFile, os.stat_result]  # an embed output opened once (vectors.opened)


def normalised(matrix: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), so a dot product is the cosine."""
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=-1, keepdims=True)
    return matrix / np.where(norms > 0, norms, 1.0)


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


def stored(index: Path | str, paths: list[str]) -> np.ndarray:
    """The unit vectors the embed output ``index`` holds for ``paths`` (as written there), in
    order, read in one pass; ``UsageError`` naming the paths it does not hold."""
    found: dict[str, np.ndarray] = {}
    wanted = set(paths)
    for names, matrix in batches(index):
        for name, row in zip(names, matrix):
            if name in wanted:
                found[name] = row  # a path's last ok row: its newest, the one an index keeps
    require_stored(paths, found, index)
    return normalised(np.stack([found[p] for p in paths]))


def require_stored(paths: list[str], held: Container[str], where: Path | str) -> None:
    """``UsageError`` naming the ``paths`` that ``held`` lacks (queries by stored path)."""
    missing = [p for p in paths if p not in held]
    if missing:
        raise UsageError(
            f"not stored in {where}: {', '.join(missing[:5])}"
            + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""),
            "give each path as the embed output holds it, or drop --stored to embed the "
            "files through the server",
        )


def nearest(
    index: Path | str,
    queries: np.ndarray,
    k: int = 10,
    exclude: list[str | None] | None = None,
    rows: int = CHUNK_ROWS,
) -> list[list[tuple[str, float]]]:
    """For each query vector, the ``k`` stored paths with the highest cosine similarity, best
    first, as (path, score). ``exclude[j]``: a file (compared by absolute path) never answered
    for query j, e.g. the query photo itself when it is in the index."""
    queries = normalised(np.atleast_2d(queries))
    exclude = [os.path.abspath(p) if p else None for p in (exclude or [None] * len(queries))]
    keep = k + 1  # one spare per query: an index holds each path once, so one exclusion
    best: list[list[tuple[float, int]]] = [[] for _ in queries]  # min-heaps of (score, row)
    version = opened(index)
    for start, matrix in unit_chunks(index, version, rows):
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


@dataclass(frozen=True)
class Grouped:
    """Groups of near-duplicates and what they were made of: ``pairs`` pairs, all there were
    (``complete``) or the first ``pairs`` found, the search stopped there (``most``)."""

    groups: list[dict]
    pairs: int
    complete: bool

    @property
    def note(self) -> str:
        """What a search stopped at its cap means (" ..."), or "" when it was not."""
        if self.complete:
            return ""
        return (
            f" The search stopped at {self.pairs:,} pairs (--max-pairs): the groups hold only "
            "the pairs found first; raise --threshold, or --max-pairs."
        )


def duplicates(
    index: Path | str, threshold: float = 0.97, most: int = MAX_PAIRS, rows: int = CHUNK_ROWS
) -> Grouped:
    """Groups of near-duplicates: files linked by a chain of pairs with cosine >=
    ``threshold``, largest group first (see ``group``), of the first ``most`` pairs found.
    Every chunk is compared with itself and every later chunk, ``BLOCK_ROWS`` rows at a time:
    memory two chunks, one block's scores and the pairs; time quadratic."""
    version = opened(index)
    found = list(itertools.islice(_pairs(index, version, threshold, rows), most + 1))
    names = _paths_at(version[0], {i for pair in found for i in pair[:2]})
    return group(((names[i], names[j], score) for i, j, score in found), most)


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


def group(pairs: Iterable[tuple[str, str, float]], most: int = MAX_PAIRS) -> Grouped:
    """Files linked by a chain of the first ``most`` of ``pairs`` (a, b, cosine), largest
    group first, each ``{"paths": [...], "min_score": s}``: paths sorted, s the lowest score
    of a pair that joined it. A pair past ``most`` stops the search (``complete`` False)."""
    parent: dict[str, str] = {}
    low: dict[str, float] = {}

    def root(i: str) -> str:
        parent.setdefault(i, i)
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    found, taken, complete = iter(pairs), 0, True
    for a, b, score in found:
        if taken == most:
            complete = False
            break
        taken += 1
        ra, rb = root(a), root(b)
        merged = min(low.get(ra, 1.0), low.get(rb, 1.0), score)
        if ra != rb:
            parent[rb] = ra
        low[ra] = merged
    getattr(found, "close", lambda: None)()  # a generator's search ends here
    members: dict[str, list[str]] = {}
    for i in list(parent):
        members.setdefault(root(i), []).append(i)
    groups = sorted((sorted(group), round(low[r], 6)) for r, group in members.items())
    groups.sort(key=lambda g: -len(g[0]))  # stable: largest first, then by first path
    return Grouped([{"paths": p, "min_score": s} for p, s in groups], taken, complete)


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
