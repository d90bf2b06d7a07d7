"""The earlier management-only client, kept for code that imports it: a ``TorchServeClient``
with one fixed management key (no key file, so no rotation). Use ``tsclient.TorchServeClient``
and the ``tsctl`` command instead."""
from __future__ import annotations

from tsclient.client import TorchServeClient
from tsclient.errors import ApiError as ManagementError
from tsclient.keys import Keys

__all__ = ["ManagementClient", "ManagementError"]


class ManagementClient(TorchServeClient):
    """Calls the management API at ``url`` with ``key``."""

    def __init__(self, url: str, key: str, timeout: float = 300.0) -> None:
        super().__init__(management_url=url, keys=Keys(inference="", management=key),
                         timeout=timeout)
