"""Encoded image bytes -> the model's input tensor, exactly as the served model prepares them.

Two steps, so that a batch can be costed before any pixel is decoded: ``open`` reads the
header (format, size, decoding cost), ``decode`` does the work. Shared by the handler and the
benchmark's raw measurement, so both time the same path.
"""
from __future__ import annotations

import torch

from handlers.config import HandlerConfig
from handlers.images import OpenedImage, decode, open_image


class Preprocessor:
    """The handler's limits on the image, then the weights' own transform (resize 232, centre
    crop 224, ImageNet mean/std). Raises ``RequestError`` for a bad image."""

    def __init__(self, config: HandlerConfig) -> None:
        from model_files.resnet_dual import WEIGHTS

        self.config = config
        self.transform = WEIGHTS.transforms()
        # JPEG draft decoding may shrink in the DCT down to the resize size, never below it.
        self.draft_size = max(self.transform.resize_size) if config.draft_decode else None

    def open(self, data: bytes) -> OpenedImage:
        """Header only: checks bytes and pixel limits and tells the decoding cost."""
        return open_image(data, max_pixels=self.config.max_image_pixels,
                          max_bytes=self.config.max_image_bytes, draft_size=self.draft_size)

    def decode(self, opened: OpenedImage) -> torch.Tensor:
        return self.transform(decode(opened))

    def __call__(self, data: bytes) -> torch.Tensor:
        return self.decode(self.open(data))
