"""``python -m bench.sweep``: which batchSize x maxBatchDelay x workers serves the tagger best
on this machine, at 16 closed-loop clients sending the small JPEG -> results/sweep.{md,json}.

Each setting is its own archive (the only way in TorchServe 0.12, ``bench.archives``),
registered on one TorchServe that otherwise serves nothing, checked with the describe API
(``bench.serving.registered_variant``; a setting that did not take is reported as failed,
never measured, and the exit status is then 1), warmed up, measured, unregistered and
deleted; bench/README.md says how the winner and the recommendation are chosen.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench import machine
from bench.archives import ArchiveInfo, variant_config
from bench.layout import BUILD, IMAGES, MODEL_STORE, SAMPLES, cli, fresh_dir, parse
from bench.layout import TAGGER as OURS
from bench.markdown import bullets, document, fmt, publish, table
from bench.serving import LoadPlan, ModelUnderTest, SettingNotApplied, registered_variant
from buildsteps.configgen import MODELS_DIR
from devtools.server import LocalTorchServe
from serveclient.errors import ApiError

log = logging.getLogger("bench.sweep")

SWEEP = BUILD / "sweep"
CLIENTS = 16
IMAGE = "small"
TIE = 0.05  # run-to-run noise here is several percent: closer than this is no real difference


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def run_setting(
    server: LocalTorchServe,
    archive: ArchiveInfo,
    base_yaml: Path,
    body: bytes,
    plan: LoadPlan,
    batch_size: int,
    delay: int,
    workers: int,
) -> dict:
    """Build, register, verify, measure and unregister one setting."""
    row = {"batchSize": batch_size, "maxBatchDelay": delay, "workers": workers}
    try:
        with registered_variant(
            server,
            archive,
            variant_config(base_yaml, batch_size, delay, workers),
            f"{OURS}-b{batch_size}-d{delay}-w{workers}.mar",
            SWEEP,
        ) as settings:
            mut = ModelUnderTest(server, OURS, batches_from_log=False, plan=plan)
            watch = {f"worker {pid}": pid for pid in settings["worker_pids"] if pid}
            row.update(mut.closed(IMAGE, body, CLIENTS, watch))
    except (ApiError, SettingNotApplied) as exc:
        log.warning("setting %s failed: %s", row, exc)
        row["failed"] = str(exc)
    return row


def clean(rows: list[dict]) -> list[dict]:
    """The settings measured with no errors."""
    return [r for r in rows if "failed" not in r and r["errors"] == 0 and r["ok"]]


def winner(rows: list[dict]) -> dict | None:
    """Highest throughput among the settings with no errors."""
    return max(clean(rows), key=lambda r: r["throughput"], default=None)


def tied(rows: list[dict]) -> list[dict]:
    """The clean settings within ``TIE`` of the winner's throughput (the winner among them)."""
    best = winner(rows)
    return [r for r in clean(rows) if best and r["throughput"] >= (1 - TIE) * best["throughput"]]


def recommended(rows: list[dict]) -> dict | None:
    """What to ship: among the settings tied with the winner (within ``TIE``), the one with
    the shortest maxBatchDelay, since a lone request always waits that long; then the fastest.
    Throughput alone would pick a long delay that only one-client latency pays for."""
    return min(tied(rows), key=lambda r: (r["maxBatchDelay"], -r["throughput"]), default=None)


def render_markdown(results: dict) -> str:
    meta, rows = results["meta"], results["rows"]
    best, ties = winner(rows), tied(rows)
    cells = []
    for row in rows:
        setting = [str(row["batchSize"]), str(row["maxBatchDelay"]), str(row["workers"])]
        if "failed" in row:
            cells.append([*setting, f"failed: {row['failed']}", "", "", "", "", ""])
            continue
        cells.append([*setting, fmt(row["throughput"]), fmt(row["p50_ms"]), fmt(row["p99_ms"]),
                      str(row["errors"]), f"{fmt(row['batch_mean'])} / {row['batch_max']}",
                      fmt(row["rss_server_mb"], 0)])  # fmt: skip
        if row is best:
            cells[-1] = [f"**{c}**" for c in cells[-1]]
            cells[-1][0] = "★ " + cells[-1][0]
        elif row in ties:
            cells[-1][0] = "≈ " + cells[-1][0]
    pick = recommended(rows)
    return document(
        "Batching sweep: resnet50-tagger, 16 closed-loop clients, small JPEG",
        bullets([
            f"Date: {meta['machine']['date']}; `{meta['command']}` took "
            f"{fmt(meta['elapsed_s'], 0)} s; backend **{meta['backend']}**, archived with QUANTIZE "
            f"**{meta.get('quantize', 'none')}**.",
            f"Machine: {meta['machine']['cpu']}, {meta['machine']['cores']} cores; CPU "
            f"{fmt(meta['machine']['cpu_busy_percent_before'], 0)}% busy just before; load average "
            f"before {' / '.join(map(str, meta['machine']['loadavg_at_start']))}, after "
            f"{' / '.join(map(str, meta['loadavg_at_end']))}.",
            f"Each setting: its own archive (model-config.yaml), verified with the describe API, "
            f"{meta['plan']['warmup_s']:g} s warm-up, {meta['plan']['closed_s']:g} s measured.",
            f"Winner (**bold**, ★): highest img/s with zero errors; ≈ marks settings within "
            f"{TIE:.0%} of it, a tie on a machine this noisy.",
        ]),
        table("batchSize | maxBatchDelay ms | workers | img/s | p50 ms | p99 ms | errors | "
              "batch mean / max | peak RSS server MB", cells),
        f"Winner: batchSize {best['batchSize']}, maxBatchDelay {best['maxBatchDelay']} ms, "
        f"{best['workers']} worker(s): {fmt(best['throughput'])} img/s, p99 "
        f"{fmt(best['p99_ms'])} ms." if best else None,
        f"Recommended (the tied setting with the shortest maxBatchDelay, which a lone request "
        f"always waits): batchSize {pick['batchSize']}, maxBatchDelay {pick['maxBatchDelay']} "
        f"ms, {pick['workers']} worker(s): {fmt(pick['throughput'])} img/s." if pick else None,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = cli("python -m bench.sweep", __doc__)
    parser.add_argument("--batch-sizes", type=_ints, default=(1, 4, 8, 16))
    parser.add_argument("--delays", type=_ints, default=(1, 5, 20), help="maxBatchDelay, ms")
    parser.add_argument("--workers", type=_ints, default=(1, 2))
    parser.add_argument("--seconds", type=float, default=8.0, help="measured time per setting")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up per setting, s")
    args = parse(parser, argv)
    plan = replace(LoadPlan(), warmup_s=args.warmup, closed_s=args.seconds)

    started = time.monotonic()
    machine_info = machine.describe_machine()
    archive = ArchiveInfo.read(MODEL_STORE / f"{OURS}.mar")
    body = (SAMPLES / IMAGES[IMAGE]).read_bytes()
    base_yaml = MODELS_DIR / f"{OURS}.yaml"
    settings = list(itertools.product(args.batch_sizes, args.delays, args.workers))
    (SWEEP / "store").mkdir(parents=True, exist_ok=True)
    server = LocalTorchServe(
        fresh_dir(SWEEP / "run"), SWEEP / "store", load_models=[], model_api=True
    )
    rows = []
    with server:
        for i, (batch_size, delay, workers) in enumerate(settings, 1):
            log.info("%d/%d: batchSize %d, maxBatchDelay %d ms, %d worker(s)", i, len(settings),
                     batch_size, delay, workers)  # fmt: skip
            rows.append(
                run_setting(server, archive, base_yaml, body, plan, batch_size, delay, workers)
            )
    best = winner(rows)
    results = {
        "meta": {
            "command": " ".join(["python -m bench.sweep", *(argv or sys.argv[1:])]),
            "machine": machine_info,
            "backend": archive.backend,
            "quantize": archive.quantize,
            "plan": {
                "warmup_s": plan.warmup_s,
                "closed_s": plan.closed_s,
                "clients": CLIENTS,
                "image": IMAGE,
            },
            "elapsed_s": time.monotonic() - started,
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        "rows": rows,
        "winner": {k: best[k] for k in ("batchSize", "maxBatchDelay", "workers")} if best else None,
    }
    publish(args.out / "sweep.md", render_markdown(results), results)
    return 1 if any("failed" in r for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
