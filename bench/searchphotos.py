"""Generated photos embedded as the server embeds them, for ``make bench-search``'s photo section
(``--photos N``: bench/search.py measures the index on them).

The photos: ``tests/imagegen.py``'s (gradients, shapes, noise; 320x240, one seed each), and 1%
near-copies of them (the same photo scaled to 90% and saved again at JPEG quality 70: what
``duplicates`` is for); 100 more photos as queries. Each is embedded as the server embeds it:
``model_files.recipe.crop``, the served model's forward in float32 with the archives'
weights (``build/weights``: ImageNet's where they were built with network access, else the
seeded untrained ones, which the report says), L2-normalised.
"""

from __future__ import annotations

import io
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger("bench.search")

QUERIES = 100
BATCH = 32


def photos(count: int, first_seed: int) -> list[bytes]:
    """``count`` generated photos as JPEG files' bytes, seeds from ``first_seed``."""
    from tests import imagegen

    return [imagegen.encode(imagegen.photo(seed=first_seed + i)) for i in range(count)]


def near_copy(data: bytes) -> bytes:
    """The photo scaled to 90% and saved again at JPEG quality 70."""
    from PIL import Image

    image = Image.open(io.BytesIO(data)).convert("RGB")
    smaller = image.resize((image.width * 9 // 10, image.height * 9 // 10))
    out = io.BytesIO()
    smaller.save(out, "JPEG", quality=70)
    return out.getvalue()


def embed(files: list[bytes], weights: Path) -> np.ndarray:
    """Unit embeddings of ``files`` as the server computes them (float32)."""
    import torch
    from PIL import Image

    from model_files.recipe import crop
    from model_files.resnet_dual import build_served

    model = build_served(torch.load(weights / "resnet50.pt", weights_only=True))
    rows = []
    with torch.inference_mode():
        for start in range(0, len(files), BATCH):
            crops = [
                crop(Image.open(io.BytesIO(f)).convert("RGB")) for f in files[start : start + BATCH]
            ]
            embedding, _ = model(torch.stack(crops))
            rows.append(torch.nn.functional.normalize(embedding, dim=1).numpy())
    return np.concatenate(rows).astype(np.float32)


@dataclass
class Embedded:
    """Generated photos' unit embeddings: the collection (its last ``copies`` rows the
    near-copies of its first ``copies``), the queries, the weights' record, the seconds taken."""

    xb: np.ndarray
    xq: np.ndarray
    copies: int
    weights: dict
    embed_s: float


def embedded(count: int, weights: Path) -> Embedded:
    """``count`` generated photos (1% of them near-copies) and ``QUERIES`` more, embedded."""
    copies = max(count // 100, 1)
    log.info("photos: %d generated, %d near-copies, %d queries", count, copies, QUERIES)
    originals = photos(count - copies, 0)
    files = originals + [near_copy(f) for f in originals[:copies]]
    start = time.perf_counter()
    xb = embed(files, weights)
    embed_s = time.perf_counter() - start
    xq = embed(photos(QUERIES, 10_000_000), weights)
    info = json.loads((weights / "weights_info.json").read_text())
    return Embedded(xb, xq, copies, info, embed_s)
