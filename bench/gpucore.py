"""(3) of ``python -m bench.gpu``: the core end to end, ``ImageModel.run`` on one request per
JPEG as an engine calls it, with the core's own times per part from its metrics. Imports the
core only when called: what it needs beyond torch (psutil) may be missing on a bare GPU host."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from bench.gpureport import Rate
from model_files.artifacts import CHECKPOINT

Timed = Callable[[Callable[[], object], int, Callable[[], None]], Rate]


def core_missing() -> str | None:
    """Why (3) cannot run here (``core skipped: psutil missing``), None when it can."""
    try:
        import servecore.service  # noqa: F401 - imported to learn what it needs
    except ModuleNotFoundError as error:
        return f"core skipped: {error.name} missing"
    return None


class CoreTimes:
    """A metrics sink (``servecore.metrics.MetricsSink``) keeping the core's own ms totals of
    the metrics named in ``parts`` (metric name -> part), and its batches."""

    def __init__(self, parts: dict[str, str], batches: str) -> None:
        self.parts, self.batches_metric = parts, batches
        self.ms: dict[str, float] = {}
        self.batches = 0.0

    def add(self, metric: Any, value: float, labels: tuple[str, ...] = ()) -> None:
        if metric.name in self.parts:
            part = self.parts[metric.name]
            self.ms[part] = self.ms.get(part, 0.0) + value
        elif metric.name == self.batches_metric:
            self.batches += value

    def flush(self) -> None:
        pass

    def reset(self) -> None:
        self.ms, self.batches = {}, 0.0

    def per_batch(self) -> dict[str, float]:
        return {part: ms / max(self.batches, 1) for part, ms in self.ms.items()}


def handler_setting(text: str) -> tuple[str, object]:
    """``--handler key=value``: a ``handler:`` setting (an int, true/false, or text)."""
    key, _, value = text.partition("=")
    if value.lstrip("-").isdigit():
        return key, int(value)
    return key, {"true": True, "false": False}.get(value.lower(), value)


def crop_request(crop: Any) -> Any:
    """One HWC uint8 crop as a v2 request in the binary tensor extension, as an engine hands
    the core its body and ``Inference-Header-Content-Length``."""
    from servecore.edges.http import HttpRequest
    from serveshared.v2binary import HEADER_LENGTH, binary_body, binary_tensor

    tensor = binary_tensor("crops", "UINT8", [1, *crop.shape], crop.nbytes)
    body, headers = binary_body({"inputs": [tensor]}, crop.tobytes())
    return HttpRequest(body=body, header_length=headers[HEADER_LENGTH])


OVERLAP_OFF = ", overlap off"  # the rows of the same photos with handler.gpu_overlap_chunks: 1


def run_core(
    folder: Path,
    device: torch.device,
    work: dict[str, list[bytes]],
    handler: dict[str, object],
    timed: Timed,
) -> tuple[dict[str, Rate], dict[str, dict[str, float]], str]:
    """(3): ``ImageModel.run`` on each batch of ``work`` (one request per JPEG; then the same
    photos as the crops a client would send, which skip decoding) with the ``handler:``
    settings ``handler``, then on a GPU the JPEGs again with the overlap off
    (``gpu_overlap_chunks: 1``, the precision the first model chose, kept in a scratch host
    cache): img/s, the core's
    own ms per batch by part (open, decode, forward, answer), and what the core chose
    (precision, decoder, CUDA graphs, overlap). ``timed(step, images, warm)`` measures,
    calling ``warm()`` once warmed up."""
    settings = {"device": device.type, "precision_cache": str(folder / "precision.json")}
    rates: dict[str, Rate] = {}
    parts: dict[str, dict[str, float]] = {}
    chose = ""
    # The overlap is a GPU worker's: on a CPU the second model would time the same path again.
    variants = [("", {})] + (
        [(OVERLAP_OFF, {"gpu_overlap_chunks": 1})] if device.type == "cuda" else []
    )
    for suffix, extra in variants:
        model, times, loaded = _model(folder, device, work, {**settings, **handler, **extra})
        requests = {
            f"{name}{suffix}": [_jpeg_request(j) for j in data] for name, data in work.items()
        }
        if not suffix:
            gpu = model.describe()["gpu"]
            chose = (
                f"{loaded}; {model.choice.line()}; decoder: {gpu['decoder']} ({gpu['why']}); "
                f"overlap: {gpu['overlap_chunks']} parts a batch; CUDA graphs: "
                f"{gpu['cuda_graphs'] or 'n/a'}"
            )
            for name, data in work.items():  # the same photos sent as crops (#44): no decode
                crops = [model.intake.preprocessor(j).permute(1, 2, 0).numpy() for j in data]
                requests[f"{name} as crops"] = [crop_request(crop) for crop in crops]
        for name, sent in requests.items():
            rates[name], parts[name] = _timed_run(model, name, sent, times, timed)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rates, parts, chose


def _model(folder: Path, device: torch.device, work: dict, handler: dict) -> tuple:
    """A loaded ``ImageModel`` for ``handler``, the metrics sink it records into, and how long
    it took to load."""
    from model_files.artifacts import ModelFiles
    from servecore import metrics
    from servecore.config import HandlerConfig
    from servecore.service import ImageModel, ModelSettings

    times = CoreTimes(
        {m.name: m.name.split("_")[1] for m in (metrics.OPEN_MS, metrics.DECODE_MS,
                                                  metrics.FORWARD_MS, metrics.ANSWER_MS)},
        metrics.BATCHES.name,
    )  # fmt: skip
    settings = ModelSettings(
        ModelFiles.read(folder, CHECKPOINT),
        "resnet50-tagger",
        "bench",
        HandlerConfig.from_mapping(handler),
        batch_size=max(len(d) for d in work.values()),
        gpu_id=0 if device.type == "cuda" else None,
    )
    started = time.perf_counter()
    model = ImageModel(settings, times)
    return (
        model,
        times,
        f"{model.backend.precision}, loaded in {time.perf_counter() - started:.1f} s",
    )


def _jpeg_request(jpeg: bytes) -> Any:
    from servecore.edges.http import HttpRequest

    return HttpRequest(body=jpeg)


def _timed_run(model: Any, name: str, sent: list, times: CoreTimes, timed: Timed) -> tuple:
    """One row: ``model.run`` on ``sent`` (one request each) as an engine calls it, timed."""
    from servecore.stages import Incoming

    incoming = [Incoming(str(i), request) for i, request in enumerate(sent)]
    # The core's replies as values, no edge: what the core itself takes.
    errors = [r.error for r in model.run(incoming, _values) if r.error is not None]
    if errors:  # a refused image is not a measurement of the core's speed
        raise RuntimeError(f"the core refused {len(errors)} of the {name} JPEGs: {errors[0]}")
    rate = timed(partial(model.run, incoming, _values), len(sent), times.reset)
    return rate, times.per_batch()


def _values(reply: Any) -> Any:
    """An edge that sends the core's ``Reply`` as it is."""
    return reply, reply
