"""Triton's client (``make serve-triton``): ``Client`` over Triton's v2 API and the model's own
request parameters (``tritonrepo/model.py``: ``describe``, ``explain``), answering as
TorchServe's does:

    client = TritonClient("http://127.0.0.1:8000", key_file="build/triton-key_file.json")
    client.describe("resnet50-tagger", customized=True)[0]["customizedMetadata"]["precision"]

``model_rows``, ``health_report`` and ``metrics_report`` read its repository index and model
configurations (the management key), its readiness (open, as Triton's health API is), its own
Prometheus series (``nv_inference_*``, on its metrics port: ``metrics_url``). The rows have
the shape of TorchServe's (``base.version_row``): instances stand for workers,
``max_batch_size`` (rows) for ``batchSize``, the dynamic batcher's queue delay for
``maxBatchDelay``. TorchServe's management commands and key rotation raise ``NotOnTriton``
with what to do instead, before anything is sent (``Client``'s own answer to them).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests

from serveclient import errors, metrics
from serveclient.base import CACHED_OUTPUT, PRECISION_OUTPUT, TIMEOUT_S, Client, Report, check_name
from serveclient.engine import Engine
from serveshared import ports
from serveshared.keys import TRITON_KEY_FILE, Keys

# What the model's describe and explanation requests answer (tritonrepo/model.py).
DESCRIBE, EXPLAIN, EXPLANATIONS = "describe", "explain", "explanations"
# nv_inference_* counter -> the total it adds to, per model (Triton 2.51's names).
TOTALS = {
    "nv_inference_request_success": "succeeded",
    "nv_inference_count": "images",
    "nv_inference_exec_count": "batches",
    "nv_inference_request_duration_us": "latency_us",
    "nv_inference_queue_duration_us": "queue_us",
    "nv_inference_compute_infer_duration_us": "compute_us",
}


def metrics_url(url: str) -> str:
    """Triton's metrics on ``url``'s host, at Triton's own metrics port (a port of its own,
    unlike its HTTP and gRPC ones: ``serveshared.ports``)."""
    parts = urlsplit(url)
    host = parts.hostname or ports.HOST
    netloc = f"[{host}]" if ":" in host else host
    return urlunsplit((parts.scheme or "http", f"{netloc}:{ports.TRITON_METRICS}", "", "", ""))


def batching(config: dict) -> dict:
    """A model configuration's instances and batching in TorchServe's words: ``workers``
    (instances), ``batchSize`` (``max_batch_size``), ``maxBatchDelay`` (ms, the dynamic
    batcher's queue delay; None without one) and ``maxQueueSize`` (None: unbounded)."""
    dynamic = config.get("dynamic_batching") or {}
    delay_us = dynamic.get("max_queue_delay_microseconds")
    queue = dynamic.get("default_queue_policy") or {}
    return {
        "workers": sum(int(g.get("count", 1)) for g in config.get("instance_group", [])),
        "batchSize": config.get("max_batch_size"),
        "maxBatchDelay": int(delay_us) // 1000 if delay_us is not None else None,
        "maxQueueSize": int(queue["max_queue_size"]) if "max_queue_size" in queue else None,
    }


def summarise(text: str) -> dict[str, dict]:
    """Per model, from Triton's own series: requests answered and failed (by Triton's
    reason), images, batches and their mean size, mean latency, queue and compute time."""
    models: dict[str, dict] = {}
    for name, labels, value in metrics.samples(text):
        model = labels.get("model")
        if model is None:
            continue
        entry = models.setdefault(model, {**dict.fromkeys(TOTALS.values(), 0.0), "failed": {}})
        if name in TOTALS:
            entry[TOTALS[name]] += value
        elif name == "nv_inference_request_failure":
            reason = labels.get("reason", "?")
            entry["failed"][reason] = entry["failed"].get(reason, 0) + int(value)
    return {model: _derive(entry) for model, entry in sorted(models.items())}


def _derive(entry: dict) -> dict:
    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 3) if b else None

    done = entry["succeeded"]
    return {
        "requests": int(done),
        "failed": dict(sorted(entry["failed"].items())),
        "images": int(entry["images"]),
        "batches": int(entry["batches"]),
        "mean_batch_images": ratio(entry["images"], entry["batches"]),
        "mean_latency_ms": ratio(entry["latency_us"] / 1000, done),
        "mean_queue_ms": ratio(entry["queue_us"] / 1000, done),
        "compute_ms_per_request": ratio(entry["compute_us"] / 1000, done),
    }


class TritonClient(Client):
    """``url``: Triton's HTTP endpoint; ``metrics_base``: its metrics port (default:
    ``metrics_url``, the same host's 8002). ``key_file``: the keys Triton was started with
    (``tritonrepo.server``'s key file; the inference key for inference and metadata, the
    management key for the repository index and configurations); else ``keys``, bearer tokens
    as on TorchServe's --url calls; neither: none sent (a Triton started without keys)."""

    engine = Engine.TRITON
    SENDS_TIMEOUT = True
    NAME = "Triton"
    START_HINT = "start it with `make serve-triton`, or point --url at it"

    def __init__(
        self,
        url: str,
        metrics_base: str | None = None,
        *,
        key_file: Path | str | None = None,
        keys: Keys | None = None,
        timeout: float = TIMEOUT_S,
    ) -> None:
        urls = {"inference": url, "management": url, "metrics": metrics_base or metrics_url(url)}
        super().__init__(
            urls,
            key_file=key_file,
            keys=keys if key_file is not None else keys or Keys("", ""),
            timeout=timeout,
        )
        self._output_names: dict[str, frozenset[str]] = {}

    @classmethod
    def at(
        cls,
        url: str,
        metrics_url: str | None = None,
        *,
        key_file: Path | str | None = None,
        keys: Keys | None = None,
        timeout: float = TIMEOUT_S,
    ) -> TritonClient:
        """The Triton at ``url``. Without a key file or a token (``keys`` empty), the key file
        ``make serve-triton`` writes (``TRITON_KEY_FILE``, from the folder tsctl runs in) when it
        is there, as TorchServe's ./key_file.json is found."""
        found = Path(TRITON_KEY_FILE)
        if key_file is None and not (keys and keys.inference) and found.is_file():
            key_file, keys = found, None
        return cls(url, metrics_url, key_file=key_file, keys=keys, timeout=timeout)

    def _retry_key(self, response: requests.Response, kind: str, used: str) -> str | None:
        """A refused key (403 restricted): the key file's when Triton restarted with new keys
        since this call read it; Triton cannot rotate a key."""
        if not errors.is_restricted(response):
            return None
        current = self.keys.key(kind)
        return current if current != used else None

    # ------------------------------------------------------------------ models

    def repository_index(self, ready: bool = False) -> list[dict]:
        """Triton's repository index (``{"name", "version", "state", "reason"}`` per model
        version; only the loaded ones with ``ready``), by the management key its
        model-repository API wants."""
        what = "list models (Triton's repository index)"
        body = {"ready": True} if ready else None
        return self._call("POST", "management", "/v2/repository/index", what, json=body).json()

    def model_config(self, model: str) -> dict:
        """``model``'s configuration (its config.pbtxt as JSON), by the management key."""
        path = f"/v2/models/{check_name(model)}/config"
        return self._call("GET", "management", path, f"read {model}'s configuration").json()

    def list_models(self) -> list[dict]:
        """The models of Triton's repository index that are loaded, as TorchServe lists them
        (``modelName``; ``modelUrl``: None, Triton does not say)."""
        names = sorted({entry["name"] for entry in self.repository_index(ready=True)})
        return [{"modelName": name, "modelUrl": None} for name in names]

    def describe(
        self, model: str, version: str | None = None, customized: bool = False
    ) -> list[dict]:
        """TorchServe's describe entry of ``model`` (``version``: Triton serves one, the
        highest; another is refused as unknown): its batching from the model's configuration
        (``/v2/models/M/config``, by the management key), its instances as ``workers`` (READY
        when the model is), and with ``customized`` as ``customizedMetadata`` the model's own
        describe (weights, settings, backend, precision choice). That one is an inference
        request (Triton counts it in ``nv_inference_request_success``, the core does not count
        it); Triton demands the ``images`` input on every request: it carries one empty
        element, not read."""
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
        settings = batching(self.model_config(model))
        ready = self._ok(path + "/ready")
        instances = settings["workers"]
        entry = {
            "modelName": metadata.get("name", model),
            "modelVersion": served,
            "default": True,
            "batchSize": settings["batchSize"],
            "maxBatchDelay": settings["maxBatchDelay"] or 0,  # no dynamic batcher: no delay
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

    def model_rows(self) -> list[dict]:
        """One row per model version in Triton's repository index, with its configuration."""
        rows = []
        for entry in _in_order(self.repository_index()):
            name, version = entry.get("name", ""), entry.get("version")
            loaded = entry.get("state") == "READY"
            settings = batching(self.model_config(name) if loaded else {})
            rows.append(
                {
                    "model": name,
                    "version": version,
                    "default": True,
                    "workers": settings["workers"],
                    "ready": settings["workers"] if loaded else 0,
                    "state": entry.get("state"),
                    "reason": entry.get("reason") or None,
                    "batchSize": settings["batchSize"],
                    "maxBatchDelay": settings["maxBatchDelay"],
                    "maxQueueSize": settings["maxQueueSize"],
                }
            )
        return rows

    # ------------------------------------------------------------------ health and metrics

    def _ok(self, path: str) -> bool:
        """Whether Triton's health API answers 200 at ``path`` (open: no key is sent)."""
        return self._send("GET", "inference", path, {}, {}).status_code == 200

    def health_report(self) -> Report:
        """The server's readiness and every indexed model version's (its state in Triton's
        repository index: READY, or not ready)."""
        ready = self._ok("/v2/health/ready")
        models = {
            f"{e.get('name', '')}/{e.get('version')}": e.get("state") == "READY"
            for e in _in_order(self.repository_index())
        }
        lines = [f"server: {'ready' if ready else 'NOT READY'} (Triton)"]
        lines += [f"{m}: {'READY' if ok else 'not ready'}" for m, ok in models.items()]
        unready = [m for m, ok in models.items() if not ok]
        if unready:
            lines.append(
                f"unhealthy: {', '.join(unready)} not ready (a model that failed to load: "
                "`tsctl list --url URL` shows Triton's reason, its log the rest)"
            )
        healthy = ready and not unready
        data = {"engine": "triton", "ready": ready, "models_ready": models, "healthy": healthy}
        return data, lines, 0 if healthy else errors.Unhealthy.exit_code

    def metrics_report(self) -> Report:
        """Triton's own series per model (``summarise``)."""
        summary = summarise(self.metrics_text())
        lines = [
            f"Triton ({self.urls['metrics']}): its own series; refusals at the queue bound "
            "(503) are not counted there (2.51)"
        ]
        for model, m in summary.items():
            lines.append(f"{model}:")
            lines.append(
                f"  requests {m['requests']}, mean latency {m['mean_latency_ms']} ms "
                f"(queued {m['mean_queue_ms']} ms, computing {m['compute_ms_per_request']} "
                "ms)"
            )
            lines.append(
                f"  batches {m['batches']} holding {m['images']} images; mean batch "
                f"{m['mean_batch_images']} images"
            )
            lines.append(
                "  failed: "
                + (", ".join(f"{k} {v}" for k, v in m["failed"].items() if v) or "none")
            )
        return {"engine": "triton", "models": summary}, lines, 0

    # ------------------------------------------------------------------ inference

    def _v2_outputs(self, model: str, output: str) -> list[str]:
        """Triton's Python backend sets no headers: the precision (and, where the model has
        it, which images the cache answered) come as outputs, asked for beside ``output``."""
        extra = [CACHED_OUTPUT] if CACHED_OUTPUT in self._outputs(model) else []
        return [output, PRECISION_OUTPUT, *extra]

    def _outputs(self, model: str) -> frozenset[str]:
        """The output names of ``model``'s v2 metadata (asked once per model)."""
        known = self._output_names.get(model)
        if known is None:
            path = f"/v2/models/{check_name(model)}"
            metadata = self._call("GET", "inference", path, f"read {model}'s metadata").json()
            known = frozenset(o.get("name") for o in metadata.get("outputs") or [])
            self._output_names[model] = known
        return known

    def _explain(self, model: str, image: bytes, filename: str, options: dict[str, Any]) -> dict:
        """The model's explanation request (the same JSON as TorchServe's: ``{"method",
        "explanations": [...]}``), ``options`` as its parameters. ``filename`` is not sent."""
        return self._infer(model, [image], {EXPLAIN: True, **options}, EXPLANATIONS)

    def _infer(
        self, model: str, images: list[bytes], parameters: dict[str, Any], output: str
    ) -> Any:
        """One v2 request for ``output``, a BYTES tensor of one JSON text, parsed."""
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


def _in_order(index: list[dict]) -> list[dict]:
    """Repository index entries by model name, then version."""
    return sorted(index, key=lambda e: (e.get("name", ""), e.get("version", "")))


def _version_order(version: str) -> tuple[int, str]:
    """Triton serves the highest numbered version by default."""
    return (int(version), "") if version.isdigit() else (-1, version)
