"""One loaded model and the three steps an engine calls per batch: ``prepare`` (each request
parsed, admitted and decoded), ``infer`` (one forward for the batch's good images, then the
explanations) and ``answer`` (one ``Reply`` per request, in its own protocol). ``run`` chains
them for an engine with one call per batch.

Engines are adapters around this: TorchServe's handler (``handlers/resnet_handler.py``) maps
its context and hooks onto ``ModelSettings`` and these steps; an engine hands requests over as
``Incoming`` and sends each ``Reply`` back as its own response.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from typing import Any

import torch

from model_files.artifacts import ModelFiles
from servecore.admission import Admission
from servecore.autoprecision import serving_backend
from servecore.backends import pick_device
from servecore.config import HandlerConfig, Output
from servecore.encode import AnswerSpec, BatchOutputs, encode_response
from servecore.errors import PayloadTooLarge, RequestError, error_body
from servecore.explain import Explanations
from servecore.intake import Intake
from servecore.metrics import BatchMetrics, MetricsSink, NoMetrics
from servecore.stages import ComputedBatch, Failed, Incoming, Placed, PreparedBatch

logger = logging.getLogger(__name__)

CONTENT_TYPE = "application/json"
BATCH_HEADER = "X-Batch-Size"  # how many requests the engine batched with this one
PRECISION_HEADER = "X-Precision"  # the arithmetic that computed this answer


@dataclass(frozen=True)
class ModelSettings:
    """What an engine tells a model when it loads: its files, name and version, the
    ``handler:`` settings, the engine's largest batch and the GPU it assigned (None: none)."""

    files: ModelFiles
    name: str
    version: str
    config: HandlerConfig = field(default_factory=HandlerConfig)
    batch_size: int = 1
    gpu_id: int | None = None


@dataclass(frozen=True)
class Reply:
    """One request's answer: its HTTP ``status``, the headers to add, the JSON ``body`` (the
    error body when it failed) and the same as ``text``; ``error``: why it failed, or None."""

    status: int
    headers: dict[str, str]
    body: Any
    text: str
    error: RequestError | None = None

    @property
    def phrase(self) -> str:
        return HTTPStatus(self.status).phrase


class ImageModel:
    """Embeddings (``task: embedding``) or top-k ImageNet tags (``task: tags``), both from one
    forward pass, on the backend and precision chosen for this host."""

    def __init__(self, settings: ModelSettings, metrics: MetricsSink = NoMetrics()) -> None:
        """Pick the device, choose and load the backend, the labels and the explainer."""
        self.settings = settings
        config, files = settings.config, settings.files
        self.config = config
        self.device = pick_device(config.device, settings.gpu_id)
        if config.threads:
            torch.set_num_threads(config.threads)
        self.forward_rows = config.forward_rows or settings.batch_size
        self.backend, self.choice = serving_backend(
            files, config, self.device, tuple(sorted({1, self.forward_rows}))
        )
        # Operators grep worker logs for this line.
        logger.info("%s precision_choice %s", settings.name, self.choice.line())
        self.answers = AnswerSpec(
            settings.name,
            settings.version,
            Output(config.task),
            files.labels,
            config.top_k,
            config.normalize_embedding,
        )
        self.explanations = Explanations(
            files.checkpoint,
            config.explain,
            self.answers.labels,
            embedding_default=self.answers.task is Output.EMBEDDING,
        )
        self.intake = Intake(config, self.explanations, Admission())
        self.metrics = BatchMetrics(metrics, self.backend.precision)
        if not files.weights.get("trained", False):
            logger.warning("%s: %s", settings.name, files.weights.get("warning"))
        logger.info(
            "%s ready: task=%s backend=%s precision=%s device=%s weights=%s sha256=%s",
            settings.name,
            config.task,
            self.backend.name,
            self.backend.precision,
            self.device,
            files.weights["source"],
            files.weights["sha256"][:16],
        )

    def prepare(self, incoming: Sequence[Incoming]) -> PreparedBatch:
        """Each request through its own path (``Intake.prepare``), the good images stacked
        into one CPU tensor. Whatever goes wrong fails its own request only."""
        batch = self.intake.prepare(incoming)
        self.metrics.batch(
            len(incoming),
            0 if batch.pixels is None else len(batch.pixels),
            batch.open_ms,
            batch.decode_ms,
        )
        return batch

    def infer(self, batch: PreparedBatch) -> ComputedBatch:
        """The batch's good images through the model, ``forward_rows`` at a time (a bound on
        the worker's memory), then its explanations."""
        if batch.pixels is None:
            return ComputedBatch(batch, None, None, {})
        started = time.perf_counter()
        outputs = [self.backend(rows) for rows in batch.pixels.split(self.forward_rows)]
        embedding, logits = (torch.cat(parts) for parts in zip(*outputs))
        self.metrics.forward(1000 * (time.perf_counter() - started))
        rows = (len(batch.pixels), len(embedding), len(logits))
        if len(set(rows)) != 1:
            raise RuntimeError(
                f"backend returned {rows[1]} embeddings and {rows[2]} logit "
                f"rows for a batch of {rows[0]} images"
            )
        return ComputedBatch(batch, embedding, logits, self.explanations.run(batch, logits))

    def answer(self, batch: ComputedBatch) -> list[Reply]:
        """One reply per request, in order and in its own protocol; a failed request gets its
        own status and error body, and so does an answer over ``handler.max_response_bytes``."""
        started = time.perf_counter()
        requests = batch.prepared.requests
        plain = [
            r.opened.request for r in requests if isinstance(r, Placed) and r.opened.addon is None
        ]
        outputs = (
            BatchOutputs.of(batch.embedding, batch.logits, plain, self.answers)
            if batch.embedding is not None and batch.logits is not None
            else None
        )
        common = {BATCH_HEADER: str(len(requests))}
        replies = []
        for i, request in enumerate(requests):
            failed = batch.addon_results.get(i, request)
            if isinstance(request, Failed) or isinstance(failed, Failed):
                replies.append(_failed(failed.error, common))
                continue
            body: dict | list
            if request.opened.addon is not None:
                body = self.explanations.answer(request, batch.addon_results[i])
            elif outputs is not None:
                body = encode_response(request.opened.request, request.rows, outputs, self.answers)
            else:  # a placed request has rows, so the batch ran
                raise RuntimeError(f"request {request.request_id} placed but no forward ran")
            replies.append(self._encoded(body, common))
        self.metrics.errors(r.error.kind for r in replies if r.error is not None)
        self.metrics.answer(1000 * (time.perf_counter() - started))
        return replies

    def run(self, incoming: Sequence[Incoming]) -> list[Reply]:
        """``prepare``, ``infer`` and ``answer`` of one batch."""
        return self.answer(self.infer(self.prepare(incoming)))

    def describe(self) -> dict:
        """Which weights, settings, backend and precision this model runs."""
        files = self.settings.files
        return {
            "weights": files.weights,
            "handler": asdict(self.config),
            "backend": self.backend.name,
            "precision": self.backend.precision,
            "precision_choice": self.choice.as_dict(),
            "quantization": files.quantization,
            "device": str(self.device),
            "preprocessing": repr(self.intake.preprocessor.transform).replace("\n", " "),
        }

    def _encoded(self, body: Any, common: dict[str, str]) -> Reply:
        text = json.dumps(body)
        limit = self.config.max_response_bytes
        if len(text) > limit:  # json.dumps writes ASCII: characters are bytes
            return _failed(
                PayloadTooLarge(
                    f"the answer would be {len(text)} bytes, more than the limit of {limit} "
                    "(handler.max_response_bytes); send fewer images or ask for less"
                ),
                common,
            )
        return Reply(
            int(HTTPStatus.OK), {**common, PRECISION_HEADER: self.backend.precision}, body, text
        )


def _failed(error: RequestError, common: dict[str, str]) -> Reply:
    """The one mapping of an error to a reply: its status, headers and error body."""
    body = error_body(error)
    return Reply(int(error.status), {**common, **error.headers}, body, json.dumps(body), error)
