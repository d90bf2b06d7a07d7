"""Our core with its two costly steps made no-ops: what an engine plus our adapter, parsing,
admission, batching and encoding cost per request, without any image work.

``null_core(build)`` calls ``build`` (an adapter's own ``initialize``, which constructs
``ImageModel``) with the backend loader replaced by ``null_backend`` (no model file is read),
then replaces the model's decode with one that writes nothing (the batch's row is left as it
is; without a row to write, it hands back a fixed tensor). Everything else is the core as it
serves: each request parsed, its images' headers read and checked against the limits, the
batch admitted within its budgets and its tensor made, answers built and encoded.
"""

from __future__ import annotations

from collections.abc import Callable
from unittest import mock

import torch

from bench.null import fixed
from model_files.recipe import ROW
from servecore import service
from servecore.backends import Backend
from servecore.precision import Choice


def null_backend(*_args, **_kwargs) -> tuple[Backend, Choice]:
    """``servecore.autoprecision.serving_backend``'s place: a backend that answers the fixed
    embedding (and zero logits) for every row, and the choice that says so."""
    row = torch.from_numpy(fixed.embedding())

    def forward(pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = len(pixels)
        return row.expand(rows, -1), torch.zeros(rows, fixed.CLASSES)

    backend = Backend("null", fixed.PRECISION, "none", "cpu", forward, torch_threads=False)
    return backend, Choice(fixed.PRECISION, "a null model for the engine ceiling benchmark")


def null_core(build: Callable[[], None], model: Callable[[], service.ImageModel]) -> None:
    """Run ``build`` with no backend loaded, then make ``model()``'s decode a no-op."""
    with mock.patch.object(service, "serving_backend", null_backend):
        build()
    pixels = torch.zeros(ROW, dtype=torch.uint8)

    def decode(_opened: object, out: torch.Tensor | None = None) -> torch.Tensor:
        # The batch's row as it is: writing pixels into it is a real decode's own work.
        return pixels if out is None else out

    model().intake.preprocessor.decode = decode  # type: ignore[method-assign]
