"""``python -m bench`` (``make bench``): in one run, from the same weights, raw model speed, our
served tagger (TorchServe, then Triton at the precision TorchServe's served) and TorchServe's
stock ``image_classifier`` -> results/benchmark.{md,json,png}; bench/README.md says what each
part measures.

The Markdown is printed (progress goes to stderr). Every server is stopped in a ``finally``;
nothing is left running but the server ``--attach`` names, measured as it is.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from bench import explain_cost, layout, machine, raw, report, stock, triton
from bench.archives import ArchiveInfo
from bench.layout import BUILD, EMBEDDING, IMAGES, MODEL_STORE, REPO, SAMPLES, WEIGHTS, cli, parse
from bench.layout import TAGGER as OURS
from bench.serving import LoadPlan, measure_model
from bench.targets import evaluate
from model_files.artifacts import CHECKPOINT
from servecore.config import HandlerConfig
from servecore.preprocessor import Preprocessor

log = logging.getLogger("bench")

# A few seconds per run: checks the whole pipeline end to end, numbers are not meaningful.
# 4 clients, not 16: each closed run ends by draining its clients' requests, and 16 of the
# stock handler's 12 MP ones took 9 s of a 134 s run here. The 16-client targets read n/a.
QUICK_PLAN = LoadPlan(
    warmup_s=0.2,
    closed_s=0.4,
    closed_max_requests=40,
    clients=(1, 4),
    rates=(20.0,),
    open_s=1.5,
)
QUICK_BUDGET = raw.Budget(seconds=0.2, min_iters=1, max_iters=10, warmup_iters=1)
# --quick leaves out the noisy 12 MP photo (its target, b2, reads n/a): the smooth one already
# runs every large-photo path, and the noisy one's rows took about 20 s of a 164 s run here.
QUICK_IMAGES = ("small", "12mp")


class InputsMissing(SystemExit):
    """A build output the benchmark needs is absent or stale; the message says which make
    target makes it."""


def _require(path: Path, hint: str) -> Path:
    if not path.is_file():
        raise InputsMissing(f"bench: missing {path.relative_to(REPO)}: run `{hint}` first")
    return path


def load_inputs() -> tuple[dict[str, bytes], ArchiveInfo, dict]:
    """The sample images, our tagger archive and the weights; refuses archives built from
    other weights than build/weights (the comparison must use one checkpoint)."""
    _require(WEIGHTS / CHECKPOINT, "make archives")
    weights = machine.weights_info(WEIGHTS)
    images = {
        name: _require(SAMPLES / f, "make samples").read_bytes() for name, f in IMAGES.items()
    }
    for name in (EMBEDDING, OURS):
        _require(MODEL_STORE / f"{name}.mar", "make archives")
    archive = ArchiveInfo.read(MODEL_STORE / f"{OURS}.mar")
    if archive.weights.get("sha256") != weights["sha256"]:
        raise InputsMissing(
            f"bench: model-store/{OURS}.mar holds weights {archive.weights.get('sha256')}, "
            f"build/weights holds {weights['sha256']}: run `make archives` first"
        )
    return images, archive, weights


def run_raw(
    config: HandlerConfig, images: dict[str, bytes], budget: raw.Budget, batches: tuple[int, ...]
) -> dict:
    from buildsteps.export import export

    # `make weights` exports only the chosen backend; export() reports on stdout, which
    # carries only the report here.
    with contextlib.redirect_stdout(sys.stderr):
        for kind in ("torchscript", "onnx", "openvino"):
            export(kind, WEIGHTS)
    return raw.run_raw(WEIGHTS, images, Preprocessor(config), batches=batches, budget=budget)


def run_pipeline(label: str, config: HandlerConfig, image: bytes, budget: raw.Budget) -> dict:
    """The served tagger's work without serving: the raw row ``label`` (what it serves) at its
    handler settings."""
    backend = raw.load_variant(WEIGHTS, label)
    measured = raw.pipeline_throughput(
        backend, Preprocessor(config), image, 8, budget, config.decode_threads
    )
    return {"backend": label, "precision": backend.precision, **measured}


def serve_ours(
    images: dict[str, bytes], plan: LoadPlan, weights: dict, attach: Path | None = None
) -> dict:
    """``OURS`` served by a fresh TorchServe on the shipped archives and settings (``attach``:
    the one running in that folder, measured and left running), loaded by ``plan``."""
    started = time.monotonic()
    with layout.torchserve(attach, BUILD / "run" / "ours") as server:
        startup_s = time.monotonic() - started
        meta = server.client().describe(OURS, customized=True)[0].get("customizedMetadata") or {}
        served_sha = meta.get("weights", {}).get("sha256")
        if served_sha != weights["sha256"]:
            raise RuntimeError(
                f"served {OURS} reports weights {served_sha}, expected {weights['sha256']}"
            )
        measured = measure_model(
            server, OURS, images, plan, batches_from_log=False, progress=log.info
        )
    choice = {k: meta.get(k, "unknown") for k in ("backend", "precision")}
    return {
        "model": OURS,
        **choice,
        **{k: meta.get(k) for k in ("precision_choice", "quantization")},
        "startup_s": None if attach else startup_s,
        **measured,
    }


def serve_stock(images: dict[str, bytes], plan: LoadPlan) -> dict:
    started = time.monotonic()
    with stock.stock_server(BUILD / "run" / "stock", like=OURS) as server:
        startup_s = time.monotonic() - started
        measured = measure_model(
            server, stock.MODEL_NAME, images, plan, batches_from_log=True, progress=log.info
        )
    return {
        "model": stock.MODEL_NAME,
        "backend": "torchscript (stock handler)",
        "startup_s": startup_s,
        **measured,
    }


def main(argv: list[str] | None = None) -> int:
    parser = cli("python -m bench", __doc__, attach="ours")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="seconds-long runs: a smoke test of the pipeline, not a benchmark",
    )
    args = parse(parser, argv)
    plan = QUICK_PLAN if args.quick else LoadPlan()
    budget = QUICK_BUDGET if args.quick else raw.Budget()

    started = time.monotonic()
    machine_info = machine.describe_machine()
    images, archive, weights = load_inputs()
    if args.quick:
        images = {name: images[name] for name in QUICK_IMAGES}
    config = HandlerConfig.from_mapping(archive.model_config.get("handler"))
    # The served batch size too: the served tagger is held to the raw forward at its own size.
    batch_size = int(archive.model_config.get("batchSize", 8))
    log.info("raw forward: %s", ", ".join(raw.VARIANTS))
    batches = {1, batch_size} if args.quick else {1, 8, batch_size}
    raw_results = run_raw(config, images, budget, tuple(sorted(batches)))
    log.info("explanations: cost per method")
    explain_results = explain_cost.run_explain(WEIGHTS, images["small"], config, args.quick)
    log.info("served: ours (%s)", OURS)
    ours = serve_ours(images, plan, weights, args.attach)
    served = raw.served_variant(ours)
    log.info("in-process pipeline: %s (what the tagger served)", served)
    pipeline = run_pipeline(served, config, images["small"], budget)
    log.info("served: ours on Triton (%s at %s)", OURS, ours["precision"])
    triton_results = triton.serve_triton(
        images, plan, ours["precision"], model_store=MODEL_STORE, progress=log.info
    )
    log.info("served: stock image_classifier")
    stock_results = serve_stock(images, plan)
    targets = evaluate(raw_results, served, ours, stock_results, raw_batch=batch_size,
                       pipeline=pipeline, cpu_flags=machine_info.get("cpu_flags"))  # fmt: skip
    results = {
        "meta": {
            "command": "python -m bench" + (" --quick" if args.quick else ""),
            "machine": machine_info,
            "versions": machine.versions(),
            "weights": weights,
            "plan": asdict(plan),
            "elapsed_s": time.monotonic() - started,
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        "raw": raw_results,
        "pipeline": pipeline,
        "explain": explain_results,
        "served": {"ours": ours, "triton": triton_results, "stock": stock_results},
        "targets": [t.to_dict() for t in targets],
    }
    print(report.write_reports(results, args.out), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
