"""KServe's Python SDK (``InferenceRESTClient``) against a server, in a process of its own.

    python -m tests.kserve_sdk calls URL TOPK IMAGE_FILE...   # v1 + v2 + one bad v1, at once
    python -m tests.kserve_sdk health URL                     # live, ready, unknown model

The SDK imports KServe's gRPC protocol, whose generated code registers the protobuf package
``inference`` that ``tritonclient.grpc`` registers too: the two cannot share one interpreter
(``duplicate symbol 'inference.ServerLiveRequest'``), and the suite uses both. Each command
prints one JSON document on stdout, plain values only: what the tests assert on.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from pathlib import Path


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def calls(url: str, topk: int, images: list[bytes]) -> dict:
    """v1 tags and v2 embedding+tags for every image and one bad v1 request, all in flight at
    once: ``{"v1": [answer...], "v2": [{"id", "model_name", "outputs": {name: {"shape",
    "data"}}}...], "bad": {"status", "body"}}``."""
    import httpx
    from kserve.protocol.infer_type import RequestedOutput

    from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig

    v1 = InferenceRESTClient(RESTConfig(protocol="v1", timeout=300))
    v2 = InferenceRESTClient(RESTConfig(protocol="v2", timeout=300))
    try:
        v1_calls = [
            v1.infer(
                url,
                {"instances": [{"data": _b64(image)}], "parameters": {"topk": topk}},
                model_name="resnet50-tagger",
            )
            for image in images
        ]
        v2_calls = [
            v2.infer(
                url,
                InferRequest(
                    model_name="resnet50-embedding",
                    request_id=f"r-{i}",
                    infer_inputs=[InferInput("images", [1], "BYTES", data=[_b64(image)])],
                    parameters={"topk": topk},
                    request_outputs=[RequestedOutput("embedding"), RequestedOutput("tags")],
                ),
                model_name="resnet50-embedding",
            )
            for i, image in enumerate(images)
        ]
        bad = v1.infer(url, {"instances": [{"data": "not base64!"}]}, model_name="resnet50-tagger")
        results = await asyncio.gather(*v1_calls, *v2_calls, bad, return_exceptions=True)
    finally:
        await v1.close()
        await v2.close()
    n = len(images)
    failed = [r for r in results[: 2 * n] if isinstance(r, BaseException)]
    if failed:
        raise failed[0]
    error = results[2 * n]
    if not isinstance(error, httpx.HTTPStatusError):
        raise AssertionError(f"the bad request was not refused: {error!r}")
    return {
        "v1": results[:n],
        "v2": [
            {
                "id": r.id,
                "model_name": r.model_name,
                "outputs": {
                    o.name: {"shape": list(o.shape), "data": list(o.data)} for o in r.outputs
                },
            }
            for r in results[n : 2 * n]
        ],
        "bad": {"status": error.response.status_code, "body": error.response.json()},
    }


async def health(url: str) -> dict:
    """Server live and ready, and the status of a v2 request to a model that does not exist."""
    import httpx

    from kserve import InferenceRESTClient, RESTConfig

    client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=60))
    try:
        live = await client.is_server_live(url)
        ready = await client.is_server_ready(url)
        body = {"inputs": [{"name": "images", "shape": [1], "datatype": "BYTES", "data": [""]}]}
        try:
            await client.infer(url, body, model_name="no-such-model")
            unknown = 200
        except httpx.HTTPStatusError as exc:
            unknown = exc.response.status_code
    finally:
        await client.close()
    return {"live": live, "ready": ready, "unknown_model": unknown}


def main(argv: list[str]) -> int:
    command, url, *rest = argv
    if command == "calls":
        images = [Path(p).read_bytes() for p in rest[1:]]
        result = asyncio.run(calls(url, int(rest[0]), images))
    else:
        result = asyncio.run(health(url))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
