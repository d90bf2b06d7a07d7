"""A Milvus Lite server process on a free loopback port (``milvus-lite server``, the
milvus-lite wheel's own command), reached at ``http://127.0.0.1:PORT`` exactly as a Milvus
Standalone is: what the Milvus tests and ``make bench-search`` search through.

    with milvus_lite(folder) as server:
        milvusindex.build([parquet], server.uri, "photos")

Milvus Lite has no authentication ("No authentication, users, roles, RBAC, or TLS", its
README). ``milvus_lite(folder, token=...)`` runs its servicer behind ``Authenticating``
(``python -m devtools.milvus``): every call is checked as Milvus Standalone with
``common.security.authorizationEnabled`` checks it, refused with its status and words.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from devtools.server import free_port

START_S = 60  # a pure-Python gRPC server: up in about a second here


@dataclass(frozen=True)
class Lite:
    """A running Milvus Lite server: where tsctl reaches it, and its process (for its memory)."""

    uri: str
    pid: int


@contextlib.contextmanager
def milvus_lite(folder: Path, token: str | None = None) -> Iterator[Lite]:
    """Start the server on its data in ``folder/db`` (its log ``folder/milvus.log``); with
    ``token``, authentication on (``Authenticating``; the token handed over in a file). Stopped
    on leaving, whatever happens; RuntimeError naming the log when it does not start."""
    import tenacity
    from pymilvus import MilvusClient
    from pymilvus.exceptions import MilvusException

    from serveclient.search.milvusindex import KEEPALIVE

    exe = shutil.which("milvus-lite", path=str(Path(sys.executable).parent))
    if exe is None:
        raise RuntimeError("no milvus-lite beside this Python: `make setup` installs it")
    port = free_port()
    log_path = folder / "milvus.log"
    command = [exe, "server"]
    if token is not None:
        (folder / "token").write_text(token)
        command = [sys.executable, "-m", "devtools.milvus", "--token-file", str(folder / "token")]
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [*command, "--data-dir", str(folder / "db"), "--host", "127.0.0.1",
             "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parent.parent,
        )  # fmt: skip
        uri = f"http://127.0.0.1:{port}"
        try:
            ready = tenacity.Retrying(
                stop=tenacity.stop_after_delay(START_S),
                wait=tenacity.wait_fixed(0.2),
                retry=tenacity.retry_if_exception_type(MilvusException),  # not listening yet
                reraise=True,
            )
            for attempt in ready:
                with attempt:
                    if proc.poll() is not None:
                        raise RuntimeError(f"milvus-lite exited {proc.returncode}: see {log_path}")
                    # pymilvus shares one connection per address in a process, made with the
                    # options of its first client: this one's, in a test session, so tsctl's
                    # keep-alive, not pymilvus's 10 s pings that Milvus answers with GOAWAY.
                    client = MilvusClient(
                        uri=uri, token=token or "", timeout=2, grpc_options=KEEPALIVE
                    )
                    try:
                        client.list_collections()
                    finally:
                        client.close()
            yield Lite(uri, proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class Authenticating(grpc.ServerInterceptor):
    """A gRPC server interceptor that checks each call as Milvus's proxy does with
    authentication on (internal/proxy/authentication_interceptor.go): the ``authorization``
    header must be base64 of the token; missing or wrong, the call ends UNAUTHENTICATED with
    Milvus's own words."""

    def __init__(self, token: str) -> None:
        self._header = base64.b64encode(token.encode()).decode()

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        sent = dict(details.invocation_metadata).get("authorization")
        if sent == self._header:
            return continuation(details)
        reason = (
            "missing authorization in header"
            if sent is None
            else "auth check failure, please check username and password are correct"
        )

        def refuse(request: Any, context: Any) -> None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

        return grpc.unary_unary_rpc_method_handler(refuse)


def main(argv: list[str] | None = None) -> None:
    """``python -m devtools.milvus --token-file F --data-dir D [--host H] [--port P]``: Milvus
    Lite's servicer on its data, behind ``Authenticating`` with the token in F; until killed."""
    from concurrent import futures

    from milvus_lite.adapter.grpc.servicer import MilvusServicer
    from milvus_lite.db import MilvusLite
    from pymilvus.grpc_gen import milvus_pb2_grpc

    parser = argparse.ArgumentParser(prog="python -m devtools.milvus")
    parser.add_argument("--token-file", type=Path, required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    big = 256 * 1024 * 1024  # as milvus-lite's own server (and Milvus Standalone)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=10),
        interceptors=[Authenticating(args.token_file.read_text())],
        options=[("grpc.max_receive_message_length", big), ("grpc.max_send_message_length", big)],
    )
    servicer = MilvusServicer(MilvusLite(args.data_dir))
    milvus_pb2_grpc.add_MilvusServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"{args.host}:{args.port}")
    server.start()
    print(f"Milvus Lite with authentication on {args.host}:{args.port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
