"""tsctl's model management: ``list``, ``describe``, ``register``, ``scale``, ``set-default``,
``unregister``. Changes go through the management API and are not kept across a restart
(``RESTART_NOTE``); on Triton, the changing ones answer ``NotOnTriton`` (exit 6)."""

from __future__ import annotations

import argparse
from typing import Any

from tabulate import tabulate

from serveclient.base import version_row
from serveclient.cli.common import TRITON_URL_HELP, Commands, managing, url_arguments
from serveclient.client import Client
from serveclient.progress import waiting

RESTART_NOTE = (
    "not kept across a restart: `make serve` starts from config/ (--ncs); to keep "
    "it, put it in config/models/{name}.yaml and run `make config`"
)


def register(commands: Commands) -> None:
    """Add this module's commands to ``commands``."""
    url_arguments(commands.add("list", cmd_list, help="registered models, versions and workers"))
    d = commands.add(
        "describe",
        cmd_describe,
        needs_management=True,
        help="one model's versions, workers, settings, weights",
    )
    d.add_argument("name")
    d.add_argument("version", nargs="?")
    url_arguments(d, TRITON_URL_HELP)
    r = commands.add(
        "register", cmd_register, help="register an archive from the model store and wait"
    )
    r.add_argument(
        "archive", help="file name in the model store (or a URL allowed by allowed_urls)"
    )
    r.add_argument("--name", help="model name (default: the archive's)")
    r.add_argument("--batch-size", type=int)
    r.add_argument("--max-batch-delay", type=int, help="milliseconds")
    r.add_argument("--workers", type=int, help="exactly this many workers (default: the YAML's)")
    url_arguments(r)
    s = commands.add("scale", cmd_scale, help="set a model's worker count and wait")
    s.add_argument("name")
    s.add_argument("--min", type=int, required=True)
    s.add_argument("--max", type=int)
    s.add_argument("--version")
    url_arguments(s)
    sd = commands.add("set-default", cmd_set_default, help="what /predictions/NAME serves")
    sd.add_argument("name")
    sd.add_argument("version")
    url_arguments(sd)
    u = commands.add("unregister", cmd_unregister, help="remove a model or one version")
    u.add_argument("name")
    u.add_argument("version", nargs="?")
    url_arguments(u)


def cmd_list(client: Client, args: argparse.Namespace) -> tuple[Any, str, int]:
    rows = client.model_rows()
    text = (
        tabulate(
            [
                [
                    r["model"],
                    r["version"],
                    "*" if r["default"] else "",
                    r["workers"],
                    r["batchSize"],
                    r["maxBatchDelay"],
                ]
                for r in rows
            ],
            headers=["model", "version", "default", "workers", "batch", "delay ms"],
            tablefmt="plain",
            disable_numparse=True,
        )
        if rows
        else "no models"
    )
    return rows, text, 0


def cmd_describe(client: Client, args: argparse.Namespace) -> tuple[Any, str, int]:
    entries = client.describe(args.name, args.version)
    # Only a single-version describe carries the handler's metadata (weights, top_k).
    custom = client.describe(args.name, args.version, customized=True)[0]
    lines = []
    for entry in entries:
        lines.append(
            _version_line(entry) + f", min/max workers {entry.get('minWorkers')}/"
            f"{entry.get('maxWorkers')}"
            + (f", archive {entry['modelUrl']}" if entry.get("modelUrl") else "")
        )
        meta = custom.get("customizedMetadata")
        if entry.get("modelVersion") == custom.get("modelVersion") and isinstance(meta, dict):
            entry["customizedMetadata"] = meta
            weights = meta.get("weights", {})
            lines.append(
                f"  weights {weights.get('source')} (trained: {weights.get('trained')}), "
                f"backend {meta.get('backend')}, top_k "
                f"{meta.get('handler', {}).get('top_k')}"
            )
            if isinstance(meta.get("precision_choice"), dict):
                lines.append(f"  precision {meta['precision_choice'].get('summary')}")
    return entries, "\n".join(lines), 0


def cmd_register(client: Client, args: argparse.Namespace) -> tuple[Any, str, int]:
    answer = waiting(
        f"registering {args.archive}",
        lambda: managing(client, "register").register(
            args.archive,
            name=args.name,
            workers=args.workers,
            batch_size=args.batch_size,
            max_batch_delay=args.max_batch_delay,
        ),
    )
    name = answer.get("model")
    described = client.describe(name) if name else []
    text = answer.get("status", "registered")
    for entry in described:
        text += "\n" + _version_line(entry)
    text += "\nnote: " + RESTART_NOTE.format(name=name or "NAME")
    return {"status": answer.get("status"), "model": name, "versions": described}, text, 0


def cmd_scale(client: Client, args: argparse.Namespace) -> tuple[Any, str, int]:
    answer = waiting(
        f"scaling {args.name}",
        lambda: managing(client, "scale").scale(args.name, args.min, args.max, args.version),
    )
    return (
        answer,
        (answer.get("status", "scaled") + "\nnote: " + RESTART_NOTE.format(name=args.name)),
        0,
    )


def cmd_set_default(client: Client, args: argparse.Namespace) -> tuple[Any, str, int]:
    answer = managing(client, "set-default").set_default(args.name, args.version)
    return answer, answer.get("status", "done"), 0


def cmd_unregister(client: Client, args: argparse.Namespace) -> tuple[Any, str, int]:
    answer = managing(client, "unregister").unregister(args.name, args.version)
    return answer, answer.get("status", "done"), 0


def _version_line(entry: dict) -> str:
    row = version_row(entry)
    return (
        f"{row['model']} {row['version']}{' (default)' if row['default'] else ''}: "
        f"{row['workers']} workers, batch {row['batchSize']}, delay {row['maxBatchDelay']} ms"
    )
