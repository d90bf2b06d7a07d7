"""Triton's Python backend: ResNet50 embeddings or ImageNet tags, from the engine-neutral core.

An adapter like TorchServe's (``handlers/resnet_handler.py``): ``initialize`` turns Triton's
arguments and this model's ``config.pbtxt`` into ``ModelSettings``; ``execute`` hands Triton's
whole batch to ``ImageModel.run`` once, each request as an ``Incoming`` (its ``images`` BYTES
tensor and ``topk`` parameter, parsed inside the core's per-request boundary), and sends each
``Reply`` back as that request's tensors or its own error. ``make triton-repo``
(``tritonrepo/generate.py``) copies this file to ``<model>/1/model.py`` beside the packages and
model files it imports, so the stub finds them on its own ``sys.path``.
"""

from __future__ import annotations

import json
from functools import partial
from http import HTTPStatus
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from model_files.artifacts import ModelFiles
from servecore.config import HandlerConfig
from servecore.parse import parse_tensor
from servecore.service import PRECISION_HEADER, ImageModel, ModelSettings, Reply
from servecore.stages import Incoming

INPUT = "images"  # BYTES [n, 1]: encoded images, or their base64 text
TOP_K = "topk"  # request parameter
PRECISION = "precision"  # BYTES [n, 1]: the arithmetic that computed each answer
# A v2 answer's tensor datatype -> numpy's (BYTES elements are JSON text).
DTYPES = {"FP32": np.float32, "BYTES": np.object_}


class TritonPythonModel:
    """One model instance: ``task: embedding`` answers ``embedding`` FP32 [n, 2048],
    ``task: tags`` answers ``tags`` BYTES [n, k] (one JSON object per tag), as TorchServe's v2."""

    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        parameters = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        folder = Path(args["model_repository"]) / args["model_version"]
        gpu = args.get("model_instance_kind") == "GPU"
        self.model = ImageModel(
            ModelSettings(
                files=ModelFiles.read(folder, parameters["serialized_file"]),
                name=args["model_name"],
                version=args["model_version"],
                config=HandlerConfig.from_mapping(json.loads(parameters["handler"])),
                batch_size=max(1, int(config.get("max_batch_size", 1))),
                gpu_id=int(args["model_instance_device_id"]) if gpu else None,
            )
        )

    def execute(self, requests: list) -> list:
        replies = self.model.run([self._incoming(request) for request in requests])
        if len(replies) != len(requests):  # Triton needs exactly one response per request
            raise RuntimeError(f"the model answered {len(replies)} of {len(requests)} requests")
        return [response(reply) for reply in replies]

    def _incoming(self, request) -> Incoming:
        return Incoming(
            request_id=request.request_id() or "?",
            parse=partial(_parse, request, self.model.config),
        )


def _parse(request, config: HandlerConfig):
    """Inside the core's per-request boundary: a missing tensor or bad ``topk`` fails this
    request alone."""
    tensor = pb_utils.get_input_tensor_by_name(request, INPUT)
    parameters = json.loads(request.parameters() or "{}")
    return parse_tensor(
        tensor.as_numpy().reshape(-1).tolist(),
        top_k=parameters.get(TOP_K),
        request_id=request.request_id() or None,
        config=config,
    )


def response(reply: Reply):
    """A ``Reply`` as Triton's response: the v2 body's outputs as tensors and the precision
    (TorchServe's ``X-Precision``) as the ``precision`` output, one per image (the 2.51 stub has
    no response parameters); or the core's error body as this request's error, with the
    nearest status Triton's HTTP frontend can send."""
    if reply.error is not None:
        return pb_utils.InferenceResponse(
            error=pb_utils.TritonError(reply.text, _code(reply.status))
        )
    outputs = reply.body["outputs"]
    precision = np.full((outputs[0]["shape"][0], 1), reply.headers[PRECISION_HEADER], np.object_)
    return pb_utils.InferenceResponse(
        output_tensors=[
            *(
                pb_utils.Tensor(
                    out["name"],
                    np.array(out["data"], dtype=DTYPES[out["datatype"]]).reshape(out["shape"]),
                )
                for out in outputs
            ),
            pb_utils.Tensor(PRECISION, precision),
        ]
    )


def _code(status: int) -> int:
    """Triton's error codes are fewer than HTTP's: 503 stays "unavailable" (retry later), other
    4xx become 400 (the core's body in the message still says which), 5xx internal."""
    if status == HTTPStatus.SERVICE_UNAVAILABLE:
        return pb_utils.TritonError.UNAVAILABLE
    if status == HTTPStatus.NOT_FOUND:
        return pb_utils.TritonError.NOT_FOUND
    if 400 <= status < 500:
        return pb_utils.TritonError.INVALID_ARG
    return pb_utils.TritonError.INTERNAL
