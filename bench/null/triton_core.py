"""Triton through our adapter (``tritonrepo/model.py``, copied beside this file as
``tritonrepo/model.py``) and core, decode and forward no-ops (``bench.null.core``)."""

from __future__ import annotations

from bench.null.core import null_core
from tritonrepo.model import TritonPythonModel as Adapter


class TritonPythonModel(Adapter):
    """Our adapter with the null backend and no decoding."""

    def initialize(self, args: dict) -> None:
        null_core(lambda: super(TritonPythonModel, self).initialize(args), lambda: self.model)
