"""Search over the collection's vectors: one interface, ``VectorSearch`` (``nearest``,
``stored``, ``pairs``, ``duplicates``), three implementations, chosen by ``open``:

    exact.py        ``ExactSearch``: exact cosine over an embed output (Parquet), a chunk at a time
    faissindex.py   ``FaissIndex``: the approximate index in a folder (``tsctl index build``)
    milvusindex.py  ``MilvusIndex``: the same in Milvus, by URI (``http://HOST:19530``, ``NAME.db``)

    found = search.open(embeddings=Path("v.parquet")).nearest(queries, k=10)

Bounds, whatever answers (this scan, the FAISS index, Milvus): ``k`` from 1 to ``MAX_K``; a
``threshold`` above 0 and at most 1; ``group`` stops at ``MAX_PAIRS`` pairs (or the caller's
``most``) and says so, so a low threshold over a large collection (every pair of post-ReLU
embeddings has a positive cosine) costs that many pairs of memory, not n^2.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from serveclient.errors import UsageError

MAX_K = 1000  # neighbours a query may ask for
MAX_PAIRS = 100_000  # pairs ``duplicates`` groups at most, unless told (--max-pairs)
MOST_PAIRS = 1_000_000  # the most --max-pairs may ask for (some 300 MB of pairs and groups)


class VectorSearch(ABC):
    """What every search answers, whatever holds the vectors."""

    @property
    @abstractmethod
    def where(self) -> str:
        """What it searches, as messages and pages name it."""

    @abstractmethod
    def nearest(
        self, queries: np.ndarray, k: int = 10, exclude: list[str | None] | None = None
    ) -> list[list[tuple[str, float]]]:
        """For each query vector, the ``k`` stored paths with the highest cosine, best first,
        as (path, score); ``exclude[j]``: a file (compared by absolute path) never answered for
        query j, e.g. the query photo itself when it is stored."""

    @abstractmethod
    def stored(self, paths: list[str]) -> np.ndarray:
        """The unit vectors held for ``paths`` (as stored), in order; ``UsageError`` naming the
        paths not held."""

    @abstractmethod
    def pairs(self, threshold: float) -> Iterator[tuple[str, str, float]]:
        """Every pair of stored paths at cosine >= ``threshold``, each once, found as drawn
        (whoever stops drawing stops the search)."""

    def duplicates(self, threshold: float = 0.97, most: int = MAX_PAIRS) -> Grouped:
        """Groups of near-duplicates of the first ``most`` pairs (``group``)."""
        return group(self.pairs(threshold), most)


def open(
    embeddings: Path | None = None,
    index: str | None = None,
    *,
    exact: bool = False,
    collection: str | None = None,
    token: str | None = None,
) -> VectorSearch:
    """The search for an embed output (``embeddings``, Parquet) and a vector ``index``: Milvus
    when ``index`` is its URI (``collection``, default the embed output's name; ``token`` as
    ``milvusindex.connect``); else the FAISS folder ``index`` (default ``EMBEDDINGS.vindex``)
    when it holds an index; else, or with ``exact``, exact search over ``embeddings``. An index
    that cannot answer (stale, corrupt) raises, naming the fix."""
    from serveclient.search import exact as scan
    from serveclient.search import faissindex, milvusindex

    if index and milvusindex.is_uri(index) and not exact:
        if not (collection or embeddings):
            raise UsageError("which collection?", "add --collection (or --embeddings PARQUET)")
        name = collection or milvusindex.collection_for(Path(embeddings or ""))
        return milvusindex.open_index(index, name, token=token)
    folder = Path(index) if index else embeddings and faissindex.default_folder(embeddings)
    if folder and not exact and (folder / faissindex.MANIFEST).is_file():
        return faissindex.open_index(folder)
    if embeddings is None:
        raise UsageError(
            f"no index in {index}" if index else "no --embeddings",
            "name the embed output (Parquet) with --embeddings, or `tsctl index build` it",
        )
    return scan.ExactSearch(Path(embeddings))


def normalised(matrix: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), so a dot product is the cosine."""
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=-1, keepdims=True)
    return matrix / np.where(norms > 0, norms, 1.0)


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
