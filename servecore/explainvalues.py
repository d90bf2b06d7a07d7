"""An explanation request's values as the request path carries them, made by the explanation
stage (``servecore.explain``): ``ExplainSpec``, what a request asks (its checked parameters),
and ``Explained``, its answer (per image, one ``Explanation`` per target). Here, below
``stages``, so that the stages carry them and the stage that makes them imports the stages."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from servecore.request import Protocol


@dataclass(frozen=True)
class ExplainSpec:
    """What one explanation request asks for. ``classes``: the named classes (indices, or
    ``-1`` for the embedding target); empty means the top ``top_k`` of each image."""

    method: str
    classes: tuple[int, ...]
    top_k: int
    n_steps: int
    internal_batch_size: int
    png: bool


@dataclass(frozen=True)
class Explanation:
    """One heatmap: for class ``target`` (-1: the embedding), its probability and rank in the
    image's prediction (None for the embedding), ``grid`` [h, w] in [0, 1], ``empty`` when
    nothing supported the target, and the PNG when one was asked for."""

    target: int
    probability: float | None
    rank: int | None
    grid: torch.Tensor
    empty: bool
    png: bytes | None = None


@dataclass(frozen=True)
class Explained:
    """One explanation request's answer: per image, its explanations (one per target), by
    ``method``; ``protocol`` says how the edge writes it."""

    protocol: Protocol
    method: str
    images: list[list[Explanation]]
