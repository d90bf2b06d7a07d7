"""What ``tsctl`` reads from Triton for ``list``, ``health`` and ``metrics``: its v2 repository
index and model configurations (the management key), model readiness (open, as Triton's
health API is), and its own Prometheus series (``nv_inference_*``, on its metrics port).

The rows have the shape ``tsctl`` prints for TorchServe (``cli._version_row``): instances
stand for workers, ``max_batch_size`` (rows) for ``batchSize``, the dynamic batcher's queue
delay for ``maxBatchDelay``.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from tsclient import metrics, ports
from tsclient.client import TorchServeClient

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
    unlike its HTTP and gRPC ones: ``tsclient.ports``)."""
    parts = urlsplit(url)
    host = parts.hostname or ports.HOST
    netloc = f"[{host}]" if ":" in host else host
    return urlunsplit((parts.scheme or "http", f"{netloc}:{ports.TRITON_METRICS}", "", "", ""))


def model_rows(client: TorchServeClient) -> list[dict]:
    """One row per model version in Triton's repository index, with its configuration."""
    index = client._call(
        "POST", "management", "/v2/repository/index", "list models (Triton's repository index)"
    ).json()
    rows = []
    for entry in sorted(index, key=lambda e: (e.get("name", ""), e.get("version", ""))):
        name, version = entry.get("name"), entry.get("version")
        config = (
            client._call(
                "GET", "management", f"/v2/models/{name}/config", f"read {name}'s configuration"
            ).json()
            if entry.get("state") == "READY"
            else {}
        )
        instances = sum(int(g.get("count", 1)) for g in config.get("instance_group", []))
        delay_us = (config.get("dynamic_batching") or {}).get("max_queue_delay_microseconds")
        queue = (config.get("dynamic_batching") or {}).get("default_queue_policy") or {}
        rows.append(
            {
                "model": name,
                "version": version,
                "default": True,
                "workers": instances,
                "ready": instances if entry.get("state") == "READY" else 0,
                "state": entry.get("state"),
                "reason": entry.get("reason") or None,
                "batchSize": config.get("max_batch_size"),
                "maxBatchDelay": int(delay_us) // 1000 if delay_us is not None else None,
                "maxQueueSize": int(queue["max_queue_size"]) if "max_queue_size" in queue else None,
            }
        )
    return rows


def health(client: TorchServeClient) -> tuple[dict, list[str], bool]:
    """(data, lines, healthy): the server's readiness and every indexed model's."""
    ready = _ok(client, "/v2/health/ready")
    models = {
        f"{r['model']}/{r['version']}": _ok(client, f"/v2/models/{r['model']}/ready")
        for r in model_rows(client)
    }
    lines = [f"server: {'ready' if ready else 'NOT READY'} (Triton)"]
    lines += [f"{m}: {'READY' if ok else 'not ready'}" for m, ok in models.items()]
    unready = [m for m, ok in models.items() if not ok]
    if unready:
        lines.append(
            f"unhealthy: {', '.join(unready)} not ready (a model that failed to load: "
            "`tsctl list --url URL` shows Triton's reason, its log the rest)"
        )
    return (
        {
            "engine": "triton",
            "ready": ready,
            "models_ready": models,
            "healthy": ready and not unready,
        },
        lines,
        ready and not unready,
    )


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


def _ok(client: TorchServeClient, path: str) -> bool:
    """Whether Triton's health API answers 200 at ``path`` (open: no key is sent)."""
    return client._send("GET", "inference", path, {}, {}).status_code == 200
