"""``make bench-search``: FAISS indexes against exact search on synthetic vectors shaped like
ResNet50 embeddings; prints Markdown (``results/search.md`` quotes a run).

The vectors: 1,000 cluster centres, each a rectified Gaussian (ResNet's pooled layer is
post-ReLU, so non-negative) scaled per channel by a log-normal (channels differ in scale), plus
a component shared by all; a vector is its centre times log-normal noise plus Gaussian noise,
rectified, L2-normalised. 1% of the vectors are near-copies of another (noise 0.004): the
duplicates. Queries: 1,000 fresh vectors of the same law. Recall@10: the share of exact
search's top 10 (FAISS ``IndexFlatIP``) the index returns; ``rerank R``: the index's top R
re-scored with the float32 vectors (read from disk in a real collection), top 10 kept.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

D = 2048


def clustered(n: int, seed: int = 0, clusters: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """(stored vectors [n, D], queries [1000, D]), unit length, as the docstring says."""
    rng = np.random.default_rng(seed)
    scale = rng.lognormal(0, 1.0, D).astype(np.float32)
    centres = (np.maximum(rng.standard_normal((clusters, D)), 0) * scale).astype(np.float32)
    centres += 0.5 * scale * np.maximum(rng.standard_normal(D), 0).astype(np.float32)

    def draw(m: int) -> np.ndarray:
        x = centres[rng.integers(0, clusters, m)] * rng.lognormal(0, 0.35, (m, D)).astype(
            np.float32
        )
        x += rng.standard_normal((m, D)).astype(np.float32) * 0.15 * scale
        np.maximum(x, 0, out=x)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    xb = np.concatenate([draw(min(10_000, n - s)) for s in range(0, n, 10_000)])
    copies = n // 100
    dup = (
        xb[rng.integers(0, n, copies)] + rng.standard_normal((copies, D)).astype(np.float32) * 0.004
    )
    xb[rng.choice(n, copies, replace=False)] = dup / np.linalg.norm(dup, axis=1, keepdims=True)
    return xb, draw(1000)


def measure(spec: str, xb: np.ndarray, xq: np.ndarray, gt: np.ndarray, queries: int) -> list[dict]:
    import faiss

    rng = np.random.default_rng(1)
    faiss.omp_set_num_threads(2)
    index = faiss.index_factory(D, spec, faiss.METRIC_INNER_PRODUCT)
    start = time.perf_counter()
    index.train(xb[rng.choice(len(xb), min(len(xb), 50_000), replace=False)])
    index.add(xb)
    built = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        faiss.write_index(index, os.path.join(tmp, "i"))
        size = os.path.getsize(os.path.join(tmp, "i"))
    faiss.omp_set_num_threads(1)  # one query at a time, as tsctl similar asks
    rows = []
    for rerank in (0, 50, 100):
        latency, hits = [], 0
        for i in range(queries):
            t = time.perf_counter()
            _, found = index.search(xq[i : i + 1], rerank or 10)
            top = found[0][found[0] >= 0]
            if rerank:
                top = top[np.argsort(-(xb[top] @ xq[i]))]
            latency.append(time.perf_counter() - t)
            hits += len(set(top[:10].tolist()) & set(gt[i].tolist()))
        rows.append(
            {
                "index": spec,
                "rerank": rerank,
                "build_s": round(built, 1),
                "bytes_per_vector": round(size / len(xb)),
                "p50_ms": round(float(np.percentile(latency, 50)) * 1e3, 2),
                "p99_ms": round(float(np.percentile(latency, 99)) * 1e3, 2),
                "recall_at_10": round(hits / (10 * queries), 3),
            }
        )
    return rows


def main() -> None:
    import faiss
    from tabulate import tabulate

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=100_000, help="stored vectors (100000)")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument(
        "--specs", nargs="+", default=["PCAR256,IVF1024,SQ8", "PCAR512,IVF1024,SQ8"]
    )
    args = parser.parse_args()
    xb, xq = clustered(args.n)
    flat = faiss.IndexFlatIP(D)
    flat.add(xb)
    faiss.omp_set_num_threads(1)
    latency = []
    for i in range(args.queries):
        t = time.perf_counter()
        flat.search(xq[i : i + 1], 10)
        latency.append(time.perf_counter() - t)
    _, gt = flat.search(xq, 10)
    rows = [
        {
            "index": "exact (float32)",
            "rerank": 0,
            "build_s": 0.0,
            "bytes_per_vector": 4 * D,
            "p50_ms": round(float(np.percentile(latency, 50)) * 1e3, 2),
            "p99_ms": round(float(np.percentile(latency, 99)) * 1e3, 2),
            "recall_at_10": 1.0,
        }
    ]
    for spec in args.specs:
        rows += measure(spec, xb, xq, gt, args.queries)
    print(f"{args.n} vectors, load average {os.getloadavg()[0]:.1f} at the end\n")
    print(tabulate(rows, headers="keys", tablefmt="github"))


if __name__ == "__main__":
    main()
