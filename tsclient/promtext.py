"""Read TorchServe's Prometheus text (``/metrics``) and summarise what an operator asks: how
big the batches were, how many requests and which errors, how long decoding, the forward pass
and whole requests took.

Counters are exposed under their declared names without a ``_total`` suffix (TorchServe 0.12,
simpleclient 0.9); the handler's counters are declared in ``config/metrics.yaml`` and written
by ``handlers/metrics.py``.
"""
from __future__ import annotations

import re
from collections import defaultdict

SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    """``[(name, labels, value)]`` of every sample line (comments skipped)."""
    samples = []
    for line in text.splitlines():
        match = SAMPLE.match(line.strip())
        if match and not line.startswith("#"):
            name, labels, value = match.groups()
            samples.append((name, dict(LABEL.findall(labels or "")), float(value)))
    return samples


def summarise(text: str) -> dict[str, dict]:
    """Per model: batches, mean batch size, batch-size distribution, requests and images in
    batches, errors by type, mean decode ms per image, mean forward ms per batch, and
    TorchServe's own request count and mean latency (ms)."""
    models: dict[str, dict] = defaultdict(lambda: {
        "batches": 0.0, "requests": 0.0, "images": 0.0, "batch_sizes": {}, "errors": {},
        "decode_ms": 0.0, "forward_ms": 0.0, "served": 0.0, "latency_us": 0.0})
    for name, labels, value in parse(text):
        model = labels.get("ModelName") or labels.get("model_name")
        if model is None:
            continue
        entry = models[model]
        if name == "HandlerBatches":
            entry["batches"] += value
        elif name == "HandlerRequests":
            entry["requests"] += value
        elif name == "HandlerImages":
            entry["images"] += value
        elif name == "HandlerBatchesBySize":
            size = labels.get("BatchSize", "?")
            entry["batch_sizes"][size] = entry["batch_sizes"].get(size, 0) + int(value)
        elif name == "HandlerErrors":
            kind = labels.get("ErrorType", "?")
            entry["errors"][kind] = entry["errors"].get(kind, 0) + int(value)
        elif name == "HandlerDecodeMs":
            entry["decode_ms"] += value
        elif name == "HandlerForwardMs":
            entry["forward_ms"] += value
        elif name == "ts_inference_requests_total":
            entry["served"] += value
        elif name == "ts_inference_latency_microseconds":
            entry["latency_us"] += value
    return {model: _derive(entry) for model, entry in sorted(models.items())}


def _derive(entry: dict) -> dict:
    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 3) if b else None

    return {
        "batches": int(entry["batches"]),
        "requests_in_batches": int(entry["requests"]),
        "images": int(entry["images"]),
        "mean_batch_size": ratio(entry["requests"], entry["batches"]),
        "batch_sizes": dict(sorted(entry["batch_sizes"].items(), key=lambda kv: int(kv[0])
                                   if kv[0].isdigit() else 0)),
        "errors": dict(sorted(entry["errors"].items())),
        "decode_ms_per_image": ratio(entry["decode_ms"], entry["images"]),
        "forward_ms_per_batch": ratio(entry["forward_ms"], entry["batches"]),
        "requests": int(entry["served"]),
        "mean_latency_ms": ratio(entry["latency_us"] / 1000, entry["served"]),
    }
