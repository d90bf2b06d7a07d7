"""Preprocessed crops as a model input: a KServe v2 ``UINT8`` tensor named ``crops``, shape
``[n, 224, 224, 3]``, each image the served recipe's crop (``model_files.recipe.crop``,
``PREPROCESSING``) laid out height, width, RGB channel.

HWC because that is how a client holds an image (``numpy.asarray(pil_image)``, OpenCV, TF), so
it sends its crop without a transpose; the server turns each into the model's channels-first
``uint8 [3, 224, 224]`` (a view: stacking the batch copies it anyway). A crop request skips
decoding: its images are "opened" here without PIL (``GivenCrop``, no decoding cost) and the
model answers them exactly as it answers the same image sent encoded (the same uint8 array).

The tensor comes as a v2 JSON ``data`` list (flat or nested integers 0..255), as the binary
tensor extension's raw bytes (``binary_data_size``; read by ``serveshared.v2binary``), or as an
array an engine has read (Triton). Every element is one crop's bytes (``CROP_BYTES``, HWC
order) in the ``ParsedRequest``: the content cache keys them apart from encoded images
(``CROP_DOMAIN``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_files.recipe import CROP, INPUT
from servecore.errors import InvalidRequest, echo

CROPS = "crops"  # the input's name (Triton requires it; TorchServe reads the datatype)
CROP_SHAPE = (CROP, CROP, 3)
CROP_BYTES = CROP * CROP * 3
# What describe says the input takes (``preprocessing`` says how the crop is made).
CROPS_INPUT = {
    "name": CROPS,
    "datatype": "UINT8",
    "shape": ["n", *CROP_SHAPE],
    "layout": "NHWC, RGB",
    "recipe": INPUT,
}
# Prefixed to a crop's bytes in the content cache's digest: no encoded image starts this way
# (one that did would not decode, so would never be stored), so a crop never answers as one.
CROP_DOMAIN = f"{INPUT}\0".encode()


@dataclass(frozen=True)
class GivenCrop:
    """A crop the request carried, "opened": the model's input as it is, channels first.
    ``pixels``: its decoding cost, none."""

    crop: torch.Tensor
    pixels: int = 0


def open_crop(data: bytes) -> GivenCrop:
    """One crop's ``CROP_BYTES`` (HWC) as the model's ``uint8 [3, 224, 224]``."""
    if len(data) != CROP_BYTES:  # parse checked the tensor's size; this is a bug of ours
        raise ValueError(f"a crop is {CROP_BYTES} bytes, got {len(data)}")
    pixels = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(CROP_SHAPE)
    return GivenCrop(pixels.permute(2, 0, 1))


def crop_count(shape: Any, where: str) -> int:
    """How many crops a ``UINT8`` tensor's declared ``shape`` holds, or a 400 saying what was
    expected (checked before any pixel is read)."""
    dims = list(shape) if isinstance(shape, (list, tuple)) else []
    n = dims[0] if dims else None
    if len(dims) != 4 or list(dims[1:]) != list(CROP_SHAPE) or type(n) is not int or n < 1:
        raise InvalidRequest(
            f"{where}.shape must be [n, {CROP}, {CROP}, 3] (n crops >= 1, each height, width, "
            f"RGB as the recipe {INPUT} crops them; see describe's crops_input), "
            f"got {echo(shape)}"
        )
    return n


def crops_of(data: Any, count: int, where: str) -> list[bytes]:
    """A ``UINT8`` tensor's elements (a JSON list of integers, raw bytes, or an array) of
    ``count`` crops (``crop_count``) as one ``CROP_BYTES`` item per crop, or a 400. Each crop
    is copied out of ``data`` once."""
    raw = _raw(data, where)
    if len(raw) != count * CROP_BYTES:
        raise InvalidRequest(
            f"{where} holds {len(raw)} values, its shape [{count}, {CROP}, {CROP}, 3] says "
            f"{count * CROP_BYTES}: send every pixel of every crop"
        )
    return [bytes(raw[i * CROP_BYTES : (i + 1) * CROP_BYTES]) for i in range(count)]


def _raw(data: Any, where: str) -> memoryview:
    """``data``'s pixels as a flat byte view (no copy of a body or an array)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return memoryview(data).cast("B")
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8:
            raise InvalidRequest(f"{where} must be UINT8, got {data.dtype}")
        return np.ascontiguousarray(data).reshape(-1).data
    try:
        values = np.asarray(data)
    except ValueError:
        values = np.asarray([])  # ragged nesting: not a tensor
    if values.dtype.kind not in "iu" or (values.size and (values.min() < 0 or values.max() > 255)):
        raise InvalidRequest(
            f"{where}.data must hold integers 0..255 (UINT8 pixels), got "
            f"{'values of ' + str(values.dtype) if values.size else 'something else'}"
        )
    return values.astype(np.uint8).reshape(-1).data
