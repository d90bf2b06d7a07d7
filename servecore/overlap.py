"""A GPU worker's batch in parts, so that its GPU is not idle while the next part is decoded.

An engine hands a worker one batch and waits for its answers (TorchServe, Triton), so the
overlap a worker can have is inside a batch: the batch's admitted requests are cut into
``handler.gpu_overlap_chunks`` consecutive parts of about equal images (a request's images stay
in one part); each part is decoded on the worker's decode stream (the GPU's JPEG decoder, its
resize and crop, the copy over of what the CPU decoded: a part all of whose images the CPU
decoded goes over whole, ``staged``), then its forward is queued on the compute stream,
which waits for that part's decode on the device, not on the host, and the worker goes on
to decode the next part while the GPU runs the forward. The outputs stay on
the device; ``collect`` copies them back once a batch into page-locked memory, and that is the
one wait for the GPU. With one part it is the same path without the overlap (what
``make bench-gpu`` compares it with). Across batches, several workers per GPU overlap one
worker's opening and answering with another's forward.

On a CPU worker nothing here runs (the intake decodes, then ``ImageModel.infer`` runs the
forward, as before). No GPU has run the streams yet: tests/test_overlap.py drives the parts,
the order of decode and forward and the copy back with the streams stood in for on the CPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from servecore.runtime import Forward
from servecore.stages import Admitted, Opened

Outputs = tuple[torch.Tensor, torch.Tensor]  # embedding, logits: one forward's, on the device


class Streams:
    """The compute stream (the worker's current one, where the forward runs) and a decode
    stream of ``device``'s own; a CPU device has neither (a test's)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.compute = torch.cuda.current_stream(device) if self.cuda else None
        self.decode = torch.cuda.Stream(device) if self.cuda else None

    def decoding(self) -> contextlib.AbstractContextManager:
        """The decode stream as the current one (what is queued inside goes there)."""
        return torch.cuda.stream(self.decode) if self.cuda else contextlib.nullcontext()

    def staged(self, pixels: torch.Tensor) -> torch.Tensor:
        """``pixels`` on the device: a part whose images the CPU decoded (PNG, progressive
        JPEGs, crops, what the GPU refused) copied over from page-locked memory, queued on the
        current stream (the decode stream, while decoding: the copy runs beside the previous
        part's forward), so that every part of a batch is on one device."""
        if pixels.device == self.device:
            return pixels
        if self.cuda:
            pixels = pixels.pin_memory()
        return pixels.to(self.device, non_blocking=True)

    def hand_over(self, pixels: torch.Tensor) -> None:
        """``pixels``, made on the decode stream, to the compute stream: it waits (on the
        device) for what the decode stream has queued, and the allocator keeps their memory
        until the compute stream is done with it."""
        if self.cuda and pixels.device.type == "cuda":
            assert self.compute is not None and self.decode is not None
            self.compute.wait_stream(self.decode)
            pixels.record_stream(self.compute)


class Overlap:
    """A batch's parts (``parts``), each decoded under ``decoding()`` and handed to ``launch``,
    which queues its forward (``start``, the backend's, ``rows`` at most at a time) on the
    compute stream and gives back the outputs on the device."""

    def __init__(self, chunks: int, start: Forward, rows: int, streams: Streams) -> None:
        self.chunks, self.start, self.rows, self.streams = chunks, start, rows, streams

    def parts(self, requests: Sequence[Admitted]) -> Iterator[list[Admitted]]:
        """``requests`` in order, in at most ``chunks`` consecutive runs: a run ends with the
        request that brings it to its share of the images (k/chunks of them, requests whole);
        a request without images (failed) joins the run it comes in."""
        images = [len(r.images) if isinstance(r, Opened) else 0 for r in requests]
        total, done, run = sum(images), 0, []
        cut = 1
        for request, count in zip(requests, images, strict=True):
            run.append(request)
            done += count
            if cut < self.chunks and done * self.chunks >= total * cut and count:
                yield run
                run, cut = [], cut + 1
        if run:
            yield run

    def decoding(self) -> contextlib.AbstractContextManager:
        return self.streams.decoding()

    def staged(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.streams.staged(pixels)

    def launch(self, pixels: torch.Tensor) -> list[Outputs]:
        """The forward of ``pixels`` queued on the compute stream, ``rows`` at a time: its
        outputs there, not waited for."""
        self.streams.hand_over(pixels)
        return [self.start(part) for part in pixels.split(self.rows)]


def collect(forwarded: Sequence[Outputs]) -> Outputs:
    """The outputs of a batch's queued forwards, in order, as CPU float32 tensors: joined on
    the device and copied back once, into page-locked memory (torch's page-locked allocator
    hands a buffer out again only once the copy out of it is done), then one wait for the
    device."""
    embedding = torch.cat([e for e, _ in forwarded]).float()
    logits = torch.cat([lg for _, lg in forwarded]).float()
    if embedding.device.type == "cpu":
        return embedding, logits
    host = tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in (embedding, logits))
    for out, tensor in zip(host, (embedding, logits), strict=True):
        out.copy_(tensor, non_blocking=True)
    torch.cuda.current_stream(embedding.device).synchronize()
    return host[0], host[1]
