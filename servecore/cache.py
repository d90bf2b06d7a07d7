"""The content cache (``handler.cache_bytes``): each image's answer values, keyed by the
sha256 of its bytes (a crop's behind ``servecore.crops.CROP_DOMAIN``) and by everything else
that changes them, kept least recently used first within a bound in bytes.

A step between admission and decode (``AnswerCache.lookup``, which ``Intake`` calls) takes
the images already answered out of each prediction request (an ``Opened`` becomes a
``Looked`` that carries what was found); only the rest are decoded and computed. When the
batch is answered, ``Looked.merge`` puts each request's images back in order, the found ones
from the cache, and stores the computed ones. Explanation requests never use it.

One cache per worker process, in its memory, touched by the thread that runs the batch only
(TorchServe and Triton's Python backend run one batch at a time per worker): no lock.
"""

from __future__ import annotations

import hashlib
import sys
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from servecore.answers import AnswerSpec, Prediction
from servecore.cacheentry import CacheKey, Entry
from servecore.config import Output
from servecore.crops import CROP_DOMAIN
from servecore.stages import Admitted, Explaining, Looked, Opened


def key_bytes(key: CacheKey) -> int:
    """What a key holds in memory (its strings are the model's own, shared)."""
    return sys.getsizeof(key) + sys.getsizeof(key.digest)


class AnswerCache:
    """Answers by image content, least recently used first out, within ``max_bytes``
    (``handler.cache_bytes``; 0: off, every lookup misses and nothing is kept)."""

    def __init__(self, max_bytes: int, spec: AnswerSpec, precision: str) -> None:
        self.max_bytes = max_bytes
        self.spec = spec
        self.precision = precision
        self.entries: OrderedDict[CacheKey, tuple[Entry, int]] = OrderedDict()
        self.bytes = 0

    @property
    def on(self) -> bool:
        return self.max_bytes > 0

    def key(self, image: bytes, request: Opened) -> CacheKey:
        parsed, spec = request.request, self.spec
        digest = hashlib.sha256(CROP_DOMAIN if parsed.crops else b"")
        digest.update(image)
        return CacheKey(
            digest.digest(),
            spec.model_name,
            spec.model_version,
            self.precision,
            parsed.tags_top_k(spec.default_top_k),
            parsed.wants(Output.EMBEDDING, spec.task),
            parsed.wants(Output.TAGS, spec.task),
        )

    def lookup(self, requests: Sequence[Admitted]) -> list[Admitted]:
        """Each prediction request as a ``Looked`` without its cached images (explanation
        requests and failed ones unchanged); nothing changes when the cache is off."""
        if not self.on:
            return list(requests)
        return [
            self._look(r) if isinstance(r, Opened) and not isinstance(r, Explaining) else r
            for r in requests
        ]

    def _look(self, request: Opened) -> Looked:
        keys = tuple(self.key(image, request) for image in request.request.images)
        found = tuple(self.get(key) for key in keys)
        missing = tuple(img for img, entry in zip(request.images, found) if entry is None)
        return Looked.of(request, missing, keys, found)

    def get(self, key: CacheKey) -> Entry | None:
        held = self.entries.get(key)
        if held is None:
            return None
        self.entries.move_to_end(key)
        return held[0]

    def put(self, key: CacheKey, entry: Entry) -> None:
        """Keep ``entry``, then drop the least recently used until within the bound (an entry
        larger than the bound is not kept)."""
        size = entry.nbytes + key_bytes(key)
        if size > self.max_bytes:
            return
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self.entries[key] = (entry, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, dropped) = self.entries.popitem(last=False)
            self.bytes -= dropped

    def merge(self, request: Looked, computed: Prediction | None) -> Prediction:
        """``request``'s whole answer: its found images from the cache, the rest from
        ``computed`` (its missing images' answer, in order; None when all were found), each
        computed image stored."""
        embeddings = None if computed is None else computed.embeddings
        tags = None if computed is None else computed.tags
        rows: list[Entry] = []
        fresh = 0
        for key, entry in zip(request.keys, request.found):
            if entry is None:
                entry = Entry.of(
                    None if embeddings is None else embeddings[fresh],
                    None if tags is None else tags[fresh],
                )
                self.put(key, entry)
                fresh += 1
            rows.append(entry)
        if fresh != len(request.images):
            raise RuntimeError(
                f"request {request.request_id}: {len(request.images)} images computed, "
                f"{fresh} missing from the cache"
            )
        parsed, spec = request.request, self.spec
        return Prediction.of(
            parsed,
            np.stack([r.embedding for r in rows if r.embedding is not None])
            if parsed.wants(Output.EMBEDDING, spec.task)
            else None,
            [r.tags(spec) for r in rows] if parsed.wants(Output.TAGS, spec.task) else None,
        )
