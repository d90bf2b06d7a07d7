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
from ts.metrics.metric_type_enum import MetricTypes
from ts.torch_handler.base_handler import BaseHandler

from handlers import codec
from handlers.batch import PreparedBatch, Slot
from handlers.backends import backend_kind, load_backend
from handlers.config import HandlerConfig
from handlers.errors import (NotSupported, PayloadTooLarge, RequestError, error_body,
                             status_line)
from handlers.preprocess import Preprocessor

logger = logging.getLogger(__name__)

BATCH_METRIC = "HandlerBatchSize"
IMAGES_METRIC = "HandlerImagesPerBatch"
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
        self.backend_kind = backend_kind(serialized)
        self.backend = load_backend(
            self.backend_kind, model_dir / serialized, self.device,
            half=self.config.half_precision, threads=self.config.threads,
            spin=self.config.onnx_spinning,
        )
        self.labels = _load_labels(model_dir / "index_to_name.json")
        self.weights_info = json.loads((model_dir / "weights_info.json").read_text())
        self.preprocessor = Preprocessor(self.config)
        self.metrics = self._batch_metrics(context)
        self.pool = ThreadPoolExecutor(self.config.decode_threads or min(4, os.cpu_count() or 1),
                                       thread_name_prefix="decode")
        self.model_version = str(self.manifest["model"].get("modelVersion", "1.0"))
        if not self.weights_info.get("trained", False):
            logger.warning("%s: %s", context.model_name, self.weights_info.get("warning"))
        logger.info(
            "%s ready: task=%s backend=%s device=%s weights=%s sha256=%s",
            context.model_name, self.config.task, self.backend_kind, self.device,
            self.weights_info["source"], self.weights_info["sha256"][:16],
        )
        self.initialized = True

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
        self._record_batch(len(data), len(tensors))
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
        """One JSON answer per request, in order; failed requests get their own status."""
        embeddings, tags = self._answers(batch)
        responses = []
        batch_size = str(len(batch.slots))
        for idx, slot in enumerate(batch.slots):
            self.context.set_response_content_type(idx, "application/json")
            # Lets a client (and our tests) see the batch the frontend formed for it.
            self.context.set_response_header(idx, "X-Batch-Size", batch_size)
            if slot.error is not None:
                self.context.set_response_status(*status_line(slot.error), idx=idx)
                responses.append(json.dumps(error_body(slot.error)))
                continue
            responses.append(json.dumps(self._encode(slot.request, slot.rows, embeddings, tags)))
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

    # ------------------------------------------------------------------ helpers

    def _parse(self, idx: int, row: dict) -> codec.ParsedRequest:
        if self._header(idx, "explain") == "True":
            raise NotSupported("explanations are not implemented for this model; use "
                               "/predictions (or the KServe :predict / infer routes)")
        request = codec.parse_request(row, self._header(idx, TOP_K_HEADER))
        limit = self.config.max_images_per_request
        if len(request.images) > limit:
            raise PayloadTooLarge(
                f"request carries {len(request.images)} images, more than the limit of {limit} "
                "(handler.max_images_per_request); split it into several requests"
            )
        return request

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

    def _answers(self, batch: PreparedBatch):
        """Per-image embeddings and top-k tags as Python lists, computed once per batch."""
        if batch.embedding is None:
            return [], []
        embedding = batch.embedding
        if self.config.normalize_embedding:
            embedding = torch.nn.functional.normalize(embedding, dim=1)
        wants_embedding = any(self._wants(s.request, "embedding") for s in batch.slots if s.request)
        embeddings = embedding.tolist() if wants_embedding else []
        k = max((s.request.tags_top_k(self.config.top_k) for s in batch.slots if s.request),
                default=1)
        probabilities = torch.softmax(batch.logits, dim=1)
        top = probabilities.topk(k, dim=1)
        return embeddings, (top.indices.tolist(), top.values.tolist())

    def _wants(self, request: codec.ParsedRequest, output: str) -> bool:
        if request.protocol == "v2" and request.outputs:
            return any(o.name == output for o in request.outputs)
        return output == ("embedding" if self.config.task == "embedding" else "tags")

    def _encode(self, request: codec.ParsedRequest, rows: range, embeddings, tags):
        indices, probabilities = tags

        def tags_for(row: int, k: int) -> list[dict]:
            return codec.tags_answer(indices[row][:k], probabilities[row][:k], self.labels)

        k = request.tags_top_k(self.config.top_k)
        if request.protocol == "v2":
            return codec.v2_response(
                self.context.model_name,
                self.model_version,
                request.request_id,
                [embeddings[r] for r in rows] if self._wants(request, "embedding") else None,
                [tags_for(r, k) for r in rows] if self._wants(request, "tags") else None,
            )
        if self.config.task == "embedding":
            answers = [{"embedding": embeddings[r]} for r in rows]
        else:
            answers = [tags_for(r, k) for r in rows]
        return {"predictions": answers} if request.protocol == "v1" else answers[0]

    def _batch_metrics(self, context) -> list:
        """Our two batch histograms, looked up once. They must be declared in the metrics YAML
        (config/metrics.yaml); without it they are skipped with a warning, never a failed batch."""
        if context.metrics is None:
            return []
        try:
            return [context.metrics.get_metric(name, MetricTypes.HISTOGRAM)
                    for name in (BATCH_METRIC, IMAGES_METRIC)]
        except Exception as exc:  # noqa: BLE001 - MetricsCacheKeyError and friends
            logger.warning("batch-size metrics off: %s (declare them as in config/metrics.yaml)",
                           exc)
            return []

    def _record_batch(self, requests: int, images: int) -> None:
        logger.debug("batch: %d requests, %d images", requests, images)
        dims = [self.context.model_name, "Model"]
        for metric, value in zip(self.metrics, (requests, images)):
            metric.add_or_update(value, dims)


def _load_labels(path: Path) -> list[str]:
    mapping = json.loads(path.read_text())
    return [mapping[str(i)] for i in range(len(mapping))]
