"""The served tagger before and after a change, side by side in one run: is it slower?

    python -m bench.beforeafter               # make bench-before-after: results/before-after.md
    python -m bench.beforeafter --before REF  # against another commit

Two TorchServes run at once on this host: one serving the tagger archive that ``--before``
builds (its own ``archive.sh``, handler, core and config, checked out in a temporary git
worktree, from the same weights in ``build/weights``), one serving this tree's archive
(``model-store/``, ``make archives``). Each load is ``python -m bench``'s closed loop of 16
clients on one image (a small JPEG, a smooth 12 MP photo, a noisy one), each side in turn, and
the whole sequence runs ``--rounds`` times, so that a busy spell of the shared host falls on
both; the side that goes first alternates from round to round (before first in the odd rounds,
after first in the even ones), so that neither always runs on the heels of the other's load; a
row is the median round of each side. Only one server takes load at a time; the other
idles (no request, its worker asleep in its socket read).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from bench.corecost import BEFORE
from bench.layout import IMAGES, MODEL_STORE, REPO, SAMPLES, TAGGER, checked_out, cli, parse
from bench.machine import dated, describe_machine, host
from bench.markdown import bullets, document, publish, table
from bench.serving import LoadPlan, ModelUnderTest
from devtools.server import LocalTorchServe

logger = logging.getLogger("bench.beforeafter")
SIDES = ("before", "after")
CLIENTS = 16  # python -m bench's throughput rows (targets a1, b, b2)


@dataclass(frozen=True)
class Side:
    """One tree's archive and the config its server starts from."""

    name: str
    store: Path
    config: Path
    metrics: Path


def build_before(tree: Path, work: Path) -> Side:
    """``tree``'s own config and tagger archive (in ``work/store``), from this tree's weights
    and virtualenv."""
    store = work / "store"
    python = REPO / ".venv" / "bin" / "python"
    env = {
        **os.environ,
        "PYTHON": str(python),
        "ARCHIVER": str(REPO / ".venv" / "bin" / "torch-model-archiver"),
        "WEIGHTS_DIR": str(REPO / "build" / "weights"),
        "OUT": str(store),
    }
    for command in ([str(python), "-m", "buildsteps.configgen"], ["./archive.sh", TAGGER]):
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} in {tree} failed:\n{done.stderr[-3000:]}")
    config = tree / "config"
    return Side("before", store, config / "config.properties", config / "metrics.yaml")


def server_of(side: Side, work: Path) -> LocalTorchServe:
    """A TorchServe of ``side``'s tagger alone (started by ``with``)."""
    return LocalTorchServe(
        work / side.name,
        side.store,
        config=side.config,
        load_models=[f"{TAGGER}.mar"],
        properties={"metrics_config": str(side.metrics)},
    )


def measure(
    servers: dict[str, LocalTorchServe], rounds: int, plan: LoadPlan, images: list[str]
) -> list[dict]:
    """Every (round, image, side) closed-loop run of ``images`` (``IMAGES``' names), both sides
    of an image one after the other, the first of them alternating from round to round."""
    bodies = {name: (SAMPLES / IMAGES[name]).read_bytes() for name in images}
    runs = []
    for round_ in range(rounds):
        for image, body in bodies.items():
            for side in SIDES if round_ % 2 == 0 else SIDES[::-1]:
                model = ModelUnderTest(servers[side], TAGGER, batches_from_log=False, plan=plan)
                stats = model.closed(image, body, CLIENTS, {})
                runs.append({"round": round_, "side": side, **stats})
                logger.info(
                    "round %d: %s %s: %.1f img/s, p50 %.0f ms, %d errors",
                    *(round_ + 1, image, side, stats["throughput"], stats["p50_ms"]),
                    stats["errors"],
                )
    return runs


def precision(server: LocalTorchServe) -> str:
    """What the served tagger computes in (describe's customised metadata)."""
    described = server.client().describe(TAGGER, customized=True)[0]
    metadata = described.get("customizedMetadata") or "{}"
    found = json.loads(metadata) if isinstance(metadata, str) else metadata
    return str(found.get("precision", "?"))


def report(runs: list[dict], ref: str, served: dict[str, str], machine: dict) -> str:
    """results/before-after.md: per image, each side's median img/s and p50, and the ratio."""
    rows = []
    for image in dict.fromkeys(r["image"] for r in runs):
        side = {s: [r for r in runs if r["image"] == image and r["side"] == s] for s in SIDES}
        rate = {s: statistics.median(r["throughput"] for r in side[s]) for s in SIDES}
        p50 = {s: statistics.median(r["p50_ms"] for r in side[s]) for s in SIDES}
        errors = sum(r["errors"] for s in SIDES for r in side[s])
        each = "; ".join(", ".join(f"{r['throughput']:.1f}" for r in side[s]) for s in SIDES)
        rows.append([image, rate["before"], rate["after"], f"{rate['after'] / rate['before']:.2f}",
                     f"{p50['before']:.0f}", f"{p50['after']:.0f}", errors, each])  # fmt: skip
    return document(
        "The served tagger before and after",
        "Generated by `python -m bench.beforeafter` (`make bench-before-after`); "
        "bench/beforeafter.py says what each row measures.",
        bullets([
            dated(), host(machine),
            f"Before: `{ref}` (its archive.sh, handler, core and config); after: this tree. Same "
            f"weights, same virtualenv; served precision before {served['before']}, after "
            f"{served['after']}.",
            f"Each run: {CLIENTS} clients, closed loop, one image; "
            f"{max(r['round'] for r in runs) + 1} rounds, before and after in turn, the first "
            "of them alternating (before first in rounds 1, 3, ...); a cell is the median round "
            "(every round's img/s in the last column).",
        ]),
        table("image | before img/s | after img/s | after/before | before p50 ms | after p50 ms | "
              "errors | img/s each round (before; after)", rows, "lrrrrrr"),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = cli("python -m bench.beforeafter", __doc__)
    parser.add_argument("--before", default=BEFORE, help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=12.0, help="measured time per run")
    parser.add_argument(
        "--images", nargs="+", choices=list(IMAGES), default=list(IMAGES), help="which images"
    )
    args = parse(parser, argv)
    machine = describe_machine()
    plan = LoadPlan(closed_s=args.seconds)
    after = Side("after", MODEL_STORE, REPO / "config" / "config.properties",
                 REPO / "config" / "metrics.yaml")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-beforeafter-") as folder, ExitStack() as up:
        work = Path(folder)
        before = build_before(up.enter_context(checked_out(args.before, work / "tree")), work)
        servers = {s.name: up.enter_context(server_of(s, work)) for s in (before, after)}
        served = {name: precision(server) for name, server in servers.items()}
        runs = measure(servers, max(1, args.rounds), plan, args.images)
    return publish(args.out / "before-after.md", report(runs, args.before, served, machine))


if __name__ == "__main__":
    raise SystemExit(main())
