"""Exact cosine search over an embedding Parquet file (``tsctl embed``'s output), with numpy,
a chunk of rows at a time: memory stays at one chunk (16,384 x 2048 float32 = 128 MB) however
many vectors the file holds.

``nearest``: the k most similar stored vectors to each query, O(n) per query. ``duplicates``:
groups of vectors at least ``threshold`` apart by cosine, O(n^2): fine up to some 100,000
vectors on a laptop; beyond, or for many queries a second, move to a vector index (FAISS,
or a vector database), which trades exactness for sub-linear search.
"""
from __future__ import annotations

import heapq
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from tsclient.vectors import OK, batches

CHUNK_ROWS = 16384


def normalised(matrix: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), so a dot product is the cosine."""
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=-1, keepdims=True)
    return matrix / np.where(norms > 0, norms, 1.0)


def nearest(index: Path | str, queries: np.ndarray, k: int = 10,
            exclude: list[str | None] | None = None,
            rows: int = CHUNK_ROWS) -> list[list[tuple[str, float]]]:
    """For each query vector, the ``k`` stored paths with the highest cosine similarity, best
    first, as (path, score). ``exclude[j]``: a file (compared by absolute path) never answered
    for query j, e.g. the query photo itself when it is in the index."""
    queries = normalised(np.atleast_2d(queries))
    exclude = [os.path.abspath(p) if p else None for p in (exclude or [None] * len(queries))]
    best: list[list[tuple[float, str]]] = [[] for _ in queries]  # min-heaps of (score, path)
    for paths, matrix in batches(index, rows):
        scores = normalised(matrix) @ queries.T  # [rows, queries]
        take = min(k + 1, len(paths))
        top = np.argpartition(-scores, take - 1, axis=0)[:take]
        for j in range(len(queries)):
            for i in top[:, j]:
                if exclude[j] is not None and os.path.abspath(paths[i]) == exclude[j]:
                    continue
                item = (float(scores[i, j]), paths[i])
                if len(best[j]) < k:
                    heapq.heappush(best[j], item)
                elif item > best[j][0]:
                    heapq.heapreplace(best[j], item)
    return [[(path, score) for score, path in sorted(heap, reverse=True)] for heap in best]


def duplicates(index: Path | str, threshold: float = 0.97,
               rows: int = CHUNK_ROWS) -> list[dict]:
    """Groups of near-duplicates: files linked by a chain of pairs with cosine >=
    ``threshold``, largest group first, each ``{"paths": [...], "min_score": s}`` (the lowest
    score of a pair that joined it). Every chunk is compared with itself and every later
    chunk, read again from the file: memory two chunks, time quadratic."""
    parent: dict[int, int] = {}
    low: dict[int, float] = {}

    def root(i: int) -> int:
        parent.setdefault(i, i)
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    offset_a = 0
    for _, a in batches(index, rows):
        a = normalised(a)
        offset_b = 0
        for _, b in batches(index, rows):
            if offset_b + len(b) <= offset_a:
                offset_b += len(b)
                continue
            scores = a @ normalised(b).T
            hits = np.argwhere(scores >= threshold)
            for i, j in hits:
                gi, gj = offset_a + int(i), offset_b + int(j)
                if gj <= gi:
                    continue
                ri, rj = root(gi), root(gj)
                score = float(scores[i, j])
                merged = min(low.get(ri, 1.0), low.get(rj, 1.0), score)
                if ri != rj:
                    parent[rj] = ri
                low[ri] = merged
            offset_b += len(b)
        offset_a += len(a)
    members: dict[int, list[int]] = {}
    for i in list(parent):
        members.setdefault(root(i), []).append(i)
    names = _paths_at(index, {i for group in members.values() for i in group})
    groups = [{"paths": [names[i] for i in sorted(group)], "min_score": round(low[r], 6)}
              for r, group in members.items()]
    return sorted(groups, key=lambda g: (-len(g["paths"]), g["paths"][0]))


def _paths_at(index: Path | str, wanted: set[int]) -> dict[int, str]:
    """The paths of the ``ok`` rows numbered ``wanted`` (in ``batches`` order)."""
    found: dict[int, str] = {}
    number = 0
    for batch in pq.ParquetFile(index).iter_batches(CHUNK_ROWS * 4, columns=["path", "status"]):
        for path, status in zip(batch.column("path").to_pylist(),
                                batch.column("status").to_pylist()):
            if status == OK:
                if number in wanted:
                    found[number] = path
                number += 1
    return found
