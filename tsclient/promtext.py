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


# Metric name -> the total it adds to (handlers/metrics.py writes the Handler* counters).
TOTALS = {"HandlerBatches": "batches", "HandlerRequests": "requests", "HandlerImages": "images",
          "HandlerDecodeMs": "decode_ms", "HandlerForwardMs": "forward_ms",
          "ts_inference_requests_total": "served",
          "ts_inference_latency_microseconds": "latency_us"}
# Metric name -> (the breakdown it adds to, the label it is broken down by).
BREAKDOWNS = {"HandlerBatchesBySize": ("batch_sizes", "BatchSize"),
              "HandlerErrors": ("errors", "ErrorType")}


def summarise(text: str) -> dict[str, dict]:
    """Per model: batches, mean batch size, batch-size distribution, requests and images in
    batches, errors by type, mean decode ms per image, mean forward ms per batch, and
    TorchServe's own request count and mean latency (ms)."""
    models: dict[str, dict] = defaultdict(lambda: {
        **dict.fromkeys(TOTALS.values(), 0.0), **{b: {} for b, _ in BREAKDOWNS.values()}})
    for name, labels, value in parse(text):
        model = labels.get("ModelName") or labels.get("model_name")
        if model is None:
            continue
        entry = models[model]
        if name in TOTALS:
            entry[TOTALS[name]] += value
        elif name in BREAKDOWNS:
            breakdown, label = BREAKDOWNS[name]
            key = labels.get(label, "?")
            entry[breakdown][key] = entry[breakdown].get(key, 0) + int(value)
    return {model: _derive(entry) for model, entry in sorted(models.items())}


def frontend_statuses(text: str) -> dict[str, int]:
    """TorchServe's own counts of answered requests by status class (``Requests2XX`` ...):
    they include what never reached a handler (503 full queue, 507 dead worker)."""
    counts = {f"{c}XX": 0 for c in "245"}
    for name, _, value in parse(text):
        if name.startswith("Requests") and name[len("Requests"):] in counts:
            counts[name[len("Requests"):]] += int(value)
    return counts


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
