"""Images generated on the fly for tests: photo-like content (gradients, shapes, noise) so that
different seeds give clearly different embeddings."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw


def photo(width: int = 320, height: int = 240, seed: int = 0) -> Image.Image:
    """An RGB image with smooth gradients, a few solid shapes and mild noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    channels = []
    for _ in range(3):
        fx, fy, phase = rng.uniform(0.5, 4.0), rng.uniform(0.5, 4.0), rng.uniform(0, 6.3)
        wave = np.sin(fx * x / width * 6.3 + phase) * np.cos(fy * y / height * 6.3)
        channels.append(127 + 100 * wave)
    pixels = np.stack(channels, axis=-1) + rng.normal(0, 8, (height, width, 3))
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(6):
        x0, y0 = rng.integers(0, width), rng.integers(0, height)
        x1, y1 = x0 + rng.integers(10, width // 2), y0 + rng.integers(10, height // 2)
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        if rng.random() < 0.5:
            draw.ellipse([x0, y0, x1, y1], fill=color)
        else:
            draw.rectangle([x0, y0, x1, y1], fill=color)
    return image


def encode(image: Image.Image, fmt: str = "JPEG", **options) -> bytes:
    buffer = io.BytesIO()
    if fmt == "JPEG":
        options.setdefault("quality", 92)
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def jpeg(width: int = 320, height: int = 240, seed: int = 0) -> bytes:
    return encode(photo(width, height, seed), "JPEG")


def png(width: int = 320, height: int = 240, seed: int = 0) -> bytes:
    return encode(photo(width, height, seed), "PNG")
