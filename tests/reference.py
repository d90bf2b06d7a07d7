"""The independent reference: torchvision's own resnet50 and the weights' own transform, run
directly, with the embedding taken from a forward hook on ``avgpool``."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from torchvision.models import ResNet50_Weights, resnet50


class Reference:
    def __init__(self, checkpoint: Path) -> None:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        # The checkpoint's own class count: ImageNet's 1,000 or a fine-tuned head's N.
        self.model = resnet50(weights=None, num_classes=state["fc.weight"].shape[0])
        self.model.load_state_dict(state)
        self.model.eval()
        self.transform = ResNet50_Weights.IMAGENET1K_V2.transforms()
        self._pooled: list[torch.Tensor] = []
        self.model.avgpool.register_forward_hook(lambda m, i, o: self._pooled.append(o))

    def input(self, image: Image.Image | bytes) -> torch.Tensor:
        """torchvision's own preprocessing of one image: ``[1, 3, 224, 224]``."""
        if isinstance(image, bytes):
            image = Image.open(io.BytesIO(image)).convert("RGB")
        return self.transform(image).unsqueeze(0)

    def __call__(self, image: Image.Image | bytes) -> tuple[torch.Tensor, torch.Tensor]:
        """``(embedding [2048], logits [classes])`` for one image, unnormalised."""
        self._pooled.clear()
        with torch.inference_mode():
            logits = self.model(self.input(image))[0]
        return torch.flatten(self._pooled[0], 1)[0], logits


# Largest relative embedding error against this float32 reference, by the arithmetic an archive
# runs (describe's ``precision``; ``int8+bf16`` counts as int8). f32: other kernels and
# summation orders, measured ~1e-6. bf16 keeps 8 mantissa bits, each rounding up to 2^-9 =
# 0.2%, and ~50 layers of them partly cancel: measured 0.4-0.8% on real photos, 2% leaves room
# for other CPUs' kernels. int8 (NNCF, MINMAX): measured 1.8% mean, 3% worst on held-apart
# photos.
TOLERANCE = {"f32": 1e-4, "bf16": 0.02, "int8": 0.06}


def tolerance(precision: str) -> float:
    """The embedding tolerance for an archive reporting ``precision``."""
    return TOLERANCE[precision.split("+")[0]]


def rel_error(actual, expected) -> float:
    """||actual - expected|| / ||expected||: the relative error of a whole vector."""
    actual = torch.as_tensor(actual, dtype=torch.float64)
    expected = torch.as_tensor(expected, dtype=torch.float64)
    return float((actual - expected).norm() / expected.norm())


def assert_same_tags(tags: list[dict], expected: list[dict]) -> None:
    """Same classes and labels in the same order; probabilities equal up to the float noise
    between a batched and a single forward pass."""
    import pytest

    assert [t["index"] for t in tags] == [t["index"] for t in expected]
    assert [t["label"] for t in tags] == [t["label"] for t in expected]
    assert [t["probability"] for t in tags] == pytest.approx(
        [t["probability"] for t in expected], rel=1e-4, abs=1e-7
    )


@dataclass(frozen=True)
class Agreement:
    """How closely two servers' answers must agree. Computed at the same precision: as
    ``assert_same_tags`` and ``embedding`` 1e-4 (batched vs single forward noise). When each
    server's ``auto`` measured and chose differently (int8+f32 on one, int8+bf16 on the other:
    a near tie on some hosts, decided by timing noise), the same top class and the embedding
    within the coarser arithmetic's tolerance: the arithmetic differs, so the digits do."""

    precisions: tuple[str, str]

    @property
    def same(self) -> bool:
        return self.precisions[0] == self.precisions[1]

    @property
    def embedding(self) -> float:
        return 1e-4 if self.same else max(tolerance(p) for p in self.precisions)

    @classmethod
    def between(cls, pod, local, image: bytes) -> Agreement:
        """``pod`` (a runtime without keys) against ``local`` (a keyed local TorchServe): the
        precision each serves, read from its tagger's answer to ``image``."""
        headers = local.keys.inference_headers()
        return cls(
            (
                served_precision(pod.inference_url, image),
                served_precision(local.inference_url, image, headers),
            )
        )

    def tags(self, tags: list[dict], expected: list[dict]) -> None:
        if self.same:
            assert_same_tags(tags, expected)
        else:
            assert (tags[0]["index"], tags[0]["label"]) == (
                expected[0]["index"],
                expected[0]["label"],
            ), self.precisions


def served_precision(url: str, image: bytes, headers: dict[str, str] | None = None) -> str:
    """The ``X-Precision`` of the tagger's answer to ``image`` at ``url`` (a server's
    inference URL)."""
    import requests

    answer = requests.post(
        f"{url}/predictions/resnet50-tagger", data=image, headers=headers or {}, timeout=120
    )
    assert answer.status_code == 200, answer.text
    return answer.headers["X-Precision"]
