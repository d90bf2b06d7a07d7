"""An explanation request's answer: per image ``{"method", "explanations": [...]}``."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from servecore.explain.options import EMBEDDING_TARGET
from servecore.parse import Protocol


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


def encode_explanations(
    protocol: Protocol, method: str, images: Sequence[Sequence[Explanation]], labels: Sequence[str]
) -> dict:
    """One request's answer: per image ``{"method", "explanations": [...]}``; the image's
    document itself (plain), or KServe v1's ``{"explanations": [one per instance]}``."""
    answers = [
        {"method": method, "explanations": [_explanation(e, labels) for e in image]}
        for image in images
    ]
    return {"explanations": answers} if protocol is Protocol.V1 else answers[0]


def _explanation(e: Explanation, labels: Sequence[str]) -> dict:
    item: dict[str, object]
    if e.target < 0:
        item = {"target": EMBEDDING_TARGET, "label": None, "index": None, "probability": None}
    else:
        item = {
            "target": "class",
            "label": labels[e.target],
            "index": e.target,
            "probability": e.probability,
            "rank": e.rank,
        }
    item.update(grid=[[round(float(v), 4) for v in line] for line in e.grid], empty=e.empty)
    if e.png is not None:
        item["png"] = base64.b64encode(e.png).decode("ascii")
    return item
