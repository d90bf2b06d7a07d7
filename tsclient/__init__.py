"""Client side of a running server (TorchServe or Triton): the Python API (``Client``, chosen by
``connect``; ``TorchServeClient``, ``TritonClient``), its keys and errors, and the ``tsctl``
command line (``tsclient.cli``)."""

from serveshared.keys import Keys
from tsclient.client import (
    Client,
    TorchServeClient,
    TritonClient,
    check_archive,
    check_name,
    connect,
)
from tsclient.errors import ServeError, TsError

__all__ = [
    "Client",
    "Keys",
    "ServeError",
    "TorchServeClient",
    "TritonClient",
    "TsError",
    "check_archive",
    "check_name",
    "connect",
]
