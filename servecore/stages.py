"""One request's values on its way through a batch, each made once by the step that owns it.

    Incoming --open--> Opened | Failed --admit--> Opened | Failed
             --look up (cache on)--> Looked | Opened | Failed --decode--> Placed | Failed
             --infer--> (explanations: Explained | Failed) --answer--> Reply

An explanation request is an ``Explaining``, the ``Opened`` that also carries its ``ExplainSpec``;
it travels the same steps, and the explanation stage's result for the batch (per request index,
its ``Explained`` or ``Failed``) goes to the answer beside the ``ComputedBatch``. A step
returns what it produced; a request that failed is a ``Failed`` from then on and carries its
error to the end, unchanged: no later step writes into an earlier step's value.

A prediction request the content cache looked up is a ``Looked``: the ``Opened`` that also
carries its images' keys and what the cache found (``servecore.cacheentry``), with only the images
left to compute as its ``images``.

Imports the explanation's and the cache's types (its spec: ``servecore.explainvalues``; key,
entry: ``servecore.cacheentry``), nothing that computes or looks one up.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from servecore.cacheentry import CacheKey, Entry
from servecore.config import HandlerConfig
from servecore.crops import GivenCrop
from servecore.errors import RequestError, detached
from servecore.explainvalues import ExplainSpec
from servecore.images import OpenedImage
from servecore.priority import Priority, parse_deadline, parse_priority
from servecore.request import ParsedRequest, Payload

_SAMPLE = 64 * 1024  # bytes of each end of an image that its fingerprint reads
TRACEPARENT, TRACESTATE = "traceparent", "tracestate"  # W3C trace context (servecore.tracing)


@dataclass(frozen=True)
class TraceHeaders:
    """The W3C trace context a request came with, as its engine read it: ``parent`` (the
    ``traceparent`` header's value) and ``state`` (``tracestate``, "" when none)."""

    parent: str
    state: str = ""

    @classmethod
    def of(cls, headers: Mapping[str, Any]) -> TraceHeaders | None:
        """From a request's headers or parameters keyed in lower case (None: no traceparent)."""
        parent, state = headers.get(TRACEPARENT), headers.get(TRACESTATE)
        if not isinstance(parent, str) or not parent:
            return None
        return cls(parent, state if isinstance(state, str) else "")

    def carrier(self) -> dict[str, str]:
        """As the W3C propagator reads it."""
        return {TRACEPARENT: self.parent, TRACESTATE: self.state}


@dataclass(frozen=True)
class Incoming:
    """A request as an engine hands it over, as values: its ``payload`` (an HTTP request's
    body, fields and headers, or a tensor request's arrays and parameters), which ``parse``
    turns into a ``ParsedRequest`` (or a ``RequestError``) inside the request's own failure
    boundary; ``explain``: it came on an explanation route (``/explanations``, KServe v1
    ``:explain``); ``priority`` and ``deadline`` (Unix seconds, None: none): what the engine
    read from its headers or parameters (``servecore.priority``); ``refused``: why a value the
    engine read fails this request (a bad ``X-Priority``), None when none does; ``trace``: the
    W3C trace context it came with, None when none."""

    request_id: str
    payload: Payload
    explain: bool = False
    priority: Priority = Priority.INTERACTIVE
    deadline: float | None = None
    refused: RequestError | None = None
    trace: TraceHeaders | None = None

    def parse(self, config: HandlerConfig) -> ParsedRequest:
        """The payload as the core's ``ParsedRequest``; raises the request's ``RequestError``."""
        if self.refused is not None:
            raise self.refused
        return self.payload.parse(config)

    def classified(self, priority: Any = None, deadline: Any = None) -> Incoming:
        """This request with the class and deadline of the ``X-Priority`` / ``X-Deadline``
        values an engine read (None: not sent; ``servecore.priority``). A value that cannot be
        read fails this request alone: its ``parse`` raises the 400 (``refused``)."""
        if priority is None and deadline is None:
            return self  # the usual request: interactive, no deadline, nothing to copy
        try:
            return dataclasses.replace(
                self,
                priority=Priority.INTERACTIVE if priority is None else parse_priority(priority),
                deadline=None if deadline is None else parse_deadline(deadline),
            )
        except RequestError as error:
            return dataclasses.replace(self, refused=detached(error))

    def traced(self, headers: Mapping[str, Any]) -> Incoming:
        """This request with the ``traceparent`` / ``tracestate`` among ``headers`` (keys in
        lower case: an engine's headers or forwarded parameters)."""
        trace = TraceHeaders.of(headers)
        return self if trace is None else dataclasses.replace(self, trace=trace)


@dataclass(frozen=True)
class Failed:
    """A request that failed, and why (its status comes from the error's kind)."""

    request_id: str
    error: RequestError


@dataclass(frozen=True)
class Opened:
    """Parsed, its images' headers read, nothing decoded: what the batch's budgets decide on.
    A prediction; an explanation request is the ``Explaining`` below. ``priority``: its class,
    the request's own ``parameters.priority`` else what the engine read (``Incoming``)."""

    request_id: str
    request: ParsedRequest
    images: tuple[OpenedImage | GivenCrop, ...]
    priority: Priority = field(default=Priority.INTERACTIVE, kw_only=True)

    @cached_property
    def fingerprint(self) -> bytes:
        """Recognises a retry of the same request (``servecore.admission``); computed only
        when admission asks."""
        return fingerprint(self.request.images)

    @property
    def image_count(self) -> int:
        """The forward rows this request asks for."""
        return len(self.images)

    @property
    def pixel_count(self) -> int:
        """The decoding work this request asks for."""
        return sum(image.pixels for image in self.images)


@dataclass(frozen=True)
class Explaining(Opened):
    """An explanation request, opened: ``spec`` is what it asks (its checked parameters)."""

    spec: ExplainSpec


@dataclass(frozen=True)
class Looked(Opened):
    """A prediction request after the cache lookup, everything its ``Opened`` had (its
    ``priority`` too) but ``images``: only those to decode and compute; ``keys`` (one per
    image the request sent) and ``found`` (its cached answer, or None to compute) say how to
    put its answer back together."""

    keys: tuple[CacheKey, ...] = ()
    found: tuple[Entry | None, ...] = ()

    @classmethod
    def of(
        cls,
        opened: Opened,
        missing: tuple[OpenedImage | GivenCrop, ...],
        keys: tuple[CacheKey, ...],
        found: tuple[Entry | None, ...],
    ) -> Looked:
        """``opened`` looked up: every field it has, ``missing`` as its images."""
        kept = {f.name: getattr(opened, f.name) for f in dataclasses.fields(Opened)}
        return cls(**{**kept, "images": missing}, keys=keys, found=found)

    @property
    def hits(self) -> tuple[bool, ...]:
        """Per image the request sent: answered from the cache."""
        return tuple(entry is not None for entry in self.found)


def fingerprint(images: tuple[bytes, ...] | list[bytes]) -> bytes:
    """A short digest that recognises a request's retry: each image's length and its first
    and last 64 KiB (cheap on a 30 MB photo; a collision only lends priority, never an
    answer)."""
    digest = hashlib.blake2b(digest_size=16)
    for data in images:
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data[:_SAMPLE])
        digest.update(data[-_SAMPLE:])
    return digest.digest()


@dataclass(frozen=True)
class Placed:
    """Decoded: the request's images are ``rows`` of the batch tensor."""

    opened: Opened
    rows: range

    @property
    def request_id(self) -> str:
        return self.opened.request_id


Admitted = Opened | Failed
State = Placed | Failed


@dataclass(frozen=True)
class PreparedBatch:
    """A batch after ``prepare``: its requests in arrival order, the stacked images of the
    placed ones (None when every request failed; on the CPU, or on the GPU when it decoded
    some) and the milliseconds opening (parsing,
    reading headers, admitting) and decoding took. ``forwarded``: on a GPU worker that
    overlaps decoding with the forward (``servecore.overlap``), the (embedding, logits) of the
    forwards already queued on the device for those images, in row order; () when ``infer``
    runs the forward. ``gpu_refused``: the JPEGs the GPU's decoder gave back to the CPU path
    (None on a worker without one)."""

    requests: tuple[State, ...]
    pixels: torch.Tensor | None
    open_ms: float = 0.0
    decode_ms: float = 0.0
    forwarded: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()
    gpu_refused: int | None = None


@dataclass(frozen=True)
class ComputedBatch:
    """A batch after ``infer``: the model's outputs for every row (None when nothing reached
    the model); ``forward_ms``: the forward's wall-clock time."""

    prepared: PreparedBatch
    embedding: torch.Tensor | None
    logits: torch.Tensor | None
    forward_ms: float = 0.0
