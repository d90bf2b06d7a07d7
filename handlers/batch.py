"""The state one batch carries from ``preprocess`` through ``inference`` to ``postprocess``,
and the rule that admits its requests' work (decoding, explanations) within a budget.

(Kept out of the handler module: TorchServe requires the handler module to define exactly one
class.)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch

from handlers.errors import Overloaded, RequestError
from handlers.images import OpenedImage
from handlers.parse import ParsedRequest


@dataclass
class Slot:
    """One request of the batch: what it asked for, or why it failed, its opened images, which
    rows of the batch tensor are its images (``start`` .. ``start + count``), and the state an
    ``Addon`` keeps for it (None: a plain prediction)."""

    request_id: str = "?"  # TorchServe's, for the logs
    request: ParsedRequest | None = None
    error: RequestError | None = None
    opened: list[OpenedImage] = field(default_factory=list)
    start: int = 0
    count: int = 0
    addon: Any = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def images(self) -> int:
        """The forward rows this request asks for."""
        return len(self.opened)

    @property
    def pixels(self) -> int:
        """The decoding work this request asks for."""
        return sum(image.pixels for image in self.opened)

    @property
    def rows(self) -> range:
        return range(self.start, self.start + self.count)


@dataclass
class PreparedBatch:
    """The batch's requests in arrival order, the stacked images of the good ones (None when
    every request failed), and the model outputs once ``inference`` has run."""

    slots: list[Slot]
    pixels: torch.Tensor | None
    decode_ms: float = 0.0
    embedding: torch.Tensor | None = None
    logits: torch.Tensor | None = None


class Addon(Protocol):
    """A feature that rides on the prediction path (explanations): the intake asks it about
    each request and the batch, so that the prediction path never imports it."""

    def open(self, request: ParsedRequest, explain_route: bool) -> Any:
        """This request's state for the addon (stored as ``Slot.addon``), or None when the
        request is a plain prediction; raises ``RequestError`` to fail the request."""

    def admit(self, slots: Sequence[Slot]) -> None:
        """Fail (``Slot.error``) the opened requests whose addon work this batch has no room
        for."""


def admit(costs: list[int], budget: int) -> list[bool]:
    """Which requests get their work done in this batch, given each one's cost (decoded
    pixels, explanation passes): cheapest first while the total stays within ``budget``; the
    cheapest one always, whatever its cost. Cheap requests (ordinary photos) are therefore
    never crowded out by expensive ones."""
    admitted = [False] * len(costs)
    spent = 0
    for i in sorted(range(len(costs)), key=costs.__getitem__):
        if spent + costs[i] > budget and spent > 0:
            break
        admitted[i] = True
        spent += costs[i]
    return admitted


def admit_within(slots: Sequence[Slot], costs: list[int], budget: int, setting: str,
                 unit: str) -> None:
    """``admit`` the slots' work (``costs``, in ``unit``) within the batch's ``budget`` (the
    ``handler.<setting>``); the slots left out get 503 ``Overloaded`` with ``Retry-After``: the
    same request alone, or in a lighter batch, fits."""
    for slot, cost, admitted in zip(slots, costs, admit(costs, budget)):
        if not admitted:
            slot.error = Overloaded(
                f"this batch's budget of {budget} {unit} (handler.{setting}) was taken by "
                f"other requests; this one needs {cost}: retry")
