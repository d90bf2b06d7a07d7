"""A Triton server serving this project's repository (``make serve-triton``), through the calls
``tsctl`` makes of ``TorchServeClient``: ``describe``, ``explain``, ``list_models`` and
``metrics_text`` answer as TorchServe's do, from Triton's v2 API and the model's own request
parameters (``tritonrepo/model.py``: ``describe``, ``explain``).

    client = TritonClient("http://127.0.0.1:8000")     # metrics: the same host, port 8002
    client.describe("resnet50-tagger", customized=True)[0]["customizedMetadata"]["precision"]

``is_triton`` tells a Triton URL from TorchServe's (``tsctl`` asks it when given ``--url``).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from tsclient import errors, ports
from tsclient.client import TIMEOUT_S, TorchServeClient, check_name
from tsclient.keys import Keys

# What the model's describe and explanation requests answer (tritonrepo/model.py).
DESCRIBE, EXPLAIN, EXPLANATIONS = "describe", "explain", "explanations"


def is_triton(client: TorchServeClient) -> bool:
    """Whether ``client``'s inference URL is a Triton server: its ``GET /v2`` server metadata
    names it (TorchServe answers that path with an error)."""
    try:
        answer = client._call("GET", "inference", "/v2", "read the server's v2 metadata")
        return answer.json().get("name") == "triton"
    except (errors.ApiError, ValueError, AttributeError):
        return False


def metrics_url_of(url: str) -> str:
    """Triton's metrics port on ``url``'s host (its own default, 8002; ``make serve-triton``)."""
    return ports.url(ports.TRITON_METRICS, urlsplit(url).hostname or ports.HOST)


class TritonClient(TorchServeClient):
    """``url``: Triton's HTTP endpoint; ``metrics_url``: its metrics port (default: the same
    host's 8002). ``keys``: bearer tokens sent as on TorchServe's --url calls."""

    def __init__(
        self,
        url: str,
        metrics_url: str | None = None,
        *,
        keys: Keys | None = None,
        timeout: float = TIMEOUT_S,
    ) -> None:
        super().__init__(
            url, url, metrics_url or metrics_url_of(url), keys=keys or Keys("", ""), timeout=timeout
        )

    def list_models(self) -> list[dict]:
        """The models of Triton's repository index that are loaded, as TorchServe lists them
        (``modelName``; ``modelUrl``: None, Triton does not say)."""
        index = self._call(
            "POST", "inference", "/v2/repository/index", "list models", json={"ready": True}
        ).json()
        names = sorted({entry["name"] for entry in index})
        return [{"modelName": name, "modelUrl": None} for name in names]

    def describe(
        self, model: str, version: str | None = None, customized: bool = False
    ) -> list[dict]:
        """TorchServe's describe entry of ``model`` (``version``: Triton serves one, the
        highest; another is refused as unknown): its batching from the model's configuration
        (``/v2/models/M/config``), its instances as ``workers`` (READY when the model is), and
        with ``customized`` as ``customizedMetadata`` the model's own describe (weights,
        settings, backend, precision choice). That one is an inference request (Triton counts
        it in ``nv_inference_request_success``, the core does not count it); Triton demands the
        ``images`` input on every request: it carries one empty element, not read."""
        path = f"/v2/models/{check_name(model)}"
        metadata = self._call("GET", "inference", path, f"describe {model}").json()
        served = max(metadata.get("versions") or ["1"], key=_version_order)
        if version is not None and version != served:
            raise errors.NotFound(
                404,
                "NotFound",
                f"{model} has no version {version} on Triton (it serves {served})",
                "leave the version out",
            )
        config = self._call("GET", "inference", path + "/config", f"describe {model}").json()
        ready = self._send("GET", "inference", path + "/ready", {}, {}).status_code == 200
        instances = sum(int(g.get("count", 1)) for g in config.get("instance_group", []))
        delay_us = int(
            (config.get("dynamic_batching") or {}).get("max_queue_delay_microseconds", 0)
        )
        entry = {
            "modelName": metadata.get("name", model),
            "modelVersion": served,
            "default": True,
            "batchSize": config.get("max_batch_size"),
            "maxBatchDelay": delay_us // 1000,
            "minWorkers": instances,
            "maxWorkers": instances,
            "workers": [
                {"id": str(i), "status": "READY" if ready else "UNAVAILABLE"}
                for i in range(instances)
            ],
        }
        if customized:
            entry["customizedMetadata"] = self._infer(model, [b""], {DESCRIBE: True}, DESCRIBE)
        return [entry]

    def default_version(self, model: str) -> str:
        return self.describe(model)[0]["modelVersion"]

    def explain(
        self,
        model: str,
        image: bytes,
        *,
        filename: str = "image",
        target: int | str | None = None,
        topk: int | None = None,
        method: str | None = None,
        n_steps: int | None = None,
        png: bool = False,
    ) -> dict:
        """``TorchServeClient.explain``'s answer from the model's explanation request (the
        same JSON: ``{"method", "explanations": [...]}``). ``filename`` is not sent."""
        parameters = {
            EXPLAIN: True,
            "target": target,
            "topk": topk,
            "method": method,
            "n_steps": n_steps,
            "png": png or None,
        }
        return self._infer(
            model, [image], {k: v for k, v in parameters.items() if v is not None}, EXPLANATIONS
        )

    def _infer(
        self, model: str, images: list[bytes], parameters: dict[str, Any], output: str
    ) -> Any:
        """One v2 request for ``output``, a BYTES tensor of one JSON text, parsed."""
        import base64

        body = {
            "inputs": [
                {
                    "name": "images",
                    "shape": [len(images), 1],
                    "datatype": "BYTES",
                    "data": [base64.b64encode(i).decode("ascii") for i in images],
                }
            ],
            "parameters": parameters,
            "outputs": [{"name": output}],
        }
        answer = self._call(
            "POST",
            "inference",
            f"/v2/models/{check_name(model)}/infer",
            f"{output} {model}",
            data=json.dumps(body),
            headers={"Content-Type": "application/json"},
        )
        [tensor] = [o for o in answer.json()["outputs"] if o["name"] == output]
        return json.loads(tensor["data"][0])


def _version_order(version: str) -> tuple[int, str]:
    """Triton serves the highest numbered version by default."""
    return (int(version), "") if version.isdigit() else (-1, version)
