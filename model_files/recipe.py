"""The served input's recipe: the ResNet50 weights' own transform up to its crop (shorter side
resized to 232, bilinear with antialias, centre crop 224), what describe reports of it, the
crop itself, as torchvision's functional calls make it on a PIL image, and the rest of the
transform (``normalize``), which runs inside the model.

Why not torchvision here: importing any part of it imports its models and ops, and with them
``torch._dynamo`` (2.5 s of a worker's start on a 2-core Zen 3, a third of its imports), and a
serving worker only crops. The constants are ``ResNet50_Weights.IMAGENET1K_V2.transforms()``'s;
``tests/test_recipe.py`` holds them and the crop to torchvision's own. The model itself, with
torchvision beneath it, is ``model_files.resnet_dual``.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from model_files.artifacts import SERVED_INPUT

RESIZE, CROP = 232, 224
ROW = (3, CROP, CROP)  # one image in the served batch: its uint8 crop, channels first
INTERPOLATION = "bilinear"  # PIL's bilinear filter, antialiased as PIL always does
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# The served input's name: files made for another input are stale (model_files/artifacts.py).
INPUT = SERVED_INPUT
# What a preprocessing step must produce, what describe reports (a client preprocessing on its
# own side compares it with its own).
PREPROCESSING = {
    "input": INPUT,
    "dtype": "uint8",
    "shape": ["n", 3, CROP, CROP],
    "layout": "NCHW, RGB",
    "resize": RESIZE,
    "interpolation": INTERPOLATION,
    "antialias": True,
    "crop": CROP,
    "in_model": f"x / 255, minus mean {list(MEAN)}, divided by std {list(STD)}",
}


def crop(image: Image.Image, out: torch.Tensor | None = None) -> torch.Tensor:
    """An RGB image -> the served input's crop, uint8 [3, 224, 224], the pixels torchvision's
    ``F.resize(image, [232])``, ``F.center_crop(.., [224])`` and ``F.pil_to_tensor`` give: the
    same PIL calls on the same sizes. The resize never leaves a side under 224, so the crop
    needs no padding.

    ``out``: a contiguous uint8 [3, 224, 224] CPU tensor (a row of the batch) to write the crop
    into, returned. Without it, a view in PIL's own layout (height, width, channel) of a copy of
    the pixels. With it, one transposing copy (numpy's) from PIL's bytes into place, where the
    views cost a copy and then a ``torch.stack`` of strided uint8 views (the slower of the two
    on a CPU) to make a batch."""
    width, height = image.size
    short, long = min(width, height), max(width, height)
    new_long = int(RESIZE * long / short)
    size = (RESIZE, new_long) if width <= height else (new_long, RESIZE)
    if size != (width, height):
        image = image.resize(size, Image.Resampling.BILINEAR)
    width, height = image.size
    if (width, height) != (CROP, CROP):
        top, left = round((height - CROP) / 2.0), round((width - CROP) / 2.0)
        image = image.crop((left, top, left + CROP, top + CROP))
    if out is not None:
        np.copyto(out.numpy(), np.asarray(image).reshape(CROP, CROP, -1).transpose(2, 0, 1))
        return out
    pixels = torch.as_tensor(np.array(image, copy=True))
    return pixels.view(CROP, CROP, -1).permute(2, 0, 1)


def normalize(pixels: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 crops -> the float input the weights expect, as torchvision's transform computes
    it (``convert_image_dtype`` then ``normalize``), in ``dtype`` on ``pixels``' device."""
    mean = torch.as_tensor(MEAN, dtype=dtype, device=pixels.device).view(-1, 1, 1)
    std = torch.as_tensor(STD, dtype=dtype, device=pixels.device).view(-1, 1, 1)
    return normalized(pixels, dtype, mean, std)


def normalized(
    pixels: torch.Tensor, dtype: torch.dtype, mean: torch.Tensor, std: torch.Tensor
) -> torch.Tensor:
    """``normalize`` with ``mean`` and ``std`` given as [3, 1, 1] tensors (a model's buffers)."""
    return (pixels.to(dtype) / 255).sub_(mean).div_(std)
