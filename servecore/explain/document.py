"""An explanation request's answer (``servecore.explainvalues.Explained``) as its JSON document,
per image ``{"method", "explanations": [...]}``."""

from __future__ import annotations

import base64

from servecore.classes import Classes
from servecore.explain.options import EMBEDDING_TARGET
from servecore.explainvalues import Explained, Explanation
from servecore.request import Protocol


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
