"""The fixed answer every null model gives: one seeded unit-length embedding, the same for
every image, with real-looking values (a vector of zeros would encode to a few bytes per
number in JSON, and our core cannot normalise it)."""

from __future__ import annotations

import numpy as np

EMBEDDING_SIZE = 2048  # servecore's ResNet50 embedding: tritonrepo.generate.EMBEDDING_SIZE
CLASSES = 1000
PRECISION = "null"  # what the null backend reports as its arithmetic


def embedding() -> np.ndarray:
    """float32 [EMBEDDING_SIZE], unit length, the same on every call."""
    vector = np.random.default_rng(0).standard_normal(EMBEDDING_SIZE).astype(np.float32)
    return vector / np.linalg.norm(vector)
