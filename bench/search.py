"""``make bench-search``: ``tsctl index build``'s index against exact search, on synthetic
vectors shaped like ResNet50 embeddings written as an embed output; results/search.md at 100k
(``-n``: another size, printed only).

The vectors: 1,000 cluster centres, each a rectified Gaussian (ResNet's pooled layer is
post-ReLU, so non-negative) scaled per channel by a log-normal (channels differ in scale), plus
a component shared by all; a vector is its centre times log-normal noise plus Gaussian noise,
rectified, L2-normalised. 1% of the vectors are near-copies of another (noise 0.004): the
duplicates. Queries: fresh vectors of the same law. Recall@10: the share of exact search's
top 10 (FAISS ``IndexFlatIP``) a search returns; pairs found: the share of exact search's pairs
at the threshold that ``tsctl duplicates`` through the index finds. Then ``--add`` more
vectors of the same law (10,000) as a second embed output: the build again updates the index
(the time, whether it trained anew, recall@10 over the whole afterwards). ``--milvus``: the
same collection through Milvus too (``tsctl index build --out URI`` into a Milvus Lite server
process on loopback: its build, memory and disk, queries and duplicates). ``--photos N``: the
index on embeddings of N generated photos too (``bench/searchphotos.py`` says how).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from bench.layout import RESULTS, cli, parse
from bench.machine import dated
from bench.markdown import bullets, document, publish, section, table

log = logging.getLogger("bench.search")

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


def write_collection(path: Path, xb: np.ndarray, first: int = 0) -> list[str]:
    """``xb`` as an embed output (``tsctl embed``'s schema), one row a vector, numbered from
    ``first``; the paths."""
    from serveclient.vectors import embedding_rows, schema

    names = [f"photos/v{i:07d}.jpg" for i in range(first, first + len(xb))]
    with pq.ParquetWriter(path, schema("embedding")) as writer:
        for s in range(0, len(xb), 10_000):
            writer.write_table(embedding_rows(names[s : s + 10_000], xb[s : s + 10_000]))
    return names


def percentiles(seconds: list[float]) -> tuple[str, str]:
    """(p50, p99) in ms, as the tables write them."""
    return tuple(str(round(float(np.percentile(seconds, q)) * 1e3, 2)) for q in (50, 99))


def exact_pairs(xb: np.ndarray, threshold: float) -> tuple[set[tuple[int, int]], float]:
    """Every pair at cosine >= ``threshold`` (FAISS's flat range search, every core), and
    the seconds it took."""
    import faiss

    faiss.omp_set_num_threads(os.cpu_count() or 1)
    flat = faiss.IndexFlatIP(D)
    flat.add(xb)
    start = time.perf_counter()
    lims, _, found = flat.range_search(xb, threshold)
    seconds = time.perf_counter() - start
    pairs = {
        (min(i, int(j)), max(i, int(j)))
        for i in range(len(xb))
        for j in found[lims[i] : lims[i + 1]]
        if i != j
    }
    return pairs, seconds


def exact_top10(xb: np.ndarray, xq: np.ndarray) -> np.ndarray:
    """Each query's 10 nearest rows of ``xb`` (ids, best first): float32 dot products,
    100,000 rows at a time (no second copy of the vectors)."""
    scores = np.full((len(xq), 10), -np.inf, np.float32)
    ids = np.zeros((len(xq), 10), np.int64)
    for start in range(0, len(xb), 100_000):
        chunk = xq @ xb[start : start + 100_000].T
        rows = np.arange(start, start + chunk.shape[1])
        both = np.concatenate([scores, chunk], 1)
        both_ids = np.concatenate([ids, np.broadcast_to(rows, chunk.shape)], 1)
        keep = np.argsort(-both, 1, kind="stable")[:, :10]
        scores, ids = np.take_along_axis(both, keep, 1), np.take_along_axis(both_ids, keep, 1)
    return ids


def top10(
    nearest: Callable[[np.ndarray], list[list[tuple[str, float]]]],
    xq: np.ndarray,
    truth: np.ndarray,
    ids: dict[str, int],
) -> tuple[list[float], float]:
    """Each query's seconds through ``nearest`` (one at a time) and the recall@10 against
    ``truth`` (exact search's top 10 ids)."""
    seconds, hits = [], 0
    for query, want in zip(xq, truth):
        start = time.perf_counter()
        [got] = nearest(query[None])
        seconds.append(time.perf_counter() - start)
        hits += len({ids[path] for path, _ in got} & set(want.tolist()))
    return seconds, hits / (10 * len(xq))


def timed_pairs(pairs: Callable[[], Iterable], ids: dict[str, int]) -> tuple[set, float]:
    """The pairs ``pairs()`` finds, as (lower id, higher id), and the seconds it took."""
    start = time.perf_counter()
    found = {(min(ids[a], ids[b]), max(ids[a], ids[b])) for a, b, _ in pairs()}
    return found, time.perf_counter() - start


@dataclass
class MilvusRun:
    """The same collection through Milvus (a Milvus Lite server process, tsctl's URI path)."""

    version: str
    spec: str
    build_s: float
    rss_bytes: float  # the server process's resident memory a vector, all of it
    disk_bytes: float  # its data folder a vector
    query_s: list[float]
    recall: float
    pairs_s: float
    pairs: set[tuple[int, int]]

    def top10_row(self) -> list:
        from serveclient.search import milvusindex

        return [
            f"Milvus Lite {self.version} server (`--out http://...`): {self.spec}"
            + (f", nprobe {milvusindex.NPROBE}" if self.spec != "FLAT" else "")
            + f", top 10 + {milvusindex.RESCORE_EXTRA} re-scored",
            f"{self.build_s:.1f}", f"{self.rss_bytes:,.0f}", f"{self.disk_bytes:,.0f}",
            *percentiles(self.query_s), f"{self.recall:.3f}",
        ]  # fmt: skip

    def pairs_row(self, want: set[tuple[int, int]]) -> list:
        from serveclient.search import faissindex as index

        found = len(self.pairs & want) / max(len(want), 1)
        return [
            f"`tsctl duplicates` through Milvus (each vector's {index.PAIR_CANDIDATES} nearest, "
            f"nprobe {index.PAIR_NPROBE}, re-scored)", f"{self.pairs_s:.1f}", len(self.pairs),
            f"{found:.3f}",
        ]  # fmt: skip

    def note(self) -> str:
        return (
            "Milvus's memory is its server process's whole resident set (a Python gRPC server "
            "and its FAISS segments) over the vectors; on disk, its data folder (the float32 "
            "vectors and the index). A query travels gRPC and back, as it would to a Milvus "
            "Standalone."
        )


def measure_milvus(
    tmp: Path,
    parquet: Path,
    xq: np.ndarray,
    truth: np.ndarray,
    ids: dict[str, int],
    threshold: float,
) -> MilvusRun:
    """Index ``parquet`` into a Milvus Lite server as ``tsctl index build --out URI`` does;
    top 10 and duplicates through it."""
    import milvus_lite
    import psutil

    from devtools.milvus import milvus_lite as lite_server
    from serveclient.search import milvusindex

    folder = tmp / "milvus"
    folder.mkdir()
    with lite_server(folder) as server:
        log.info("Milvus: tsctl index build --out %s", server.uri)
        start = time.perf_counter()
        built = milvusindex.build([parquet], server.uri, "bench", progress=False)
        build_s = time.perf_counter() - start
        opened = milvusindex.open_index(server.uri, "bench")
        n = built.count
        log.info("Milvus: %d queries", len(xq))
        query_s, recall = top10(lambda q: opened.nearest(q, 10), xq, truth, ids)
        rss = psutil.Process(server.pid).memory_info().rss / n
        disk = sum(f.stat().st_size for f in (folder / "db").rglob("*") if f.is_file()) / n
        log.info("Milvus: duplicates")
        pairs, pairs_s = timed_pairs(lambda: opened.pairs(threshold), ids)
    return MilvusRun(
        milvus_lite.__version__, built.spec, build_s, rss, disk, query_s, recall, pairs_s, pairs
    )


def photos_section(count: int, work: Path, weights: Path, threshold: float) -> str:
    """The report's section for ``count`` generated photos (bench/searchphotos.py; index files
    under ``work``). The index is the one a large collection gets (``PROJ256,IVF{lists},SQ8``,
    tsctl's nprobe and re-scoring), forced at this size, where ``tsctl index build`` would build
    an exact flat index; the cosines of unrelated photos and of near-copies say whether the
    weights spread photos apart at all."""
    from bench.searchphotos import QUERIES, embedded
    from serveclient.search import faissindex as index

    photos = embedded(count, weights)
    xb, xq, copies, info, embed_s = (
        photos.xb,
        photos.xq,
        photos.copies,
        photos.weights,
        photos.embed_s,
    )
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
    query_s, recall = top10(lambda q: opened.nearest(q, 10), xq, exact_ranking, ids)
    found = {tuple(sorted((ids[p], ids[q]))) for p, q, _ in opened.pairs(threshold)}
    exact = {(int(i), int(j)) for i, j in np.argwhere(np.triu(xb @ xb.T >= threshold, 1))}
    planted = {(i, count - copies + i) for i in range(copies)}
    weights_line = f"weights: {info['source']}" + (
        "" if info.get("trained") else " (**untrained**: these are not real embeddings)"
    )
    rows = [
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
    return section(
        f"Embeddings of {count:,} generated photos",
        f"`tests/imagegen.py`'s photos, 1% of them near-copies (90% scale, JPEG quality 70), "
        f"embedded as the server embeds them in {embed_s:.0f} s; {weights_line}.",
        table(["", ""], rows),
    )


def main(argv: list[str] | None = None) -> int:
    parser = cli("python -m bench.search", __doc__, out=None)
    add = parser.add_argument
    add("-n", type=int, default=100_000, help="stored vectors (100000)")
    add("--queries", type=int, default=300, help="timed queries (300)")
    add("--exact-queries", type=int, default=50, help="of them, exact (50)")
    add("--threshold", type=float, default=0.97, help="duplicates' cosine")
    add("--pairs-upto", type=int, default=200_000, help="exact search's pairs only up to this "
        "many vectors (200000: all pairs are n²)")  # fmt: skip
    add("--add", type=int, default=10_000, help="photos added to the indexed collection (10000)")
    add("--milvus", action="store_true", help="also through Milvus (a Milvus Lite server "
        "process, tsctl index build --out URI)")  # fmt: skip
    add("--photos", type=int, default=0, help="also the index on embeddings of this many "
        "generated photos (bench/searchphotos.py)")  # fmt: skip
    add("--weights", type=Path, default=Path("build/weights"), help="their weights (build/weights)")
    add("--out", type=Path, help="the report (default: results/search.md at 100k)")
    args = parse(parser, argv)
    provenance = dated()  # the code as it was loaded: later edits are not what ran
    everything, xq = clustered(args.n + args.add)
    xq = xq[: args.queries]
    log.info("exact top 10 over %d vectors, and over them with %d added", args.n, args.add)
    truth = {"before": exact_top10(everything[: args.n], xq), "after": exact_top10(everything, xq)}
    want = None  # exact search's pairs, and the seconds they took
    if args.n <= args.pairs_upto:
        log.info("exact pairs at %.2f (FAISS flat, all pairs)", args.threshold)
        want = exact_pairs(everything[: args.n], args.threshold)
    with tempfile.TemporaryDirectory() as tmp:
        parquet = Path(tmp) / "collection.parquet"
        ids = {name: i for i, name in enumerate(write_collection(parquet, everything[: args.n]))}
        added = Path(tmp) / "added.parquet"  # the next embed run's output, beside the first
        more = write_collection(added, everything[args.n :], args.n)
        ids.update((name, args.n + i) for i, name in enumerate(more))
        del everything
        run = measure(args, Path(tmp), (parquet, added), xq, truth, ids)
    text = report(args, provenance, run, want)
    if args.out is None and args.n != 100_000:
        print(text)
        return 0
    return publish(args.out or RESULTS / "search.md", text)


def measure(args, tmp: Path, files: tuple[Path, Path], xq, truth: dict, ids: dict) -> dict:
    """``tsctl index build`` over the first embed output, its top 10 and duplicates, exact
    search's top 10, Milvus and the photos where asked; then the build again with the second
    output beside the first, and its recall@10."""
    import faiss

    from serveclient.search import faissindex as index
    from serveclient.search.exact import ExactSearch

    parquet, added = files
    folder = tmp / "collection.parquet.vindex"
    log.info("tsctl index build over %d vectors", args.n)
    start = time.perf_counter()
    built = index.build([parquet], folder, progress=False)
    build_s = time.perf_counter() - start
    opened = index.open_index(folder)
    files = opened.files  # the build folder the manifest names
    size = {f: (files / f).stat().st_size / args.n for f in (index.VECTORS, index.RESCORE)}
    faiss.omp_set_num_threads(1)  # one query at a time, as tsctl similar asks
    log.info("%d queries through the index, %d exact", args.queries, args.exact_queries)
    index_s, recall = top10(lambda q: opened.nearest(q, 10), xq, truth["before"], ids)
    ExactSearch(parquet).nearest(xq[:1], 10)  # the exact path's cache, written once
    few = slice(0, args.exact_queries)
    exact = top10(lambda q: ExactSearch(parquet).nearest(q, 10), xq[few], truth["before"][few], ids)
    log.info("duplicates through the index")
    faiss.omp_set_num_threads(os.cpu_count() or 1)  # one batch job, as tsctl duplicates runs
    pairs = timed_pairs(lambda: opened.pairs(args.threshold), ids)
    milvus = (
        measure_milvus(tmp, parquet, xq, truth["before"], ids, args.threshold)
        if args.milvus
        else None
    )
    photos = photos_section(args.photos, tmp, args.weights, args.threshold) if args.photos else None
    log.info("%d photos added: the index updated", args.add)
    start = time.perf_counter()
    update = index.build([parquet, added], folder, progress=False)
    update_s = time.perf_counter() - start
    faiss.omp_set_num_threads(1)
    opened = index.open_index(folder)
    _, recall_after = top10(lambda q: opened.nearest(q, 10), xq, truth["after"], ids)
    return {
        "faiss": faiss.__version__, "built": built, "build_s": build_s, "opened": opened,
        "size": size, "pq_bytes": parquet.stat().st_size / args.n, "index_s": index_s,
        "recall": recall, "exact": exact, "pairs": pairs, "milvus": milvus, "photos": photos,
        "update": update, "update_s": update_s, "recall_after": recall_after,
    }  # fmt: skip


def report(args, provenance: str, run: dict, want: tuple[set, float] | None) -> str:
    """results/search.md from ``measure``'s figures and exact search's pairs (``want``)."""
    from serveclient.search import faissindex as index

    built, opened, size, milvus, update = (
        run[k] for k in ("built", "opened", "size", "milvus", "update")
    )
    (exact_s, exact_recall), (pairs, pairs_s) = run["exact"], run["pairs"]
    rows = [
        ["exact (`--exact`: float32 over the Parquet)", "-", f"{4 * D:,}", "-",
         *percentiles(exact_s), f"{exact_recall:.3f}"],
        [f"`tsctl index build`: {built.spec}, nprobe {index.nprobe_for(built.spec)}"
         + (f", top {index.RESCORE_DEPTH} re-scored" if opened.approximate else ""),
         f"{run['build_s']:.1f}", f"{size[index.VECTORS]:,.0f}", f"{size[index.RESCORE]:,.0f}",
         *percentiles(run["index_s"]), f"{run['recall']:.3f}"],
        *([milvus.top10_row()] if milvus else []),
    ]  # fmt: skip
    through = [f"`tsctl duplicates` through the index (each vector's {index.PAIR_CANDIDATES} "
               f"nearest, nprobe {index.PAIR_NPROBE}, re-scored)", f"{pairs_s:.1f}",
               len(pairs)]  # fmt: skip
    if want is None:
        duplicates = [
            [*through, f"not measured: exact search's all pairs past {args.pairs_upto:,}"]
        ]
    else:
        found = len(pairs & want[0]) / max(len(want[0]), 1)
        duplicates = [["exact (all pairs, FAISS flat, every core)", f"{want[1]:.1f}", len(want[0]),
                       "1.000"], [*through, f"{found:.3f}"],
                      *([milvus.pairs_row(want[0])] if milvus else [])]  # fmt: skip
    return document(
        "Vector search (`make bench-search`): the index against exact search",
        bullets([
            provenance,
            f"faiss-cpu {run['faiss']}; {args.n:,} synthetic vectors shaped like ResNet50 "
            f"embeddings (`bench/search.py`: {D}-d, unit length, post-ReLU clusters, 1% "
            f"near-copies) in an embed output; {args.queries} fresh queries of the same law "
            f"({args.exact_queries} of them exact), one at a time on one thread",
        ]),
        section(
            "Top 10",
            table("search | build s | index bytes/vector (memory) | bytes/vector on disk | "
                  "p50 ms | p99 ms | recall@10", rows),
            milvus.note() if milvus else None,
            f"Float32 is {4 * D:,} bytes a vector: the index in memory is "
            f"{size[index.VECTORS] / (4 * D):.3f} of it"
            + (f"; the float16 copy the candidates are re-scored from stays on disk, "
               f"{index.RESCORE_DEPTH} rows read a query. The projection keeps at least "
               f"{opened.manifest['kept']:.3f} of a vector's length² (the training sample's "
               "0.1% quantile): how far the index's own scores are from cosines."
               if opened.approximate else "."),
            f"Ten million vectors on paper, from these bytes a vector (not measured): "
            f"{size[index.VECTORS] * 1e7 / 1e9:.1f} GB of memory for the index, "
            f"{size[index.RESCORE] * 1e7 / 1e9:.0f} GB of disk for the float16 copy, beside "
            f"an embed output of about {run['pq_bytes'] * 1e7 / 1e9:.0f} GB.",
        ),
        section(
            f"{args.add:,} photos added",
            f"`tsctl index build` again with a second embed output of {args.add:,} photos "
            f"beside the first: {update.added:,} added, {update.removed} removed, "
            f"{'trained anew' if update.trained else 'no training (the index updated in place)'}, "
            f"{run['update_s']:.1f} s; recall@10 over all {update.count:,} afterwards "
            f"{run['recall_after']:.3f}.",
        ),
        section(
            f"Duplicates at cosine {args.threshold}",
            table("search | seconds | pairs | share of exact's pairs found", duplicates),
        ),
        run["photos"],
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
