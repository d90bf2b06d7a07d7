"""The Python API over a running server, whichever engine serves it: ``Client`` (the interface),
its two implementations, ``TorchServeClient`` and ``TritonClient``, and ``connect``, which
chooses between them once, from what the server at a URL says it is.

    from serveclient.client import TorchServeClient, connect

    client = TorchServeClient()                # the local TorchServe, ./key_file.json
    client = connect("http://127.0.0.1:8000")  # whatever answers there (here: Triton)
    client.infer("resnet50-embedding", [open("cat.jpg", "rb").read()])
"""

from __future__ import annotations

from pathlib import Path

from serveclient.base import (
    MAX_NAME,
    TIMEOUT_S,
    Answers,
    Client,
    check_name,
    is_loopback,
    new_session,
)
from serveclient.engine import Engine, detect
from serveclient.torchserve import TorchServeClient, check_archive
from serveclient.triton import TritonClient
from serveshared.keys import Keys

__all__ = [
    "MAX_NAME",
    "TIMEOUT_S",
    "Answers",
    "Client",
    "TorchServeClient",
    "TritonClient",
    "check_archive",
    "check_name",
    "connect",
    "is_loopback",
]

IMPLEMENTATIONS: dict[Engine, type[TorchServeClient] | type[TritonClient]] = {
    Engine.TORCHSERVE: TorchServeClient,
    Engine.TRITON: TritonClient,
}


def connect(
    url: str,
    metrics_url: str | None = None,
    *,
    key_file: Path | str | None = None,
    keys: Keys | None = None,
    timeout: float = TIMEOUT_S,
    verify: bool | str = True,
) -> Client:
    """The client for the engine at ``url`` (asked once, without a key: ``engine.detect``),
    with ``key_file`` or ``keys`` (each engine finds its own key file when given neither) and
    TLS verified against ``verify`` (a CA bundle's path, or True)."""
    # The session every later call to ``url`` gets: no proxy to a loopback server.
    engine = detect(url, new_session(is_loopback(url), verify))
    client = IMPLEMENTATIONS[engine].at(
        url, metrics_url, key_file=key_file, keys=keys, timeout=timeout
    )
    client.verify(verify)
    return client
