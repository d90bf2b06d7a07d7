"""Explanations (``/explanations``, KServe v1 ``:explain``) as an addon of the prediction path.

``Explanations`` is what the handler and its intake call: ``open`` checks one request's
parameters (``options``), ``admit`` keeps a batch's explanation work within its budget,
``run`` computes the batch's explanations from its pixels and logits (``compute``, Captum on
the eager model), ``answer`` encodes one request's answer (``encode``). The prediction path
never imports this package.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from handlers.batch import PreparedBatch, Slot, admit_within
from handlers.config import ExplainConfig
from handlers.errors import InvalidParameter, NotSupported, detached
from handlers.explain.compute import ExplainJob, load_explainer, passes, thumbnail
from handlers.explain.encode import Explanation, encode_explanations
from handlers.explain.options import ExplainSpec, parse_explain
from handlers.images import decode
from handlers.intake import as_request_error
from handlers.parse import ParsedRequest, Protocol


@dataclass
class ExplainRequest:
    """An explanation request's ``Slot.addon``: its checked parameters, then its answers (per
    image, one ``Explanation`` per target)."""

    spec: ExplainSpec
    answers: list[list[Explanation]] = field(default_factory=list)


class Explanations:
    """Explanations on the archive's PyTorch checkpoint (gradients need the eager model,
    whatever backend serves predictions); without one, explanation requests get 501."""

    def __init__(self, checkpoint: Path, config: ExplainConfig, labels: Sequence[str],
                 embedding_default: bool) -> None:
        self.config = config
        self.labels = labels
        self.embedding_default = embedding_default  # the embedding model explains its vector
        self.explainer = load_explainer(checkpoint, config.png_max_side)
        self.checkpoint_name = checkpoint.name

    def open(self, request: ParsedRequest, explain_route: bool) -> ExplainRequest | None:
        """The request's checked parameters, None for a prediction. TorchServe 0.12 sets the
        ``explain`` property to "True" for ``/explanations`` and KServe ``:explain`` (and to
        "False" otherwise, whatever header a client sends)."""
        if not explain_route:
            if request.options:
                raise InvalidParameter(
                    f"{sorted(request.options)} only apply to explanations: POST to "
                    "/explanations/{model} (or KServe v1 :explain)")
            return None
        if self.explainer is None:
            raise NotSupported("this archive carries no PyTorch checkpoint for explanations; "
                               f"rebuild it with archive.sh (it packs {self.checkpoint_name})")
        if request.protocol is Protocol.V2:
            raise NotSupported("explanations answer /explanations/{model} and KServe v1 "
                               ":explain; the v2 protocol has no explain route")
        return ExplainRequest(parse_explain(request.options, request.top_k, self.labels,
                                            self.config, self.embedding_default))

    def admit(self, slots: Sequence[Slot]) -> None:
        """Explanation work within ``handler.explain.max_passes_per_batch``, cheapest first;
        the requests that do not fit get 503 and ``Retry-After``, so a burst of explanations
        cannot hold the predictions of the same queue back for long."""
        budget = self.config.max_passes_per_batch
        asking = [(s, passes(s.addon.spec) * len(s.opened)) for s in slots
                  if s.ok and s.addon is not None]
        for slot, cost in asking:
            if cost > budget:  # never fits, unlike a request that only lost the race: 400
                slot.error = InvalidParameter(
                    f"this explanation needs {cost} forward/backward passes ({len(slot.opened)} "
                    f"image(s) x {passes(slot.addon.spec)}), more than the limit of {budget} "
                    "(handler.explain.max_passes_per_batch); send fewer images, targets or "
                    "n_steps")
        fits = [(s, cost) for s, cost in asking if s.ok]
        admit_within([s for s, _ in fits], [cost for _, cost in fits], budget,
                     "explain.max_passes_per_batch", "explanation passes")

    def run(self, batch: PreparedBatch) -> None:
        """The batch's explanations, from its pixels and logits; a failure here fails the
        explanation requests only (500), never the batch's predictions."""
        asking = [s for s in batch.slots if s.ok and s.addon is not None]
        if not asking:
            return
        try:
            jobs = [ExplainJob(s.addon.spec, s.rows, self._pictures(s)) for s in asking]
            answers = self.explainer.explain(batch.pixels, batch.logits, jobs)
        except Exception as exc:  # noqa: BLE001 - the boundary of the explanation requests
            error = detached(as_request_error(exc, "explaining", asking[0].request_id))
            for slot in asking:
                slot.error = error
            return
        for slot, answer in zip(asking, answers):
            slot.addon.answers = answer

    def answer(self, slot: Slot) -> dict:
        """One explanation request's JSON answer."""
        return encode_explanations(slot.request.protocol, slot.addon.spec.method,
                                   slot.addon.answers, self.labels)

    def _pictures(self, slot: Slot) -> list:
        """The request's images, shrunk, for a PNG heatmap (decoded already: no new work but
        the orientation and colour conversion)."""
        if not slot.addon.spec.png:
            return []
        return [thumbnail(decode(image), self.config.png_max_side) for image in slot.opened]
