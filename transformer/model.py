"""The transformer as a ``kserve.Model``: ``preprocess`` turns a v1 or v2 upload into the v2
``crops`` request (``transformer.convert``, on a thread pool: decoding must not hold the event
loop), ``predict`` sends it to ``--predictor_host`` (REST v2 with the binary tensor extension,
or gRPC v2; KServe's own clients) and passes a predictor's refusal on as it came, and a v1
caller gets the predictor's v2 outputs back as the v1 answer the single server writes."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
from kserve.model import InferenceVerb, Model, append_forwardable_headers
from kserve.protocol.infer_type import InferInput, InferRequest, InferResponse, RequestedOutput

from servecore.config import HandlerConfig
from servecore.crops import CROPS
from servecore.preprocessor import Preprocessor
from servecore.priority import PRIORITY_KEY
from servecore.request import ParsedRequest
from servecore.stages import TRACEPARENT, TRACESTATE
from serveshared.wire import TOP_K_HEADER
from transformer import convert
from transformer.guard import PredictorRefused


class CropTransformer(Model):
    """Serves ``name`` in front of a predictor that serves the same name and takes ``crops``.
    ``config``: the model's handler settings (limits, draft decoding), as the predictor's."""

    def __init__(self, name: str, config: HandlerConfig, threads: int = 0) -> None:
        super().__init__(name)
        self.config = config
        self.preprocessor = Preprocessor(config)
        self.pool = ThreadPoolExecutor(threads or os.cpu_count() or 1, "crop")
        self.ready = True

    async def __call__(
        self, body: Any, headers: dict | None = None, verb: InferenceVerb = InferenceVerb.PREDICT
    ):
        """KServe's preprocess -> predict -> postprocess; a v1 body (a dict; v2 arrives as an
        ``InferRequest``) gets the v1 answer."""
        response, response_headers = await super().__call__(body, headers, verb)
        if isinstance(body, dict):
            outputs = {o.name: o.as_numpy() for o in response.outputs}
            return convert.v1_answer(outputs), response_headers
        return response, response_headers

    async def preprocess(self, payload: Any, headers: dict | None = None) -> InferRequest:
        body = payload if isinstance(payload, dict) else _as_mapping(payload)
        loop = asyncio.get_running_loop()
        request, pixels = await loop.run_in_executor(self.pool, self._read, body, headers or {})
        binary = self.predictor_config.protocol == "v2"  # gRPC sends raw contents anyway
        return _crops_request(self.name, request, pixels, binary)

    def _read(self, body: dict, headers: dict) -> tuple[ParsedRequest, np.ndarray]:
        """The body parsed and its images cropped, on the pool: parsing decodes the base64 of
        up to ``handler.max_json_bytes`` of JSON, which must not hold the event loop either."""
        request = convert.parse(body, headers.get(TOP_K_HEADER.lower()), self.config)
        request_id = request.request_id or headers.get("x-request-id") or "-"
        return request, convert.crops(request, self.preprocessor, request_id)

    async def predict(
        self, payload: Any, headers: dict | None = None, response_headers: dict | None = None
    ) -> InferResponse:
        forwarded = append_forwardable_headers(headers, trace_context(headers))
        if self.predictor_config.protocol == "grpc-v2":  # KServe's _grpc_predict, plus the trace
            metadata = (("request_type", "grpc_v2"), ("response_type", "grpc_v2"))
            return await self._grpc_client.infer(
                infer_request=payload, headers=(*metadata, *forwarded.items())
            )
        try:
            return await self._http_client.infer(
                self.predictor_config.predictor_base_url,
                model_name=self.name,
                data=payload,
                headers=forwarded,
            )
        except httpx.HTTPStatusError as exc:
            raise PredictorRefused.of(exc.response) from None


def trace_context(headers: dict | None) -> dict[str, str]:
    """The caller's W3C ``traceparent`` / ``tracestate`` (KServe hands headers over in lower
    case), for the predictor: its request spans continue the caller's trace."""
    return {k: v for k in (TRACEPARENT, TRACESTATE) if (v := (headers or {}).get(k))}


def _as_mapping(request: InferRequest) -> dict:
    """A v2 request KServe has read, as the JSON mapping the core's parser takes."""
    body: dict[str, Any] = {
        "inputs": [
            {
                "name": i.name,
                "shape": list(i.shape),
                "datatype": i.datatype,
                "data": i.data,
                "parameters": i.parameters or None,
            }
            for i in request.inputs
        ],
    }
    if request.id is not None:
        body["id"] = request.id
    if request.parameters:
        body["parameters"] = request.parameters
    if request.request_outputs:
        body["outputs"] = [
            {"name": o.name, **({"parameters": o.parameters} if o.parameters else {})}
            for o in request.request_outputs
        ]
    return body


def _crops_request(
    model: str, request: ParsedRequest, pixels: np.ndarray, binary: bool
) -> InferRequest:
    """The predictor's request: the ``crops`` tensor with the caller's ``topk``, priority and
    outputs."""
    tensor = InferInput(CROPS, list(pixels.shape), "UINT8")
    tensor.set_data_from_numpy(pixels, binary_data=binary)
    parameters: dict[str, Any] = {}
    if request.top_k is not None:
        parameters["topk"] = request.top_k
    if request.priority is not None:
        parameters[PRIORITY_KEY] = int(request.priority)
    outputs = [
        RequestedOutput(o.output.value, {"topk": o.top_k} if o.top_k else None)
        for o in request.outputs
    ]
    return InferRequest(
        model,
        [tensor],
        request_id=request.request_id,
        parameters=parameters or None,
        request_outputs=outputs or None,
    )
