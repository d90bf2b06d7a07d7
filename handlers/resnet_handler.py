"""TorchServe handler: ResNet50 image embeddings and ImageNet tags from one forward pass.

``preprocess`` takes each request through its own path (``handlers.intake``: parse, admit,
decode; a bad one gets its own 4xx and never reaches the model), ``inference`` runs every good
image of the batch as one tensor, ``postprocess`` answers each request in its own protocol
(``handlers.encode``). Explanations ride along (``handlers.explain``). The archive's
``model-config.yaml`` ``handler:`` section picks the task and the rest
(``handlers.config.HandlerConfig``).
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path

import torch

from handlers.batch import PreparedBatch
from handlers.config import HandlerConfig, Output
from handlers.encode import AnswerSpec, BatchOutputs, encode_response
from handlers.errors import PayloadTooLarge, error_body, status_line
from handlers.explain import Explanations
from handlers.intake import Intake
from handlers.metrics import BatchMetrics
from handlers.routing import PerRequestHandler
from model_files.artifacts import CHECKPOINT, INFO, LABELS, backend_of, fidelity_record, load_labels
from model_files.autoprecision import serving_backend
from model_files.backends import pick_device

logger = logging.getLogger(__name__)


class ResNetHandler(PerRequestHandler):
    """Embeddings (``task: embedding``) or top-k ImageNet tags (``task: tags``)."""

    def initialize(self, context) -> None:
        """Read the typed config, pick the device, load the backend, labels and explainer."""
        self.context = context
        self.manifest = context.manifest
        self.config = config = HandlerConfig.from_mapping(
            (context.model_yaml_config or {}).get("handler"))
        model_dir = Path(context.system_properties["model_dir"])
        self.device = pick_device(config.device, context.system_properties.get("gpu_id"))
        if config.threads:
            torch.set_num_threads(config.threads)
        self.forward_rows = (config.forward_rows
                             or int(context.system_properties.get("batch_size") or 1))
        serialized = self.manifest["model"]["serializedFile"]
        self.backend_kind = backend_of(serialized)
        self.weights_info = json.loads((model_dir / INFO).read_text())
        self.backend, self.precision_choice = serving_backend(
            self.backend_kind, model_dir, serialized, self.device,
            precision=config.precision, half=config.half_precision, threads=config.threads,
            spin=config.onnx_spinning, allow_int8=config.auto_int8,
            cache_setting=config.precision_cache, weights_sha256=self.weights_info["sha256"],
            batch_sizes=tuple(sorted({1, self.forward_rows})),
        )
        # Operators grep worker logs for this line.
        logger.info("%s precision_choice %s", context.model_name, self.precision_choice.line())
        record = model_dir / fidelity_record(serialized)
        self.quantization = json.loads(record.read_text()) if record.is_file() else None
        self.answers = AnswerSpec(
            model_name=context.model_name,
            model_version=str(self.manifest["model"].get("modelVersion", "1.0")),
            task=Output(config.task),
            labels=load_labels(model_dir / LABELS),
            default_top_k=config.top_k,
            normalize_embedding=config.normalize_embedding,
        )
        self.explanations = Explanations(model_dir / CHECKPOINT, config.explain,
                                         self.answers.labels,
                                         embedding_default=self.answers.task is Output.EMBEDDING)
        self.intake = Intake(config, self.explanations)
        self.metrics = BatchMetrics(context.metrics, context.model_name)
        if not self.weights_info.get("trained", False):
            logger.warning("%s: %s", context.model_name, self.weights_info.get("warning"))
        logger.info(
            "%s ready: task=%s backend=%s precision=%s device=%s weights=%s sha256=%s",
            context.model_name, config.task, self.backend_kind, self.backend.precision,
            self.device, self.weights_info["source"], self.weights_info["sha256"][:16],
        )
        self.initialized = True

    def preprocess(self, data: list[dict]) -> PreparedBatch:
        """Each request through its own path (``Intake.prepare``), the good images stacked
        into one CPU tensor. Whatever goes wrong fails its own request only."""
        batch = self.intake.prepare(data, self.context)
        self.metrics.record(len(data), 0 if batch.pixels is None else len(batch.pixels))
        self.metrics.record_time(decode_ms=batch.decode_ms)
        return batch

    def inference(self, batch: PreparedBatch, *args, **kwargs) -> PreparedBatch:
        """The batch's good images through the model, ``forward_rows`` at a time (a bound on
        the worker's memory), then its explanations."""
        if batch.pixels is not None:
            started = time.perf_counter()
            outputs = [self.backend(rows) for rows in batch.pixels.split(self.forward_rows)]
            batch.embedding, batch.logits = (torch.cat(parts) for parts in zip(*outputs))
            self.metrics.record_time(forward_ms=1000 * (time.perf_counter() - started))
            rows = (len(batch.pixels), len(batch.embedding), len(batch.logits))
            if len(set(rows)) != 1:
                raise RuntimeError(f"backend returned {rows[1]} embeddings and {rows[2]} logit "
                                   f"rows for a batch of {rows[0]} images")
            self.explanations.run(batch)
        return batch

    def postprocess(self, batch: PreparedBatch) -> list[str]:
        """One JSON answer per request, in order and in its own protocol; failed requests get
        their own status and error body."""
        requests = [slot.request for slot in batch.slots if slot.ok and slot.addon is None]
        outputs = (BatchOutputs.of(batch.embedding, batch.logits, requests, self.answers)
                   if batch.pixels is not None else None)
        responses = []
        batch_size = str(len(batch.slots))
        for idx, slot in enumerate(batch.slots):
            self.context.set_response_content_type(idx, "application/json")
            # Lets a client (and our tests) see the batch the frontend formed for it.
            self.context.set_response_header(idx, "X-Batch-Size", batch_size)
            if slot.ok:
                answer = json.dumps(self.explanations.answer(slot) if slot.addon is not None
                                    else encode_response(slot.request, slot.rows, outputs,
                                                         self.answers))
                limit = self.config.max_response_bytes
                if len(answer) <= limit:  # json.dumps writes ASCII: characters are bytes
                    responses.append(answer)
                    continue
                slot.error = PayloadTooLarge(
                    f"the answer would be {len(answer)} bytes, more than the limit of {limit} "
                    "(handler.max_response_bytes); send fewer images or ask for less")
            self.context.set_response_status(*status_line(slot.error), idx=idx)
            for name, value in slot.error.headers.items():
                self.context.set_response_header(idx, name, value)
            responses.append(json.dumps(error_body(slot.error)))
        self.metrics.record_errors([s.error.kind for s in batch.slots if s.error is not None])
        return responses

    def describe_handle(self) -> str:
        """``GET /models/{name}?customized=true``: which weights and settings this model runs."""
        return json.dumps({
            "weights": self.weights_info,
            "handler": asdict(self.config),
            "backend": self.backend_kind,
            "precision": self.backend.precision,
            "precision_choice": self.precision_choice.as_dict(),
            "quantization": self.quantization,
            "device": str(self.device),
            "preprocessing": repr(self.intake.preprocessor.transform).replace("\n", " "),
        })
