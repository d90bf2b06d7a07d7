"""An explanation request's answer: its values (``Explained``: per image, one ``Explanation``
per target) and their JSON document, per image ``{"method", "explanations": [...]}``."""

from __future__ import annotations

import base64
from dataclasses import dataclass

import torch

from servecore.classes import Classes
from servecore.explain.options import EMBEDDING_TARGET
from servecore.request import Protocol


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


def encode_explanations(answer: Explained, classes: Classes) -> dict:
    """One request's JSON answer: per image ``{"method", "explanations": [...]}``; the image's
    document itself (plain), or KServe v1's ``{"explanations": [one per instance]}``."""
    answers = [
        {"method": answer.method, "explanations": [_explanation(e, classes) for e in image]}
        for image in answer.images
    ]
    return {"explanations": answers} if answer.protocol is Protocol.V1 else answers[0]


def _explanation(e: Explanation, classes: Classes) -> dict:
    item: dict[str, object]
    if e.target < 0:
        item = {"target": EMBEDDING_TARGET, "label": None, "index": None, "probability": None}
    else:
        item = {
            "target": "class",
            "label": classes.labels[e.target],
            "index": e.target,
            "probability": e.probability,
            "rank": e.rank,
        }
        if classes.named:  # probability and rank are within the target's head
            item["head"] = classes.head_of(e.target).name
    item.update(grid=[[round(float(v), 4) for v in line] for line in e.grid], empty=e.empty)
    if e.png is not None:
        item["png"] = base64.b64encode(e.png).decode("ascii")
    return item
