"""An approximate vector index over the collection job's embedding Parquet (one file or the
shards of an Indexed Job), with FAISS, in a folder on disk (``tsctl index build``).

Layout of ``FOLDER``: ``vectors.faiss`` (the FAISS index, ids = row numbers in ``paths``),
``paths.parquet`` (id, path, size, mtime of every live photo), ``rescore.f16`` (each id's unit
vector in float16, row ``id``: what approximate candidates are re-scored with, read from disk a
few rows a query) and ``manifest.json`` (what it was built from: each source file's size and
mtime, the index file's sha256, the FAISS spec, the count and the rows of ``rescore.f16``).
Searching checks the manifest first: a source changed since the build is a ``StaleIndex``; an
index file whose hash differs, or a ``rescore.f16`` shorter than its rows, a ``CorruptIndex``;
both name the fix (``tsctl index build`` again, or ``--exact``), neither is answered from.

Incremental: a build over an existing folder adds the photos it does not hold (or holds at an
older size/mtime) and removes the ids of photos no source holds any more, as the collection
job resumes: each path once, its newest row wins. A removed id is gone from the FAISS index
(``remove_ids``), so it is never answered again.

Which FAISS index: under ``EXACT_BELOW`` vectors a flat inner-product index (exact, and too
few to train quantisers on); above, ``PROJ256,IVF{nlist},SQ8``: a projection onto the 256
directions that keep most of the vectors' length (``_projection``), inverted lists, one byte per
dimension (256 B a vector against float32's 8 KB, in memory). Its own scores blur neighbours a
few hundredths apart, so a search takes its top ``RESCORE_DEPTH`` candidates and re-scores them
with the float16 vectors, and ``duplicates`` re-scores each vector's nearest few and keeps the
pairs whose cosine reaches the threshold: recall and the pairs found against exact search are
measured by ``make bench-search``, never assumed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from serveclient import objectstore
from serveclient.errors import TsError, UsageError
from serveclient.search import normalised, require_stored
from serveclient.vectors import EMBEDDING_DIM, OK

EXACT_BELOW = 50_000  # IVF1024 wants some 40 vectors per list to train on
PCA_DIM = 256
RESCORE_DEPTH = 100  # candidates re-scored per query (results/search.md measures the recall)
MANIFEST, VECTORS, PATHS, RESCORE = "manifest.json", "vectors.faiss", "paths.parquet", "rescore.f16"
ROW_BYTES = EMBEDDING_DIM * 2  # a float16 vector of rescore.f16
FORMAT = 2


class IndexUnusable(TsError):
    """The index cannot answer: it is corrupt or older than its sources."""

    def __init__(self, message: str) -> None:
        super().__init__(
            message, "rebuild it with `tsctl index build`, or search exactly with --exact"
        )


class StaleIndex(IndexUnusable):
    """A source Parquet changed (or went) since the index was built."""


class CorruptIndex(IndexUnusable):
    """The index folder's files do not match its manifest, or cannot be read."""


def spec_for(count: int) -> str:
    """The index for ``count`` vectors: a FAISS index_factory string, or ``PROJ{d},{rest}``:
    ``rest`` behind ``_projection``'s d dimensions."""
    if count < EXACT_BELOW:
        return "IDMap2,Flat"
    nlist = int(2 ** round(np.log2(4 * np.sqrt(count))))
    return f"PROJ{PCA_DIM},IVF{nlist},SQ8"


def training_rows(spec: str) -> int:
    """Vectors the quantisers train on: 50,000, and at least the 40 a list FAISS's k-means
    asks for (1M vectors: 4,096 lists, 163,840); none for a flat index."""
    lists = re.search(r"IVF(\d+)", spec)
    return max(50_000, 40 * int(lists.group(1))) if lists else 0


def _new_index(spec: str, sample: np.ndarray) -> tuple[Any, float]:
    """An empty, trained index for ``spec`` and the least share of a vector's length² its
    projection keeps (1.0 without one), from the unit vectors ``sample``."""
    import faiss

    if not spec.startswith("PROJ"):
        index = faiss.index_factory(EMBEDDING_DIM, spec, faiss.METRIC_INNER_PRODUCT)
        if not index.is_trained:
            index.train(sample)
        return index, 1.0
    head, _, rest = spec.partition(",")
    projection, kept = _projection(sample, int(head[len("PROJ") :]))
    inner = faiss.index_factory(projection.d_out, rest, faiss.METRIC_INNER_PRODUCT)
    index = faiss.IndexPreTransform(projection, inner)
    index.train(sample)
    return index, kept


def _projection(sample: np.ndarray, dim: int) -> tuple[Any, float]:
    """The ``dim`` directions that keep most of the unit vectors' length² (the eigenvectors of
    their uncentred second moment), as an orthonormal FAISS transform, and the share the
    sample's 0.1% quantile keeps. Not FAISS's PCA: it subtracts the mean, so inner products
    after it are not cosines (post-ReLU embeddings share a large mean) and no threshold on
    them means what it says."""
    import faiss

    _, vectors = np.linalg.eigh((sample.T @ sample).astype(np.float64))  # ascending
    basis = np.ascontiguousarray(vectors[:, ::-1][:, :dim].T, np.float32)  # [dim, D]
    projection = faiss.LinearTransform(EMBEDDING_DIM, dim, False)
    faiss.copy_array_to_vector(basis.ravel(), projection.A)
    projection.set_is_orthonormal()
    projection.is_trained = True
    kept = np.square(sample @ basis.T).sum(axis=1)
    return projection, float(np.quantile(kept, 0.001))


def nprobe_for(spec: str) -> int:
    """Lists visited per query: measured at 100k for recall@10 >= 0.95 (results/search.md)."""
    return 32 if "IVF" in spec else 1


# ``duplicates`` through an approximate index: each vector's PAIR_CANDIDATES nearest by the
# index's own scores, from PAIR_NPROBE lists, re-scored (a near-copy ranks first in its
# original's list or a neighbouring one); results/search.md measures the share of exact
# search's pairs found. A range search on the index's scores would need a margin as wide as
# the projection's loss, and re-score thousands of candidates a vector.
PAIR_NPROBE = 8
PAIR_CANDIDATES = 16


@dataclass(frozen=True)
class Source:
    """A Parquet source: the file read here, and what a manifest names it by (its resolved
    path, or the ``s3://`` object it was fetched from)."""

    local: Path
    origin: str


def sources_of(inputs: list[Path | str], work_dir: Path = objectstore.WORK_DIR) -> list[Source]:
    """Parquet files from files or folders (an Indexed Job's shards), sorted; ``s3://`` objects
    or prefixes (``s3://bucket/embeddings/``) are fetched into ``work_dir`` first."""
    found: list[Source] = []
    for item in inputs:
        if objectstore.is_remote(str(item)):
            for uri, size, mtime_ns in objectstore.parquet_objects(str(item)):
                found.append(Source(objectstore.fetched(uri, size, mtime_ns, work_dir), uri))
            continue
        item = Path(item)
        for path in sorted(item.glob("*.parquet")) if item.is_dir() else [item]:
            found.append(Source(path, str(path.resolve())))
    if not found:
        raise UsageError(
            f"no Parquet in {', '.join(map(str, inputs))}", "name `tsctl embed`'s output"
        )
    return found


def stamp(source: Source) -> dict:
    """What a manifest records of a source: its name (``origin``), where this machine read it,
    its size and mtime (a fetched copy carries its object's)."""
    stat = source.local.stat()
    return {
        "path": source.origin,
        "local": str(source.local.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
    }


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_PATHS_SCHEMA = pa.schema([("id", pa.int64()), ("path", pa.string()), ("key", pa.string())])


def rows_of(
    sources: list[Source] | list[Path], vectors: bool = True
) -> Iterator[tuple[list[str], list[str], Any]]:
    """(paths, "size:mtime" keys, unit vectors or None) of the sources' ``ok`` rows, a batch
    at a time, in the sources' order (a later row of a path is newer: the job's rule)."""
    columns = ["path", "size", "mtime", "status"] + (["embedding"] if vectors else [])
    for source in sources:
        local = source.local if isinstance(source, Source) else source
        for batch in pq.ParquetFile(local).iter_batches(8192, columns=columns):
            batch = batch.filter(pc.equal(batch.column("status"), OK))
            if not batch.num_rows:
                continue
            sizes = batch.column("size").to_pylist()
            mtimes = batch.column("mtime").cast(pa.int64()).to_pylist()
            keys = [f"{s}:{m}" for s, m in zip(sizes, mtimes)]
            matrix = None
            if vectors:
                column = batch.column("embedding")
                flat = column.values.to_numpy(zero_copy_only=False)
                matrix = normalised(flat.reshape(-1, EMBEDDING_DIM))
            yield batch.column("path").to_pylist(), keys, matrix


@dataclass
class Opened:
    """A checked index: the FAISS index and the live paths by id."""

    folder: Path
    index: Any
    names: dict[int, str]  # id -> path, live ids only
    keys: dict[int, str]
    manifest: dict
    rescore: np.ndarray  # float16 [rows, EMBEDDING_DIM], memory-mapped: row id = id's vector

    @property
    def approximate(self) -> bool:
        return "IVF" in self.manifest["spec"]


@dataclass
class Built:
    """What a build did."""

    added: int
    removed: int
    count: int
    spec: str
    trained: bool  # a new index trained (first build, or a flat one outgrown), else updated


def open_index(folder: Path, check_sources: bool = True) -> Opened:
    """The index in ``folder``, checked against its manifest (and its sources' stamps);
    ``CorruptIndex`` or ``StaleIndex`` when it must not answer."""
    import faiss

    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        if manifest.get("format") != FORMAT:
            raise ValueError(f"format {manifest.get('format')}, this tsctl reads {FORMAT}")
        if _sha256(folder / VECTORS) != manifest["vectors_sha256"]:
            raise ValueError(f"{VECTORS} does not match the sha256 its manifest records")
        index = faiss.read_index(str(folder / VECTORS))
        table = pq.read_table(folder / PATHS, schema=_PATHS_SCHEMA)
        rescore = _rescore_rows(folder, manifest["rows"])
    except (OSError, ValueError, KeyError, RuntimeError, pa.ArrowException) as exc:
        raise CorruptIndex(f"the index in {folder} is corrupt: {exc}") from exc
    ids, paths, keys = (table.column(c).to_pylist() for c in ("id", "path", "key"))
    if index.ntotal != len(ids):
        raise CorruptIndex(
            f"the index in {folder} holds {index.ntotal} vectors, its paths {len(ids)}"
        )
    if check_sources:
        check_fresh(manifest, f"the index in {folder}")
    if ids and max(ids) >= len(rescore):
        raise CorruptIndex(f"the index in {folder} holds ids past the rows of its {RESCORE}")
    _tune(index, manifest["spec"])
    return Opened(folder, index, dict(zip(ids, paths)), dict(zip(ids, keys)), manifest, rescore)


def check_fresh(manifest: dict, what: str) -> None:
    """``StaleIndex`` when a source the manifest stamps changed or went since the build (an
    ``s3://`` source is asked of its store)."""
    for stamped in manifest["sources"]:
        origin = stamped["path"]
        was = (stamped["size"], stamped["mtime_ns"])
        try:
            if objectstore.is_remote(origin):
                # whole seconds: a store's listing and its answer for one object may differ
                # in the milliseconds (MinIO, S3), and an object is never replaced twice a second
                now = objectstore.stamp_of(origin)
                now, was = (now[0], now[1] // 10**9) if now else None, (was[0], was[1] // 10**9)
            else:
                stat = Path(origin).stat() if Path(origin).is_file() else None
                now = (stat.st_size, stat.st_mtime_ns) if stat else None
        except OSError as exc:
            raise StaleIndex(f"{what}: cannot tell whether {origin} changed: {exc}") from exc
        if now != was:
            raise StaleIndex(f"{what} is older than {origin}")


def local_sources(manifest: dict) -> list[Path]:
    """Where the build read the manifest's sources (fresh by ``check_fresh``); ``StaleIndex``
    when a fetched copy of an ``s3://`` source is gone or changed here (another machine, or a
    pod's emptied work folder)."""
    found = []
    for stamped in manifest["sources"]:
        local = Path(stamped.get("local", stamped["path"]))
        stat = local.stat() if local.is_file() else None
        if stat is None or (stat.st_size, stat.st_mtime_ns) != (
            stamped["size"],
            stamped["mtime_ns"],
        ):
            raise StaleIndex(
                f"the copy of {stamped['path']} the index was built from is not at {local}"
            )
        found.append(local)
    return found


def wanted(sources: list[Source]) -> dict[str, str]:
    """Each live path of the sources and the "size:mtime" key of its newest row."""
    want: dict[str, str] = {}
    for row_paths, row_keys, _ in rows_of(sources, vectors=False):
        want.update(zip(row_paths, row_keys))
    return want


def _rescore_rows(folder: Path, rows: int) -> np.ndarray:
    """``rescore.f16``'s first ``rows`` rows, memory-mapped (rows past them are a killed
    build's, never referenced); ValueError when it is shorter."""
    path = folder / RESCORE
    if path.stat().st_size < rows * ROW_BYTES:
        raise ValueError(f"{RESCORE} holds fewer than the {rows} rows its manifest records")
    if rows == 0:
        return np.zeros((0, EMBEDDING_DIM), np.float16)
    return np.memmap(path, np.float16, "r", shape=(rows, EMBEDDING_DIM))


def _tune(index: Any, spec: str) -> None:
    import faiss

    if "IVF" in spec:
        faiss.extract_index_ivf(index).nprobe = nprobe_for(spec)


def build(
    inputs: list[Path | str],
    folder: Path,
    progress: bool = True,
    work_dir: Path = objectstore.WORK_DIR,
) -> Built:
    """Build the index in ``folder`` from the Parquet ``inputs`` (``s3://`` ones fetched into
    ``work_dir``), or bring the one there up to date: add the photos it lacks (or holds at an
    older size/mtime), remove those gone."""
    from tqdm import tqdm

    sources = sources_of(inputs, work_dir)
    want = wanted(sources)
    spec = spec_for(len(want))
    old = None
    if (folder / MANIFEST).is_file():
        try:
            old = open_index(folder, check_sources=False)
        except CorruptIndex:
            old = None  # rebuilt whole below
    names: dict[int, str] = {}
    keys: dict[int, str] = {}
    trained = not (
        old is not None and ("IVF" in old.manifest["spec"] or spec == old.manifest["spec"])
    )
    if old is not None and not trained:
        index, names, keys, spec = old.index, old.names, old.keys, old.manifest["spec"]
        kept = old.manifest["kept"]
    else:
        index, kept = _new_index(spec, _sample(sources, training_rows(spec)))
    held = {path: id_ for id_, path in names.items()}
    gone = [id_ for path, id_ in held.items() if want.get(path) != keys[id_]]
    if gone:
        index.remove_ids(np.asarray(gone, np.int64))
        for id_ in gone:
            del held[names.pop(id_)]
            keys.pop(id_)
    fresh = {path for path in want if path not in held}
    # Ids are rows of rescore.f16, never reused: new vectors are appended after the rows the
    # manifest records (a killed build's extra rows are cut off first).
    next_id = old.manifest["rows"] if old is not None and names else 0
    folder.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(fresh), unit="vec", desc="index", disable=not progress)
    with (folder / RESCORE).open("ab") as store:
        store.truncate(next_id * ROW_BYTES)
        for paths, row_keys, matrix in rows_of(sources):
            take = [
                j for j, (p, k) in enumerate(zip(paths, row_keys)) if p in fresh and want[p] == k
            ]
            if not take:
                continue
            ids = np.arange(next_id, next_id + len(take), dtype=np.int64)
            index.add_with_ids(np.ascontiguousarray(matrix[take]), ids)
            store.write(matrix[take].astype(np.float16).tobytes())
            for id_, j in zip(ids.tolist(), take):
                names[id_], keys[id_] = paths[j], row_keys[j]
                fresh.discard(paths[j])  # a path's first row at its newest key, once
            next_id += len(take)
            bar.update(len(take))
    bar.close()
    _save(folder, index, names, keys, sources, spec, next_id, kept)
    added = len(names) - (len(held))
    return Built(added, len(gone), int(index.ntotal), spec, trained)


def _sample(sources: list[Source], most: int) -> np.ndarray:
    """The first ``most`` unit vectors of the sources: what the quantisers train on."""
    parts, taken = [], 0
    for _, _, matrix in rows_of(sources):
        parts.append(matrix)
        taken += len(matrix)
        if taken >= most:
            break
    return np.ascontiguousarray(np.concatenate(parts)[:most])


def _save(
    folder: Path,
    index: Any,
    names: dict,
    keys: dict,
    sources: list[Source],
    spec: str,
    rows: int,
    kept: float,
) -> None:
    """Files written to temporary names, then replaced, the manifest last: a kill in between
    leaves a manifest whose hash no longer matches (``CorruptIndex``, rebuilt by the next build)."""
    import faiss

    folder.mkdir(parents=True, exist_ok=True)
    ids = sorted(names)
    faiss.write_index(index, str(folder / (VECTORS + ".tmp")))
    os.replace(folder / (VECTORS + ".tmp"), folder / VECTORS)
    table = pa.table(
        {"id": ids, "path": [names[i] for i in ids], "key": [keys[i] for i in ids]},
        schema=_PATHS_SCHEMA,
    )
    pq.write_table(table, folder / (PATHS + ".tmp"))
    os.replace(folder / (PATHS + ".tmp"), folder / PATHS)
    manifest = {
        "format": FORMAT,
        "spec": spec,
        "count": int(index.ntotal),
        "rows": rows,
        "kept": kept,
        "vectors_sha256": _sha256(folder / VECTORS),
        "sources": [stamp(s) for s in sources],
    }
    (folder / (MANIFEST + ".tmp")).write_text(json.dumps(manifest, indent=1))
    os.replace(folder / (MANIFEST + ".tmp"), folder / MANIFEST)


def nearest(
    opened: Opened, queries: np.ndarray, k: int = 10, exclude: list[str | None] | None = None
) -> list[list[tuple[str, float]]]:
    """As ``search.nearest``, from the index: the ``k`` nearest live paths per query; from an
    approximate index, its top ``RESCORE_DEPTH`` re-scored with the float16 vectors."""
    queries = normalised(np.atleast_2d(queries))
    exclude = [os.path.abspath(p) if p else None for p in (exclude or [None] * len(queries))]
    depth = max(RESCORE_DEPTH, k + 1) if opened.approximate else k + 1
    scores, ids = opened.index.search(np.ascontiguousarray(queries), depth)
    found = []
    for j, query in enumerate(queries):
        candidates = ids[j][ids[j] >= 0]
        ranked = scores[j][: len(candidates)]
        if opened.approximate:
            ranked = _rescored(opened, query, candidates)
        order = np.argsort(-ranked, kind="stable")
        hits = [
            (opened.names[int(candidates[i])], float(ranked[i]))
            for i in order
            if exclude[j] is None or os.path.abspath(opened.names[int(candidates[i])]) != exclude[j]
        ]
        found.append(hits[:k])
    return found


def _near(
    opened: Opened, vectors: np.ndarray, threshold: float
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(ids, cosines) of each vector's candidate pairs: from an exact index, its range search
    at ``threshold``; from an approximate one, its ``PAIR_CANDIDATES`` nearest, re-scored
    (512 vectors at a time: 64 MB of float32 candidates)."""
    if not opened.approximate:
        lims, scores, ids = opened.index.range_search(vectors, threshold)
        for n in range(len(vectors)):
            yield ids[lims[n] : lims[n + 1]], scores[lims[n] : lims[n + 1]]
        return
    _, found = opened.index.search(vectors, PAIR_CANDIDATES)
    for start in range(0, len(vectors), 512):
        ids = found[start : start + 512]
        rows = _stored(opened, np.maximum(ids.ravel(), 0))  # -1: no candidate, masked below
        cosines = np.einsum(
            "rd,rkd->rk", vectors[start : start + 512], rows.reshape(*ids.shape, -1)
        )
        for n in range(len(ids)):
            valid = ids[n] >= 0
            yield ids[n][valid], cosines[n][valid]


def _rescored(opened: Opened, query: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Cosine of ``query`` (unit) with the stored vectors of ``ids``."""
    return _stored(opened, ids) @ query


def stored(opened: Opened, paths: list[str]) -> np.ndarray:
    """The vectors the index holds for ``paths`` (its float16 copies, as float32 rows), in
    order; ``UsageError`` naming the paths it does not hold."""
    ids = {path: id_ for id_, path in opened.names.items()}
    require_stored(paths, ids, opened.folder)
    return _stored(opened, np.asarray([ids[p] for p in paths], np.int64))


def _stored(opened: Opened, ids: np.ndarray) -> np.ndarray:
    """The float16 vectors of ``ids`` as float32 rows, read from disk in id order."""
    order = np.argsort(ids)
    rows = np.empty((len(ids), EMBEDDING_DIM), np.float32)
    rows[order] = opened.rescore[ids[order]]
    return rows


def pairs(
    opened: Opened, threshold: float, progress: bool = False
) -> Iterator[tuple[str, str, float]]:
    """Every pair of live paths with cosine >= ``threshold``, each once, from each stored
    vector's candidates (``_near``; the vectors read from the sources, checked fresh by
    ``open_index``)."""
    import faiss

    def near(vectors: np.ndarray) -> Iterator[tuple[list[str], np.ndarray]]:
        for ids, scores in _near(opened, vectors, threshold):
            yield [opened.names[int(i)] for i in ids], scores

    live = {path: opened.keys[id_] for id_, path in opened.names.items()}

    def batches() -> Iterator[tuple[list[str], np.ndarray]]:
        for paths, keys, matrix in rows_of(local_sources(opened.manifest)):
            rows = [j for j, (p, k) in enumerate(zip(paths, keys)) if live.get(p) == k]
            if rows:
                yield [paths[j] for j in rows], matrix[rows]

    if opened.approximate:
        faiss.extract_index_ivf(opened.index).nprobe = PAIR_NPROBE  # this search only
    try:
        yield from pairs_of(batches(), len(live), near, threshold, progress)
    finally:
        _tune(opened.index, opened.manifest["spec"])


def pairs_of(
    batches: Iterable[tuple[list[str], np.ndarray]],
    total: int,
    near: Callable[[np.ndarray], Iterator[tuple[list[str], np.ndarray]]],
    threshold: float,
    progress: bool,
) -> Iterator[tuple[str, str, float]]:
    """The pairs at cosine >= ``threshold``, each once: every held vector (``batches`` of
    paths and unit vectors, ``total`` in all) asked of ``near`` (for a batch of unit vectors,
    each one's candidate paths and cosines), whatever index answers it."""
    from tqdm import tqdm

    bar = tqdm(total=total, unit="vec", desc="duplicates", disable=not progress)
    seen: set[tuple[str, str]] = set()
    for paths, matrix in batches:
        for mine, (found, scores) in zip(paths, near(np.ascontiguousarray(matrix))):
            for other, score in zip(found, scores):
                pair = (min(mine, other), max(mine, other))
                if score >= threshold and mine != other and pair not in seen:
                    seen.add(pair)  # each pair once: a's search and b's may both find it
                    yield pair[0], pair[1], float(score)
        bar.update(len(paths))
    bar.close()
