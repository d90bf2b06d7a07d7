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

from serveclient import errors

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


# What each TorchServe-only command would be on Triton, and how to do it there instead.
NOT_ON_TRITON = {
    "register": "Triton loads the models of its repository at start (model control mode "
    "none): add config/models/NAME.yaml, then `make triton-repo` and restart it",
    "unregister": "Triton serves every model of its repository: remove config/models/NAME.yaml, "
    "then `make triton-repo` and restart it",
    "scale": "a model's instances are instance_group in its config.pbtxt, from minWorkers in "
    "config/models/NAME.yaml: edit it, then `make triton-repo` and restart Triton",
    "set-default": "the generated repository holds one version per model, which Triton serves",
    "keys": "Triton reads its keys at start and cannot rotate them: restart it with "
    "`python -m tritonrepo.server --new-keys` (clients re-read the key file)",
}


def not_on_triton(command: str) -> errors.NotOnTriton:
    """The error for ``command`` (a TorchServe-only tsctl command) asked of Triton."""
    return errors.NotOnTriton(f"not available on Triton: {command}", NOT_ON_TRITON[command])
