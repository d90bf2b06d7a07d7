"""A batch's requests through open, admit and decode, each request on its own.

Each request is parsed and its images' headers read on its own (``Intake.open``); the batch's
work is admitted within its budgets (``servecore.admission``: forward rows, decoded pixels, an
addon's work) before anything is decoded; the admitted images are decoded on a small thread
pool (PIL and torch release the GIL) and stacked into one CPU tensor. Whatever goes wrong fails
its own request only: failures are exceptions, caught at one per-request boundary
(``_attempt``) and returned as that request's ``Failed``.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

from servecore.admission import Admission, Budget
from servecore.config import HandlerConfig
from servecore.errors import InternalError, PayloadTooLarge, RequestError, detached
from servecore.images import OpenedImage, decode, open_image
from servecore.parse import ParsedRequest
from servecore.stages import Admitted, Failed, Incoming, Opened, Placed, PreparedBatch, State

logger = logging.getLogger(__name__)

T = TypeVar("T")
# handler.decode_threads 0 = one decode thread per usable core, at most this many.
MAX_DECODE_THREADS = 4
Failure = Callable[[Exception], RequestError]


class Addon(Protocol):
    """A feature that rides on the prediction path (explanations): the intake asks it about
    each request and the batch through this protocol and imports no feature; the model
    (``servecore.service``) builds the addon and hands it over."""

    def open(self, request: ParsedRequest, explain_route: bool) -> Any:
        """This request's state for the addon (``Opened.addon``), or None when the request is
        a plain prediction; raises ``RequestError`` to fail the request."""

    def admit(self, requests: Sequence[Admitted], admission: Admission) -> list[Admitted]:
        """``requests`` with the opened ones whose addon work this batch has no room for
        replaced by their ``Failed``."""


class Preprocessor:
    """Encoded image bytes -> the model's input tensor: the handler's limits on the image, then
    the weights' own transform (resize 232, centre crop 224, ImageNet mean/std). In two steps,
    so that a batch is costed before any pixel is decoded; the benchmark times the same path.
    Raises ``RequestError`` for a bad image."""

    def __init__(self, config: HandlerConfig) -> None:
        from model_files.resnet_dual import WEIGHTS

        self.config = config
        self.transform = WEIGHTS.transforms()
        # JPEG draft decoding may shrink in the DCT down to the resize size, never below it.
        self.draft_size = max(self.transform.resize_size) if config.draft_decode else None

    def open(self, data: bytes) -> OpenedImage:
        """Header only: checks bytes and pixel limits and tells the decoding cost."""
        return open_image(
            data,
            max_pixels=self.config.max_image_pixels,
            max_bytes=self.config.max_image_bytes,
            draft_size=self.draft_size,
        )

    def decode(self, opened: OpenedImage) -> torch.Tensor:
        return self.transform(decode(opened))

    def __call__(self, data: bytes) -> torch.Tensor:
        return self.decode(self.open(data))


class Intake:
    """Turns one batch of ``Incoming`` requests into a ``PreparedBatch``."""

    def __init__(self, config: HandlerConfig, addon: Addon, admission: Admission) -> None:
        self.config = config
        self.addon = addon
        self.admission = admission
        self.preprocessor = Preprocessor(config)
        self.budgets = (
            Budget(
                "max_batch_images",
                "images",
                config.max_batch_images,
                lambda request: request.image_count,
            ),
            Budget(
                "max_batch_pixels",
                "decoded pixels",
                config.max_batch_pixels,
                lambda request: request.pixel_count,
            ),
        )
        threads = config.decode_threads or min(MAX_DECODE_THREADS, usable_cpus())
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="decode")

    def prepare(self, incoming: Sequence[Incoming]) -> PreparedBatch:
        started = time.perf_counter()
        requests: list[Admitted] = [self.open(request) for request in incoming]
        for budget in self.budgets:
            requests = self.admission.within(requests, budget)
        requests = self.addon.admit(requests, self.admission)
        self.admission.served(requests)
        opened = time.perf_counter()
        states, tensors = self._decode(requests)
        return PreparedBatch(
            tuple(states),
            torch.stack(tensors) if tensors else None,
            open_ms=1000 * (opened - started),
            decode_ms=1000 * (time.perf_counter() - opened),
        )

    def open(self, incoming: Incoming) -> Opened | Failed:
        """Parse one request and read its images' headers."""
        request_id = incoming.request_id

        def parse(_: Failure) -> tuple[ParsedRequest, Any]:
            request = incoming.parse()
            return request, self.addon.open(request, incoming.explain)

        parsed = _attempt(request_id, "parsing", parse)
        if isinstance(parsed, Failed):
            return parsed
        return _attempt(request_id, "reading", functools.partial(self._read, request_id, *parsed))

    def _read(
        self, request_id: str, request: ParsedRequest, addon: Any, failure: Failure
    ) -> Opened:
        images = tuple(_each_image(request.images, self.preprocessor.open, failure))
        opened = Opened(request_id, request, images, addon)
        limit = self.config.max_request_pixels
        if opened.pixel_count > limit:
            raise PayloadTooLarge(
                f"request would decode {opened.pixel_count} pixels ({len(images)} image(s)), "
                f"more than the limit of {limit} (handler.max_request_pixels); send fewer "
                "or smaller images"
            )
        return opened

    def _decode(self, requests: Sequence[Admitted]) -> tuple[list[State], list[torch.Tensor]]:
        """The admitted requests' images as model inputs, in order; a request whose image
        fails becomes its ``Failed`` and gets no rows."""
        work = sum(r.image_count for r in requests if isinstance(r, Opened))
        start = self.pool.submit if work > 1 else _now
        pending = [
            [start(self.preprocessor.decode, image) for image in r.images]
            if isinstance(r, Opened)
            else []
            for r in requests
        ]
        states: list[State] = []
        tensors: list[torch.Tensor] = []
        for request, futures in zip(requests, pending):
            if isinstance(request, Failed):
                states.append(request)
                continue
            decoded = _attempt(
                request.request_id,
                "decoding",
                functools.partial(_each_image, futures, Future.result),
            )
            if isinstance(decoded, Failed):
                states.append(decoded)
                continue
            states.append(Placed(request, range(len(tensors), len(tensors) + len(decoded))))
            tensors.extend(decoded)
        return states, tensors


def usable_cpus(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup CPU quota (a
    pod's CPU limit; ``os.cpu_count()`` is the node's cores)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quota = _cgroup_quota(cgroup)
    return max(1, min(cpus or 1, math.ceil(quota) if quota else cpus or 1))


def _cgroup_quota(root: Path) -> float | None:
    """CPUs allowed by the cgroup (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), None if none."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    for folder in (root / "cpu", root / "cpu,cpuacct"):
        try:
            cfs_quota = int((folder / "cpu.cfs_quota_us").read_text())
            cfs_period = int((folder / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return cfs_quota / cfs_period if cfs_quota > 0 and cfs_period > 0 else None
    return None


def as_request_error(exc: Exception, stage: str, request_id: str) -> RequestError:
    """``exc`` as the request's error. Anything but a ``RequestError`` is a bug of ours:
    logged with the request id and answered 500 for this request alone, never a failed
    batch."""
    if isinstance(exc, RequestError):
        return exc
    logger.error(
        "request %s: unexpected %s while %s", request_id, type(exc).__name__, stage, exc_info=exc
    )
    return InternalError(
        f"unexpected error while {stage} this request "
        f"({type(exc).__name__}); request id {request_id}"
    )


def _attempt(request_id: str, stage: str, step: Callable[[Failure], T]) -> T | Failed:
    """The one place a request's failure is caught: ``step``'s result, or the request's
    ``Failed``. ``step`` gets the converter ``_each_image`` uses."""
    failure = functools.partial(as_request_error, stage=stage, request_id=request_id)
    try:
        return step(failure)
    except Exception as exc:  # noqa: BLE001 - the last line of defence, per request
        return Failed(request_id, detached(failure(exc)))


def _each_image(items: Sequence[Any], step: Callable[[Any], Any], failure: Failure) -> list:
    """``step`` of every image of a request; the first failure says which image it was."""
    results = []
    for k, item in enumerate(items):
        try:
            results.append(step(item))
        except Exception as exc:  # noqa: BLE001 - converted, then raised to the boundary
            raise failure(exc).of_image(k, len(items)) from None
    return results


def _now(fn: Callable, *args) -> Future:
    """``fn(*args)`` run here, as a finished future (one image is not worth a thread hop)."""
    future: Future = Future()
    try:
        future.set_result(fn(*args))
    except Exception as exc:  # noqa: BLE001 - kept for Future.result, like the pool does
        future.set_exception(detached(exc))  # else exc -> this frame -> future -> exc
    return future
