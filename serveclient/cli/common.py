"""What every tsctl command shares: how a command joins the parser (``Commands``), the options
that name and reach a server (``url_arguments``, ``endpoint_arguments``) the client made
from them (``make_client``), and ``wrote_page`` for the commands that write an HTML page.

A command is a function ``(client, args) -> (data for --json, text for humans, exit code)``;
text ``None`` means the command drew its own screen (``top``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from serveclient import errors
from serveclient.client import Client, TorchServeClient, connect
from serveclient.engine import not_on_triton
from serveshared import ports
from serveshared.keys import KEY_FILE, Keys

Command = Callable[[Client, argparse.Namespace], tuple[Any, "str | None", int]]

DEFAULT_MODELS = {"embedding": "resnet50-embedding", "tags": "resnet50-tagger"}

URL_HELP = (
    "a server other than the local TorchServe: a KServe endpoint "
    "(https://resnet50.default.example.com) or Triton (http://127.0.0.1:8000)"
)

TRITON_URL_HELP = (
    "a Triton server (make serve-triton: http://127.0.0.1:8000) instead of the local TorchServe"
)


class Commands:
    """The subcommands of one parser. ``add`` declares one: its parser also takes the options
    accepted after any command's name (``after``: ``--json``), ``args.func`` is ``run``, and
    ``needs_management`` marks a command that reads a server's management and metrics APIs,
    which a TorchServe reached by ``--url`` alone does not offer (``make_client`` refuses)."""

    def __init__(
        self, subparsers: argparse._SubParsersAction, after: argparse.ArgumentParser
    ) -> None:
        self._subparsers = subparsers
        self._after = after

    def add(
        self, name: str, run: Command, *, needs_management: bool = False, **kwargs: Any
    ) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = self._subparsers.add_parser(
            name, parents=[self._after], **kwargs
        )
        parser.set_defaults(func=run, needs_management=needs_management)
        return parser


def url_arguments(c: argparse.ArgumentParser, what: str = URL_HELP) -> None:
    """``--url`` (a server reached by its URL alone) and how to authenticate to it."""
    c.add_argument("--url", help=what)
    c.add_argument(
        "--token-env",
        default="TSCTL_TOKEN",
        help="with --url: the environment variable holding a bearer token",
    )
    c.add_argument(
        "--ca-bundle",
        help="with --url: CA certificates to verify TLS with (verification is always on)",
    )


def work_dir_argument(c: argparse.ArgumentParser, what: str) -> None:
    """``--work-dir``: where ``what`` (local copies of s3:// objects) are kept."""
    from serveclient.objectstore import WORK_DIR

    c.add_argument("--work-dir", type=Path, default=WORK_DIR, help=f"{what} ({WORK_DIR})")


def endpoint_arguments(c: argparse.ArgumentParser) -> None:
    """``url_arguments`` for a KServe endpoint, and the KServe protocol to speak to it."""
    url_arguments(
        c,
        "a KServe endpoint of this runtime instead of the local server, e.g. "
        "https://resnet50.default.example.com",
    )
    c.add_argument(
        "--protocol",
        choices=("v2", "v1"),
        default="v2",
        help="KServe protocol of the requests (v2)",
    )


def make_client(args: argparse.Namespace) -> Client:
    """The local TorchServe with its key file; or whatever engine serves ``--url``
    (``client.connect``: TorchServe behind KServe, or Triton) with the keys of ``--key-file``
    when given, else a bearer token from the environment, else (a Triton) the key file
    ``make serve-triton`` wrote; TLS verified. ``UsageError`` for a command that needs the
    management API (``Commands.add``) at a ``--url`` that does not reach it."""
    if getattr(args, "url", None) is None:
        return TorchServeClient(
            args.inference_url,
            args.management_url,
            args.metrics_url or ports.METRICS_URL,
            key_file=args.key_file or KEY_FILE,
            timeout=args.timeout,
        )
    token = os.environ.get(args.token_env, "")
    client = connect(
        args.url,
        args.metrics_url,
        key_file=args.key_file,
        keys=None if args.key_file else Keys(token, token),
        timeout=args.timeout,
        verify=args.ca_bundle or True,
    )
    if getattr(args, "needs_management", False) and not client.reaches_management:
        raise errors.UsageError(
            f"{args.command} --url reads a Triton server (make serve-triton); TorchServe's "
            f"{args.command} reads its management and metrics APIs",
            "drop --url (and give --management-url/--metrics-url if it is not local)",
        )
    return client


def managing(client: Client, command: str) -> TorchServeClient:
    """``client`` for one of TorchServe's management commands (``register``, ``scale``,
    ``set-default``, ``unregister``, key rotation): only TorchServe's client manages; another
    engine's refuses ``command`` before anything is sent, saying what to do there instead."""
    if isinstance(client, TorchServeClient):
        return client
    raise not_on_triton(command)


def wrote_page(path: Path, html: str) -> str:
    """Write ``html`` to ``path``; the line that says so."""
    from serveclient import pages

    size = pages.write(path, html)
    return f"wrote {path} ({size / 1e6:.1f} MB; open it in a browser)"


def read_image(path: Path | str) -> bytes:
    """A file's bytes, or the usage error that names it."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise errors.UsageError(
            f"cannot read {path}: {exc.strerror}", "check the file path"
        ) from None
