"""TorchServe handler: ResNet50 image embeddings and ImageNet tags from one forward pass.

An adapter: ``initialize`` turns TorchServe's context into ``ModelSettings`` and loads the
engine-neutral model (``servecore.service.ImageModel``); the hooks hand each batch to it
(``preprocess`` -> ``prepare``, ``inference`` -> ``infer``, ``postprocess`` -> ``answer``) and
set every request's own status and headers. The archive's ``model-config.yaml`` ``handler:``
section holds the model's settings (``servecore.config.HandlerConfig``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from handlers.routing import PerRequestHandler, incoming
from handlers.ts_metrics import TorchServeMetrics
from model_files.artifacts import ModelFiles
from servecore.config import HandlerConfig
from servecore.encode import CONTENT_TYPE, json_reply
from servecore.service import ImageModel, ModelSettings
from servecore.stages import ComputedBatch, PreparedBatch


class ResNetHandler(PerRequestHandler):
    """Embeddings (``task: embedding``) or top-k ImageNet tags (``task: tags``)."""

    def initialize(self, context) -> None:
        self.context = context
        model = context.manifest["model"]
        properties = context.system_properties
        self.model = ImageModel(
            ModelSettings(
                files=ModelFiles.read(Path(properties["model_dir"]), model["serializedFile"]),
                name=context.model_name,
                version=str(model.get("modelVersion", "1.0")),
                config=HandlerConfig.from_mapping((context.model_yaml_config or {}).get("handler")),
                batch_size=int(properties.get("batch_size") or 1),
                gpu_id=properties.get("gpu_id"),
                archive_name=model.get("modelName", ""),
            ),
            TorchServeMetrics(context.metrics, context.model_name),
        )
        self.initialized = True

    def preprocess(self, data: list[dict]) -> PreparedBatch:
        config = self.model.config
        return self.model.prepare(
            [incoming(self.context, idx, row, config) for idx, row in enumerate(data)]
        )

    def inference(self, batch: PreparedBatch, *args, **kwargs) -> ComputedBatch:
        return self.model.infer(batch)

    def postprocess(self, batch: ComputedBatch) -> list[str]:
        replies, limit = self.model.answer(batch), self.model.config.max_response_bytes
        started = time.perf_counter()
        encoded = [json_reply(reply, self.model.answers, limit) for reply in replies]
        for idx, (reply, _, _) in enumerate(encoded):
            self.context.set_response_content_type(idx, CONTENT_TYPE)
            if reply.error is not None:
                self.context.set_response_status(reply.status, reply.phrase, idx=idx)
            for name, value in reply.headers.items():
                self.context.set_response_header(idx, name, value)
        refused = [e.refused for e in encoded if e.refused is not None]
        self.model.encoded(refused, 1000 * (time.perf_counter() - started))
        return [e.text for e in encoded]

    def describe_handle(self) -> str:
        """``GET /models/{name}?customized=true``: which weights and settings this model runs."""
        return json.dumps(self.model.describe())
