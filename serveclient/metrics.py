"""Read TorchServe's Prometheus text (``/metrics``) with ``prometheus_client``'s parser and
summarise what an operator asks: how big the batches were, how many requests and which errors,
how long decoding, the forward pass and whole requests took.

TorchServe 0.12 (simpleclient 0.9) exports a counter as declared: its own without a ``_total``
suffix (but ``ts_inference_requests_total``), ours (``resnet50_*_total``, the same names on
every engine: ``servecore/metrics.py``) with one; prometheus_client's parser appends it where
it is missing. ``samples`` names every counter without the suffix, so a name reads the same
whichever way it was written.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families

from serveclient.errors import MetricsUnreadable


class Sample(NamedTuple):
    name: str  # a counter's without ``_total``; a histogram's parts keep ``_sum`` etc.
    labels: dict[str, str]
    value: float


def samples(text: str) -> list[Sample]:
    """Every sample of a ``/metrics`` text. Raises ``MetricsUnreadable`` when the text is not
    Prometheus' text format (a scrape cut short ends mid-line)."""
    try:
        return [
            Sample(s.name.removesuffix("_total"), s.labels, s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]
    except ValueError as exc:  # the parser's own message names the token, not the line
        cut = bool(text) and not text.endswith("\n")
        last = text.rstrip("\n").rsplit("\n", 1)[-1]
        raise MetricsUnreadable(
            f"the /metrics text is not Prometheus text format ({exc or 'malformed line'})"
            + (f": it ends mid-line ({last[-60:]!r}), the scrape was cut short" if cut else ""),
            "read it again (a restart or a proxy can cut a scrape short); if it stays "
            "unreadable, look at the metrics address's answer with curl",
        ) from None


# Metric name (without _total) -> the total it adds to (servecore/metrics.py's counters).
TOTALS = {
    "resnet50_batches": "batches",
    "resnet50_requests": "requests",
    "resnet50_images": "images",
    "resnet50_decode_ms": "decode_ms",
    "resnet50_forward_ms": "forward_ms",
    "ts_inference_requests": "served",
    "ts_inference_latency_microseconds": "latency_us",
}
# Metric name -> (the breakdown it adds to, the label it is broken down by).
BREAKDOWNS = {
    "resnet50_batches_by_size": ("batch_sizes", "batch_size"),
    "resnet50_errors": ("errors", "error_type"),
}


def summarise(text: str) -> dict[str, dict]:
    """Per model: batches, mean batch size, batch-size distribution, requests and images in
    batches, errors by type, mean decode ms per image, mean forward ms per batch, and
    TorchServe's own request count and mean latency (ms)."""
    models: dict[str, dict] = defaultdict(
        lambda: {**dict.fromkeys(TOTALS.values(), 0.0), **{b: {} for b, _ in BREAKDOWNS.values()}}
    )
    for name, labels, value in samples(text):
        model = labels.get("model") or labels.get("model_name")
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
    for name, _, value in samples(text):
        if name.startswith("Requests") and name[len("Requests") :] in counts:
            counts[name[len("Requests") :]] += int(value)
    return counts


def _derive(entry: dict) -> dict:
    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 3) if b else None

    return {
        "batches": int(entry["batches"]),
        "requests_in_batches": int(entry["requests"]),
        "images": int(entry["images"]),
        "mean_batch_size": ratio(entry["requests"], entry["batches"]),
        "batch_sizes": dict(
            sorted(
                entry["batch_sizes"].items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0
            )
        ),
        "errors": dict(sorted(entry["errors"].items())),
        "decode_ms_per_image": ratio(entry["decode_ms"], entry["images"]),
        "forward_ms_per_batch": ratio(entry["forward_ms"], entry["batches"]),
        "requests": int(entry["served"]),
        "mean_latency_ms": ratio(entry["latency_us"] / 1000, entry["served"]),
    }
