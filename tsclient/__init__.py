"""The client package's old name, kept for one release: ``serveclient`` was ``tsclient`` until
issue #50 (it is a client of TorchServe and Triton alike). ``import tsclient`` and ``from
tsclient.torchserve import TorchServeClient`` still work, with a ``DeprecationWarning``: each
``tsclient.X`` is the module ``serveclient.X`` itself (one object under two names, so that
``isinstance`` and ``except`` agree). No module of this repository imports it; the ``tsctl``
command keeps its name.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

from serveclient import *  # noqa: F403 - the old name's public API is the new one's
from serveclient import __all__ as __all__

NEW = "serveclient"
warnings.warn(
    f"the tsclient package is now {NEW}: import {NEW} (tsclient goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``tsclient.X`` (after every other finder) and loads it as ``serveclient.X``."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path=None, target=None):
        if not fullname.startswith(f"{__name__}."):
            return None
        if importlib.util.find_spec(NEW + fullname.removeprefix(__name__)) is None:
            return None  # "No module named tsclient.X", as for any missing module
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(NEW + spec.name.removeprefix(__name__))
        self._specs[spec.name] = module.__spec__  # the import system overwrites it
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (it ran under its own name); its own spec back."""
        module.__spec__ = self._specs.pop(module.__spec__.name if module.__spec__ else "", None)


# First: an aliased package's ``__path__`` is serveclient's folder, where the path finder would
# load a second copy of each submodule under the old name. Nothing is found in this folder.
__path__.clear()  # noqa: F405 - this package's own, not a star-imported name
sys.meta_path.insert(0, _Alias())
