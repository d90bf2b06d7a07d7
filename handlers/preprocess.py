"""Encoded image bytes -> the model's input tensor, exactly as the served model prepares them.

Shared by the handler and the benchmark's raw measurement, so both time the same path.
"""
from __future__ import annotations

import torch

from handlers.config import HandlerConfig
from handlers.images import decode_image


class Preprocessor:
    """``decode_image`` with the handler's limits, then the weights' own transform (resize 232,
    centre crop 224, ImageNet mean/std). Raises ``RequestError`` for a bad image."""

    def __init__(self, config: HandlerConfig) -> None:
        from model_files.resnet_dual import WEIGHTS

        self.config = config
        self.transform = WEIGHTS.transforms()
        # JPEG draft decoding may shrink in the DCT down to the resize size, never below it.
        self.draft_size = max(self.transform.resize_size) if config.draft_decode else None

    def __call__(self, data: bytes) -> torch.Tensor:
        image = decode_image(data, max_pixels=self.config.max_image_pixels,
                             max_bytes=self.config.max_image_bytes, draft_size=self.draft_size)
        return self.transform(image)
