"""A prediction's answer as values: the batch's model outputs, computed once per batch
(``BatchOutputs``), sliced into each request's ``Prediction`` (its embedding rows as a float32
array, its tags as ``Tag`` lists). No text: each engine's edge encodes these values, the JSON
protocols in ``servecore/edges/bodies.py`` (TorchServe), tensors in Triton's adapter."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from servecore.classes import Classes, HeadTop
from servecore.config import Output
from servecore.request import ParsedRequest, Protocol


@dataclass(frozen=True)
class AnswerSpec:
    """How a model answers, fixed when it loads: its name and version (v2 echoes them), its
    task (the default output), the classes (labels and heads), the default ``topk`` and
    whether embeddings are L2-normalised."""

    model_name: str
    model_version: str
    task: Output
    classes: Classes
    default_top_k: int
    normalize_embedding: bool

    def tag(self, index: int, probability: float, head: str | None = None) -> Tag:
        """Class ``index``'s tag, naming its head (``head``, else looked up) where the model
        has several."""
        if not self.classes.named:
            head = ""
        elif head is None:
            head = self.classes.head_of(index).name
        return Tag(self.classes.labels[index], index, probability, head)


@dataclass(frozen=True)
class Tag:
    """One class of an image's top k: its label, index (its row of the served ``fc``),
    probability and, for a model with several heads, the head's name ("" otherwise)."""

    label: str
    index: int
    probability: float
    head: str = ""


@dataclass(frozen=True)
class Prediction:
    """One request's prediction: per image, its embedding (``embeddings``, float32 [n, 2048])
    and/or its tags (most probable first), whichever the request asked for (None: not asked);
    ``protocol``, ``request_id`` (KServe v2's ``id``) and ``binary`` (the v2 outputs to write
    as raw bytes) say how the edge writes it."""

    protocol: Protocol
    request_id: str | None
    embeddings: np.ndarray | None
    tags: list[list[Tag]] | None
    binary: frozenset[Output] = frozenset()  # v2 outputs asked for as raw bytes

    @classmethod
    def of(
        cls,
        request: ParsedRequest,
        embeddings: np.ndarray | None,
        tags: list[list[Tag]] | None,
    ) -> Prediction:
        """``request``'s prediction: its protocol, id and binary outputs with these values."""
        # Most requests name no outputs and no binary_data_output: nothing to ask each output.
        asked = request.outputs or request.binary_output
        binary = frozenset(o for o in Output if request.binary(o)) if asked else frozenset()
        return cls(request.protocol, request.request_id, embeddings, tags, binary)


@dataclass(frozen=True)
class TopK:
    """Each head's most probable classes of every image row of a batch (``Classes.top``)."""

    heads: tuple[HeadTop, ...]

    @classmethod
    def of(cls, logits: torch.Tensor, k: int, classes: Classes) -> TopK:
        return cls(tuple(classes.top(logits, k)))

    def tags(self, row: int, k: int, spec: AnswerSpec) -> list[Tag]:
        """One row's ``k`` first tags of each head, head after head."""
        return [
            spec.tag(i, p, top.head.name)
            for top in self.heads
            for i, p in zip(top.indices[row][:k], top.probabilities[row][:k])
        ]


@dataclass(frozen=True)
class BatchOutputs:
    """The model's answers for every image row of a batch, computed once per batch: the
    embeddings (float32, L2-normalised when the model says so) and the tags (up to the largest
    ``topk``), each only when some request wants them."""

    embeddings: np.ndarray | None
    top: TopK

    @classmethod
    def of(
        cls,
        embedding: torch.Tensor,
        logits: torch.Tensor,
        requests: Sequence[ParsedRequest],
        spec: AnswerSpec,
    ) -> BatchOutputs:
        embeddings = None
        if any(r.wants(Output.EMBEDDING, spec.task) for r in requests):
            if spec.normalize_embedding:
                embedding = torch.nn.functional.normalize(embedding, dim=1)
            embeddings = embedding.numpy()
        tagged = [r for r in requests if r.wants(Output.TAGS, spec.task)]
        if not tagged:  # no softmax and top-k for a batch of embeddings
            return cls(embeddings, TopK(()))
        k = max(r.tags_top_k(spec.default_top_k) for r in tagged)
        return cls(embeddings, TopK.of(logits, k, spec.classes))

    def prediction(self, request: ParsedRequest, rows: range, spec: AnswerSpec) -> Prediction:
        """One request's prediction, from its image ``rows`` of the batch."""
        k = request.tags_top_k(spec.default_top_k)
        embeddings = (
            self.embeddings[rows.start : rows.stop]
            if self.embeddings is not None and request.wants(Output.EMBEDDING, spec.task)
            else None
        )
        tags = (
            [self.top.tags(r, k, spec) for r in rows]
            if request.wants(Output.TAGS, spec.task)
            else None
        )
        return Prediction.of(request, embeddings, tags)
