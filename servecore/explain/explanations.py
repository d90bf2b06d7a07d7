"""The explanation stage: ``Explanations.run``, entered once per batch by ``ImageModel.run``
after the forward, computes the batch's explanations from its pixels and logits (``compute``,
Captum on the eager model) as ``Explained`` values. What a request may ask (``rules``, an
``options.ExplainRules``) the intake checks when it opens the request and prices for the
batch's budget; this stage then computes what was admitted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from PIL import Image

from servecore.boundary import as_request_error
from servecore.classes import Classes
from servecore.config import ExplainConfig
from servecore.crops import GivenCrop
from servecore.errors import detached
from servecore.explain.compute import Explainer, ExplainJob, load_explainer, thumbnail
from servecore.explain.options import ExplainRules
from servecore.explainvalues import Explained
from servecore.images import OpenedImage, decode
from servecore.stages import ComputedBatch, Explaining, Failed, Placed

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
        self.checkpoint = checkpoint if checkpoint.is_file() else None
        self.rules = ExplainRules(
            config, classes.labels, embedding_default, checkpoint.name, self.checkpoint is not None
        )
        self._explainer: Explainer | None = None
        self._loading = threading.Lock()

    def run(self, computed: ComputedBatch) -> dict[int, Explained | Failed]:
        """Per explanation request that reached the model (its index in the batch; every one
        of them has its entry), its ``Explained`` (per image, one ``Explanation`` per target);
        a failure here fails the explanation requests only (500), never the batch's
        predictions."""
        batch, logits = computed.prepared, computed.logits
        asking = [
            (i, r, r.opened)
            for i, r in enumerate(batch.requests)
            if isinstance(r, Placed) and isinstance(r.opened, Explaining)
        ]
        if not asking or batch.pixels is None or logits is None or self.checkpoint is None:
            return {}  # none placed: nothing reached the model (no checkpoint: none let in)
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
