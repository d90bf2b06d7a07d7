"""What every tsctl command shares: how a command joins the parser (``Commands``), the options
that name and reach a server (``url_arguments``, ``endpoint_arguments``) the client made
from them (``make_client``), a Milvus URI's token (``milvus_token_argument``, ``milvus_token``),
and ``wrote_page`` for the commands that write an HTML page.

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
from serveclient.collection import MAX_FILE_BYTES, read_file
from serveclient.engine import not_on_triton
from serveclient.jobs import DEFAULT_MODELS as DEFAULT_MODELS  # the commands' defaults
from serveshared import ports
from serveshared.keys import KEY_FILE, Keys

Command = Callable[[Client, argparse.Namespace], tuple[Any, "str | None", int]]

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


MILVUS_TOKEN_ENV = "MILVUS_TOKEN"
TOKEN_BYTES = 4096  # user:password (Milvus allows 72 bytes of password) or an API key, with room


def milvus_token_argument(c: argparse.ArgumentParser) -> None:
    """``--milvus-token-file``: where the token of a Milvus URI is read from. There is no option
    that takes the token itself: every user of the host reads a process's argv in /proc."""
    c.add_argument(
        "--milvus-token-file",
        type=Path,
        metavar="PATH",
        help=f"with a Milvus URI: a file holding its token, user:password (else "
        f"${MILVUS_TOKEN_ENV}); never give the token itself on the command line",
    )


def milvus_token(args: argparse.Namespace) -> str | None:
    """The token of ``--milvus-token-file`` (the file's text, whitespace at its ends dropped),
    else ``$MILVUS_TOKEN``, else None (Milvus without authentication). ``MilvusTokenError`` for
    a file that is not a readable regular file of at most ``TOKEN_BYTES`` holding a token; no
    message quotes what the file holds."""
    path = args.milvus_token_file
    if path is None:
        return os.environ.get(MILVUS_TOKEN_ENV) or None
    hint = f"write the token (user:password) into a file and name it, or set ${MILVUS_TOKEN_ENV}"
    if not path.is_file():
        # Named as given unless it may be the token itself, mistyped into the option.
        shown = "the path given" if ":" in str(path) else str(path)
        raise errors.MilvusTokenError(f"--milvus-token-file: {shown} is not a file", hint)
    try:
        with path.open("rb") as f:
            data = f.read(TOKEN_BYTES + 1)
    except OSError as exc:
        raise errors.MilvusTokenError(f"cannot read {path}: {exc.strerror}", hint) from None
    token = data.decode("utf-8", "replace").strip()
    if not token or len(data) > TOKEN_BYTES:
        found = "nothing" if not token else f"more than {TOKEN_BYTES} bytes"
        raise errors.MilvusTokenError(f"{path} holds {found}, not a Milvus token", hint)
    return token


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
    """A file's bytes as ``collection.read_file`` reads them (a regular file of at most
    ``MAX_FILE_BYTES``; a FIFO never blocks), or the usage error that names it."""
    try:
        return read_file(path)[0]
    except (OSError, ValueError) as exc:
        raise errors.UsageError(
            f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}",
            f"check the file path: an image, a regular file of {MAX_FILE_BYTES >> 20} MiB at most",
        ) from None
