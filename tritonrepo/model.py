"""Triton's Python backend: ResNet50 embeddings or tags (ImageNet's or yours), from the engine-
neutral core.

An adapter like TorchServe's (``handlers/resnet_handler.py``): ``initialize`` turns Triton's
arguments and this model's ``config.pbtxt`` into ``ModelSettings`` and the tensor edge
(``servecore.edges.tensor.TensorEdge``, with each output's dtype from the model config); ``execute``
hands Triton's whole batch to ``ImageModel.run`` in one call, as TorchServe's ``handle`` does, each
request's input tensors and requested outputs read into a ``TensorRequest`` and decoded by the edge
into an ``Incoming`` (the core parses it inside its per-request boundary, never calling back here),
each ``Reply`` encoded once by the edge as output arrays (no JSON but each tag's BYTES element and
an explanation's document) or its error; what ``run`` returns, ``_response`` wraps in Triton's own
tensors or ``TritonError``. ``make triton-repo`` (``tritonrepo/generate.py``) copies this file to
``<model>/1/model.py`` beside the packages and model files it imports, so the stub finds them on its
own ``sys.path``. The core's metrics go out through Triton's custom metrics
(``tritonrepo/metrics.py``) on its metrics port.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from model_files.artifacts import ModelFiles
from servecore.config import HandlerConfig
from servecore.crops import CROPS
from servecore.edges.tensor import DESCRIBE, INPUT, TensorEdge, TensorReply, TensorRequest
from servecore.service import ImageModel, ModelSettings
from tritonrepo.metrics import TritonMetrics


class TritonPythonModel:
    """One model instance: ``task: embedding`` answers ``embedding`` FP32 [n, 2048],
    ``task: tags`` answers ``tags`` BYTES [n, k] (one JSON object per tag), as TorchServe's v2."""

    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        parameters = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        folder = Path(args["model_repository"]) / args["model_version"]
        gpu = args.get("model_instance_kind") == "GPU"
        self.metrics = TritonMetrics(pb_utils, args["model_name"])
        self.model = ImageModel(
            ModelSettings(
                files=ModelFiles.read(folder, parameters["serialized_file"]),
                name=args["model_name"],
                version=args["model_version"],
                config=HandlerConfig.from_mapping(json.loads(parameters["handler"])),
                batch_size=max(1, int(config.get("max_batch_size", 1))),
                gpu_id=int(args["model_instance_device_id"]) if gpu else None,
                archive_name=parameters.get("archive_name", ""),
                slot=args.get("model_instance_name", ""),  # "": no restarts counted
            ),
            self.metrics,
        )
        self.edge = TensorEdge(self.model.answers, output_dtypes(config))

    def execute(self, requests: list) -> list:
        """Describe requests answered here, the rest by the core as one batch; one response
        per request, in order."""
        asks = [_parameters(r) for r in requests]
        served = [(r, ask) for r, ask in zip(requests, asks) if ask.get(DESCRIBE) is not True]
        payloads = [_payload(r, ask) for r, ask in served]
        incoming = [  # traceparent as the client spelled it
            self.edge.decode(p.request_id or "?", p).traced({k.lower(): v for k, v in ask.items()})
            for p, (_, ask) in zip(payloads, served)
        ]
        replies = self.model.run(incoming, self.edge.encode) if served else []
        if len(replies) != len(served):  # Triton needs exactly one response per request
            raise RuntimeError(f"the model answered {len(replies)} of {len(served)} requests")
        answers = map(_response, replies, (p.outputs for p in payloads))
        return [self._described() if ask.get(DESCRIBE) is True else next(answers) for ask in asks]

    def finalize(self) -> None:
        self.metrics.close()

    def _described(self):
        """``ImageModel.describe`` as this request's ``describe`` output ([1, 1] BYTES)."""
        text = json.dumps(self.model.describe())
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(DESCRIBE, np.array([[text]], dtype=np.object_))]
        )


def _response(sent: TensorReply, named: frozenset[str]):
    """The tensor edge's reply as Triton's response: its output arrays as tensors (those its
    request ``named``, all when none), or its error body as this request's ``TritonError`` with
    the code the edge named."""
    if sent.outputs is None:
        code = getattr(pb_utils.TritonError, str(sent.code))
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(sent.error, code))
    return pb_utils.InferenceResponse(
        output_tensors=[
            pb_utils.Tensor(name, array)
            for name, array in sent.outputs.items()
            if not named or name in named
        ]
    )


def _payload(request, parameters: dict) -> TensorRequest:
    """The request's input tensors read into arrays, with its parameters and the outputs it
    named: the values the core parses (``servecore.edges.tensor``), without calling back here."""
    # One pass over the inputs: each ``get_input_tensor_by_name`` converts them all anew.
    given = {tensor.name(): tensor for tensor in request.inputs()}
    images, crops = (given[name].as_numpy() if name in given else None for name in (INPUT, CROPS))
    named = frozenset(request.requested_output_names())
    return TensorRequest(images, crops, parameters, request.request_id() or None, named)


def _parameters(request) -> dict:
    """The request's parameters (Triton hands them over as JSON text, "{}" when none)."""
    text = request.parameters()
    return json.loads(text) if text and text != "{}" else {}


def output_dtypes(config: dict) -> dict[str, type]:
    """Each output's numpy dtype, from the model config's ``data_type`` (``TYPE_FP32`` ->
    float32, ``TYPE_STRING`` -> object)."""
    return {
        out["name"]: pb_utils.triton_string_to_numpy(out["data_type"])
        for out in config.get("output", [])
    }
