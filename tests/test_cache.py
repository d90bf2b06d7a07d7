"""The content cache (issue #37, ``handler.cache_bytes``): within its byte bound under a flood
of distinct images, least recently used out first, never answering across models, versions,
precisions, ``topk`` or outputs; a hit skips decoding and the forward pass, is marked with
``X-Cache-Hits`` and answers the same bytes as the miss did."""

from __future__ import annotations

import dataclasses
import json
import re
import tracemalloc

import numpy as np
import pytest

from servecore.answers import AnswerSpec, Tag
from servecore.cache import AnswerCache, key_bytes
from servecore.cacheentry import CacheKey, Entry
from servecore.classes import Classes
from servecore.config import Output
from servecore.errors import InvalidImage
from servecore.explainvalues import ExplainSpec
from servecore.preprocessor import Preprocessor
from servecore.priority import Priority
from servecore.request import OutputSpec, ParsedRequest, Protocol
from servecore.stages import Explaining, Failed, Looked, Opened
from tests import imagegen
from tests.corpus import b64
from tests.handler_context import make_handler, run_batch

ROW_BYTES = 2048 * 4  # one float32 embedding row's data
PHOTO_A = imagegen.jpeg(320, 240, seed=71)
PHOTO_B = imagegen.png(300, 200, seed=72)
PHOTO_C = imagegen.jpeg(256, 256, seed=73)


def spec(name: str = "resnet50-embedding", version: str = "1.0") -> AnswerSpec:
    return AnswerSpec(name, version, Output.EMBEDDING, Classes.of(["a", "b"]), 5, True)


def opened(image: bytes, top_k: int | None = None, outputs=()) -> Opened:
    return Opened("r", ParsedRequest(Protocol.V2, [image], top_k, outputs=outputs), ())


def row(seed: int) -> Entry:
    return Entry(np.random.default_rng(seed).random(2048, dtype=np.float32), None)


def key(cache: AnswerCache, image: bytes) -> CacheKey:
    return cache.key(image, opened(image))


def tags(seed: int) -> Entry:
    top = np.sort(np.random.default_rng(seed).random(5, dtype=np.float32))[::-1]
    return Entry.of(None, [Tag("a", i, float(p)) for i, p in enumerate(top)])


@pytest.mark.parametrize("entry", [row, tags], ids=["embeddings", "tags"])
def test_the_cache_stays_within_its_bound_under_a_flood_of_distinct_images(entry):
    """3,000 distinct images' answers into a 256 KiB cache: what Python allocates for it
    (tracemalloc, numpy's buffers included) never exceeds the bound, and the newest stay."""
    bound = 256 * 1024
    cache = AnswerCache(bound, spec(), "f32")
    keys = [key(cache, i.to_bytes(4, "little")) for i in range(3000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, k in enumerate(keys):
            cache.put(k, entry(i))  # the cache holds the only reference to each answer
            assert cache.bytes <= bound, i
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    kept = len(cache.entries)
    assert held <= bound, f"{held} bytes held for a bound of {bound}"
    assert held >= bound // 2, f"only {held} bytes held: the bound is not used"
    assert 1 < kept < len(keys)
    assert [cache.get(k) is not None for k in keys[-kept:]] == [True] * kept
    assert cache.get(keys[-kept - 1]) is None


def test_the_entry_sizes_docs_operations_md_states():
    """docs/operations.md, "Content cache": an embedding entry about 8.7 KB, a topk-5 tags
    entry about 0.7 KB, each with its key."""
    cache = AnswerCache(1 << 20, spec(), "f32")
    k = key(cache, PHOTO_A)
    sizes = (row(1).nbytes + key_bytes(k), tags(1).nbytes + key_bytes(k))
    assert 8_500 <= sizes[0] <= 8_900 and 600 <= sizes[1] <= 800, sizes
    assert 29_000 <= (256 << 20) // sizes[0] <= 31_000  # "256 MiB holds about 30,000"


def test_the_least_recently_used_entry_goes_first():
    """Room for two rows: a, b, then a read, then c: b goes, a and c stay."""
    cache = AnswerCache(3 * ROW_BYTES, spec(), "f32")
    (a, b, c), entries = (key(cache, x) for x in (b"a", b"b", b"c")), [row(i) for i in range(3)]
    cache.put(a, entries[0])
    cache.put(b, entries[1])
    assert cache.get(a) is entries[0]
    cache.put(c, entries[2])
    assert (cache.get(a), cache.get(b), cache.get(c)) == (entries[0], None, entries[2])


def test_an_entry_is_found_only_under_the_same_model_version_precision_topk_and_outputs():
    """One store seen by caches that differ in one thing each, and requests that differ in
    ``topk`` or the outputs they ask for: only the exact same ask finds the entry."""
    stored = AnswerCache(1 << 20, spec(), "f32")
    stored.put(key(stored, PHOTO_A), row(1))
    others = [
        AnswerCache(1 << 20, spec(name="resnet50-tagger"), "f32"),
        AnswerCache(1 << 20, spec(version="2.0"), "f32"),
        AnswerCache(1 << 20, spec(), "int8+f32"),
    ]
    for other in others:
        other.entries = stored.entries
        assert other.get(key(other, PHOTO_A)) is None
    asks = [
        opened(PHOTO_A, top_k=3),
        opened(PHOTO_A, outputs=(OutputSpec(Output.TAGS),)),
        opened(PHOTO_A, outputs=(OutputSpec(Output.EMBEDDING), OutputSpec(Output.TAGS))),
        opened(PHOTO_B),
    ]
    assert [
        stored.get(stored.key(PHOTO_A if i < 3 else PHOTO_B, a)) for i, a in enumerate(asks)
    ] == [None] * 4
    assert stored.get(stored.key(PHOTO_A, opened(PHOTO_A, top_k=5))) is not None  # the default


def test_explanation_and_failed_requests_pass_the_lookup_untouched():
    cache = AnswerCache(1 << 20, spec(), "f32")
    plain = opened(PHOTO_A)
    cache.put(cache.key(PHOTO_A, plain), row(1))
    explaining = Explaining("e", plain.request, (), ExplainSpec("gradcam", (), 5, 32, 8, True))
    failed = Failed("f", InvalidImage("not an image"))
    looked = cache.lookup([explaining, failed, plain])
    assert looked[:2] == [explaining, failed]
    assert isinstance(looked[2], Looked) and looked[2].hits == (True,)
    assert AnswerCache(0, spec(), "f32").lookup([plain]) == [plain]  # off: nothing looked up


def test_a_looked_up_request_keeps_its_class():
    """A bulk request stays bulk after the lookup (the class is the request's, not the cache's)."""
    cache = AnswerCache(1 << 20, spec(), "f32")
    bulk = dataclasses.replace(opened(PHOTO_A), priority=Priority.BULK)
    (looked,) = cache.lookup([bulk])
    assert isinstance(looked, Looked) and looked.priority is Priority.BULK


def test_a_looked_up_request_keeps_every_field_its_opened_had_but_the_images():
    cache = AnswerCache(1 << 20, spec(), "f32")
    asked = dataclasses.replace(opened(PHOTO_A, top_k=3), priority=Priority.BULK)
    cache.put(cache.key(PHOTO_A, asked), row(1))
    (looked,) = cache.lookup([asked])
    kept = {f.name for f in dataclasses.fields(Opened)} - {"images"}
    assert {name: getattr(looked, name) for name in kept} == {
        name: getattr(asked, name) for name in kept
    }
    assert looked.images == () and looked.hits == (True,)  # the hit leaves nothing to decode


@pytest.fixture(scope="module")
def cached_tagger(weights_dir):
    return make_handler(
        weights_dir, task="tags", draft_decode=False, precision="f32", cache_bytes=1 << 24
    )


@pytest.fixture(scope="module")
def plain_tagger(weights_dir):
    return make_handler(weights_dir, task="tags", draft_decode=False, precision="f32")


@pytest.fixture
def decoded(monkeypatch):
    """The images each batch decodes (a spy on the preprocessor)."""
    seen: list[int] = []
    original = Preprocessor.decode

    def spy(self, image, out=None):
        seen.append(image.pixels)
        return original(self, image, out)

    monkeypatch.setattr(Preprocessor, "decode", spy)
    return seen


def hits(context, count: int) -> list[str | None]:
    return [context.get_response_headers(i).get("X-Cache-Hits") for i in range(count)]


def test_a_hit_is_not_decoded_nor_computed_and_answers_the_misss_bytes(cached_tagger, decoded):
    handler, context = cached_tagger
    first, statuses, _ = run_batch(handler, context, [{"body": PHOTO_C}])
    assert statuses[0][0] == 200 and hits(context, 1) == ["0"]
    assert len(decoded) == 1
    again, _, computed = run_batch(handler, context, [{"body": PHOTO_C}])
    assert hits(context, 1) == ["1"]
    assert len(decoded) == 1, "a hit was decoded"
    assert computed.prepared.pixels is None and computed.logits is None  # no forward pass
    assert again == first  # the same bytes


def test_a_partial_hit_decodes_only_its_missing_images(cached_tagger, plain_tagger, decoded):
    """A v1 request of [A, B] after A alone: one image decoded, ``X-Cache-Hits: 1``, and each
    answer equal to what the cache-less model answers for that image alone."""
    handler, context = cached_tagger
    run_batch(handler, context, [{"body": PHOTO_A}])
    decoded.clear()
    body = json.dumps({"instances": [{"image": {"b64": b64(p)}} for p in (PHOTO_A, PHOTO_B)]})
    answer, statuses, _ = run_batch(handler, context, [{"body": body.encode()}])
    assert statuses[0][0] == 200 and hits(context, 1) == ["1"]
    assert len(decoded) == 1
    plain, plain_context = plain_tagger
    alone = [
        json.loads(run_batch(plain, plain_context, [{"body": p}])[0][0]) for p in (PHOTO_A, PHOTO_B)
    ]
    assert "X-Cache-Hits" not in plain_context.get_response_headers(0)  # off: no marker
    assert json.loads(answer[0])["predictions"] == alone


def test_topk_and_outputs_are_never_answered_from_another_ask(cached_tagger, decoded):
    handler, context = cached_tagger
    run_batch(handler, context, [{"body": PHOTO_B}])
    decoded.clear()
    responses, _, _ = run_batch(handler, context, [{"body": PHOTO_B}], headers=[{"X-Top-K": "3"}])
    assert hits(context, 1) == ["0"] and len(decoded) == 1
    assert len(json.loads(responses[0])) == 3
    v2 = {
        "inputs": [{"name": "images", "shape": [1], "datatype": "BYTES", "data": [b64(PHOTO_B)]}],
        "outputs": [{"name": "embedding"}],
    }
    responses, _, _ = run_batch(handler, context, [{"body": json.dumps(v2).encode()}])
    assert hits(context, 1) == ["0"] and len(decoded) == 2
    assert [o["name"] for o in json.loads(responses[0])["outputs"]] == ["embedding"]


def test_hits_misses_and_bytes_are_counted(cached_tagger, caplog):
    handler, context = cached_tagger
    photo = imagegen.jpeg(200, 180, seed=74)
    with caplog.at_level("INFO", logger="ts.metrics"):
        run_batch(handler, context, [{"body": photo}, {"body": photo}])
        run_batch(handler, context, [{"body": photo}])
    text = "\n".join(r.getMessage() for r in caplog.records)

    def values(name: str) -> list[float]:
        return [float(v) for v in re.findall(rf"\[METRICS\]{name}\.\w+:([0-9.]+)\|", text)]

    # Both copies in the first batch were looked up before either was computed.
    assert values("resnet50_cache_misses_total") == [2.0, 0.0]
    assert values("resnet50_cache_hits_total") == [0.0, 1.0]
    held = values("resnet50_cache_bytes")
    assert len(held) == 2 and 0 < held[0] == held[1] <= 1 << 24
