"""A Milvus Lite server process on a free loopback port (``milvus-lite server``, the
milvus-lite wheel's own command), reached at ``http://127.0.0.1:PORT`` exactly as a Milvus
Standalone is: what the Milvus tests and ``make bench-search`` search through.

    with milvus_lite(folder) as server:
        milvusindex.build([parquet], server.uri, "photos")
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from devtools.server import free_port

START_S = 60  # a pure-Python gRPC server: up in about a second here


@dataclass(frozen=True)
class Lite:
    """A running Milvus Lite server: where tsctl reaches it, and its process (for its memory)."""

    uri: str
    pid: int


@contextlib.contextmanager
def milvus_lite(folder: Path) -> Iterator[Lite]:
    """Start the server on its data in ``folder/db`` (its log ``folder/milvus.log``). Stopped
    on leaving, whatever happens; RuntimeError naming the log when it does not start."""
    import tenacity
    from pymilvus import MilvusClient
    from pymilvus.exceptions import MilvusException

    from serveclient.milvusindex import KEEPALIVE

    exe = shutil.which("milvus-lite", path=str(Path(sys.executable).parent))
    if exe is None:
        raise RuntimeError("no milvus-lite beside this Python: `make setup` installs it")
    port = free_port()
    log_path = folder / "milvus.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [exe, "server", "--data-dir", str(folder / "db"), "--host", "127.0.0.1",
             "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
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
                    client = MilvusClient(uri=uri, timeout=2, grpc_options=KEEPALIVE)
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
