"""Response encoding: the batch's model outputs, computed once per batch (``BatchOutputs``),
turned into each request's JSON answer in the protocol it came in. Pure functions."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from servecore.config import Output
from servecore.parse import ParsedRequest, Protocol


@dataclass(frozen=True)
class AnswerSpec:
    """How a model answers, fixed when it loads: its name and version (v2 echoes them), its
    task (the default output), the class labels, the default ``topk`` and whether embeddings
    are L2-normalised."""

    model_name: str
    model_version: str
    task: Output
    labels: Sequence[str]
    default_top_k: int
    normalize_embedding: bool


@dataclass(frozen=True)
class TopK:
    """The ``k`` most probable classes of every image row of a batch, most probable first."""

    indices: list[list[int]]
    probabilities: list[list[float]]

    @classmethod
    def of(cls, logits: torch.Tensor, k: int) -> TopK:
        top = torch.softmax(logits, dim=1).topk(k, dim=1)
        return cls(top.indices.tolist(), top.values.tolist())

    def tags(self, row: int, k: int, labels: Sequence[str]) -> list[dict]:
        """``[{"label", "index", "probability"}, ...]`` of one row, its ``k`` first."""
        return [
            {"label": labels[i], "index": i, "probability": p}
            for i, p in zip(self.indices[row][:k], self.probabilities[row][:k])
        ]


@dataclass(frozen=True)
class BatchOutputs:
    """The model's answers for every image row of a batch as Python lists, computed once per
    batch: embeddings only when some request wants them, tags up to the largest ``topk``."""

    embeddings: list[list[float]]
    top: TopK

    @classmethod
    def of(
        cls,
        embedding: torch.Tensor,
        logits: torch.Tensor,
        requests: Sequence[ParsedRequest],
        spec: AnswerSpec,
    ) -> BatchOutputs:
        embeddings: list[list[float]] = []
        if any(r.wants(Output.EMBEDDING, spec.task) for r in requests):
            if spec.normalize_embedding:
                embedding = torch.nn.functional.normalize(embedding, dim=1)
            embeddings = embedding.tolist()
        k = max((r.tags_top_k(spec.default_top_k) for r in requests), default=1)
        return cls(embeddings, TopK.of(logits, k))


def encode_response(
    request: ParsedRequest, rows: range, outputs: BatchOutputs, spec: AnswerSpec
) -> dict | list:
    """One request's JSON answer, in its own protocol, from its image ``rows`` of the batch."""
    k = request.tags_top_k(spec.default_top_k)
    embeddings = (
        [outputs.embeddings[r] for r in rows]
        if request.wants(Output.EMBEDDING, spec.task)
        else None
    )
    tags = (
        [outputs.top.tags(r, k, spec.labels) for r in rows]
        if request.wants(Output.TAGS, spec.task)
        else None
    )
    if request.protocol is Protocol.V2:
        return _v2_response(spec, request.request_id, embeddings, tags)
    answers = tags if embeddings is None else [{"embedding": e} for e in embeddings]
    if answers is None:  # a request without outputs wants its model's own
        raise RuntimeError(f"request {request.request_id} asked for no output")
    return {"predictions": answers} if request.protocol is Protocol.V1 else answers[0]


def _v2_response(
    spec: AnswerSpec,
    request_id: str | None,
    embeddings: list[list[float]] | None,
    tags: list[list[dict]] | None,
) -> dict:
    """An Open Inference Protocol response; ``tags`` elements are JSON-encoded strings."""
    outputs = []
    if embeddings is not None:
        outputs.append(
            {
                "name": Output.EMBEDDING.value,
                "datatype": "FP32",
                "shape": [len(embeddings), len(embeddings[0])],
                "data": [x for row in embeddings for x in row],
            }
        )
    if tags is not None:
        outputs.append(
            {
                "name": Output.TAGS.value,
                "datatype": "BYTES",
                "shape": [len(tags), len(tags[0])],
                "data": [json.dumps(t) for row in tags for t in row],
            }
        )
    response = {
        "model_name": spec.model_name,
        "model_version": spec.model_version,
        "outputs": outputs,
    }
    if request_id is not None:
        response["id"] = request_id
    return response
