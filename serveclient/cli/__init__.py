"""``tsctl``: operate a running TorchServe or Triton from the shell.

    tsctl list | describe NAME [VERSION] | health | metrics | top [--once] [--interval S]
    tsctl list | health | metrics | describe NAME | explain ... | top ... --url TRITON_URL
          [--key-file build/triton-key_file.json]          (Triton: make serve-triton)
    tsctl keys [--rotate inference|management|all] [--print inference|management]
    tsctl register ARCHIVE [--name N] [--batch-size B] [--max-batch-delay MS] [--workers W]
    tsctl scale NAME --min N [--max M] | set-default NAME VERSION | unregister NAME [VERSION]
    tsctl embed FILE|FOLDER|-... [--out embeddings.parquet] [--shard i/n] [--verify-sha256]
                 [--priority bulk|interactive] [--wait]
    tsctl tag FILE|FOLDER|-... [--topk K] [--out tags.parquet]    (no --out: print the tags)
    tsctl similar QUERY... --index embeddings.parquet [-k 10] [--html similar.html]
                 [--deadline-ms MS]
    tsctl duplicates --index ... [--threshold 0.97] [--max-pairs N] [--html duplicates.html]
    tsctl index build PARQUET... --out FOLDER|MILVUS_URI [--wait] [--milvus-token-file F]
    tsctl explain FILE [--model M] [--target T | --topk K] [--method M] [--n-steps N]
                 [--out heatmap.png]
    tsctl head train FOLDER --out DIR [--backbone build/weights/resnet50.pt] [--seed S] [--wait]
    tsctl explain FILE|FOLDER... --html gallery.html [--target T | --topk K] [--method M]

Human-readable output by default, ``--json`` (before or after the command) for scripts.
``embed``/``tag`` work through whole collections, resumably (serveclient.jobs;
docs/operations.md, "Embed a collection"), as ``bulk`` traffic unless ``--priority
interactive``. Exit codes: 0 ok, 1 other server error, 2 bad arguments (including names
TorchServe cannot route), 3 server not running, 4 key file missing or key refused, 5 unknown
model or version, 6 refused by the server (registration outside the allowed sources, a name
already registered, removing the default version, an API switched off, a TorchServe-only command
pointed at Triton), 7 unhealthy (a model without a READY worker, or some files failed in
``tag``/``embed``), 8 another run holds the output's lock (``embed``, ``index build``,
``head train``: ``--wait`` queues behind it; serveclient.outputlock), 130 interrupted
(Ctrl-C: what was answered is kept; rerun to resume).
"""

# The package: common.py (the options and client every command shares), one module per group of
# commands (models.py, batch.py, similar.py, ops.py, explain.py, head.py), each declaring its
# commands' options beside their code in register(commands); jobs.py reads the collection and
# the job options that tag, embed, explain --html and head train pass to serveclient.jobs;
# __main__.py is ``python -m serveclient.cli``. This module builds the top-level parser and
# dispatches.

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys

from serveclient import errors
from serveclient.cli import batch, explain, head, models, ops, similar
from serveclient.cli.common import Commands, make_client
from serveclient.client import TIMEOUT_S
from serveshared import ports
from serveshared.keys import KEY_FILE

__all__ = ["main", "make_client", "parser"]

# In the order `tsctl --help` lists them.
GROUPS = (models, batch, similar, ops, explain, head)


def parser() -> argparse.ArgumentParser:
    """tsctl's parser: the common options, then each group's commands (``args.func`` runs the
    command given)."""
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="tsctl",
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for api, default in (("inference", ports.INFERENCE_URL), ("management", ports.MANAGEMENT_URL)):
        p.add_argument(
            f"--{api}-url",
            default=env(f"TSCTL_{api.upper()}_URL", default),
            help=f"default: {default} (or $TSCTL_{api.upper()}_URL)",
        )
    # Unset unless given: with --url their defaults depend on the engine found there.
    p.add_argument(
        "--metrics-url",
        default=env("TSCTL_METRICS_URL"),
        help=f"default: {ports.METRICS_URL}; with --url, Triton's metrics port on "
        "its host (or $TSCTL_METRICS_URL)",
    )
    p.add_argument(
        "--key-file",
        default=env("TSCTL_KEY_FILE"),
        help=f"TorchServe's {KEY_FILE} (default: ./{KEY_FILE}, or $TSCTL_KEY_FILE); "
        "with --url, the keys of that server (else $TSCTL_TOKEN)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument(
        "--timeout", type=float, default=TIMEOUT_S, help=f"seconds per call ({TIMEOUT_S:g})"
    )
    # Also accepted after the command; SUPPRESS keeps a --json given before it.
    after = argparse.ArgumentParser(add_help=False)
    after.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="machine-readable output on stdout",
    )
    commands = Commands(p.add_subparsers(dest="command", required=True, metavar="COMMAND"), after)
    for group in GROUPS:
        group.register(commands)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # One trace per command, unless the caller's TRACEPARENT continues its own (base.new_session)
    os.environ.setdefault("TRACEPARENT", f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01")
    try:
        client = make_client(args)
        try:
            data, text, code = args.func(client, args)
        except errors.ApiError as exc:
            refusal = client.refusal(args.command, exc)
            if refusal is exc:
                raise
            raise refusal from None
    except KeyboardInterrupt:
        print(
            f"tsctl {args.command}: interrupted; what was answered is kept, rerun the same "
            "command to resume",
            file=sys.stderr,
        )
        return 130
    except errors.ServeError as exc:
        if args.json:
            print(
                json.dumps(
                    {"error": exc.message, "hint": exc.hint, "status": getattr(exc, "status", None)}
                )
            )
        print(f"tsctl {args.command}: error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return exc.exit_code
    if text is not None:  # None: the command drew its own screen (top)
        print(json.dumps(data, indent=2) if args.json else text)
    return code
