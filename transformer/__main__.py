"""``python -m transformer``: KServe's model server with one ``CropTransformer``.

KServe's own arguments (``--http_port``, ``--grpc_port``, ``--predictor_host``,
``--predictor_protocol``, ``--model_name``, ...) plus ``--model_config`` (the model's YAML,
whose ``handler:`` section gives the limits and draft decoding; default
``config/models/<model_name>.yaml`` beside this package), ``--max_request_bytes`` (default the
handler's ``max_json_bytes``), ``--max_images_per_request`` (default the handler's) and
``--max_inflight`` (requests preprocessed at once, default twice the cores).
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

    path = args.model_config or REPO / "config" / "models" / f"{args.model_name}.yaml"
    config = handler_config(path, args.max_images_per_request)
    app.add_exception_handler(RequestError, on_request_error)
    app.add_exception_handler(PredictorRefused, on_predictor_refused)
    app.add_middleware(
        Limits,
        max_request_bytes=args.max_request_bytes or config.max_json_bytes,
        max_inflight=args.max_inflight,
    )
    ModelServer().start([CropTransformer(args.model_name, config)])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
