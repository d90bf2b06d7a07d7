"""Client side of a running TorchServe: the Python API (``TorchServeClient``), its keys and
errors, and the ``tsctl`` command line (``tsclient.cli``)."""

from serveshared.keys import Keys
from tsclient.client import TorchServeClient, check_archive, check_name
from tsclient.errors import TsError

__all__ = ["Keys", "TorchServeClient", "TsError", "check_archive", "check_name"]
