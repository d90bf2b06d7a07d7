"""One loaded model and the one call an engine makes per batch: ``run``, which chains
``prepare`` (each request parsed, admitted and decoded), ``infer`` (one forward for the batch's
good images), the explanation stage (entered there, once per batch, for the explanation
requests that reached the model) and ``answer`` (one ``Reply`` per request: its answer as
values, or its error), then hands each reply to the engine's own ``encode``.

Engines are adapters around this: an engine hands its batch over as ``Incoming`` requests in one
call and gives its edge's ``encode``, which writes a ``Reply`` as its response (``servecore.edges``:
the HTTP edge's status, headers and JSON body for TorchServe, the tensor edge's arrays for Triton).
The core times that writing as part of answering and counts the errors of the replies as sent,
so every metric means the same on every engine.

Imports explanations: the model loads the explanation stage (``servecore.explain.explanations``),
gives the intake its ``rules`` and, in ``run``, enters it once per batch after the forward.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import TypeVar

import torch

from model_files.artifacts import ModelFiles
from model_files.recipe import PREPROCESSING
from servecore.answers import AnswerSpec, BatchOutputs, Prediction
from servecore.autoprecision import serving_backend
from servecore.backends import device_memory, pick_device
from servecore.cache import AnswerCache
from servecore.classes import Classes
from servecore.config import HandlerConfig, Output
from servecore.crops import CROPS_INPUT
from servecore.errors import RequestError
from servecore.explain.explanations import Explanations
from servecore.explainvalues import Explained
from servecore.intake import Intake
from servecore.lanes import lane_of, yield_cpu
from servecore.metrics import BatchMetrics, MetricsSink, NoMetrics
from servecore.overlap import Overlap, Streams, collect
from servecore.priority import Priority
from servecore.restarts import mark_start
from servecore.stages import (
    ComputedBatch,
    Failed,
    Incoming,
    Looked,
    Placed,
    PreparedBatch,
)
from servecore.tracing import traced

logger = logging.getLogger(__name__)

Sent = TypeVar("Sent")  # a reply as an engine sends it (an HTTP response, Triton's response)


@dataclass(frozen=True)
class ModelSettings:
    """What an engine tells a model when it loads: its files, name and version, the
    ``handler:`` settings, the engine's largest batch, the GPU it assigned (None: none) and
    the name the archive was built as ("": ``name``; another when the engine registered it
    under a second name, the bulk lane, which then serves the precision the model chose) and
    the worker's ``slot``: where the engine runs it, kept when it starts it again (TorchServe's
    worker socket, Triton's instance name; ``servecore.restarts``)."""

    files: ModelFiles
    name: str
    version: str
    config: HandlerConfig = field(default_factory=HandlerConfig)
    batch_size: int = 1
    gpu_id: int | None = None
    archive_name: str = ""
    slot: str = ""


Answer = Prediction | Explained


@dataclass(frozen=True)
class Reply:
    """One request's outcome as values: its ``answer`` (a ``Prediction`` or, for an
    explanation request, an ``Explained``) or its ``error``, never both; ``batch_size``: how many
    requests the engine batched with it; ``precision``: the arithmetic that computed it;
    ``cached``: per image, whether the content cache answered it (None: the cache is off, or
    an explanation). Values only: the error's kind says its status
    (``servecore.edges.bodies.STATUS``); each engine's edge writes its own response from these.
    """

    batch_size: int
    precision: str
    answer: Answer | None = None
    error: RequestError | None = None
    cached: tuple[bool, ...] | None = None

    def __post_init__(self) -> None:
        if (self.answer is None) == (self.error is None):
            raise ValueError("a reply carries an answer or an error, exactly one")

    def refused(self, error: RequestError) -> Reply:
        """This request failed after all, with ``error`` (an edge refusing an answer too large
        to send: its ``encode`` gives this back as the reply sent)."""
        return dataclasses.replace(self, answer=None, error=error, cached=None)


def within_classes(config: HandlerConfig, files: ModelFiles, classes: int) -> HandlerConfig:
    """``config`` with ``top_k`` and ``explain.max_targets`` at most ``classes`` (the model's
    largest head): the shipped 5 means all the classes of a model that has fewer (a user's
    4-label tagger); each setting lowered is logged, and describe shows the value served."""
    top_k = min(config.top_k, classes)
    explain = dataclasses.replace(
        config.explain, max_targets=min(config.explain.max_targets, classes)
    )
    for name, asked, served in (
        ("top_k", config.top_k, top_k),
        ("explain.max_targets", config.explain.max_targets, explain.max_targets),
    ):
        if served < asked:
            logger.warning(
                "handler.%s is %d but the model has %d classes (%s): serving %d",
                name,
                asked,
                classes,
                files.weights.get("labels", "its labels"),
                served,
            )
    if (top_k, explain) == (config.top_k, config.explain):
        return config
    return dataclasses.replace(config, top_k=top_k, explain=explain)


def timed_batches(device: torch.device, forward_rows: int) -> tuple[int, ...]:
    """The batch sizes a worker warms up and ``auto`` times at: on a GPU the served batch only
    (a GPU worker is there for throughput, and a half precision that wins at 64 rows can lose
    at 1), on a CPU 1 and the served batch (latency when idle and throughput under load)."""
    return (forward_rows,) if device.type == "cuda" else tuple(sorted({1, forward_rows}))


class ImageModel:
    """Embeddings (``task: embedding``) or the top-k of its labels (``task: tags``; ImageNet's
    or yours), both from one forward pass, on the backend and precision chosen for this host."""

    def __init__(self, settings: ModelSettings, metrics: MetricsSink = NoMetrics()) -> None:
        """Pick the device, choose and load the backend, the labels and the explainer; a bulk
        lane's worker then yields the CPU (``servecore.lanes``)."""
        self.settings = settings
        files = settings.files
        classes = Classes.read(files)
        config = self.config = within_classes(settings.config, files, classes.largest)
        self.lane = lane_of(settings.name, config.bulk_model)
        self.device = pick_device(config.device, settings.gpu_id)
        if config.threads:
            torch.set_num_threads(config.threads)
        self.forward_rows = config.forward_rows or settings.batch_size
        self.backend, self.choice = serving_backend(
            files,
            config,
            self.device,
            timed_batches(self.device, self.forward_rows),
            f"{settings.archive_name or settings.name} {settings.version}",
            classes.rows,
        )
        # Beside a runtime with threads of its own, the core's torch work (stacking crops, top-k)
        # is small and torch's idle OpenMP threads busy-wait after each parallel op: on one
        # thread the core's CPU per image halves (results/core-cost.md). The explainer's
        # eager passes get every thread back while they run.
        cores = torch.get_num_threads()
        if self.device.type == "cpu" and not self.backend.torch_threads and not config.threads:
            torch.set_num_threads(1)
        # Operators grep worker logs for this line.
        logger.info("%s precision_choice %s", settings.name, self.choice.line())
        self.answers = AnswerSpec(
            settings.name,
            settings.version,
            Output(config.task),
            classes,
            config.top_k,
            config.normalize_embedding,
        )
        self.explanations = Explanations(
            files.checkpoint,
            config.explain,
            classes,
            embedding_default=self.answers.task is Output.EMBEDDING,
            threads=cores,
        )
        self.cache = AnswerCache(config.cache_bytes, self.answers, self.backend.precision)
        self.intake = Intake(
            config,
            classes,
            self.explanations.rules,
            lookup=self.cache.lookup,
            device=self.device,
        )
        self.overlap = (
            Overlap(
                config.gpu_overlap_chunks,
                self.backend.start,
                self.forward_rows,
                Streams(self.device),
            )
            if self.backend.start is not None
            else None
        )
        on_gpu = self.device.type == "cuda"
        self.metrics = BatchMetrics(
            metrics,
            self.backend.precision,
            settings.slot,
            mark_start(settings.name, settings.slot) if settings.slot else 0,
            partial(torch.cuda.memory_reserved, self.device) if on_gpu else None,
        )
        self.trace = traced(settings.name, self.backend.precision)  # off unless the env says
        if not files.weights.get("trained", False):
            logger.warning("%s: %s", settings.name, files.weights.get("warning"))
        # Loaded and warmed up at normal priority, so a lane starts as fast as the model.
        self.cpu_policy = yield_cpu() if self.lane is Priority.BULK else "normal"
        logger.info(
            "%s ready: lane=%s cpu=%s task=%s backend=%s precision=%s device=%s weights=%s "
            "sha256=%s",
            settings.name,
            self.lane.name.lower(),
            self.cpu_policy,
            config.task,
            self.backend.name,
            self.backend.precision,
            self.device,
            files.weights["source"],
            files.weights["sha256"][:16],
        )

    def prepare(self, incoming: Sequence[Incoming]) -> PreparedBatch:
        """Each request through its own path (``Intake.prepare``), the good images stacked
        into one tensor (on the GPU where ``gpu_decode`` put them there, else the CPU).
        Whatever goes wrong fails its own request only."""
        batch = self.intake.prepare(incoming, self.overlap)
        self.metrics.batch(
            len(incoming),
            0 if batch.pixels is None else len(batch.pixels),
            batch.open_ms,
            batch.decode_ms,
            batch.gpu_refused,
        )
        return batch

    def infer(self, batch: PreparedBatch) -> ComputedBatch:
        """The batch's good images through the model, ``forward_rows`` at a time (a bound on
        the worker's memory); on a GPU worker that overlaps, the forwards ``prepare`` queued
        are collected instead (one copy back, one wait)."""
        if batch.pixels is None:
            return ComputedBatch(batch, None, None)
        started = time.perf_counter()
        if batch.forwarded:
            embedding, logits = collect(batch.forwarded)
        else:
            outputs = [self.backend(rows) for rows in batch.pixels.split(self.forward_rows)]
            embedding, logits = (torch.cat(parts) for parts in zip(*outputs))
        forward_ms = 1000 * (time.perf_counter() - started)
        self.metrics.forward(forward_ms)
        rows = (len(batch.pixels), len(embedding), len(logits))
        if len(set(rows)) != 1:
            raise RuntimeError(
                f"backend returned {rows[1]} embeddings and {rows[2]} logit "
                f"rows for a batch of {rows[0]} images"
            )
        return ComputedBatch(batch, embedding, logits, forward_ms)

    def answer(
        self, batch: ComputedBatch, explained: Mapping[int, Explained | Failed]
    ) -> list[Reply]:
        """One reply per request, in order: its answer as values, or its own error; a
        request with an entry in ``explained`` (its index: an explanation request that
        reached the model) gets that."""
        requests = batch.prepared.requests
        plain = [
            r.opened.request
            for i, r in enumerate(requests)
            if isinstance(r, Placed) and i not in explained
        ]
        outputs = (
            BatchOutputs.of(batch.embedding, batch.logits, plain, self.answers)
            if batch.embedding is not None and batch.logits is not None
            else None
        )
        reply = partial(Reply, len(requests), self.backend.precision)
        replies = []
        for i, request in enumerate(requests):
            if isinstance(request, Failed):
                replies.append(reply(error=request.error))
            elif i in explained:
                result = explained[i]
                replies.append(
                    reply(error=result.error) if isinstance(result, Failed) else reply(result)
                )
            else:
                opened = request.opened
                computed = (
                    None
                    if outputs is None
                    else outputs.prediction(opened.request, request.rows, self.answers)
                )
                if isinstance(opened, Looked):  # the cache's images put back in order
                    replies.append(reply(self.cache.merge(opened, computed), cached=opened.hits))
                elif computed is None:  # a placed request always reached the model
                    raise RuntimeError(f"request {request.request_id} was placed but not computed")
                else:
                    replies.append(reply(computed))
        if self.cache.on:
            self.metrics.cache(
                (hit for r in replies if r.cached is not None for hit in r.cached),
                self.cache.bytes,
            )
        return replies

    def run(
        self, incoming: Sequence[Incoming], encode: Callable[[Reply], tuple[Reply, Sent]]
    ) -> list[Sent]:
        """One batch, the one call an engine makes: ``prepare``, ``infer``, the explanation
        stage (its one entry per batch) and ``answer``, then each reply written once by the
        edge's ``encode``, in order, which gives back the reply as sent (an HTTP edge's 413 for
        an answer too large to send) and its response. Answering and writing are timed
        together (``resnet50_answer_ms_total``), and the errors counted are those of the replies
        as sent. With tracing on (``servecore.tracing``) the batch's spans carry those timings."""
        trace = self.trace(incoming)
        try:
            computed = self.infer(self.prepare(incoming))
            explained = self.explanations.run(computed)
            started = time.perf_counter()
            sent = [encode(reply) for reply in self.answer(computed, explained)]
            self.metrics.errors(reply.error.kind for reply, _ in sent if reply.error is not None)
            answer_ms = 1000 * (time.perf_counter() - started)
            self.metrics.answer(answer_ms)
            trace.answered(computed, answer_ms, [reply.error for reply, _ in sent])
        finally:
            self.metrics.spans_dropped(trace.end())
            self.metrics.flush()  # the batch's metrics out together, even when it failed
        return [response for _, response in sent]

    def describe(self) -> dict:
        """Which weights (how many classes their labels name, in which heads), settings, backend and
        precision this model runs; on a GPU, what this worker holds of its memory now."""
        files = self.settings.files
        decoder = self.intake.device_decoder
        return {
            "weights": files.weights,
            "classes": len(self.answers.classes),
            "heads": [asdict(h) for h in self.answers.classes.heads],
            "handler": asdict(self.config),
            "lane": self.lane.name.lower(),
            "cpu_policy": self.cpu_policy,
            "backend": self.backend.name,
            "precision": self.backend.precision,
            "precision_choice": self.choice.as_dict(),
            "quantization": files.quantization,
            "device": str(self.device),
            "decode": str(decoder or "cpu"),
            "gpu": {
                **self.intake.decoder_choice.as_dict(),
                "overlap_chunks": self.overlap.chunks if self.overlap else 0,
                "cuda_graphs": self.backend.graphs,
                "memory": device_memory(self.device),
                **({"refused": decoder.refusals.as_dict()} if decoder else {}),
            },
            "preprocessing": PREPROCESSING,
            "crops_input": CROPS_INPUT,
        }
