"""The content cache's values (``servecore.cache``): what an image's answer depends on
(``CacheKey``) and the answer values kept for it (``Entry``). Types only, so that the request's
stages (``servecore.stages.Looked``) carry them without importing the cache."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from servecore.answers import AnswerSpec, Tag

# An entry's bookkeeping beyond its key and values: the OrderedDict's slot and links, the
# entry object (measured on CPython 3.11: about 200 bytes).
ENTRY_OVERHEAD = 200


@dataclass(frozen=True, slots=True)
class CacheKey:
    """Everything an image's answer depends on: its bytes' sha256, the model's name and
    version, the precision the worker serves, the effective ``topk`` and the outputs asked
    for (embedding, tags)."""

    digest: bytes
    model: str
    version: str
    precision: str
    top_k: int
    embedding: bool
    tags: bool


@dataclass(frozen=True, slots=True)
class Entry:
    """One image's answer values, whichever its key asked for: its embedding row (float32, a
    copy of its own) and its tags as two arrays, the class indices and their probabilities
    (float64 holds each float the answer carries exactly)."""

    embedding: np.ndarray | None
    indices: np.ndarray | None = None
    probabilities: np.ndarray | None = None

    @classmethod
    def of(cls, embedding: np.ndarray | None, tags: Sequence[Tag] | None) -> Entry:
        if tags is None:
            return cls(None if embedding is None else np.array(embedding, copy=True))
        return cls(
            None if embedding is None else np.array(embedding, copy=True),
            np.array([t.index for t in tags], dtype=np.int32),
            np.array([t.probability for t in tags], dtype=np.float64),
        )

    def tags(self, spec: AnswerSpec) -> list[Tag]:
        if self.indices is None or self.probabilities is None:
            raise ValueError("this entry holds no tags")
        return [spec.tag(i, p) for i, p in zip(self.indices.tolist(), self.probabilities.tolist())]

    @property
    def nbytes(self) -> int:
        """What this entry holds in memory: itself, its arrays (header and data: each owns
        its data) and its slot in the cache."""
        arrays = (self.embedding, self.indices, self.probabilities)
        return (
            sys.getsizeof(self)
            + ENTRY_OVERHEAD
            + sum(sys.getsizeof(a) for a in arrays if a is not None)
        )
