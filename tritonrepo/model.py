"""Triton's Python backend: ResNet50 embeddings or ImageNet tags, from the engine-neutral core.

An adapter like TorchServe's (``handlers/resnet_handler.py``): ``initialize`` turns Triton's
arguments and this model's ``config.pbtxt`` into ``ModelSettings``; ``execute`` hands Triton's
whole batch to ``ImageModel.run`` once, each request as an ``Incoming`` (its ``images`` BYTES
tensor and ``topk`` parameter, parsed inside the core's per-request boundary), and sends each
``Reply`` back as that request's tensors, built straight from its arrays (each output's dtype
from the model config, as Triton's add_sub example does; no JSON but each tag's BYTES
element), an explanation's JSON document, or its own error. ``make triton-repo``
(``tritonrepo/generate.py``) copies this file to ``<model>/1/model.py`` beside the packages and
model files it imports, so the stub finds them on its own ``sys.path``. The core's metrics go
out through Triton's custom metrics (``tritonrepo/metrics.py``) on its metrics port.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from model_files.artifacts import ModelFiles
from servecore.answers import AnswerSpec, Prediction
from servecore.config import HandlerConfig, Output
from servecore.crops import CROPS
from servecore.encode import answer_body, tag_json
from servecore.errors import InvalidRequest, error_body
from servecore.explain.encode import Explained
from servecore.parse import EXPLAIN_KEYS, Protocol, parse_crops, parse_tensor
from servecore.service import ImageModel, ModelSettings, Reply
from servecore.stages import Incoming
from servecore.traffic import DEADLINE_HEADER, PRIORITY_HEADER
from tritonrepo.codes import triton_code
from tritonrepo.metrics import TritonMetrics

INPUT = "images"  # BYTES [n, 1]: encoded images, or their base64 text; or CROPS, UINT8 crops
TOP_K = "topk"  # request parameter
# BYTES [n, 1] beside each prediction: the arithmetic that computed each answer (TorchServe's
# X-Precision; the 2.51 stub has no response parameters).
PRECISION = "precision"
# BOOL [n, 1] beside each prediction: the content cache answered that image (TorchServe's
# X-Cache-Hits; False everywhere when handler.cache_bytes is 0).
CACHED = "cached"
# Request parameter ``describe: true`` (its ``images`` are not read): the answer is the output
# of the same name, one JSON text, what TorchServe's describe carries.
DESCRIBE = "describe"
# Request parameter ``explain: true``: the request goes through the core's explanation stage
# (as TorchServe's /explanations), its answer is the ``explanations`` output, one JSON text;
# the explanation parameters (target, method, ...) ride beside it as request parameters.
EXPLAIN, EXPLANATIONS = "explain", "explanations"


class TritonPythonModel:
    """One model instance: ``task: embedding`` answers ``embedding`` FP32 [n, 2048],
    ``task: tags`` answers ``tags`` BYTES [n, k] (one JSON object per tag), as TorchServe's v2."""

    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        parameters = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        folder = Path(args["model_repository"]) / args["model_version"]
        gpu = args.get("model_instance_kind") == "GPU"
        self.dtypes = output_dtypes(config)
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
            ),
            self.metrics,
        )

    def execute(self, requests: list) -> list:
        """Describe requests answered here, the rest by the core as one batch; one response
        per request, in order."""
        asks = [_parameters(r) for r in requests]
        served = [(r, ask) for r, ask in zip(requests, asks) if ask.get(DESCRIBE) is not True]
        replies = self.model.run([self._incoming(*s) for s in served]) if served else []
        if len(replies) != len(served):  # Triton needs exactly one response per request
            raise RuntimeError(f"the model answered {len(replies)} of {len(served)} requests")
        answers = iter(replies)
        return [
            self._described()
            if ask.get(DESCRIBE) is True
            else response(next(answers), self.dtypes, self.model.answers)
            for ask in asks
        ]

    def finalize(self) -> None:
        self.metrics.close()

    def _described(self):
        """``ImageModel.describe`` as this request's ``describe`` output ([1, 1] BYTES)."""
        text = json.dumps(self.model.describe())
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(DESCRIBE, np.array([[text]], dtype=np.object_))]
        )

    def _incoming(self, request, parameters: dict) -> Incoming:
        """The request as the core takes it, with the class and deadline of its forwarded
        ``X-Priority`` and ``X-Deadline`` headers (``tritonrepo.server``); a bad value fails
        this request alone."""
        # HTTP hands a header over under the name as sent, gRPC under its lower-case name.
        headers = {k.lower(): v for k, v in parameters.items()}
        return Incoming(
            request_id=request.request_id() or "?",
            parse=partial(_parse, request, parameters, self.model.config),
            explain=parameters.get(EXPLAIN) is True,
        ).classified(headers.get(PRIORITY_HEADER.lower()), headers.get(DEADLINE_HEADER.lower()))


def _parse(request, parameters: dict, config: HandlerConfig):
    """Inside the core's per-request boundary: a missing tensor or bad ``topk`` fails this
    request alone. An explanation request is answered as TorchServe's: one image as
    ``/explanations`` answers it, several as KServe v1's ``:explain``."""
    tensor = pb_utils.get_input_tensor_by_name(request, INPUT)
    crops = pb_utils.get_input_tensor_by_name(request, CROPS)
    if (tensor is None) == (crops is None):
        raise InvalidRequest(
            f"send one input: '{INPUT}' (BYTES [n, 1], encoded images) or '{CROPS}' "
            "(UINT8 [n, 224, 224, 3], crops; see describe's crops_input)"
        )
    asked = {"top_k": parameters.get(TOP_K), "request_id": request.request_id() or None}
    parsed = (
        parse_crops(crops.as_numpy(), **asked, config=config)
        if crops is not None
        else parse_tensor(tensor.as_numpy().reshape(-1).tolist(), **asked, config=config)
    )
    # Explanation parameters on a prediction are the core's 400, not silently ignored.
    options = {k: parameters[k] for k in EXPLAIN_KEYS if k in parameters}
    if parameters.get(EXPLAIN) is not True:
        return replace(parsed, options=options)
    return replace(
        parsed, protocol=Protocol.PLAIN if len(parsed.images) == 1 else Protocol.V1, options=options
    )


def _parameters(request) -> dict:
    """The request's parameters (Triton hands them over as JSON text)."""
    return json.loads(request.parameters() or "{}")


def output_dtypes(config: dict) -> dict[str, type]:
    """Each output's numpy dtype, from the model config's ``data_type`` (``TYPE_FP32`` ->
    float32, ``TYPE_STRING`` -> object)."""
    return {
        out["name"]: pb_utils.triton_string_to_numpy(out["data_type"])
        for out in config.get("output", [])
    }


def response(reply: Reply, dtypes: dict[str, type], spec: AnswerSpec):
    """A ``Reply`` as Triton's response: a prediction's arrays as the output tensors the model
    config declares, with the precision that computed them (TorchServe's ``X-Precision``) as
    the ``precision`` output, one per image (the 2.51 stub has no response parameters), and
    whether the content cache answered each image as the ``cached`` output; an
    explanation's JSON document as the ``explanations`` output; or the core's error body as
    this request's error, with the nearest status Triton's HTTP frontend can send."""
    if reply.error is not None:
        error = pb_utils.TritonError(json.dumps(error_body(reply.error)), _code(reply.status))
        return pb_utils.InferenceResponse(error=error)
    if isinstance(reply.answer, Explained):
        text = json.dumps(answer_body(reply.answer, spec))
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(EXPLANATIONS, np.array([[text]], dtype=np.object_))]
        )
    if not isinstance(reply.answer, Prediction):
        raise TypeError(f"a reply without an error carries an answer, got {reply.answer!r}")
    answer, tensors = reply.answer, []
    if answer.embeddings is not None and Output.EMBEDDING.value in dtypes:
        name = Output.EMBEDDING.value
        tensors.append(pb_utils.Tensor(name, answer.embeddings.astype(dtypes[name], copy=False)))
    if answer.tags is not None and Output.TAGS.value in dtypes:
        name = Output.TAGS.value
        rows = [[tag_json(tag) for tag in row] for row in answer.tags]
        tensors.append(pb_utils.Tensor(name, np.array(rows, dtype=dtypes[name])))
    images = len(answer.embeddings if answer.embeddings is not None else answer.tags or [])
    if PRECISION in dtypes:
        precision: np.ndarray = np.full((images, 1), reply.precision, dtype=dtypes[PRECISION])
        tensors.append(pb_utils.Tensor(PRECISION, precision))
    if CACHED in dtypes:
        hits: np.ndarray = np.array(reply.cached or [False] * images, dtype=dtypes[CACHED])
        hits = hits.reshape(images, 1)
        tensors.append(pb_utils.Tensor(CACHED, hits))
    return pb_utils.InferenceResponse(output_tensors=tensors)


def _code(status: int) -> int:
    """The Triton error code for the core's HTTP status (``tritonrepo/codes.py``)."""
    codes = {
        "UNAVAILABLE": pb_utils.TritonError.UNAVAILABLE,
        "INVALID_ARG": pb_utils.TritonError.INVALID_ARG,
        "INTERNAL": pb_utils.TritonError.INTERNAL,
    }
    return codes[triton_code(status)]
