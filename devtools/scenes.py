"""A small labelled photo set made here, for ``tsctl head train``'s test and the docs' picture
of its report: four kinds of synthetic scene (``SCENES``), each drawn with random colours,
scales and phases, distinct enough that a linear probe on even an untrained backbone's
embedding separates them.

    labelled_set(Path("build/scenes"), per_label=12)   # build/scenes/<kind>/<i>.jpg
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

SCENES = ("checks", "gradient", "noise", "stripes")
# Each kind in its own palette (which channel dominates), so that what tells them apart is
# both texture and colour, as it is for many real labels (receipts are white, grass is green).
DOMINANT = {"checks": 0, "gradient": 1, "noise": None, "stripes": 2}


def scene(kind: str, width: int = 160, height: int = 120, seed: int = 0) -> Image.Image:
    """One scene of ``kind`` (one of ``SCENES``)."""
    rng = np.random.default_rng(seed)
    a, b = (rng.integers(0, 128, 3).astype(np.float32) for _ in range(2))
    if DOMINANT.get(kind) is not None:
        a[DOMINANT[kind]] += 128
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    if kind == "noise":
        pixels = rng.normal(127, 60, (height, width, 1)).repeat(3, axis=2)  # grey
    elif kind == "gradient":
        angle = rng.uniform(0, 2 * np.pi)
        t = (np.cos(angle) * x / width + np.sin(angle) * y / height + 1) / 2
        pixels = a + (b - a) * t[..., None] + rng.normal(0, 4, (height, width, 3))
    elif kind in ("stripes", "checks"):
        period = int(rng.integers(6, 20))
        phase = int(rng.integers(0, period))
        rows = (y.astype(int) + phase) // period
        cols = (x.astype(int) + phase) // period
        mask = (rows % 2 == 0) if kind == "stripes" else ((rows + cols) % 2 == 0)
        pixels = np.where(mask[..., None], a, b) + rng.normal(0, 6, (height, width, 3))
    else:
        raise ValueError(f"unknown scene {kind!r}; one of {SCENES}")
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")


def labelled_set(root: Path, per_label: int, seed: int = 0) -> dict[str, list[Path]]:
    """``root/<kind>/<i>.jpg`` for every kind of ``SCENES``; the paths per label."""
    paths: dict[str, list[Path]] = {}
    for k, kind in enumerate(SCENES):
        folder = root / kind
        folder.mkdir(parents=True, exist_ok=True)
        paths[kind] = []
        for i in range(per_label):
            buffer = io.BytesIO()
            scene(kind, seed=seed + 1000 * k + i).save(buffer, "JPEG", quality=92)
            path = folder / f"{i:03d}.jpg"
            path.write_bytes(buffer.getvalue())
            paths[kind].append(path)
    return paths
