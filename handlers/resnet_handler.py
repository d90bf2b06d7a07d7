"""TorchServe handler: ResNet50 image embeddings and tags from one forward pass.

An adapter: ``initialize`` turns TorchServe's context into ``ModelSettings`` and loads the
core's ``servecore.service.ImageModel``; ``handle``, per batch, hands it to ``ImageModel.run``
in one call (as Triton's ``execute`` does), each request decoded and each reply encoded as its
HTTP response by the HTTP edge (``servecore.edges.http.HttpEdge``). Settings: ``model-
config.yaml``'s ``handler:`` (``HandlerConfig``).
"""

from __future__ import annotations

import json
import sys
import time
from http import HTTPStatus
from pathlib import Path

from handlers.routing import incoming, is_describe
from handlers.ts_metrics import TorchServeMetrics
from model_files.artifacts import ModelFiles
from servecore.config import HandlerConfig
from servecore.edges.http import HttpEdge
from servecore.service import ImageModel, ModelSettings

# TorchServe's base_handler imports openvino.torch only to log whether torch.compile may use it:
# 1.2 s of a worker's start. This handler runs OpenVINO's runtime, never torch.compile.
sys.modules.setdefault("openvino.torch", None)  # type: ignore[arg-type]
from ts.torch_handler.base_handler import BaseHandler  # noqa: E402


class ResNetHandler(BaseHandler):
    """Embeddings (``task: embedding``) or the top-k of its labels (``task: tags``)."""

    def initialize(self, context) -> None:
        self.context = context
        model, properties = context.manifest["model"], context.system_properties
        argv = dict(zip(sys.argv, sys.argv[1:]))  # its socket: the slot a restart keeps
        self.model = ImageModel(
            ModelSettings(
                files=ModelFiles.read(Path(properties["model_dir"]), model["serializedFile"]),
                name=context.model_name,
                version=str(model.get("modelVersion", "1.0")),
                config=HandlerConfig.from_mapping((context.model_yaml_config or {}).get("handler")),
                batch_size=int(properties.get("batch_size") or 1),
                gpu_id=properties.get("gpu_id"),
                archive_name=model.get("modelName", ""),
                slot=argv.get("--sock-name") or argv.get("--port") or "",
            ),
            TorchServeMetrics(context.metrics, context.model_name),
        )
        self.edge = HttpEdge(self.model.answers, self.model.config.max_response_bytes)
        self.initialized = True

    def handle(self, data: list[dict], context) -> list[bytes]:
        """One batch, framed as ``BaseHandler.handle`` frames it (its ``HandlerTime``; a
        describe call answered by ``describe_handle``), else answered by the core: each
        request's status, headers and JSON body; explanations per request on the same path."""
        started, self.context = time.time(), context
        if is_describe(context):
            sent = [self.describe_handle().encode()]
        else:
            replies = self.model.run(
                [incoming(self.edge, context, idx, row) for idx, row in enumerate(data)],
                self.edge.encode,
            )
            for idx, reply in enumerate(replies):
                context.set_response_content_type(idx, reply.content_type)
                if reply.status != HTTPStatus.OK:
                    context.set_response_status(reply.status, reply.phrase, idx=idx)
                for name, value in reply.headers.items():
                    context.set_response_header(idx, name, value)
            sent = [reply.body for reply in replies]
        context.metrics.add_time(
            "HandlerTime", round((time.time() - started) * 1000, 2), None, "ms"
        )
        return sent

    def describe_handle(self) -> str:
        """``GET /models/{name}?customized=true``: which weights and settings this model runs."""
        return json.dumps(self.model.describe())
