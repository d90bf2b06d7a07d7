"""Explanations (``/explanations``, KServe v1 ``:explain``) as an addon of the prediction path.

``Explanations`` is what the model calls: ``open`` checks one request's parameters
(``options``), ``admit`` keeps a batch's explanation work within its budget, ``run`` computes
the batch's explanations from its pixels and logits (``compute``, Captum on the eager model),
``answer`` encodes one request's answer (``encode``). Only the model (``servecore.service``)
imports this package, to hand it to the intake as its ``Addon``; the request path (parse,
intake, decode, encode) never does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from servecore.admission import Admission, Budget
from servecore.config import ExplainConfig
from servecore.errors import InvalidParameter, NotSupported, detached
from servecore.explain.compute import ExplainJob, load_explainer, passes, thumbnail
from servecore.explain.encode import Explanation, encode_explanations
from servecore.explain.options import ExplainSpec, parse_explain
from servecore.images import decode
from servecore.intake import as_request_error
from servecore.parse import ParsedRequest, Protocol
from servecore.stages import Admitted, Failed, Opened, Placed, PreparedBatch


class Explanations:
    """Explanations on the archive's PyTorch checkpoint (gradients need the eager model,
    whatever backend serves predictions); without one, explanation requests get 501. An
    explanation request's ``Opened.addon`` is its ``ExplainSpec``."""

    def __init__(
        self,
        checkpoint: Path,
        config: ExplainConfig,
        labels: Sequence[str],
        embedding_default: bool,
    ) -> None:
        self.config = config
        self.labels = labels
        self.embedding_default = embedding_default  # the embedding model explains its vector
        self.explainer = load_explainer(checkpoint, config.png_max_side)
        self.checkpoint_name = checkpoint.name
        self.budget = Budget(
            "explain.max_passes_per_batch",
            "explanation passes",
            config.max_passes_per_batch,
            self.cost,
        )

    def open(self, request: ParsedRequest, explain_route: bool) -> ExplainSpec | None:
        """The request's checked parameters, None for a prediction. TorchServe 0.12 sets the
        ``explain`` property to "True" for ``/explanations`` and KServe ``:explain`` (and to
        "False" otherwise, whatever header a client sends)."""
        if not explain_route:
            if request.options:
                raise InvalidParameter(
                    f"{sorted(request.options)} only apply to explanations: POST to "
                    "/explanations/{model} (or KServe v1 :explain)"
                )
            return None
        if self.explainer is None:
            raise NotSupported(
                "this archive carries no PyTorch checkpoint for explanations; "
                f"rebuild it with archive.sh (it packs {self.checkpoint_name})"
            )
        if request.protocol is Protocol.V2:
            raise NotSupported(
                "explanations answer /explanations/{model} and KServe v1 "
                ":explain; the v2 protocol has no explain route"
            )
        return parse_explain(
            request.options, request.top_k, self.labels, self.config, self.embedding_default
        )

    @staticmethod
    def cost(request: Opened) -> int:
        """An explanation request's forward/backward passes."""
        return passes(request.addon) * request.image_count

    def admit(self, requests: Sequence[Admitted], admission: Admission) -> list[Admitted]:
        """Explanation work within ``handler.explain.max_passes_per_batch`` (the admission's
        order: earlier refusals, then cheapest first); the requests that do not fit get 503
        and ``Retry-After``, so a burst of explanations cannot hold the predictions of the
        same queue back for long. A request that costs more than the budget alone gets 400."""
        result = list(requests)
        opened = [
            (i, r) for i, r in enumerate(result) if isinstance(r, Opened) and r.addon is not None
        ]
        asking = [i for i, _ in opened]
        for i, request in opened:
            cost = self.cost(request)
            if cost > self.budget.limit:  # never fits, unlike one that only lost the race
                result[i] = Failed(
                    request.request_id,
                    InvalidParameter(
                        f"this explanation needs {cost} forward/backward passes "
                        f"({request.image_count} image(s) x {passes(request.addon)}), more than "
                        f"the limit of {self.budget.limit} (handler.explain.max_passes_per_batch); "
                        "send fewer images, targets or n_steps"
                    ),
                )
        admitted = admission.within([result[i] for i in asking], self.budget)
        for i, state in zip(asking, admitted):
            result[i] = state
        return result

    def run(self, batch: PreparedBatch, logits: torch.Tensor) -> dict[int, Any]:
        """Per explanation request (its index in the batch), its explanations (per image, one
        ``Explanation`` per target); a failure here fails the explanation requests only (500),
        never the batch's predictions."""
        asking = [
            (i, r)
            for i, r in enumerate(batch.requests)
            if isinstance(r, Placed) and r.opened.addon is not None
        ]
        if not asking:
            return {}
        try:
            if self.explainer is None or batch.pixels is None:  # open() refuses without one
                raise RuntimeError("explanations admitted without an explainer or pixels")
            jobs = [ExplainJob(r.opened.addon, r.rows, self._pictures(r.opened)) for _, r in asking]
            answers = self.explainer.explain(batch.pixels, logits, jobs)
        except Exception as exc:  # noqa: BLE001 - the boundary of the explanation requests
            error = detached(as_request_error(exc, "explaining", asking[0][1].request_id))
            return {i: Failed(r.request_id, error) for i, r in asking}
        return {i: answer for (i, _), answer in zip(asking, answers)}

    def answer(self, request: Placed, explanations: list[list[Explanation]]) -> dict:
        """One explanation request's JSON answer."""
        return encode_explanations(
            request.opened.request.protocol, request.opened.addon.method, explanations, self.labels
        )

    def _pictures(self, request: Opened) -> list:
        """The request's images, shrunk, for a PNG heatmap (decoded already: no new work but
        the orientation and colour conversion)."""
        if not request.addon.png:
            return []
        return [thumbnail(decode(image), self.config.png_max_side) for image in request.images]
