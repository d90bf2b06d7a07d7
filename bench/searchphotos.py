"""``make bench-search``'s photo section (``--photos N``): the index on embeddings of generated
photos, beside the synthetic vectors' figures.

The photos: ``tests/imagegen.py``'s (gradients, shapes, noise; 320x240, one seed each), and 1%
near-copies of them (the same photo scaled to 90% and saved again at JPEG quality 70: what
``duplicates`` is for); 100 more photos as queries. Each is embedded as the server embeds it:
``model_files.resnet_dual.crop``, the served model's forward in float32 with the archives'
weights (``build/weights``: ImageNet's where they were built with network access, else the
seeded untrained ones, which the report says), L2-normalised. The index is the one a large
collection gets (``PROJ256,IVF{lists},SQ8``, tsctl's nprobe and re-scoring), forced at this
size, where ``tsctl index build`` would build an exact flat index. The cosines of unrelated
photos and of near-copies say whether the weights spread photos apart at all.
"""

from __future__ import annotations

import io
import json
import logging
import time
from pathlib import Path

import numpy as np
from tabulate import tabulate

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

    from model_files.resnet_dual import build_served, crop

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


def section(count: int, work: Path, weights: Path, threshold: float) -> str:
    """The report's section for ``count`` generated photos (index files under ``work``)."""
    from bench.search import exact_top10, percentiles, top10, write_collection
    from serveclient import index

    info = json.loads((weights / "weights_info.json").read_text())
    copies = max(count // 100, 1)
    log.info("photos: %d generated, %d near-copies, %d queries", count, copies, QUERIES)
    originals = photos(count - copies, 0)
    files = originals + [near_copy(f) for f in originals[:copies]]
    queries = photos(QUERIES, 10_000_000)
    start = time.perf_counter()
    xb = embed(files, weights)
    embed_s = time.perf_counter() - start
    xq = embed(queries, weights)
    parquet = work / "photos.parquet"
    ids = {name: i for i, name in enumerate(write_collection(parquet, xb))}
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, count - copies, (2, 2000))
    unrelated = np.einsum("nd,nd->n", xb[a[a != b]], xb[b[a != b]])
    twins = np.einsum("nd,nd->n", xb[:copies], xb[count - copies :])
    exact_ranking = exact_top10(xb, xq)
    saved = index.EXACT_BELOW
    index.EXACT_BELOW = 0  # the index a large collection gets, at this size
    try:
        built = index.build([parquet], work / "photos.vindex", progress=False)
    finally:
        index.EXACT_BELOW = saved
    opened = index.open_index(work / "photos.vindex")
    query_s, recall = top10(lambda q: index.nearest(opened, q, 10), xq, exact_ranking, ids)
    found = {tuple(sorted((ids[p], ids[q]))) for p, q, _ in index.pairs(opened, threshold)}
    exact = {(int(i), int(j)) for i, j in np.argwhere(np.triu(xb @ xb.T >= threshold, 1))}
    planted = {(i, count - copies + i) for i in range(copies)}
    weights_line = f"weights: {info['source']}" + (
        "" if info.get("trained") else " (**untrained**: these are not real embeddings)"
    )
    table = [
        ["cosine of unrelated photos (median of 2,000 pairs)", f"{np.median(unrelated):.3f}"],
        [f"cosine of a near-copy to its photo (median of {copies})", f"{np.median(twins):.3f}"],
        [f"`tsctl index build` forced to {built.spec}: recall@10 ({QUERIES} queries)",
         f"{recall:.3f}"],
        ["its query p50 / p99 ms", "{} / {}".format(*percentiles(query_s))],
        [f"exact search's pairs at cosine {threshold}", f"{len(exact):,}"],
        ["of them, planted near-copies", f"{len(exact & planted)} of {copies}"],
        ["share of exact's pairs `tsctl duplicates` finds through the index",
         f"{len(found & exact) / max(len(exact), 1):.3f}"],
    ]  # fmt: skip
    return "\n".join(
        [
            f"## Embeddings of {count:,} generated photos",
            "",
            f"`tests/imagegen.py`'s photos, 1% of them near-copies (90% scale, JPEG quality "
            f"70), embedded as the server embeds them in {embed_s:.0f} s; {weights_line}.",
            "",
            tabulate(table, headers=["", ""], tablefmt="github", disable_numparse=True),
            "",
        ]
    )
