"""tsctl's view of a running server: ``health``, ``metrics``, ``top`` (live) and ``keys``
(expiry, rotation, a valid key for scripts)."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from typing import Any

from serveclient.cli.common import Commands, managing, url_arguments
from serveclient.client import Client
from serveshared.keys import KINDS

ROTATE_MARGIN_S = 60.0  # `keys --print` hands out keys that live at least this long


def register(commands: Commands) -> None:
    """Add this module's commands to ``commands``."""
    url_arguments(commands.add("health", cmd_health, help="is the server up and every model READY"))
    k = commands.add("keys", cmd_keys, help="key expiry; rotate keys")
    k.add_argument("--rotate", choices=[*KINDS, "all"])
    k.add_argument(
        "--print",
        choices=KINDS,
        help="print a valid key (rotated first when it expires within a minute), "
        "e.g. KEY=$(tsctl keys --print inference)",
    )
    url_arguments(k)
    url_arguments(
        commands.add(
            "metrics", cmd_metrics, help="batch sizes, requests, errors and latency per model"
        )
    )
    t = commands.add(
        "top",
        cmd_top,
        needs_management=True,
        help="live per-model rates, latency, batches, errors and workers (q quits)",
    )
    t.add_argument("--once", action="store_true", help="print one frame and exit")
    t.add_argument(
        "--interval",
        type=float,
        default=2.0,
        help="seconds between frames, and the span each one measures (2)",
    )
    url_arguments(
        t,
        "a Triton server (make serve-triton: http://127.0.0.1:8000; its metrics "
        "from the same host's port 8002 unless --metrics-url names them)",
    )


def cmd_health(client: Client, args: argparse.Namespace) -> tuple[Any, str, int]:
    data, lines, code = client.health_report()
    return data, "\n".join(lines), code


def cmd_metrics(client: Client, args: argparse.Namespace) -> tuple[Any, str, int]:
    data, lines, code = client.metrics_report()
    return data, "\n".join(lines), code


def cmd_top(client: Client, args: argparse.Namespace) -> tuple[Any, str | None, int]:
    """``--once``: one frame as text; else the live screen until q (text ``None``)."""
    from serveclient import top

    if args.once:
        text = top.once(client, args.interval)
        return text, text, 0
    return None, None, top.run(client, interval=args.interval)


def cmd_keys(client: Client, args: argparse.Namespace) -> tuple[Any, str, int]:
    """Each key's expiry; ``--rotate`` first; ``--print``: one key, alone, valid for at least
    ``ROTATE_MARGIN_S``."""
    if args.rotate:
        for kind in KINDS if args.rotate == "all" else (args.rotate,):
            managing(client, "keys").rotate(kind)
    keys = client.keys
    if args.print:
        if keys.expired(args.print, ROTATE_MARGIN_S):
            keys = managing(client, "keys").rotate(args.print)
        return keys.key(args.print), keys.key(args.print), 0
    now = datetime.now(timezone.utc)
    data, lines = {}, [f"key file: {client.key_file.resolve() if client.key_file else '-'}"]
    for kind in KINDS:
        expires = keys.expires(kind)
        left = (expires - now).total_seconds() if expires else None
        data[kind] = {
            "expires": expires.isoformat() if expires else None,
            "seconds_left": round(left) if left is not None else None,
            "expired": left is not None and left <= 0,
        }
        state = (
            f"EXPIRED (tsctl rotates it on its next call; `tsctl keys --rotate {kind}` now)"
            if data[kind]["expired"]
            else f"{_duration(left)} left"
            if left is not None
            else "no expiry: kept until the server restarts with new keys"
        )
        lines.append(f"{kind}: expires {data[kind]['expires']} ({state})")
    lines.append("API key: never expires (rotates the other two)")
    if args.rotate:
        lines.insert(0, f"rotated: {args.rotate}")
    return data, "\n".join(lines), 0


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown time"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
