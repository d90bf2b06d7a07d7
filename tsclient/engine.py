"""Which engine answers at a URL: TorchServe or Triton (``detect``), for the commands that
speak to both and for the TorchServe-only ones that must say "not available on Triton".

Triton names itself in its server metadata (``GET /v2``: ``{"name": "triton", ...}``) and,
when that API is restricted to a key, refuses it with its own 403 text; TorchServe has no
``/v2`` of its own on its management port and none that says "triton" on its inference port.
The check sends no key: a key never goes to a server before it is known which one it is.
"""

from __future__ import annotations

from enum import Enum

import requests

from tsclient import errors

TIMEOUT_S = 10.0


class Engine(str, Enum):
    TORCHSERVE = "torchserve"
    TRITON = "triton"


def detect(url: str, session: requests.Session | None = None, timeout: float = TIMEOUT_S) -> Engine:
    """The engine serving ``url`` (a server's base URL, without ``/v2``); ``ServerNotRunning``
    when nothing answers there."""
    try:
        response = (session or requests).get(url.rstrip("/") + "/v2", timeout=timeout)
    except requests.ConnectionError:
        raise errors.ServerNotRunning(
            f"nothing answers at {url}", "check the URL and that the server is running"
        ) from None
    if errors.is_restricted(response):
        return Engine.TRITON
    try:
        name = response.json().get("name") if response.status_code == 200 else None
    except (ValueError, AttributeError):
        name = None
    return Engine.TRITON if name == "triton" else Engine.TORCHSERVE
