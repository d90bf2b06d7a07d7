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
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import torch
from ts.torch_handler.base_handler import BaseHandler

from handlers import codec, explain
from handlers.batch import PreparedBatch, Slot, admit_within
from handlers.config import HandlerConfig
from handlers.errors import (InternalError, InvalidParameter, NotSupported, PayloadTooLarge,
                             RequestError, error_body, status_line)
from handlers.images import OpenedImage, decode
from handlers.metrics import BatchMetrics
from handlers.preprocess import Preprocessor
from model_files.artifacts import CHECKPOINT, INFO, LABELS, backend_of, fidelity_record
from model_files.backends import load_backend

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
            spin=self.config.onnx_spinning, precision=self.config.precision,
            warmup=tuple(sorted({1, int(context.system_properties.get("batch_size") or 1)})),
        )
        record = model_dir / fidelity_record(serialized)
        self.quantization = json.loads(record.read_text()) if record.is_file() else None
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
        self.explainer = explain.load_explainer(model_dir / CHECKPOINT,
                                               self.config.explain_png_max_side)
        self.explain_limits = self.config.explain_limits
        self.limits = self.config.parse_limits
        self.metrics = BatchMetrics(context.metrics, context.model_name)
        self.pool = ThreadPoolExecutor(self.config.decode_threads or min(4, os.cpu_count() or 1),
                                       thread_name_prefix="decode")
        if not self.weights_info.get("trained", False):
            logger.warning("%s: %s", context.model_name, self.weights_info.get("warning"))
        logger.info(
            "%s ready: task=%s backend=%s precision=%s device=%s weights=%s sha256=%s",
            context.model_name, self.config.task, self.backend_kind, self.backend.precision,
            self.device,
            self.weights_info["source"], self.weights_info["sha256"][:16],
        )
        self.initialized = True

    # ------------------------------------------------------------------ the four hooks

    def preprocess(self, data: list[dict]) -> PreparedBatch:
        """Parse each request alone, cost its images from their headers, admit the batch's
        decoding work within ``max_batch_pixels``, decode on a small thread pool and stack the
        good images into one CPU tensor. Whatever goes wrong fails its own request only.

        PIL and torch release the GIL, so a batch decodes on every core while the model is idle
        between batches.
        """
        slots = [self._open(idx, row) for idx, row in enumerate(data)]
        good = [slot for slot in slots if slot.ok]
        admit_within(good, [s.pixels for s in good], self.config.max_batch_pixels,
                     "max_batch_pixels", "decoded pixels")
        self._admit_explanations(slots)
        started = time.perf_counter()
        work = [(idx, image, slot.explain is not None and slot.explain.png)
                for idx, slot in enumerate(slots) if slot.ok for image in slot.opened]
        decoded = iter(self.pool.map(self._decode, work) if len(work) > 1
                       else map(self._decode, work))
        tensors: list[torch.Tensor] = []
        for slot in slots:
            if not slot.ok:
                continue
            results = [next(decoded) for _ in slot.opened]
            slot.error = _first_error(results)
            if slot.ok and slot.explain is not None and slot.explain.png:
                results, slot.pictures = map(list, zip(*results))
            if slot.ok:
                slot.start, slot.count = len(tensors), len(results)
                tensors.extend(results)
        self.metrics.record(len(data), len(tensors))
        self.metrics.record_time(decode_ms=1000 * (time.perf_counter() - started))
        return PreparedBatch(slots, torch.stack(tensors) if tensors else None)

    def inference(self, batch: PreparedBatch, *args, **kwargs) -> PreparedBatch:
        """One forward pass over every good image of the batch."""
        if batch.pixels is not None:
            started = time.perf_counter()
            batch.embedding, batch.logits = self.backend(batch.pixels)
            self.metrics.record_time(forward_ms=1000 * (time.perf_counter() - started))
            rows = (len(batch.pixels), len(batch.embedding), len(batch.logits))
            if len(set(rows)) != 1:
                raise RuntimeError(f"backend returned {rows[1]} embeddings and {rows[2]} logit "
                                   f"rows for a batch of {rows[0]} images")
            self._explain(batch)
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
                for name, value in slot.error.headers.items():
                    self.context.set_response_header(idx, name, value)
                responses.append(json.dumps(error_body(slot.error)))
            elif slot.explain is not None:
                responses.append(json.dumps(codec.encode_explanations(
                    slot.request.protocol, slot.explain.method, batch.explanations[idx],
                    self.answers.labels)))
            else:
                responses.append(json.dumps(
                    codec.encode_response(slot.request, slot.rows, outputs, self.answers)))
        self.metrics.record_errors([s.error.kind for s in batch.slots if s.error is not None])
        return responses

    def describe_handle(self) -> str:
        """``GET /models/{name}?customized=true``: which weights and settings this model runs."""
        return json.dumps({
            "weights": self.weights_info,
            "handler": asdict(self.config),
            "backend": self.backend_kind,
            "precision": self.backend.precision,
            "quantization": self.quantization,
            "device": str(self.device),
            "preprocessing": repr(self.preprocessor.transform).replace("\n", " "),
        })

    # ------------------------------------------------------------------ TorchServe's switches

    def _is_explain(self) -> bool:
        """Explanations are answered per request (``_explain``), never by BaseHandler's
        captum path, which would explain the first request's target for the whole batch."""
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

    def _open(self, idx: int, row: dict) -> Slot:
        """Parse one request and read its images' headers; any failure is the slot's error."""
        slot = Slot()
        slot.request = self._guarded(idx, "parsing", self._parse, idx, row)
        if isinstance(slot.request, RequestError):
            slot.request, slot.error = None, slot.request
            return slot
        slot.explain = self._guarded(idx, "parsing", self._explain_spec, idx, slot.request)
        if isinstance(slot.explain, RequestError):
            slot.explain, slot.error = None, slot.explain
            return slot
        opened = [self._guarded(idx, "reading", self.preprocessor.open, image)
                  for image in slot.request.images]
        slot.error = _first_error(opened)
        if slot.ok:
            slot.opened = opened
            limit = self.config.max_request_pixels
            if slot.pixels > limit:
                slot.error = PayloadTooLarge(
                    f"request would decode {slot.pixels} pixels ({len(opened)} image(s)), more "
                    f"than the limit of {limit} (handler.max_request_pixels); send fewer or "
                    "smaller images")
        return slot

    def _parse(self, idx: int, row: dict) -> codec.ParsedRequest:
        return codec.parse_request(row, header_top_k=self._header(idx, TOP_K_HEADER),
                                   limits=self.limits)

    def _explain_spec(self, idx: int, request: codec.ParsedRequest):
        """An explanation request's checked ``ExplainSpec``; None for a prediction. TorchServe
        0.12 sets the ``explain`` property to "True" for ``/explanations`` and KServe
        ``:explain`` (and to "False" otherwise, whatever header a client sends)."""
        if self.context.get_request_header(idx, "explain") != "True":
            if request.options:
                raise InvalidParameter(
                    f"{sorted(request.options)} only apply to explanations: POST to "
                    "/explanations/{model} (or KServe v1 :explain)")
            return None
        if self.explainer is None:
            raise NotSupported("this archive carries no PyTorch checkpoint for explanations; "
                               f"rebuild it with archive.sh (it packs {CHECKPOINT})")
        if request.protocol is codec.Protocol.V2:
            raise NotSupported("explanations answer /explanations/{model} and KServe v1 "
                               ":explain; the v2 protocol has no explain route")
        return codec.parse_explain(request.options, request.top_k, self.answers.labels,
                                   self.explain_limits,
                                   embedding_default=self.answers.task is codec.Output.EMBEDDING)

    def _admit_explanations(self, slots: list[Slot]) -> None:
        """Explanation work within ``max_explain_passes_per_batch``, cheapest first; the
        requests that do not fit get 503 and ``Retry-After``, so a burst of explanations
        cannot hold the predictions of the same queue back for long."""
        budget = self.config.max_explain_passes_per_batch
        asking = [(s, explain.passes(s.explain) * len(s.opened)) for s in slots
                  if s.ok and s.explain is not None]
        for slot, cost in asking:
            if cost > budget:  # never fits, unlike a request that only lost the race: 400
                slot.error = InvalidParameter(
                    f"this explanation needs {cost} forward/backward passes ({len(slot.opened)} "
                    f"image(s) x {explain.passes(slot.explain)}), more than the limit of {budget} "
                    "(handler.max_explain_passes_per_batch); send fewer images, targets or "
                    "n_steps")
        fits = [(s, cost) for s, cost in asking if s.ok]
        admit_within([s for s, _ in fits], [cost for _, cost in fits], budget,
                     "max_explain_passes_per_batch", "explanation passes")

    def _explain(self, batch: PreparedBatch) -> None:
        """Explanations for the batch's explanation requests, from its pixels and logits; a
        failure here fails those requests only (500), never the batch's predictions."""
        asking = [(idx, s) for idx, s in enumerate(batch.slots) if s.ok and s.explain is not None]
        if not asking:
            return
        jobs = [explain.ExplainJob(s.explain, s.rows, s.pictures) for _, s in asking]
        answers = self._guarded(asking[0][0], "explaining", self.explainer.explain,
                                batch.pixels, batch.logits, jobs)
        for k, (idx, slot) in enumerate(asking):
            if isinstance(answers, RequestError):
                slot.error = answers
            else:
                batch.explanations[idx] = answers[k]

    def _header(self, idx: int, name: str):
        """A request header by case-insensitive name (clients differ in capitalisation)."""
        processor = self.context.request_processor
        if not processor or idx >= len(processor) or processor[idx] is None:
            return None
        for key, value in processor[idx].get_request_properties().items():
            if key.lower() == name and isinstance(value, str):
                return value
        return None

    def _decode(self, item: tuple[int, OpenedImage, bool]):
        """One image as a model input (and, for a PNG heatmap, the image itself, shrunk);
        failures are returned, not raised, so that the thread pool hands every request its
        own outcome."""
        idx, opened, keep_picture = item
        if not keep_picture:
            return self._guarded(idx, "decoding", self.preprocessor.decode, opened)
        return self._guarded(idx, "decoding", self._decode_with_picture, opened)

    def _decode_with_picture(self, opened: OpenedImage):
        image = decode(opened)
        return (self.preprocessor.transform(image),
                explain.thumbnail(image, self.config.explain_png_max_side))

    def _guarded(self, idx: int, stage: str, step, *args):
        """``step(*args)``, or the ``RequestError`` it raised. Anything else is a bug of ours,
        answered 500 for this request alone and logged with its request id: never a failed
        batch."""
        try:
            return step(*args)
        except RequestError as error:
            return error
        except Exception as exc:  # noqa: BLE001 - the last line of defence, per request
            request_id = (self.context.request_ids or {}).get(idx, "?")
            logger.exception("request %s: unexpected %s while %s", request_id,
                             type(exc).__name__, stage)
            return InternalError(f"unexpected error while {stage} this request "
                                 f"({type(exc).__name__}); request id {request_id}")


def _first_error(results: list) -> RequestError | None:
    """The first error of a request's per-image results, saying which image of several."""
    for k, result in enumerate(results):
        if isinstance(result, RequestError):
            if len(results) > 1:
                return type(result)(f"image {k} of {len(results)}: {result.message}")
            return result
    return None


def _load_labels(path: Path) -> list[str]:
    mapping = json.loads(path.read_text())
    return [mapping[str(i)] for i in range(len(mapping))]
