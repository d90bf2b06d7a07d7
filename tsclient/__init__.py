"""Client side of a running TorchServe: the Python API (``TorchServeClient``), its keys and
errors, and the ``tsctl`` command line (``tsclient.cli``)."""

from tsclient.client import TorchServeClient, check_archive, check_name
from tsclient.errors import TsError
from tsclient.keys import Keys

__all__ = ["Keys", "TorchServeClient", "TsError", "check_archive", "check_name"]
