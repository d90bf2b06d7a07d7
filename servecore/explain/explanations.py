"""The explanation stage: what the intake and the model call for explanation requests.

``Explanations.spec`` checks an explanation request's parameters (``options``) before any of
its images is read, ``refuse_options`` refuses them on a prediction, ``admit`` keeps a batch's
explanation work within its budget, ``run`` computes the batch's explanations from its pixels
and logits (``compute``, Captum on the eager model) as ``Explained`` values.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from PIL import Image

from servecore.admission import Admission, Budget
from servecore.boundary import as_request_error
from servecore.classes import Classes
from servecore.config import ExplainConfig
from servecore.crops import GivenCrop
from servecore.errors import InvalidParameter, NotSupported, detached
from servecore.explain.compute import (
    Explainer,
    ExplainJob,
    load_explainer,
    passes,
    thumbnail,
)
from servecore.explain.options import parse_explain
from servecore.explainvalues import Explained, ExplainSpec
from servecore.images import OpenedImage, decode
from servecore.request import ParsedRequest, Protocol
from servecore.stages import Admitted, Explaining, Failed, Opened, Placed, PreparedBatch

logger = logging.getLogger(__name__)


class Explanations:
    """Explanations on the archive's PyTorch checkpoint (gradients need the eager model,
    whatever backend serves predictions); without one, explanation requests get 501. The eager
    model is built by the first batch that explains, not when the worker starts: torchvision
    and the model are seconds of a start that most workers never use; a checkpoint that does
    not load then fails that batch's explanations (500), not the worker's predictions."""

    def __init__(
        self,
        checkpoint: Path,
        config: ExplainConfig,
        classes: Classes,
        embedding_default: bool,
        threads: int = 0,
    ) -> None:
        self.config = config
        self.threads = threads  # torch's intra-op threads for the eager passes (0: as they are)
        self.classes = classes
        self.embedding_default = embedding_default  # the embedding model explains its vector
        self.checkpoint = checkpoint if checkpoint.is_file() else None
        self.checkpoint_name = checkpoint.name
        self._explainer: Explainer | None = None
        self._loading = threading.Lock()
        self.budget = Budget(
            "explain.max_passes_per_batch",
            "explanation passes",
            config.max_passes_per_batch,
            self.cost,
        )

    def refuse_options(self, request: ParsedRequest) -> None:
        """A prediction carries no explanation parameters (400)."""
        if request.options:
            raise InvalidParameter(
                f"{sorted(request.options)} only apply to explanations: POST to "
                "/explanations/{model} (or KServe v1 :explain)"
            )

    def spec(self, request: ParsedRequest) -> ExplainSpec:
        """An explanation request's checked parameters (4xx, or 501 when this model cannot
        explain or the protocol has no explanations)."""
        if self.checkpoint is None:
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
            request.options, request.top_k, self.classes.labels, self.config, self.embedding_default
        )

    @staticmethod
    def cost(request: Opened) -> int:
        """A request's forward/backward passes of explanation work (none for a prediction)."""
        if not isinstance(request, Explaining):
            return 0
        return passes(request.spec) * request.image_count

    def admit(self, requests: Sequence[Admitted], admission: Admission) -> list[Admitted]:
        """Explanation work within ``handler.explain.max_passes_per_batch`` (the admission's
        order: earlier refusals, then cheapest first); the requests that do not fit get 503
        and ``Retry-After``, so a burst of explanations cannot hold the predictions of the
        same queue back for long. A request that costs more than the budget alone gets 400."""
        result = list(requests)
        asking = [(i, r) for i, r in enumerate(result) if isinstance(r, Explaining)]
        for i, request in asking:
            cost = self.cost(request)
            if cost > self.budget.limit:  # never fits, unlike one that only lost the race
                result[i] = Failed(
                    request.request_id,
                    InvalidParameter(
                        f"this explanation needs {cost} forward/backward passes "
                        f"({request.image_count} image(s) x {passes(request.spec)}), more than "
                        f"the limit of {self.budget.limit} (handler.explain.max_passes_per_batch); "
                        "send fewer images, targets or n_steps"
                    ),
                )
        admitted = admission.within([result[i] for i, _ in asking], self.budget)
        for (i, _), state in zip(asking, admitted):
            result[i] = state
        return result

    def run(self, batch: PreparedBatch, logits: torch.Tensor) -> dict[int, Explained | Failed]:
        """Per explanation request that reached the model (its index in the batch), its
        ``Explained`` (per image, one ``Explanation`` per target); a failure here fails the
        explanation requests only (500), never the batch's predictions."""
        asking = [
            (i, r, r.opened)
            for i, r in enumerate(batch.requests)
            if isinstance(r, Placed) and isinstance(r.opened, Explaining)
        ]
        if not asking or batch.pixels is None or self.checkpoint is None:
            return {}  # no checkpoint: spec() let no explanation request through
        try:
            jobs = [
                ExplainJob(opened.spec, r.rows, self._pictures(opened)) for _, r, opened in asking
            ]
            # The explainer runs on the CPU; a GPU worker's batch may be on its GPU.
            with torch_threads(self.threads):
                explainer = self._loaded(self.checkpoint)
                answers = explainer.explain(batch.pixels.cpu(), logits, jobs, self.classes)
        except Exception as exc:  # noqa: BLE001 - the boundary of the explanation requests
            error = detached(as_request_error(exc, "explaining", asking[0][1].request_id))
            return {i: Failed(r.request_id, error) for i, r, _ in asking}
        return {
            i: Explained(opened.request.protocol, opened.spec.method, answer)
            for (i, _, opened), answer in zip(asking, answers)
        }

    def _loaded(self, checkpoint: Path) -> Explainer:
        """The explainer, built from ``checkpoint`` by the first caller."""
        with self._loading:
            if self._explainer is None:
                started = time.monotonic()
                self._explainer = load_explainer(checkpoint, self.config.png_max_side)
                if self._explainer is None:
                    raise FileNotFoundError(f"{checkpoint} is gone")
                logger.info(
                    "explainer: the eager model from %s built in %.1f s",
                    checkpoint.name,
                    time.monotonic() - started,
                )
            return self._explainer

    def _pictures(self, request: Explaining) -> list:
        """The request's images, shrunk, for a PNG heatmap (decoded already: no new work but
        the orientation and colour conversion)."""
        if not request.spec.png:
            return []
        return [thumbnail(_picture(image), self.config.png_max_side) for image in request.images]


def _picture(image: OpenedImage | GivenCrop) -> Image.Image:
    """An opened image decoded; a crop the request carried as the picture it is."""
    if isinstance(image, GivenCrop):
        return Image.fromarray(image.crop.permute(1, 2, 0).numpy())
    return decode(image)


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads set to ``threads`` (0: unchanged) for the block, then back."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
