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
    from servecore.parse import HttpRequest
    from serveshared.v2binary import HEADER_LENGTH, binary_body, binary_tensor

    tensor = binary_tensor("crops", "UINT8", [1, *crop.shape], crop.nbytes)
    body, headers = binary_body({"inputs": [tensor]}, crop.tobytes())
    return HttpRequest(body=body, header_length=headers[HEADER_LENGTH])


def run_core(
    folder: Path,
    device: torch.device,
    work: dict[str, list[bytes]],
    handler: dict[str, object],
    timed: Timed,
) -> tuple[dict[str, Rate], dict[str, dict[str, float]], str]:
    """(3): ``ImageModel.run`` on each batch of ``work`` (one request per JPEG; then the same
    photos as the crops a client would send, which skip decoding) with the
    ``handler:`` settings ``handler``: img/s, the core's own ms per batch by part (open,
    decode, forward, answer), and the precision it chose. ``timed(step, images, warm)``
    measures, calling ``warm()`` once warmed up."""
    from model_files.artifacts import ModelFiles
    from servecore import metrics
    from servecore.config import HandlerConfig
    from servecore.parse import HttpRequest
    from servecore.service import ImageModel, ModelSettings
    from servecore.stages import Incoming

    config = HandlerConfig.from_mapping(
        {"device": device.type, "precision_cache": "off", **handler}
    )
    times = CoreTimes(
        {m.name: m.name.split("_")[1] for m in (metrics.OPEN_MS, metrics.DECODE_MS,
                                                  metrics.FORWARD_MS, metrics.ANSWER_MS)},
        metrics.BATCHES.name,
    )  # fmt: skip
    settings = ModelSettings(
        ModelFiles.read(folder, CHECKPOINT),
        "resnet50-tagger",
        "bench",
        config,
        batch_size=max(len(d) for d in work.values()),
        gpu_id=0 if device.type == "cuda" else None,
    )
    started = time.perf_counter()
    model = ImageModel(settings, times)
    loaded = f"{model.backend.precision}, loaded in {time.perf_counter() - started:.1f} s"
    rates: dict[str, Rate] = {}
    parts: dict[str, dict[str, float]] = {}
    requests: dict[str, list[HttpRequest]] = {
        name: [HttpRequest(body=jpeg) for jpeg in data] for name, data in work.items()
    }
    for name, data in work.items():  # the same photos sent as crops (#44): no decode at all
        crops = [model.intake.preprocessor(jpeg).permute(1, 2, 0).numpy() for jpeg in data]
        requests[f"{name} as crops"] = [crop_request(crop) for crop in crops]
    for name, sent in requests.items():
        incoming = [Incoming(str(i), request) for i, request in enumerate(sent)]
        # The core's replies as values, no edge: what the core itself takes.
        errors = [r.error for r in model.run(incoming, _values) if r.error is not None]
        if errors:  # a refused image is not a measurement of the core's speed
            raise RuntimeError(f"the core refused {len(errors)} of the {name} JPEGs: {errors[0]}")
        run = partial(model.run, incoming, _values)
        rates[name] = timed(run, len(sent), times.reset)
        parts[name] = times.per_batch()
    return rates, parts, f"{loaded}; {model.choice.line()}"


def _values(reply: Any) -> Any:
    """An edge that sends the core's ``Reply`` as it is."""
    return reply
