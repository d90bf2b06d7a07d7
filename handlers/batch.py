"""The state one batch carries from ``preprocess`` through ``inference`` to ``postprocess``.

(Kept out of the handler module: TorchServe requires the handler module to define exactly one
class.)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from handlers.codec import ParsedRequest
from handlers.errors import RequestError


@dataclass
class Slot:
    """One request of the batch: what it asked for, or why it failed, and which rows of the
    batch tensor are its images (``start`` .. ``start + count``)."""

    request: ParsedRequest | None = None
    error: RequestError | None = None
    start: int = 0
    count: int = 0

    @property
    def rows(self) -> range:
        return range(self.start, self.start + self.count)


@dataclass
class PreparedBatch:
    """The batch's requests in arrival order, the stacked images of the good ones (None when
    every request failed), and the model outputs once ``inference`` has run."""

    slots: list[Slot]
    pixels: torch.Tensor | None
    embedding: torch.Tensor | None = None
    logits: torch.Tensor | None = None
