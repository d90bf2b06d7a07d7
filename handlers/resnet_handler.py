"""TorchServe handler: ResNet50 image embeddings and ImageNet tags from one forward pass.

``preprocess`` parses and decodes each request on its own (a bad one gets its own 4xx and never
reaches the model), ``inference`` runs every good image of the batch as one tensor,
``postprocess`` answers each request in its own protocol. The archive's ``model-config.yaml``
``handler:`` section picks the task (``embedding`` or ``tags``) and the rest (see
``handlers.config.HandlerConfig``).
"""
from __future__ import annotations

import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import torch
from ts.torch_handler.base_handler import BaseHandler

from handlers import codec
from handlers.backends import load_backend
from handlers.batch import PreparedBatch, Slot
from handlers.config import HandlerConfig
from handlers.errors import NotSupported, RequestError, error_body, status_line
from handlers.metrics import BatchMetrics
from handlers.preprocess import Preprocessor
from model_files.artifacts import INFO, LABELS, backend_of

logger = logging.getLogger(__name__)

TOP_K_HEADER = "x-top-k"


class ResNetHandler(BaseHandler):
    """Embeddings (``task: embedding``) or top-k ImageNet tags (``task: tags``)."""

    def initialize(self, context) -> None:
        """Read the typed config, pick the device, load the backend, labels and transform."""
        self.context = context
        self.manifest = context.manifest
        self.config = HandlerConfig.from_mapping((context.model_yaml_config or {}).get("handler"))
        model_dir = Path(context.system_properties["model_dir"])
        self.device = self._pick_device(context.system_properties.get("gpu_id"))
        if self.config.threads:
            torch.set_num_threads(self.config.threads)
        serialized = self.manifest["model"]["serializedFile"]
        self.backend_kind = backend_of(serialized)
        self.backend = load_backend(
            self.backend_kind, model_dir / serialized, self.device,
            half=self.config.half_precision, threads=self.config.threads,
            spin=self.config.onnx_spinning,
        )
        self.weights_info = json.loads((model_dir / INFO).read_text())
        self.answers = codec.AnswerSpec(
            model_name=context.model_name,
            model_version=str(self.manifest["model"].get("modelVersion", "1.0")),
            task=codec.Output(self.config.task),
            labels=_load_labels(model_dir / LABELS),
            default_top_k=self.config.top_k,
            normalize_embedding=self.config.normalize_embedding,
        )
        self.preprocessor = Preprocessor(self.config)
        self.metrics = BatchMetrics(context.metrics, context.model_name)
        self.pool = ThreadPoolExecutor(self.config.decode_threads or min(4, os.cpu_count() or 1),
                                       thread_name_prefix="decode")
        if not self.weights_info.get("trained", False):
            logger.warning("%s: %s", context.model_name, self.weights_info.get("warning"))
        logger.info(
            "%s ready: task=%s backend=%s device=%s weights=%s sha256=%s",
            context.model_name, self.config.task, self.backend_kind, self.device,
            self.weights_info["source"], self.weights_info["sha256"][:16],
        )
        self.initialized = True

    # ------------------------------------------------------------------ the four hooks

    def preprocess(self, data: list[dict]) -> PreparedBatch:
        """Parse and decode each request alone; stack the good images into one CPU tensor.

        Images are decoded on a small thread pool (PIL and torch release the GIL), so a batch
        of JPEGs decodes on every core while the model is idle between batches.
        """
        slots = []
        for idx, row in enumerate(data):
            slot = Slot()
            try:
                slot.request = self._parse(idx, row)
            except RequestError as error:
                slot.error = error
            slots.append(slot)
        encoded = [image for slot in slots if slot.request for image in slot.request.images]
        loaded = iter(self.pool.map(self._load, encoded) if len(encoded) > 1
                      else map(self._load, encoded))
        tensors: list[torch.Tensor] = []
        for slot in slots:
            if slot.request is None:
                continue
            results = [next(loaded) for _ in slot.request.images]
            errors = [(k, r) for k, r in enumerate(results) if isinstance(r, RequestError)]
            if errors:
                k, error = errors[0]
                if len(results) > 1:  # say which image of a multi-image request failed
                    error = type(error)(f"image {k} of {len(results)}: {error.message}")
                slot.error = error
                continue
            slot.start, slot.count = len(tensors), len(results)
            tensors.extend(results)
        self.metrics.record(len(data), len(tensors))
        return PreparedBatch(slots, torch.stack(tensors) if tensors else None)

    def inference(self, batch: PreparedBatch, *args, **kwargs) -> PreparedBatch:
        """One forward pass over every good image of the batch."""
        if batch.pixels is not None:
            batch.embedding, batch.logits = self.backend(batch.pixels)
            rows = (len(batch.pixels), len(batch.embedding), len(batch.logits))
            if len(set(rows)) != 1:
                raise RuntimeError(f"backend returned {rows[1]} embeddings and {rows[2]} logit "
                                   f"rows for a batch of {rows[0]} images")
        return batch

    def postprocess(self, batch: PreparedBatch) -> list[str]:
        """One JSON answer per request, in order and in its own protocol; failed requests get
        their own status and error body."""
        requests = [slot.request for slot in batch.slots if slot.error is None]
        outputs = (codec.BatchOutputs.of(batch.embedding, batch.logits, requests, self.answers)
                   if batch.pixels is not None else None)
        responses = []
        batch_size = str(len(batch.slots))
        for idx, slot in enumerate(batch.slots):
            self.context.set_response_content_type(idx, "application/json")
            # Lets a client (and our tests) see the batch the frontend formed for it.
            self.context.set_response_header(idx, "X-Batch-Size", batch_size)
            if slot.error is not None:
                self.context.set_response_status(*status_line(slot.error), idx=idx)
                responses.append(json.dumps(error_body(slot.error)))
            else:
                responses.append(json.dumps(
                    codec.encode_response(slot.request, slot.rows, outputs, self.answers)))
        return responses

    def describe_handle(self) -> str:
        """``GET /models/{name}?customized=true``: which weights and settings this model runs."""
        return json.dumps({
            "weights": self.weights_info,
            "handler": asdict(self.config),
            "backend": self.backend_kind,
            "device": str(self.device),
            "preprocessing": repr(self.preprocessor.transform).replace("\n", " "),
        })

    # ------------------------------------------------------------------ TorchServe's switches

    def _is_explain(self) -> bool:
        """Explanations are answered per request by ``preprocess`` (501), never by
        BaseHandler's captum path, which would fail the whole batch."""
        return False

    def _is_describe(self) -> bool:
        """Only the management API's describe call (one request, no image) is a describe;
        a ``describe: True`` header on a prediction is just a header."""
        processors = self.context.request_processor or []
        if len(processors) != 1 or processors[0] is None:
            return False
        properties = processors[0].get_request_properties()
        if any(key in properties for key in codec.BODY_KEYS):
            return False
        return super()._is_describe()

    # ------------------------------------------------------------------ helpers

    def _pick_device(self, gpu_id) -> torch.device:
        wants_gpu = self.config.device in ("auto", "cuda")
        if wants_gpu and gpu_id is not None and torch.cuda.is_available():
            return torch.device(f"cuda:{gpu_id}")
        if self.config.device == "cuda":
            raise RuntimeError(
                "handler.device is 'cuda' but TorchServe gave this worker no GPU "
                f"(gpu_id={gpu_id}, cuda available={torch.cuda.is_available()})"
            )
        return torch.device("cpu")

    def _parse(self, idx: int, row: dict) -> codec.ParsedRequest:
        if self._header(idx, "explain") == "True":
            raise NotSupported("explanations are not implemented for this model; use "
                               "/predictions (or the KServe :predict / infer routes)")
        return codec.parse_request(row, header_top_k=self._header(idx, TOP_K_HEADER),
                                   max_images=self.config.max_images_per_request)

    def _header(self, idx: int, name: str):
        """A request header by case-insensitive name (clients differ in capitalisation)."""
        processor = self.context.request_processor
        if not processor or idx >= len(processor) or processor[idx] is None:
            return None
        for key, value in processor[idx].get_request_properties().items():
            if key.lower() == name and isinstance(value, str):
                return value
        return None

    def _load(self, data: bytes) -> torch.Tensor | RequestError:
        """One image as a model input; a client's bad image is returned, not raised, so that
        the thread pool hands every request its own outcome."""
        try:
            return self.preprocessor(data)
        except RequestError as error:
            return error


def _load_labels(path: Path) -> list[str]:
    mapping = json.loads(path.read_text())
    return [mapping[str(i)] for i in range(len(mapping))]
