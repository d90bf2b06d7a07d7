"""The classes a tagger answers: its labels, in the order of the served ``fc``'s rows, and its
heads. A model built from one checkpoint has one head (unnamed): its tags carry no head. A
model built with several heads on one backbone (``python -m buildsteps.weights --add-head``:
ImageNet's tags and your own, say) has one ``fc`` whose rows are each head's rows one after the
other, so every backend computes all the heads' logits in the one forward pass; here they are
told apart again: a softmax per head, each head's own top k, every tag naming its head.

A class's ``index`` is its row of the served ``fc`` (the same for the first head as its own
index; describe's ``heads`` gives each head's first row), so ``topk``, explanation targets and
tags share one index space.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from model_files.artifacts import ModelFiles


@dataclass(frozen=True)
class Head:
    """One head: its ``name`` ("" for a model's only head), its first row of the served ``fc``
    and its number of classes."""

    name: str
    first: int
    size: int

    @property
    def rows(self) -> slice:
        return slice(self.first, self.first + self.size)


@dataclass(frozen=True)
class Classes:
    """A model's labels (one per ``fc`` row) and its heads, which cover the rows in order."""

    labels: tuple[str, ...]
    heads: tuple[Head, ...]

    @classmethod
    def of(cls, labels: Sequence[str], heads: Sequence[dict] | None = None) -> Classes:
        """The classes of ``labels`` with the heads ``weights_info.json`` records (a list of
        ``{"name", "classes"}``, in row order; None or empty: one unnamed head)."""
        if not heads:
            return cls(tuple(labels), (Head("", 0, len(labels)),))
        made, first = [], 0
        for head in heads:
            made.append(Head(str(head["name"]), first, int(head["classes"])))
            first += made[-1].size
        if first != len(labels):
            raise ValueError(f"the heads hold {first} classes, the labels name {len(labels)}")
        return cls(tuple(labels), tuple(made))

    @classmethod
    def read(cls, files: ModelFiles) -> Classes:
        """The classes of a model's files (its labels file, its weights info's heads)."""
        return cls.of(files.labels, files.weights.get("heads"))

    @property
    def rows(self) -> list[slice]:
        """Each head's logit columns."""
        return [h.rows for h in self.heads]

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def named(self) -> bool:
        """Whether tags name their head (a model with several)."""
        return len(self.heads) > 1

    @property
    def largest(self) -> int:
        """The most classes one head has: the largest ``topk`` a request may ask for (each
        head answers at most its own classes)."""
        return max(h.size for h in self.heads)

    def head_of(self, index: int) -> Head:
        for head in self.heads:
            if head.first <= index < head.first + head.size:
                return head
        raise IndexError(f"class {index} is past the model's {len(self)} classes")

    def softmax(self, logits: torch.Tensor) -> torch.Tensor:
        """Each head's probabilities (a softmax over its own rows), side by side as the
        logits are: ``[N, classes]``."""
        if not self.named:
            return torch.softmax(logits, dim=1)
        return torch.cat([torch.softmax(logits[:, h.rows], dim=1) for h in self.heads], dim=1)

    def top(self, logits: torch.Tensor, k: int) -> list[HeadTop]:
        """Each head's ``min(k, its classes)`` most probable classes of every row, most
        probable first, in head order."""
        tops = []
        for head in self.heads:
            part = logits if not self.named else logits[:, head.rows]
            best = torch.softmax(part, dim=1).topk(min(k, head.size), dim=1)
            tops.append(HeadTop(head, (best.indices + head.first).tolist(), best.values.tolist()))
        return tops


@dataclass(frozen=True)
class HeadTop:
    """One head's top classes for every row of a batch: their indices (rows of the served
    ``fc``) and probabilities, most probable first."""

    head: Head
    indices: list[list[int]]
    probabilities: list[list[float]]
