"""The Grafana dashboard, as code: built with Grafana's own builder library
(grafana-foundation-sdk) from the recording rules of config/monitoring/rules.yml and the metric
names of config/metrics.yaml, written to config/monitoring/dashboard.json (committed; a test
fails when it drifts from this code, or names a series that nothing exports or records).

    python -m buildsteps.dashboard          # rewrite config/monitoring/dashboard.json
    python -m buildsteps.dashboard --check  # exit 1 if the committed JSON is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "config" / "monitoring" / "dashboard.json"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")

# (title, unit, [(expr, legend)], description): one time series panel each, in reading order.
PANELS: list[tuple[str, str, list[tuple[str, str]], str]] = [
    (
        "Requests per second",
        "reqps",
        [("model_name:ts_inference_requests:rate1m", "{{model_name}}")],
        "Every request the frontend answered, per model (all statuses).",
    ),
    (
        "Images per second",
        "short",
        [("model:resnet50_images:rate1m", "{{model}}")],
        "Images our handler decoded and ran, per model.",
    ),
    (
        "Mean latency (ms)",
        "ms",
        [
            ("model_name:ts_inference_latency_ms:mean1m", "{{model_name}} total"),
            ("model_name:ts_queue_latency_ms:mean1m", "{{model_name}} queued"),
        ],
        "Arrival to answer, and the part spent queued. TorchServe exports sums, not "
        "histograms: means, no percentiles.",
    ),
    (
        "Handler time (ms)",
        "ms",
        [
            ("model:resnet50_forward_ms:mean_per_batch1m", "{{model}} forward / batch"),
            ("model:resnet50_decode_ms:mean_per_image1m", "{{model}} decode / image"),
        ],
        "Where the handler's time goes.",
    ),
    (
        "Batch size",
        "short",
        [
            ("model:resnet50_batch_size:mean1m", "{{model}} requests / batch"),
            ("model:resnet50_images_per_batch:mean1m", "{{model}} images / batch"),
        ],
        "How full the batches the frontend formed were (batchSize is the ceiling).",
    ),
    (
        "Batches by size (share)",
        "percentunit",
        [
            (
                "sum by (model, batch_size) (rate(resnet50_batches_by_size_total[5m]))"
                " / ignoring (batch_size) group_left"
                " sum by (model) (rate(resnet50_batches_total[5m]))",
                "{{model}} size {{batch_size}}",
            )
        ],
        "Share of batches of each size over 5 minutes.",
    ),
    (
        "Answers by status class",
        "reqps",
        [("job:ts_requests:rate1m", "{{code}}")],
        "All answers by class; 5xx includes the frontend's 503 (queue full) and 507.",
    ),
    (
        "Errors by kind",
        "reqps",
        [("model:resnet50_errors:rate1m", "{{model}} {{error_type}}")],
        "Requests the handler failed, by kind (InvalidImage 400, PayloadTooLarge 413, "
        "Overloaded 503, InternalError 500, ...).",
    ),
    (
        "503 refusals",
        "reqps",
        [
            ("model:resnet50_overloaded:rate1m", "{{model}} handler (Overloaded)"),
            ('job:ts_requests:rate1m{code="5xx"}', "frontend 5xx (queue full, no worker)"),
        ],
        "Requests turned away: alert TorchServeSustainedRefusals.",
    ),
    (
        "Worker memory (MB)",
        "decmbytes",
        [
            ("model:resnet50_worker_rss_mb:max", "{{model}} largest worker"),
            ("resnet50_worker_rss_mb", "{{model}} pid {{worker_pid}}"),
        ],
        "Resident memory per worker; alert TorchServeWorkerMemoryHigh at 1800 MB.",
    ),
    (
        "Worker restarts (15 min)",
        "short",
        [("model:resnet50_worker_restarts:changes15m", "{{model}}")],
        "Restarts in the last 15 minutes; alert TorchServeWorkerRestarting at 3.",
    ),
    (
        "GPU utilisation",
        "percentunit",
        [("instance_gpu:gpu_utilization:ratio", "{{instance}} GPU {{gpu}}")],
        "How busy each GPU is (TorchServe samples it every minute, Triton every second); "
        "empty on CPU hosts. Alert GPUIdleUnderLoad under 30% while images flow.",
    ),
    (
        "GPU memory",
        "percentunit",
        [("instance_gpu:gpu_memory_used:ratio", "{{instance}} GPU {{gpu}}")],
        "Share of each GPU's memory in use; alert GPUMemoryNearlyFull over 90%.",
    ),
]
# (title, expr, legend): stat panels across the top.
STATS: list[tuple[str, str, str]] = [
    ("Scrape targets up", 'sum(up{job="torchserve"})', "up"),
    ("5xx share", "job:ts_requests_5xx:ratio1m", "5xx"),
    (
        "Precision served",
        "max by (model, precision) (resnet50_precision) == 1",
        "{{model}} {{precision}}",
    ),
]


def _query(expr: str, legend: str, ref: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref)


def build() -> dict:
    """The dashboard as Grafana's JSON model."""
    board = (
        dashboard.Dashboard("resnet50-serve: TorchServe")
        .uid("resnet50-serve-torchserve")
        .description(
            "Throughput, latency, batches, errors, refusals, workers and GPUs of the "
            "resnet50-serve models (config/monitoring; docs/operations.md)."
        )
        .tags(["torchserve", "resnet50-serve"])
        .refresh("30s")
        .time("now-1h", "now")
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
        )
    )
    for title, expr, legend in STATS:
        board = board.with_panel(
            stat.Panel()
            .title(title)
            .datasource(DATASOURCE)
            .span(8)
            .height(4)
            .with_target(_query(expr, legend, "A"))
        )
    for title, unit, queries, description in PANELS:
        panel = (
            timeseries.Panel()
            .title(title)
            .description(description)
            .unit(unit)
            .datasource(DATASOURCE)
            .span(12)
            .height(8)
            .min(0)
        )
        for index, (expr, legend) in enumerate(queries):
            panel = panel.with_target(_query(expr, legend, "ABCDEFGH"[index]))
        board = board.with_panel(panel)
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def exprs(model: dict) -> list[str]:
    """Every query expression of a dashboard JSON model."""
    return [
        target["expr"]
        for panel in model.get("panels", [])
        for target in panel.get("targets", [])
        if "expr" in target
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m buildsteps.dashboard", description=__doc__)
    p.add_argument("--check", action="store_true", help="fail if the committed JSON is stale")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.is_file() or OUT.read_text() != text:
            print(
                f"{OUT.relative_to(REPO)} is stale: run python -m buildsteps.dashboard",
                file=sys.stderr,
            )
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
