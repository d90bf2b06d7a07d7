"""``python -m transformer``: KServe's model server with a ``CropTransformer`` per model.

KServe's own arguments (``--http_port``, ``--grpc_port``, ``--predictor_host``,
``--predictor_protocol``, ``--model_name``, ...; ``--model_name`` may name several models,
comma-separated, each served in front of the predictor's model of that name) and ours:

- ``--model_config``: the model's YAML, whose ``handler:`` section gives the limits and draft
  decoding (default ``config/models/<model_name>.yaml`` beside this package);
- ``--max_request_bytes``: a request body's bytes (default the handler's ``max_json_bytes``);
- ``--max_images_per_request``: default the handler's;
- ``--max_inflight``: requests preprocessed at once (default twice the cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def arguments(argv: list[str]):
    from kserve.model_server import parser as kserve_arguments

    parser = argparse.ArgumentParser(
        prog="python -m transformer", parents=[kserve_arguments], description=__doc__
    )
    parser.add_argument(
        "--model_config",
        type=Path,
        default=None,
        help="the model's YAML (its handler: limits); default config/models/<model_name>.yaml",
    )
    parser.add_argument(
        "--max_request_bytes", type=int, default=None, help="413 above (default: max_json_bytes)"
    )
    parser.add_argument(
        "--max_images_per_request", type=int, default=None, help="413 above (default: handler's)"
    )
    parser.add_argument(
        "--max_inflight",
        type=int,
        default=2 * (os.cpu_count() or 1),
        help="requests preprocessed at once; 503 + Retry-After beyond",
    )
    args = parser.parse_args(argv)
    if args.predictor_protocol not in ("v2", "grpc-v2"):
        parser.error(
            f"--predictor_protocol must be v2 or grpc-v2 (crops are a v2 tensor), "
            f"got {args.predictor_protocol}"
        )
    if not args.predictor_host:
        parser.error("--predictor_host HOST:PORT is required")
    return args


def handler_config(path: Path, images: int | None):
    """The model's ``handler:`` settings, with the transformer's own images-per-request."""
    from servecore.config import HandlerConfig

    section = (yaml.safe_load(path.read_text()) or {}).get("handler")
    config = HandlerConfig.from_mapping(section)
    if images is not None:
        config = dataclasses.replace(config, max_images_per_request=images)
        config.check()
    return config


def main(argv: list[str]) -> int:
    args = arguments(argv)
    from kserve.model_server import ModelServer, app

    from servecore.errors import RequestError
    from transformer.guard import Limits, PredictorRefused, on_predictor_refused, on_request_error
    from transformer.model import CropTransformer

    names = [name for name in args.model_name.split(",") if name]
    if args.model_config and len(names) > 1:
        raise SystemExit("--model_config names one model's YAML: give one --model_name with it")
    configs = {
        name: handler_config(
            args.model_config or REPO / "config" / "models" / f"{name}.yaml",
            args.max_images_per_request,
        )
        for name in names
    }
    app.add_exception_handler(RequestError, on_request_error)
    app.add_exception_handler(PredictorRefused, on_predictor_refused)
    app.add_middleware(
        Limits,
        max_request_bytes=args.max_request_bytes or max(c.max_json_bytes for c in configs.values()),
        max_inflight=args.max_inflight,
    )
    ModelServer().start([CropTransformer(name, config) for name, config in configs.items()])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
