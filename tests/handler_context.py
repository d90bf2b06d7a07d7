"""A small stand-in for the context TorchServe gives a handler: the real ``ts.context.Context``
and metrics cache, without a server."""

from __future__ import annotations

from pathlib import Path

from ts.context import Context, RequestProcessor
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

from handlers.resnet_handler import ResNetHandler

REPO = Path(__file__).resolve().parent.parent


def make_context(
    model_dir: Path,
    handler_config: dict | None = None,
    model_name: str = "resnet50-tagger",
    serialized: str = "resnet50.pt",
) -> Context:
    metrics = MetricsCacheYamlImpl(str(REPO / "config" / "metrics.yaml"))
    metrics.initialize_cache()
    manifest = {
        "model": {
            "modelName": model_name,
            "serializedFile": serialized,
            "handler": "resnet_handler.py",
            "modelVersion": "1.0",
        }
    }
    return Context(
        model_name,
        str(model_dir),
        manifest,
        8,
        None,
        "0.12.0",
        True,
        metrics,
        {"handler": handler_config or {}},
    )


def make_handler(
    model_dir: Path, serialized: str = "resnet50.pt", **handler_config
) -> tuple[ResNetHandler, Context]:
    context = make_context(model_dir, handler_config, serialized=serialized)
    handler = ResNetHandler()
    handler.initialize(context)
    return handler, context


def run_batch(
    handler: ResNetHandler, context: Context, rows: list[dict], headers: list[dict] | None = None
):
    """What TorchServe does for one batch: fresh per-request state, then ``handle``.
    Returns ``(responses, [(status, phrase), ...], the batch the model computed)``."""
    headers = headers or [{} for _ in rows]
    context.request_processor = [RequestProcessor(h) for h in headers]
    context.request_ids = {i: f"req-{i}" for i in range(len(rows))}
    computed = []
    infer = handler.model.infer
    handler.model.infer = lambda batch: computed.append(infer(batch)) or computed[-1]
    try:
        responses = handler.handle(rows, context)
    finally:
        del handler.model.infer  # the class's own again
    statuses = [context.get_response_status(i) for i in range(len(rows))]
    return responses, statuses, computed[0] if computed else None
