"""Explanations people can look at: where the model looked, for the class a request asks about.

Pure functions and one small class, testable without an engine. ``Explainer.explain``: for
the explanation requests of one batch (each an ``ExplainSpec``), resolve each image's targets
from the batch's logits, run Captum on the eager PyTorch model (one call per method and
settings, every row with its own target), normalise to a compact grid in [0, 1] and, when
asked, render a PNG heatmap over the image the client sent, as ``Explanation`` values.

Methods: ``gradcam`` (default; Captum ``LayerGradCam`` on ``layer4``: one forward and one
backward pass, a 7x7 grid), ``ig`` (``IntegratedGradients`` from the ImageNet-mean image:
``n_steps`` forward+backward passes, |attribution| summed over colour and average-pooled to
28x28) and ``occlusion`` (``Occlusion`` with a 56-pixel window, stride 28: 49 forward passes,
pooled to 28x28).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw
from torch import nn

from model_files.recipe import CROP, RESIZE, normalize
from servecore.classes import Classes
from servecore.explainvalues import ExplainSpec, Explanation

# The model's view of an image (model_files.recipe, as servecore.intake applies it): the
# shorter side resized to RESIZE, then a centre CROP x CROP.
INPUT_GRID = 28  # IG and occlusion: |attribution| average-pooled to 28x28
OCCLUSION_WINDOW, OCCLUSION_STRIDE = 56, 28
OCCLUSION_PASSES = ((CROP - OCCLUSION_WINDOW) // OCCLUSION_STRIDE + 1) ** 2  # 49
EPS = 1e-12


def passes(spec: ExplainSpec) -> int:
    """Forward(+backward) passes per explained image for ``spec``: the request's cost."""
    per_target = {"gradcam": 1, "ig": spec.n_steps, "occlusion": OCCLUSION_PASSES}
    return per_target[spec.method] * max(1, len(spec.classes) or spec.top_k)


# ---------------------------------------------------------------------------- attribution


class LogitsScore(nn.Module):
    """``x -> logits [N, classes]`` of a ``(embedding, logits)`` model: Captum picks ``target``."""

    def __init__(self, dual: nn.Module) -> None:
        super().__init__()
        self.dual = dual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dual(x)[1]


class EmbeddingScore(nn.Module):
    """``(x, direction) -> [embedding(x) . direction]`` (Captum ``target=0``). ``direction`` is
    the image's own unit embedding, so GradCAM splits ``|embedding|`` over the 7x7 locations:
    where the features the embedding is made of come from. (Not cosine(e(x), e0): its gradient
    at x is zero.)"""

    def __init__(self, dual: nn.Module) -> None:
        super().__init__()
        self.dual = dual

    def forward(self, x: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
        return (self.dual(x)[0] * direction).sum(dim=1, keepdim=True)


@dataclass(frozen=True)
class Method:
    """How to attribute: ``name`` (gradcam, ig, occlusion), Integrated Gradients' ``n_steps``
    (0 for the others) and the rows per forward pass (``internal_batch_size``)."""

    name: str
    n_steps: int = 0
    internal_batch_size: int = 8

    @classmethod
    def of(cls, spec: ExplainSpec) -> Method:
        return cls(
            spec.method, spec.n_steps if spec.method == "ig" else 0, spec.internal_batch_size
        )


def attribute(
    dual: nn.Module, layer: nn.Module, pixels: torch.Tensor, classes: Sequence[int], method: Method
) -> torch.Tensor:
    """Raw attributions of ``pixels`` [M, 3, 224, 224], row m for class ``classes[m]`` (-1: the
    embedding's own direction): GradCAM [M, 7, 7] (on ``layer``), IG / occlusion [M, 3, 224,
    224]. At most two Captum calls (class rows, embedding rows), rows in the given order."""
    class_rows = [m for m, c in enumerate(classes) if c >= 0]
    embed_rows = [m for m, c in enumerate(classes) if c < 0]
    parts = []
    if class_rows:
        parts.append(
            _captum(
                method,
                LogitsScore(dual),
                layer,
                pixels[class_rows].clone(),
                [classes[m] for m in class_rows],
                None,
            )
        )
    if embed_rows:
        rows = pixels[embed_rows].clone()
        with torch.no_grad():
            direction = F.normalize(dual(rows)[0].float(), dim=1)
        parts.append(_captum(method, EmbeddingScore(dual), layer, rows, 0, (direction,)))
    raw = torch.cat(parts)
    return raw[torch.argsort(torch.tensor(class_rows + embed_rows))]


def _captum(
    method: Method, score: nn.Module, layer: nn.Module, inputs: torch.Tensor, target, extra
) -> torch.Tensor:
    from captum.attr import IntegratedGradients, LayerGradCam, Occlusion

    with torch.inference_mode(False), torch.enable_grad():
        if method.name == "gradcam":
            return (
                LayerGradCam(score, layer)
                .attribute(inputs, target=target, additional_forward_args=extra)[:, 0]
                .detach()
            )
        if method.name == "ig":
            return (
                IntegratedGradients(score)
                .attribute(
                    inputs,
                    baselines=torch.zeros_like(inputs),
                    target=target,
                    additional_forward_args=extra,
                    n_steps=method.n_steps,
                    internal_batch_size=method.internal_batch_size,
                )
                .detach()
            )
    with torch.no_grad():
        return Occlusion(score).attribute(
            inputs,
            sliding_window_shapes=(3, OCCLUSION_WINDOW, OCCLUSION_WINDOW),
            strides=(3, OCCLUSION_STRIDE, OCCLUSION_STRIDE),
            baselines=0.0,
            target=target,
            additional_forward_args=extra,
            perturbations_per_eval=method.internal_batch_size,
        )


def normalise(raw: torch.Tensor) -> tuple[torch.Tensor, list[bool]]:
    """Raw attributions -> ``([M, h, w] in [0, 1], empty flags)``.

    GradCAM maps ([M, h, w]) keep only evidence for the target (ReLU); input-space maps
    ([M, 3, 224, 224]) become |attribution| summed over colour, average-pooled to 28x28. Each
    map is divided by its maximum; a map with nothing positive stays all zeros and is flagged
    ``empty`` (never scale noise up to 1)."""
    x = torch.nan_to_num(raw.float(), nan=0.0, posinf=0.0, neginf=0.0)
    if x.dim() == 4:
        x = F.adaptive_avg_pool2d(x.abs().sum(dim=1, keepdim=True), INPUT_GRID)[:, 0]
    else:
        x = x.clamp(min=0)
    peak = x.flatten(1).amax(dim=1)
    empty = peak <= EPS
    x = x / peak.clamp(min=EPS).view(-1, 1, 1)
    x[empty] = 0
    return x.clamp(0, 1), empty.tolist()


# ---------------------------------------------------------------------------- rendering


def crop_box(
    width: int, height: int, resize: int = RESIZE, crop: int = CROP
) -> tuple[float, float, float, float]:
    """The centre crop the model saw, as ``(x0, y0, x1, y1)`` in the image's own pixels
    (torchvision: the shorter side resized to ``resize``, then a centre ``crop``)."""
    if width <= height:
        new_w, new_h = resize, int(resize * height / width)
    else:
        new_w, new_h = int(resize * width / height), resize
    left, top = round((new_w - crop) / 2.0), round((new_h - crop) / 2.0)
    sx, sy = width / new_w, height / new_h
    return left * sx, top * sy, (left + crop) * sx, (top + crop) * sy


def _colormap() -> np.ndarray:
    """A 256-entry jet-like colour table (blue = no evidence, red = most)."""
    stops = [
        (0.0, (0, 0, 128)),
        (0.125, (0, 0, 255)),
        (0.375, (0, 255, 255)),
        (0.625, (255, 255, 0)),
        (0.875, (255, 0, 0)),
        (1.0, (128, 0, 0)),
    ]
    xs = np.linspace(0, 1, 256)
    return (
        np.stack(
            [np.interp(xs, [s for s, _ in stops], [c[i] for _, c in stops]) for i in range(3)],
            axis=1,
        )
        .round()
        .astype(np.uint8)
    )


COLORMAP = _colormap()


def thumbnail(image: Image.Image, max_side: int) -> Image.Image:
    """The client's image at most ``max_side`` pixels on its longer side (aspect kept)."""
    scale = min(1.0, max_side / max(image.size))
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return (
        image if scale == 1.0 else image.resize(size, Image.Resampling.BILINEAR, reducing_gap=2.0)
    )


def render_png(image: Image.Image, grid: torch.Tensor, max_side: int, alpha: float = 0.5) -> bytes:
    """A PNG of ``grid`` ([h, w] in [0, 1], over the model's centre crop) laid over ``image``
    at its aspect ratio, longer side at most ``max_side``. Outside the crop (what the model
    never saw) the photo is dimmed; a thin white outline marks the crop."""
    base = thumbnail(image if image.mode == "RGB" else image.convert("RGB"), max_side)
    x0, y0, x1, y1 = (round(v) for v in crop_box(*base.size))
    heat = Image.fromarray(grid.numpy().astype(np.float32), mode="F").resize(
        (max(1, x1 - x0), max(1, y1 - y0)), Image.Resampling.BILINEAR
    )
    heat_u8 = (np.clip(np.asarray(heat), 0, 1) * 255).round().astype(np.uint8)
    photo = np.asarray(base, dtype=np.float32)
    out = 0.35 * photo + 0.65 * 40.0
    out[y0:y1, x0:x1] = (1 - alpha) * photo[y0:y1, x0:x1] + alpha * COLORMAP[heat_u8]
    result = Image.fromarray(out.clip(0, 255).round().astype(np.uint8), "RGB")
    ImageDraw.Draw(result).rectangle([x0, y0, x1 - 1, y1 - 1], outline=(255, 255, 255))
    buffer = io.BytesIO()
    result.save(buffer, format="PNG", compress_level=6)
    return buffer.getvalue()


# ---------------------------------------------------------------------------- the batch


@dataclass
class ExplainJob:
    """One explanation request of a batch: its spec, its rows of the batch tensor, and its
    images (thumbnails) when a PNG is asked for."""

    spec: ExplainSpec
    rows: range
    pictures: list[Image.Image]


class Explainer:
    """Explanations on the eager PyTorch model (gradients need it, whatever backend serves
    predictions). ``dual(x) -> (embedding, logits)``; ``layer`` is where GradCAM looks."""

    def __init__(self, dual: nn.Module, layer: nn.Module, png_max_side: int) -> None:
        self.dual = dual.eval()
        for parameter in self.dual.parameters():
            parameter.requires_grad_(False)  # gradients w.r.t. inputs only
        self.layer = layer
        self.png_max_side = png_max_side  # handler.explain.png_max_side

    def explain(
        self,
        pixels: torch.Tensor,
        logits: torch.Tensor,
        jobs: Sequence[ExplainJob],
        classes: Classes,
    ) -> list[list[list[Explanation]]]:
        """Per job, per image (``pixels``: the batch's uint8 crops), its explanations (one per
        target; a class's probability and rank are within its head of ``classes``). Jobs with
        the same method and settings share Captum calls of at most ``internal_batch_size`` rows
        each (autograd keeps every row's activations: the rows of one call bound the memory)."""
        probabilities = classes.softmax(logits.float())
        plan = [
            (j, row, target)
            for j, job in enumerate(jobs)
            for row in job.rows
            for target in (
                job.spec.classes or probabilities[row].topk(job.spec.top_k).indices.tolist()
            )
        ]
        maps: list[Any] = [None] * len(plan)
        empty: list[bool] = [False] * len(plan)
        groups: dict[Method, list[int]] = {}
        for p, (j, _, _) in enumerate(plan):
            groups.setdefault(Method.of(jobs[j].spec), []).append(p)
        for method, group in groups.items():
            batch = method.internal_batch_size
            for members in (group[i : i + batch] for i in range(0, len(group), batch)):
                rows = torch.tensor([plan[p][1] for p in members])
                raw = attribute(
                    self.dual,
                    self.layer,
                    normalize(pixels.index_select(0, rows)),  # the float input gradients need
                    [plan[p][2] for p in members],
                    method,
                )
                grids, flags = normalise(raw)
                for p, grid, flag in zip(members, grids, flags):
                    maps[p], empty[p] = grid, flag
        answers: list[list[list[Explanation]]] = [[[] for _ in job.rows] for job in jobs]
        for p, (j, row, target) in enumerate(plan):
            job = jobs[j]
            png = (
                render_png(job.pictures[row - job.rows.start], maps[p], self.png_max_side)
                if job.spec.png
                else None
            )
            answers[j][row - job.rows.start].append(
                Explanation(
                    target,
                    *_standing(probabilities[row], target, classes),
                    maps[p],
                    empty[p],
                    png,
                )
            )
        return answers


def _standing(
    probabilities: torch.Tensor, target: int, classes: Classes
) -> tuple[float | None, int | None]:
    """The target class's probability and rank in its head (1 = most probable); None for the
    embedding."""
    if target < 0:
        return None, None
    rank = int((probabilities[classes.head_of(target).rows] > probabilities[target]).sum()) + 1
    return float(probabilities[target]), rank


def load_explainer(checkpoint: Path, png_max_side: int) -> Explainer | None:
    """The eager model from the archive's checkpoint (``archive.sh`` packs it whatever the
    backend), or None when the archive has none (explanations then answer 501)."""
    if not checkpoint.is_file():
        return None
    from model_files.resnet_dual import build_dual  # torchvision: imported by the first to explain

    dual = build_dual(torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True))
    return Explainer(dual, dual.backbone.layer4, png_max_side)
