"""Turn one benchmark run's results dict into results/benchmark.{md,json,png}.

Rendering only (with ``bench.markdown``): no measuring, no numbers invented. Missing values
print as ``n/a``.
"""

from __future__ import annotations

from pathlib import Path

from bench.markdown import bullets, document, fmt, section, table, write_json

SERVERS = (
    ("ours", "tagger (ours)"),
    ("triton", "tagger on Triton"),
    ("stock", "stock image_classifier"),
)
IMAGE_NAMES = {
    "small": "small JPEG 451x300",
    "12mp": "12 MP photo 4242x2828",
    "12mp-noisy": "noisy 12 MP photo 4242x2828",
}


def _servers(results: dict):
    """(key, label, runs) of each server measured in this run."""
    return [
        (key, label, results["served"][key]) for key, label in SERVERS if results["served"].get(key)
    ]


def _batch(run: dict) -> str:
    if not run.get("batch_max"):
        return "n/a"
    return f"{fmt(run['batch_mean'])} / {run['batch_max']}"


def _errors(run: dict) -> str:
    if not run["errors"]:
        return "0"
    kinds = ", ".join(f"{k}: {v}" for k, v in sorted(run["error_kinds"].items()))
    return f"**{run['errors']}** ({kinds})"


def _header(results: dict) -> str:
    meta = results["meta"]
    machine, versions, weights = meta["machine"], meta["versions"], meta["weights"]
    ours, stock = results["served"]["ours"], results["served"]["stock"]
    flags = machine.get("cpu_flags", {})
    flags_line = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in flags.items()) or "n/a"
    if weights.get("trained"):
        weights_line = f"{weights['source']}, trained (sha256 {weights['sha256'][:16]}...)"
    else:
        weights_line = (
            f"**untrained** ({weights['source']}: {weights.get('detail', '')}); sha256 "
            f"{weights['sha256'][:16]}... Speed is representative, the predicted labels are "
            "meaningless."
        )
    return bullets([
        f"Date: {machine['date']}; `{meta['command']}` took {fmt(meta['elapsed_s'], 0)} s.",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gb']} GB RAM,"
        f" {machine['os']}; CPU features: {flags_line}. Other work on the machine: CPU "
        f"{fmt(machine['cpu_busy_percent_before'], 0)}% busy in the second before the run; "
        f"load average {' / '.join(str(x) for x in machine['loadavg_at_start'])} (1/5/15 min) "
        f"before, {' / '.join(str(x) for x in meta['loadavg_at_end'])} after (the run itself "
        "keeps about 2 busy).",
        f"Weights (the same file for every row): {weights_line}",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
        f"Ours: `{ours['model']}` archive from `model-store/`, backend **{ours['backend']}**, "
        f"precision **{ours.get('precision', 'n/a')}**, {_settings(ours['settings'])}; the "
        "embedding model is loaded too (idle).",
        f"What `precision: {_choice(ours).get('requested', 'n/a')}` chose on this host "
        f"(describe): {_choice(ours).get('summary', 'n/a')}.",
        f"The archive's int8 IR (what `auto` weighed beside the float IR): fidelity vs "
        f"float32 on held-apart photos: {_fidelity(ours.get('quantization'))}.",
        _triton_line(results["served"].get("triton")),
        f"Stock: `{stock['model']}`, `image_classifier` handler, plain torchvision ResNet50 "
        f"traced and frozen to TorchScript from the same weights, {_settings(stock['settings'])}.",
        "Servers run one at a time; the load generator shares the 2 cores with the server "
        "under test (both sides pay for it).",
    ])  # fmt: skip


def _triton_line(triton: dict | None) -> str:
    if not triton:
        return "Triton: not measured (no `make triton-server`: nvidia-pytriton missing)."
    return (
        f"Triton: the same tagger archive's files and handler settings at precision "
        f"**{triton['precision']}** (pinned to what ours served; the embedding model "
        "loaded too, idle), in Triton 2.51 from the "
        "nvidia-pytriton wheel (`tritonrepo`, docs/triton.md): the same batchSize and "
        "maxBatchDelay as `max_batch_size` and `max_queue_delay_microseconds`; requests "
        "carry the raw image in the binary tensor extension; its batch mean is per batch "
        "(Triton's statistics), not per request."
    )


def _choice(served: dict) -> dict:
    return served.get("precision_choice") or {}


def _fidelity(record: dict | None) -> str:
    if not record:
        return "n/a"
    f = record["fidelity_vs_f32"]
    return (
        f"embedding cosine mean {f['embedding_cosine_mean']:.4f} / min "
        f"{f['embedding_cosine_min']:.4f}, top-1 agreement {f['top1_agreement']:.3f}, top-5 "
        f"overlap {f['top5_overlap']:.3f} on {f['photos']} photos (untrained weights: "
        f"{f['reference_distinct_top1']} distinct top-1 class(es), says nothing about "
        "accuracy)"
    )


def _settings(s: dict) -> str:
    return (
        f"batchSize {s['batchSize']}, maxBatchDelay {s['maxBatchDelay']} ms, "
        f"{s['workers']} worker(s)"
    )


def _targets(results: dict) -> str:
    rows = [
        [t["key"], t["description"], f"{fmt(t['value'], 3)} ({t['detail']})",
         f"{t['op']} {fmt(t['threshold'], 2)}", "PASS" if t["passed"] else "**MISS**"]
        for t in results["targets"]
    ]  # fmt: skip
    return section("Targets", table(["", "target", "measured", "needed", "result"], rows))


def _raw(results: dict) -> str:
    timed = {label: r for label, r in results["raw"].items() if "forward" in r}
    batches = sorted({f["batch"] for r in timed.values() for f in r["forward"]})
    images = list(next(iter(timed.values()))["single_image"])
    header = (
        ["backend", "precision"]
        + [f"forward batch {b} (img/s)" for b in batches]
        + [f"decode+preprocess+forward, {IMAGE_NAMES.get(i, i)}, p50 (ms)" for i in images]
    )
    served = (results.get("pipeline") or {}).get("backend")
    rows = []
    for backend, r in timed.items():
        by_batch = {f["batch"]: f["images_per_s"] for f in r["forward"]}
        label = f"**{backend}** (served)" if backend == served else backend
        rows.append(
            [label, r.get("precision", "n/a")]
            + [fmt(by_batch.get(b)) for b in batches]
            + [fmt(r["single_image"][i]["p50_ms"]) for i in images]
        )
    skipped = [f"{label} ({r['skipped']})" for label, r in results["raw"].items() if "skipped" in r]
    pipeline = results.get("pipeline")
    return section(
        "Raw model, no serving (this process, one image repeated to the batch size)",
        table(header, rows),
        "Not run: " + "; ".join(skipped) + "." if skipped else None,
        f"In-process pipeline (small JPEG decoded and preprocessed on the handler's decode "
        f"threads, stacked, one {pipeline['backend']} forward at batch {pipeline['batch']}, "
        f"precision {pipeline['precision']}, no HTTP): **{fmt(pipeline['images_per_s'])} img/s**."
        if pipeline
        else None,
    )


def _served(results: dict, loop: str) -> list[list[str]]:
    """Each server's ``loop`` runs (closed or open) as table rows, the first cells left to the
    caller: what every row has after them."""
    return [
        [label, run, fmt(run["throughput"]), fmt(run["p50_ms"]), fmt(run["p95_ms"]),
         fmt(run["p99_ms"]), str(run["requests"]), _errors(run), _batch(run),
         fmt(run["rss_server_mb"], 0), fmt(run["rss_worker_mb"], 0)]
        for _key, label, served in _servers(results)
        for run in served[loop]
    ]  # fmt: skip


FIGURES = "p50 ms | p95 ms | p99 ms | requests | errors | batch mean / max | peak RSS server MB"


def _closed(results: dict) -> str:
    rows = [
        [label, IMAGE_NAMES.get(run["image"], run["image"]), str(run["clients"]), *figures]
        for label, run, *figures in _served(results, "closed")
    ]
    return section(
        "Served, closed loop (each client sends its next request when the answer arrives)",
        table(f"server | image | clients | img/s | {FIGURES} | peak RSS worker MB", rows),
    )


def _open(results: dict) -> str:
    rows = [
        [label, fmt(run["rate"], 0), *figures[:-1]]
        for label, run, *figures in _served(results, "open")
    ]
    image = results["meta"]["plan"]["open_image"]
    return section(
        f"Served, open loop (Poisson arrivals, {IMAGE_NAMES.get(image, image)})",
        table(f"server | Poisson rate req/s | achieved img/s | {FIGURES}", rows),
    )


def _method(results: dict) -> str:
    plan = results["meta"]["plan"]
    return section("How it was measured", bullets([
        f"Closed loop: {plan['warmup_s']:g} s warm-up (discarded), then {plan['closed_s']:g} s"
        f" (at most {plan['closed_max_requests']} requests); img/s = successful requests / time"
        " from the first send to the last answer.",
        f"Open loop: Poisson arrivals for {plan['open_s']:g} s per rate (same seeded arrival "
        f"times for both servers), at most {plan['open_max_in_flight']} in flight; latency runs "
        "from each request's scheduled arrival, so client-side queueing counts.",
        "Latency percentiles are of successful requests; an error is any non-200 answer or "
        "client exception.",
        "Batch mean / max: the server-side batch each answered request travelled in (mean "
        "over requests). Ours: the `X-Batch-Size` header; stock: its request ids in the "
        "worker's `PredictionTime` log line.",
        "Peak RSS: sampled every 0.2 s; server = Java frontend + every worker, summed "
        "(shared pages counted per process); worker = the measured model's worker process.",
        "Raw: `servecore.backends.load_backend` as the handler loads each backend; "
        "decode+preprocess+forward is `servecore.images.decode_image` with the tagger's handler "
        "settings, the weights' transform and one forward at batch 1.",
    ]))  # fmt: skip


def _explain(result: dict) -> str:
    """``bench.explain_cost.run_explain``'s result: load, memory, PNG and each method's cost."""
    rows = [
        [method, f"n_steps {r['n_steps']}, internal_batch_size {r['internal_batch_size']}"
         if r["n_steps"] else "defaults", str(r["passes"]), fmt(r["ms_per_image_p50"], 0)]
        for method, r in result["methods"].items()
    ]  # fmt: skip
    return section(
        "Explanations (one image, top-1 target, eager PyTorch on CPU)",
        f"Eager model for gradients: loaded in {fmt(result['load_s'], 2)} s, "
        f"+{fmt(result['rss_added_mb'], 0)} MB resident beside the serving backend. "
        f"PNG overlay (longer side <= {result['png']['max_side']} px): "
        f"{fmt(result['png']['ms_p50'], 0)} ms, {result['png']['bytes'] / 1024:.0f} KiB.",
        table(["method", "settings", "passes", "ms/image (p50)"], rows),
    )


def render_markdown(results: dict) -> str:
    return document(
        "Benchmark: resnet50-tagger vs TorchServe's stock image_classifier",
        _header(results),
        _targets(results),
        _raw(results),
        _closed(results),
        _open(results),
        _method(results),
        _explain(results["explain"]) if "explain" in results else None,
    )


def render_plot(results: dict, path: Path) -> None:
    """p50 latency against achieved throughput over the open-loop rates, ours vs stock."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for (_key, label, served), marker in zip(_servers(results), ("o", "s", "^")):
        runs = served["open"]
        if not runs:
            continue
        xs = [r["throughput"] for r in runs]
        ys = [r["p50_ms"] for r in runs]
        ax.plot(xs, ys, marker=marker, label=label)
        for run, x, y in zip(runs, xs, ys):
            ax.annotate(
                f"{run['rate']:g}/s", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8
            )
    ax.set_xlabel("achieved throughput (img/s)")
    ax.set_ylabel("p50 latency (ms)")
    ax.set_yscale("log")
    ax.set_title("Open-loop Poisson sweep, small JPEG (labels: offered rate)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_reports(results: dict, out_dir: Path, stem: str = "benchmark") -> str:
    """Write ``<stem>.json``, ``<stem>.md`` and ``<stem>.png``; return the Markdown."""
    write_json(results, out_dir / f"{stem}.json")
    markdown = render_markdown(results)
    (out_dir / f"{stem}.md").write_text(markdown)
    render_plot(results, out_dir / f"{stem}.png")
    return markdown
