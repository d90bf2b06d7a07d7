"""TorchServe through our handler and core, decode and forward no-ops (``bench.null.core``)."""

from __future__ import annotations

from bench.null.core import null_core
from handlers.resnet_handler import ResNetHandler


class NullCoreHandler(ResNetHandler):
    """``ResNetHandler`` with the null backend and no decoding."""

    def initialize(self, context) -> None:
        null_core(lambda: super(NullCoreHandler, self).initialize(context), lambda: self.model)
