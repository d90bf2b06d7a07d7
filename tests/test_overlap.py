"""A GPU worker's overlap (``servecore/overlap.py``) driven on the CPU: a batch's requests cut
into parts, each part decoded, then its forward queued before the next part is decoded, the
answers collected once; what is answered is what the serial path answers. The two CUDA streams
are stood in for by no-ops here (no GPU); the order of decode and forward is what is checked."""

from __future__ import annotations

import json

import pytest
import torch

from servecore.overlap import Overlap, Streams, collect
from servecore.stages import Failed, Opened, Placed
from tests import imagegen
from tests.handler_context import make_handler, run_batch
from tests.test_gpudecode import CORRUPT, SERVED

CPU = torch.device("cpu")


def opened(images: int) -> Opened:
    return Opened("r", None, tuple(range(images)))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("sizes", "chunks", "expected"),
    [
        ([1] * 8, 2, [4, 4]),
        ([1] * 7, 2, [4, 3]),
        ([1] * 8, 3, [3, 3, 2]),
        ([8, 1, 1], 2, [1, 2]),  # a request's images stay together
        ([1, 1], 4, [1, 1]),
        ([1] * 6, 1, [6]),
    ],
)
def test_a_batch_is_cut_between_requests_into_parts_of_about_equal_images(sizes, chunks, expected):
    overlap = Overlap(chunks, lambda batch: batch, 64, Streams(CPU))
    parts = list(overlap.parts([opened(n) for n in sizes]))
    assert [len(p) for p in parts] == expected
    failed = Failed("f", None)  # type: ignore[arg-type]
    with_failed = list(overlap.parts([failed, *[opened(n) for n in sizes]]))
    assert sum(len(p) for p in with_failed) == len(sizes) + 1 and with_failed[0][0] is failed


@pytest.fixture(scope="module")
def embedder(weights_dir):
    return make_handler(weights_dir, task="embedding", normalize_embedding=False)


BODIES = [imagegen.jpeg(320 + 8 * i, 240, seed=i) for i in range(5)]


def test_each_parts_forward_is_queued_before_the_next_part_is_decoded(embedder, monkeypatch):
    """Six requests in three parts of two, the fourth a corrupt JPEG: decode and forward alternate
    part by part, the forward runs ``rows`` at most at a time, one collect joins them; the
    answers are the serial path's, the corrupt one its own 400, the rows in request order."""
    handler, context = embedder
    model = handler.model
    bodies = [*BODIES[:3], CORRUPT, *BODIES[3:]]
    serial, serial_statuses, serial_batch = run_batch(
        handler, context, [{"body": b} for b in bodies]
    )
    events: list[str] = []
    decode = model.intake.preprocessor.decode

    def decoding(image, out=None):
        events.append("decode")
        return decode(image, out)

    def start(batch):
        events.append(f"forward {len(batch)}")
        return model.backend.forward(batch)

    monkeypatch.setattr(model.intake.preprocessor, "decode", decoding)
    monkeypatch.setattr(model.intake, "threads", 1)  # one task per part: the order is the test's
    monkeypatch.setattr(model, "overlap", Overlap(3, start, 2, Streams(CPU)))
    responses, statuses, batch = run_batch(handler, context, [{"body": b} for b in bodies])
    assert events == ["decode", "decode", "forward 2", "decode", "decode", "forward 1",
                      "decode", "decode", "forward 2"]  # fmt: skip
    assert (
        [s for s, _ in statuses]
        == [s for s, _ in serial_statuses]
        == [200, 200, 200, 400, 200, 200]
    )
    assert json.loads(responses[3]) == json.loads(serial[3])
    placed = [r for r in batch.prepared.requests if isinstance(r, Placed)]
    assert [list(r.rows) for r in placed] == [[0], [1], [2], [3], [4]]
    for row, body in zip(batch.prepared.pixels, [*BODIES[:3], *BODIES[3:]]):
        assert torch.equal(row, SERVED(body))
    torch.testing.assert_close(batch.embedding, serial_batch.embedding, rtol=1e-4, atol=1e-4)


def test_collect_joins_the_parts_in_order():
    parts = [
        (torch.full((2, 3), 1.0), torch.full((2, 4), 2.0)),
        (torch.zeros(1, 3), torch.ones(1, 4)),
    ]
    embedding, logits = collect(parts)
    assert embedding.shape == (3, 3) and logits.shape == (3, 4)
    assert embedding[:, 0].tolist() == [1.0, 1.0, 0.0] and logits[:, 0].tolist() == [2.0, 2.0, 1.0]
