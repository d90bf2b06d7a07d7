"""One request's path through the worker, for every request of a batch: open, parse, admit,
decode.

Each request is parsed and its images' headers read on its own; the batch's work is admitted
within ``max_batch_images`` forward rows and ``max_batch_pixels`` decoded pixels (an addon's
work, within its own budget), fewest first, before anything is decoded; the admitted
images are decoded on a small thread pool (PIL and torch release the GIL) and stacked into one
CPU tensor. Whatever goes wrong fails its own request only: failures are exceptions, caught at
one per-request boundary (``_stage``) and kept as the slot's error.
"""
from __future__ import annotations

import functools
import logging
import math
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from handlers.batch import Addon, PreparedBatch, Slot, admit_within
from handlers.config import HandlerConfig
from handlers.errors import InternalError, PayloadTooLarge, RequestError, detached
from handlers.images import OpenedImage, decode, open_image
from handlers.parse import parse_request

logger = logging.getLogger(__name__)

TOP_K_HEADER = "x-top-k"
EXPLAIN_PROPERTY = "explain"  # "True" on /explanations and KServe v1 :explain (TorchServe 0.12)


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
        return open_image(data, max_pixels=self.config.max_image_pixels,
                          max_bytes=self.config.max_image_bytes, draft_size=self.draft_size)

    def decode(self, opened: OpenedImage) -> torch.Tensor:
        return self.transform(decode(opened))

    def __call__(self, data: bytes) -> torch.Tensor:
        return self.decode(self.open(data))


class Intake:
    """Turns one batch of TorchServe requests into a ``PreparedBatch``; ``addon`` (the
    explanations) is asked about each request and the batch on the way."""

    def __init__(self, config: HandlerConfig, addon: Addon) -> None:
        self.config = config
        self.addon = addon
        self.preprocessor = Preprocessor(config)
        threads = config.decode_threads or min(4, usable_cpus())
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="decode")

    def prepare(self, data: list[dict], context) -> PreparedBatch:
        slots = [self._open(idx, row, context) for idx, row in enumerate(data)]
        for budget, unit, cost in (("max_batch_images", "images", lambda s: s.images),
                                   ("max_batch_pixels", "decoded pixels", lambda s: s.pixels)):
            good = [slot for slot in slots if slot.ok]
            admit_within(good, [cost(s) for s in good], getattr(self.config, budget), budget,
                         unit)
        self.addon.admit([slot for slot in slots if slot.ok])
        started = time.perf_counter()
        tensors = self._decode([slot for slot in slots if slot.ok])
        return PreparedBatch(slots, torch.stack(tensors) if tensors else None,
                             decode_ms=1000 * (time.perf_counter() - started))

    def _open(self, idx: int, row: dict, context) -> Slot:
        """Parse one request and read its images' headers; any failure is the slot's error."""
        slot = Slot(request_id=str((context.request_ids or {}).get(idx, "?")))
        with _stage(slot, "parsing"):
            slot.request = parse_request(row, header_top_k=header(context, idx, TOP_K_HEADER),
                                         config=self.config)
            slot.addon = self.addon.open(
                slot.request, context.get_request_header(idx, EXPLAIN_PROPERTY) == "True")
        if not slot.ok:
            return slot
        with _stage(slot, "reading") as failure:
            slot.opened = _each_image(slot.request.images, self.preprocessor.open, failure)
            limit = self.config.max_request_pixels
            if slot.pixels > limit:
                raise PayloadTooLarge(
                    f"request would decode {slot.pixels} pixels ({len(slot.opened)} image(s)), "
                    f"more than the limit of {limit} (handler.max_request_pixels); send fewer "
                    "or smaller images")
        return slot

    def _decode(self, slots: Sequence[Slot]) -> list[torch.Tensor]:
        """The admitted slots' images as model inputs, in order; a slot whose image fails
        gets the error and no rows."""
        work = sum(len(slot.opened) for slot in slots)
        start = self.pool.submit if work > 1 else _now
        pending = [[start(self.preprocessor.decode, image) for image in slot.opened]
                   for slot in slots]
        tensors: list[torch.Tensor] = []
        for slot, futures in zip(slots, pending):
            with _stage(slot, "decoding") as failure:
                results = _each_image(futures, Future.result, failure)
                slot.start, slot.count = len(tensors), len(results)
                tensors.extend(results)
        return tensors


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
            quota = int((folder / "cpu.cfs_quota_us").read_text())
            period = int((folder / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return quota / period if quota > 0 and period > 0 else None
    return None


def header(context, idx: int, name: str) -> str | None:
    """A request header by case-insensitive name (clients differ in capitalisation)."""
    processor = context.request_processor
    if not processor or idx >= len(processor) or processor[idx] is None:
        return None
    for key, value in processor[idx].get_request_properties().items():
        if key.lower() == name and isinstance(value, str):
            return value
    return None


def as_request_error(exc: Exception, stage: str, request_id: str) -> RequestError:
    """``exc`` as the request's error. Anything but a ``RequestError`` is a bug of ours:
    logged with the request id and answered 500 for this request alone, never a failed
    batch."""
    if isinstance(exc, RequestError):
        return exc
    logger.error("request %s: unexpected %s while %s", request_id, type(exc).__name__, stage,
                 exc_info=exc)
    return InternalError(f"unexpected error while {stage} this request "
                         f"({type(exc).__name__}); request id {request_id}")


@contextmanager
def _stage(slot: Slot, name: str) -> Iterator[Callable[[Exception], RequestError]]:
    """The one place a request's failure is caught: it becomes the slot's error. Yields the
    converter ``_each_image`` uses."""
    failure = functools.partial(as_request_error, stage=name, request_id=slot.request_id)
    try:
        yield failure
    except Exception as exc:  # noqa: BLE001 - the last line of defence, per request
        slot.error = detached(failure(exc))


def _each_image(items: Sequence[Any], step: Callable[[Any], Any],
                failure: Callable[[Exception], RequestError]) -> list:
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
