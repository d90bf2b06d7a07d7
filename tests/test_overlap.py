"""A GPU worker's overlap (``servecore/overlap.py``) driven on the CPU: a batch's requests cut
into parts, each part decoded, then its forward queued before the next part is decoded, the
answers collected once; what is answered is what the serial path answers. The two CUDA streams
are stood in for by no-ops here (no GPU); the order of decode and forward is what is checked."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from torch.utils import _pytree

from servecore.overlap import Overlap, Streams, collect
from servecore.stages import Failed, Opened, Placed
from tests import imagegen
from tests.handler_context import make_handler, run_batch
from tests.test_gpudecode import CORRUPT, JPEG, PNG, SERVED, stand_in

CPU = torch.device("cpu")
GPU = torch.device("cuda", 0)  # where the stand-ins below say their tensors are


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


class OnGpu(torch.Tensor):
    """A CPU tensor standing in for one on the worker's GPU: it says it is on ``GPU``, what is
    computed from it is too, and an operation that mixes it with a CPU tensor fails as torch
    fails one on two devices (a copy across excepted)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func == torch.Tensor.device.__get__:  # a new wrapper each time: ==, not is
            return GPU
        leaves = _pytree.tree_leaves((args, kwargs or {}))
        if func not in (torch.Tensor.to, torch.Tensor.copy_, torch.Tensor.as_subclass) and any(
            type(t) is torch.Tensor and t.dim() for t in leaves
        ):
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two "
                "devices, cuda:0 and cpu!"
            )
        return super().__torch_function__(func, types, args, kwargs or {})


class GpuDecoder:
    """The device decoder on the CPU (``stand_in``), its crops said to be on ``GPU``."""

    device = GPU

    def __init__(self):
        self.decoder, self.recording = stand_in()
        self.refusals = self.decoder.refusals

    def __call__(self, images, turns):
        crops = self.decoder(images, turns)
        return [None if crop is None else crop.as_subclass(OnGpu) for crop in crops]


class GpuStreams(Streams):
    """The two streams as no-ops that record what is queued inside ``decoding``: ``staged``
    copies a CPU part to ``GPU`` (an ``OnGpu``)."""

    def __init__(self, events: list[str]):
        super().__init__(CPU)
        self.device, self.events = GPU, events

    @contextlib.contextmanager
    def decoding(self):
        self.events.append("decoding")
        yield
        self.events.append("decoded")

    def staged(self, pixels):
        self.events.append(f"staged from {pixels.device.type}")
        return pixels if isinstance(pixels, OnGpu) else pixels.as_subclass(OnGpu)


def test_a_part_the_cpu_decoded_is_copied_to_the_gpu_before_its_forward(embedder, monkeypatch):
    """A JPEG (the GPU's decoder) and a PNG (the CPU's) in two parts: the PNG's part goes over to
    the GPU on the decode stream before its forward, the batch is joined there, and both
    answers are the serial path's (the same decoder, no overlap). Before, the batch's parts
    stayed on two devices and joining them failed the whole batch."""
    handler, context = embedder
    model = handler.model
    bodies = [{"body": JPEG}, {"body": PNG}]
    model.intake.device_decoder = stand_in()[0]
    try:
        serial, serial_statuses, serial_batch = run_batch(handler, context, bodies)
        events: list[str] = []

        def start(batch):
            events.append(f"forward {len(batch)} from {batch.device.type}")
            return model.backend.forward(batch.as_subclass(torch.Tensor))

        model.intake.device_decoder = GpuDecoder()
        monkeypatch.setattr(model, "overlap", Overlap(2, start, 64, GpuStreams(events)))
        responses, statuses, batch = run_batch(handler, context, bodies)
    finally:
        model.intake.device_decoder = None
    assert events == [
        "decoding", "staged from cuda", "decoded", "forward 1 from cuda",
        "decoding", "staged from cpu", "decoded", "forward 1 from cuda",
    ]  # fmt: skip
    assert [s for s, _ in statuses] == [s for s, _ in serial_statuses] == [200, 200]
    assert batch.prepared.pixels.device == GPU and len(batch.prepared.pixels) == 2
    for answer, expected in zip(responses, serial):
        torch.testing.assert_close(
            torch.tensor(json.loads(answer)["embedding"]),
            torch.tensor(json.loads(expected)["embedding"]),
            rtol=1e-4,
            atol=1e-4,
        )
    torch.testing.assert_close(batch.embedding, serial_batch.embedding, rtol=1e-4, atol=1e-4)
