"""``python -m bench.availability``: what two workers per model cost in throughput, and what
they buy when one worker dies (bench/README.md says what it runs). Prints a Markdown table.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import yaml

from bench.archives import ArchiveInfo, variant_config
from bench.layout import BUILD, IMAGES, MODEL_STORE, SAMPLES, TAGGER, cli, fresh_dir, parse
from bench.loadgen import closed_loop
from bench.markdown import table
from bench.serving import LoadPlan, ModelUnderTest, registered_variant
from bench.stats import summarize
from buildsteps.configgen import MODELS_DIR
from devtools.server import LocalTorchServe

WORK = BUILD / "availability"
CLIENTS = 16


def measure(
    server: LocalTorchServe, body: bytes, workers: int, threads: int | None, plan: LoadPlan
) -> dict:
    base = MODELS_DIR / f"{TAGGER}.yaml"
    frontend = yaml.safe_load(base.read_text())
    config = variant_config(base, frontend["batchSize"], frontend["maxBatchDelay"], workers)
    if threads is not None:
        config["handler"] = {**config.get("handler", {}), "threads": threads}
    archive = ArchiveInfo.read(MODEL_STORE / f"{TAGGER}.mar")
    with registered_variant(server, archive, config, f"{TAGGER}-w{workers}.mar", WORK) as settings:
        mut = ModelUnderTest(server, TAGGER, batches_from_log=False, plan=plan)
        row = {
            "workers": workers,
            "threads": threads or "all cores",
            **mut.closed("small", body, CLIENTS, {}),
        }
        # The same load while one worker is killed: count what fails.
        endpoint = mut.endpoint(body)
        victim = settings["worker_pids"][0]
        killer = threading.Timer(2.0, os.kill, (victim, signal.SIGKILL))
        killer.start()
        stats = summarize(closed_loop(endpoint, CLIENTS, plan.closed_s, 10_000))
        killer.join()
        return row | {
            "kill_requests": stats.requests,
            "kill_errors": stats.errors,
            "kill_error_kinds": stats.error_kinds,
            "kill_throughput": stats.throughput,
        }


def main(argv: list[str] | None = None) -> int:
    parser = cli("python -m bench.availability", __doc__, out=None)
    parser.add_argument("--seconds", type=float, default=12.0)
    args = parse(parser, argv)  # SIGTERM reaches the finally that stops the server
    plan = LoadPlan(closed_s=args.seconds)
    body = (SAMPLES / IMAGES["small"]).read_bytes()
    (WORK / "store").mkdir(parents=True, exist_ok=True)
    server = LocalTorchServe(
        fresh_dir(WORK / "run"), WORK / "store", load_models=[], model_api=True
    )
    with server:
        rows = [measure(server, body, *setting, plan) for setting in ((1, None), (2, 1))]
    cells = [
        [f"{r['workers']} x {r['threads']}", r["throughput"], f"{r['p50_ms']:.0f}",
         f"{r['p99_ms']:.0f}", f"{r['kill_errors']} / {r['kill_requests']} "
         f"{r['kill_error_kinds'] or ''}", r["kill_throughput"]]
        for r in rows
    ]  # fmt: skip
    header = "workers x threads | img/s | p50 ms | p99 ms | worker killed: failed / requests | "
    print(
        f"tagger, {CLIENTS} clients, small JPEG, {time.strftime('%Y-%m-%d')}, load average "
        f"{os.getloadavg()[0]:.1f}\n\n" + table(header + "img/s during kill", cells)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
