"""Encoded image bytes -> the served model's input, one image at a time: what the batch intake
(``servecore.intake``), the KServe transformer, the client's preprocessing tier and the
benchmarks share, without the batch machinery."""

from __future__ import annotations

import torch

from model_files.recipe import RESIZE, crop
from servecore.boundary import each_image
from servecore.config import HandlerConfig
from servecore.crops import GivenCrop, open_crop
from servecore.errors import PayloadTooLarge
from servecore.images import OpenedImage, decode, open_image
from servecore.request import ParsedRequest


class Preprocessor:
    """Encoded image bytes -> the served model's input (``model_files.recipe.INPUT``): the
    handler's limits on the image, then the weights' transform up to its crop (resize 232,
    centre crop 224), a uint8 [3, 224, 224] crop; the backend normalises it in the model. In
    two steps, so that a batch is costed before any pixel is decoded; the benchmark times the
    same path. Raises ``RequestError`` for a bad image."""

    def __init__(self, config: HandlerConfig) -> None:
        self.config = config
        # JPEG draft decoding may shrink in the DCT down to the resize size, never below it.
        self.draft_size = RESIZE if config.draft_decode else None

    def open(self, data: bytes) -> OpenedImage:
        """Header only: checks bytes and pixel limits and tells the decoding cost."""
        return open_image(
            data,
            max_pixels=self.config.max_image_pixels,
            max_bytes=self.config.max_image_bytes,
            draft_size=self.draft_size,
        )

    def decode(
        self, opened: OpenedImage | GivenCrop, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The model's input for an opened image; a crop the request carried is one already.
        ``out``: a contiguous uint8 [3, 224, 224] CPU tensor, a row of the batch, that the crop
        is written into and returned as (``model_files.recipe.crop``)."""
        if isinstance(opened, GivenCrop):
            return opened.crop if out is None else out.copy_(opened.crop)
        return crop(decode(opened), out)

    def __call__(self, data: bytes) -> torch.Tensor:
        return self.decode(self.open(data))

    def read(self, request_id: str, request: ParsedRequest) -> tuple[OpenedImage | GivenCrop, ...]:
        """The request's images opened (``open``; a crop the request carried as a
        ``GivenCrop``), the first bad one raising its ``RequestError`` ("image k of n"), and 413
        ``PayloadTooLarge`` when together they would decode more than
        ``handler.max_request_pixels``."""
        opener = open_crop if request.crops else self.open
        images: tuple[OpenedImage | GivenCrop, ...] = tuple(
            each_image(request_id, "reading", request.images, opener)
        )
        pixels, limit = sum(image.pixels for image in images), self.config.max_request_pixels
        if pixels > limit:
            raise PayloadTooLarge(
                f"request would decode {pixels} pixels ({len(images)} image(s)), "
                f"more than the limit of {limit} (handler.max_request_pixels); send fewer "
                "or smaller images"
            )
        return images
