"""An approximate vector index over the collection job's embedding Parquet (one file or the
shards of an Indexed Job), with FAISS, in a folder on disk (``tsctl index build``).

Layout of ``FOLDER``: ``manifest.json`` and one build's folder ``gen-XXXXXXXXXXXX/`` (the name
is the manifest's ``generation``) holding ``vectors.faiss`` (the FAISS index, ids = row numbers
in ``paths``), ``paths.parquet`` (id, path, "size:mtime" key and the digest of the id's row of
``rescore.f16`` for every live photo) and ``rescore.f16`` (each id's unit vector in float16, row
``id``: what approximate candidates are re-scored with, read from disk a few rows a query). The
manifest names what the index was built from (each source's size and mtime), the FAISS spec, how
its quantisers were trained, the count and rows, and each file's bytes and sha256 (``rescore.f16``
is checked row by row instead, against the digests in ``paths.parquet``, as a search reads it:
it is the one file no search reads whole).

Opening checks the manifest first: a source changed since the build is a ``StaleIndex``; a
file whose size or hash differs, a row whose digest differs, a ``CorruptIndex``; both name the
fix (``tsctl index build`` again, or ``--exact``), neither is answered from.

One writer, whole indexes: a build holds the folder's lock (``serveclient.outputlock``,
``FOLDER.lock`` beside it: a second build is refused, or waits with ``wait``), writes a new
build folder of a name no other build uses, flushes it to disk and only then replaces
``manifest.json`` (``os.replace``: atomic), which is the one thing readers follow. A reader
therefore opens the old index or the new one, whole; a build killed at any point leaves the
index it started from, and the next build removes what it left. A reader opens all of one
build's files before reading any, so a build that removes them afterwards removes names, not
what the reader holds (its memory-mapped ``rescore.f16`` stays the file it opened).

Incremental: a build over an existing folder adds the photos it does not hold (or holds at an
older size/mtime) and removes the ids of photos no source holds any more, as the collection
job resumes: each path once, its newest row wins. A removed id is gone from the FAISS index
(``remove_ids``), so it is never answered again. The new build's ``rescore.f16`` starts as a copy
of the old one's (ids are never reused); a build that changes nothing renews the manifest only.

Which FAISS index: under ``EXACT_BELOW`` vectors a flat inner-product index (exact, and too
few to train quantisers on); above, ``PROJ256,IVF{nlist},SQ8``: a projection onto the 256
directions that keep most of the vectors' length (``_projection``), inverted lists, one byte per
dimension (256 B a vector against float32's 8 KB, in memory). The quantisers are trained on a
seeded random sample of the live vectors (``_sample``: the same collection in any folder order
gives the same sample), and trained anew once the collection holds more than ``RETRAIN_GROWTH``
times the vectors it held when they were trained. Its own scores blur neighbours a few
hundredths apart, so a search takes its top ``RESCORE_DEPTH`` candidates and re-scores them
with the float16 vectors, and ``duplicates`` re-scores each vector's nearest few and keeps the
pairs whose cosine reaches the threshold: recall and the pairs found against exact search are
measured by ``make bench-search``, never assumed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from serveclient import objectstore, outputlock
from serveclient.errors import ServeError, UsageError
from serveclient.search import VectorSearch, normalised, require_stored
from serveclient.vectors import EMBEDDING_DIM, OK

EXACT_BELOW = 50_000  # IVF1024 wants some 40 vectors per list to train on
PCA_DIM = 256
RESCORE_DEPTH = 100  # candidates re-scored per query (results/search.md measures the recall)
MANIFEST, VECTORS, PATHS, RESCORE = "manifest.json", "vectors.faiss", "paths.parquet", "rescore.f16"
GENERATION = "gen-"  # a build's folder inside FOLDER: gen- and 12 hex digits
ROW_BYTES = EMBEDDING_DIM * 2  # a float16 vector of rescore.f16
FORMAT = 3  # 3: build folders swapped in by the manifest, every file hashed (2: files in FOLDER)
RETRAIN_GROWTH = 2.0  # quantisers trained anew past this many times the vectors they were for
SAMPLE_SEED = 0
OPEN_TRIES = 3  # a build may replace the index while a reader opens it: read the new one


class IndexUnusable(ServeError):
    """The index cannot answer: it is corrupt or older than its sources."""

    def __init__(self, message: str) -> None:
        super().__init__(
            message, "rebuild it with `tsctl index build`, or search exactly with --exact"
        )


class StaleIndex(IndexUnusable):
    """A source Parquet changed (or went) since the index was built."""


class CorruptIndex(IndexUnusable):
    """The index folder's files do not match its manifest, or cannot be read."""


def default_folder(parquet: Path) -> Path:
    """Where ``tsctl index build`` writes by default and the searches look: ``PARQUET.vindex``."""
    return parquet.with_name(parquet.name + ".vindex")


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
RANGE_BATCH = 64  # an exact index's range searches: vectors asked at a time


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


_PATHS_SCHEMA = pa.schema(
    [("id", pa.int64()), ("path", pa.string()), ("key", pa.string()), ("digest", pa.int64())]
)


def row_digest(row: np.ndarray) -> int:
    """The digest of a float16 row of ``rescore.f16`` that ``paths.parquet`` records: 8 bytes
    of BLAKE2b, as a signed integer."""
    digest = hashlib.blake2b(row.tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


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
class FaissIndex(VectorSearch):
    """A checked index: the FAISS index and the live paths by id, from the build folder
    (``files``) its manifest named when it was opened."""

    folder: Path
    files: Path
    index: Any
    names: dict[int, str]  # id -> path, live ids only
    keys: dict[int, str]
    manifest: dict
    rescore: np.ndarray  # float16 [rows, EMBEDDING_DIM], memory-mapped: row id = id's vector
    digests: np.ndarray  # int64 [rows]: each live row's digest (paths.parquet's)
    unchecked: np.ndarray  # bool [rows]: live rows this reader has not checked yet

    @property
    def approximate(self) -> bool:
        return "IVF" in self.manifest["spec"]

    @property
    def where(self) -> str:
        return str(self.folder)

    def nearest(
        self, queries: np.ndarray, k: int = 10, exclude: list[str | None] | None = None
    ) -> list[list[tuple[str, float]]]:
        """From an approximate index, its top ``RESCORE_DEPTH`` re-scored with the float16
        vectors."""
        queries = normalised(np.atleast_2d(queries))
        exclude = [os.path.abspath(p) if p else None for p in (exclude or [None] * len(queries))]
        depth = max(RESCORE_DEPTH, k + 1) if self.approximate else k + 1
        scores, ids = self.index.search(np.ascontiguousarray(queries), depth)
        found = []
        for j, query in enumerate(queries):
            candidates = ids[j][ids[j] >= 0]
            ranked = scores[j][: len(candidates)]
            if self.approximate:
                ranked = _rescored(self, query, candidates)
            order = np.argsort(-ranked, kind="stable")
            hits = [
                (self.names[int(candidates[i])], float(ranked[i]))
                for i in order
                if exclude[j] is None
                or os.path.abspath(self.names[int(candidates[i])]) != exclude[j]
            ]
            found.append(hits[:k])
        return found

    def stored(self, paths: list[str]) -> np.ndarray:
        """Its float16 copies, as float32 rows."""
        ids = {path: id_ for id_, path in self.names.items()}
        require_stored(paths, ids, self.folder)
        return _stored(self, np.asarray([ids[p] for p in paths], np.int64))

    def pairs(self, threshold: float) -> Iterator[tuple[str, str, float]]:
        """Every pair of live paths with cosine >= ``threshold``, each once, from each stored
        vector's candidates (``_near``; the vectors read from the sources, checked fresh by
        ``open_index``)."""
        import faiss

        def near(vectors: np.ndarray) -> Iterator[tuple[list[str], np.ndarray]]:
            for ids, scores in _near(self, vectors, threshold):
                yield [self.names[int(i)] for i in ids], scores

        live = {path: self.keys[id_] for id_, path in self.names.items()}

        def batches() -> Iterator[tuple[list[str], np.ndarray]]:
            for paths, keys, matrix in rows_of(local_sources(self.manifest)):
                rows = [j for j, (p, k) in enumerate(zip(paths, keys)) if live.get(p) == k]
                if rows:
                    yield [paths[j] for j in rows], matrix[rows]

        if self.approximate:
            faiss.extract_index_ivf(self.index).nprobe = PAIR_NPROBE  # this search only
        try:
            yield from pairs_of(batches(), near, threshold)
        finally:
            _tune(self.index, self.manifest["spec"])


@dataclass
class Built:
    """What a build did."""

    added: int
    removed: int
    count: int
    spec: str
    trained: bool  # quantisers trained anew (first build, an outgrown index), else kept
    trained_at: int | None = None  # IVF: the vectors the collection held when they were trained
    retrain_past: int | None = None  # IVF: past this count the next build trains them anew


def open_index(folder: Path, check_sources: bool = True) -> FaissIndex:
    """The index in ``folder``, checked against its manifest (and its sources' stamps);
    ``CorruptIndex`` or ``StaleIndex`` when it must not answer. A build that replaces the
    index while this reads it removes the files of the old one: the new one is read then."""
    for attempt in range(1, OPEN_TRIES + 1):
        try:
            opened = _read(folder)
            break
        except FileNotFoundError as exc:
            if attempt == OPEN_TRIES:
                raise CorruptIndex(f"the index in {folder} is corrupt: {exc}") from exc
        except (OSError, ValueError, KeyError, TypeError, RuntimeError, pa.ArrowException) as exc:
            raise CorruptIndex(f"the index in {folder} is corrupt: {exc}") from exc
    if check_sources:
        check_fresh(opened.manifest, f"the index in {folder}")
    return opened


def _read(folder: Path) -> FaissIndex:
    """``folder``'s manifest, then every file of the build it names, all opened before any is
    read (a build removing them later removes names, not these) and checked against it."""
    import faiss

    manifest = json.loads((folder / MANIFEST).read_text())
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise ValueError(f"format {found}, this tsctl reads {FORMAT}")
    files, rows = folder / manifest["generation"], manifest["rows"]
    with ExitStack() as stack:
        handles = {
            n: stack.enter_context((files / n).open("rb")) for n in (VECTORS, PATHS, RESCORE)
        }
        for name, handle in handles.items():
            size, recorded = os.fstat(handle.fileno()).st_size, manifest["files"][name]["bytes"]
            if size != recorded or (name == RESCORE and size != rows * ROW_BYTES):
                raise ValueError(f"{name} holds {size} bytes, its manifest records {recorded}")
        for name in (VECTORS, PATHS):
            _check(name, handles[name], manifest)
        # from the handle opened above (faiss-cpu's stubs omit its SWIG callback readers)
        reader = faiss.PyCallbackIOReader(handles[VECTORS].read)  # type: ignore[attr-defined]
        index = faiss.read_index(reader)
        table = pq.read_table(handles[PATHS], schema=_PATHS_SCHEMA)
        rescore = (
            np.memmap(handles[RESCORE], np.float16, "r", shape=(rows, EMBEDDING_DIM))
            if rows
            else np.zeros((0, EMBEDDING_DIM), np.float16)
        )
    ids, paths, keys = (table.column(c).to_pylist() for c in ("id", "path", "key"))
    if not index.ntotal == len(ids) == manifest["count"]:
        raise ValueError(f"{VECTORS} holds {index.ntotal} vectors, {PATHS} {len(ids)}")
    if ids and max(ids) >= rows:
        raise ValueError(f"{PATHS} holds ids past the rows of its {RESCORE}")
    digests, unchecked = np.zeros(rows, np.int64), np.zeros(rows, bool)
    digests[ids], unchecked[ids] = table.column("digest").to_numpy(), True
    _tune(index, manifest["spec"])
    names, held = dict(zip(ids, paths)), dict(zip(ids, keys))
    return FaissIndex(folder, files, index, names, held, manifest, rescore, digests, unchecked)


def _check(name: str, handle: Any, manifest: dict) -> None:
    """ValueError unless the file open as ``handle`` has the sha256 ``manifest`` records; it
    is read again from its start after."""
    digest = hashlib.sha256()
    for block in iter(lambda: handle.read(1 << 20), b""):
        digest.update(block)
    if digest.hexdigest() != manifest["files"][name]["sha256"]:
        raise ValueError(f"{name} does not match the sha256 its manifest records")
    handle.seek(0)


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


def _tune(index: Any, spec: str) -> None:
    import faiss

    if "IVF" in spec:
        faiss.extract_index_ivf(index).nprobe = nprobe_for(spec)


def build(
    inputs: list[Path | str],
    folder: Path,
    progress: bool = True,
    work_dir: Path = objectstore.WORK_DIR,
    wait: bool = False,
) -> Built:
    """Build the index in ``folder`` from the Parquet ``inputs`` (``s3://`` ones fetched into
    ``work_dir``), or bring the one there up to date: add the photos it lacks (or holds at an
    older size/mtime), remove those gone. Holds ``folder``'s lock throughout: another build
    holding it is waited for (``wait``) or refused at once (``outputlock.OutputBusy``)."""
    with outputlock.hold(folder, wait=wait):
        return _build(inputs, folder, progress, work_dir)


@dataclass
class _Draft:
    """A build in progress: the index it updates or trained, and the rows it holds."""

    spec: str
    index: Any
    kept: float
    trained: dict | None  # the manifest's: {count, sample, seed} (IVF), None (flat)
    names: dict[int, str]
    keys: dict[int, str]
    digests: dict[int, int]
    rows: int  # rows of rescore.f16, the next id: ids are never reused
    base: Path | None  # the build folder whose rescore.f16 these rows start as


def _build(inputs: list[Path | str], folder: Path, progress: bool, work_dir: Path) -> Built:
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder} is a file, not an index folder", "name a folder with --out")
    sources = sources_of(inputs, work_dir)
    want = wanted(sources)
    old = _previous(folder)
    draft, retrained = _draft(old, sources, want, progress)
    held = {path: id_ for id_, path in draft.names.items()}
    gone = [id_ for path, id_ in held.items() if want.get(path) != draft.keys[id_]]
    if gone:
        draft.index.remove_ids(np.asarray(gone, np.int64))
        for id_ in gone:
            del held[draft.names.pop(id_)]
            draft.keys.pop(id_), draft.digests.pop(id_)
    fresh = {path for path in want if path not in held}
    added = len(fresh)
    _say(
        progress,
        f"{len(want):,} photos in {len(sources)} source(s): {added:,} to add, "
        f"{len(gone):,} to remove",
    )
    if old is not None and not (retrained or gone or fresh):
        _swap(folder, {**old.manifest, "sources": [stamp(s) for s in sources]})
        generation = old.manifest["generation"]  # up to date: the same files, renewed stamps
    else:
        generation = _write(folder, draft, sources, want, fresh, progress)
    _sweep(folder, generation)
    trained_at = draft.trained["count"] if draft.trained else None
    return Built(
        added,
        len(gone),
        int(draft.index.ntotal),
        draft.spec,
        retrained,
        trained_at,
        int(trained_at * RETRAIN_GROWTH) if trained_at else None,
    )


def _previous(folder: Path) -> FaissIndex | None:
    """The index in ``folder`` to update, or None (none, corrupt, another format: built anew);
    what killed builds left there is removed first."""
    old = None
    if (folder / MANIFEST).is_file():
        try:
            old = open_index(folder, check_sources=False)
        except CorruptIndex:
            old = None
    _sweep(folder, old.manifest["generation"] if old else None)
    return old


def _draft(
    old: FaissIndex | None, sources: list[Source], want: dict[str, str], progress: bool
) -> tuple[_Draft, bool]:
    """What the build starts from, and whether it trained it: ``old`` updated in place, unless
    there is none or it is outgrown (``_outgrown``): then a new index, trained on a sample."""
    spec = spec_for(len(want))
    if old is not None and not _outgrown(old.manifest, spec, len(want)):
        m, digests = old.manifest, {id_: int(old.digests[id_]) for id_ in old.names}
        rows = m["rows"] if old.names else 0
        base = old.files if rows else None
        draft = _Draft(
            m["spec"], old.index, m["kept"], m["trained"], old.names, old.keys, digests, rows, base
        )
        return draft, False
    sample = _sample(sources, want, training_rows(spec))
    trained = None
    if "IVF" in spec:
        _say(progress, f"training {spec} on {len(sample):,} vectors sampled from {len(want):,}")
        trained = {"count": len(want), "sample": len(sample), "seed": SAMPLE_SEED}
    index, kept = _new_index(spec, sample)
    return _Draft(spec, index, kept, trained, {}, {}, {}, 0, None), True


def _outgrown(manifest: dict, spec: str, count: int) -> bool:
    """Whether the index of ``manifest`` is trained anew for ``count`` vectors: a flat one once
    ``spec`` (the count's) is another, an IVF one past ``RETRAIN_GROWTH`` times the vectors the
    collection held when its quantisers were trained (its lists and projection were fitted to
    them; past that its lists grow long and what it projects away may be what tells new
    photos apart)."""
    if "IVF" not in manifest["spec"]:
        return spec != manifest["spec"]
    return count > manifest["trained"]["count"] * RETRAIN_GROWTH


def _sample(sources: list[Source], want: dict[str, str], most: int) -> np.ndarray:
    """``most`` of the live unit vectors (each path's newest row) drawn at random, seeded by
    ``SAMPLE_SEED`` and in path order: the same collection, in any folder or shard order, gives
    the same sample. What the quantisers train on."""
    if not most:
        return np.zeros((0, EMBEDDING_DIM), np.float32)
    paths = sorted(want)
    if len(paths) > most:
        picked = np.random.default_rng(SAMPLE_SEED).choice(len(paths), most, replace=False)
        paths = [paths[i] for i in np.sort(picked)]
    chosen, found = set(paths), {}
    for row_paths, row_keys, matrix in rows_of(sources):
        for j, (path, key) in enumerate(zip(row_paths, row_keys)):
            if path in chosen and want[path] == key:
                found[path] = matrix[j]
                chosen.discard(path)
    return np.ascontiguousarray(np.stack([found[p] for p in paths]), np.float32)


def _write(
    folder: Path,
    draft: _Draft,
    sources: list[Source],
    want: dict[str, str],
    fresh: set[str],
    progress: bool,
) -> str:
    """A new build folder: ``draft`` with the ``fresh`` paths' rows added, written and flushed
    to disk, then swapped in by the manifest; its name."""
    import faiss

    generation = f"{GENERATION}{uuid.uuid4().hex[:12]}"
    files = folder / generation
    files.mkdir(parents=True)
    _say(progress, f"writing {files}")
    if draft.base is not None:
        shutil.copyfile(draft.base / RESCORE, files / RESCORE)
    with (files / RESCORE).open("ab") as store:
        _append(draft, store, sources, want, fresh, progress)
        store.flush()
        os.fsync(store.fileno())
    ids = sorted(draft.names)
    table = pa.table(
        {
            "id": ids,
            "path": [draft.names[i] for i in ids],
            "key": [draft.keys[i] for i in ids],
            "digest": [draft.digests[i] for i in ids],
        },
        schema=_PATHS_SCHEMA,
    )
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer)
    records = {
        VECTORS: _flushed(
            files / VECTORS,
            lambda write: faiss.write_index(
                draft.index,
                faiss.PyCallbackIOWriter(write),  # type: ignore[attr-defined]  # as _read's
            ),
        ),
        PATHS: _flushed(files / PATHS, lambda write: write(buffer.getvalue())),
        RESCORE: {"bytes": draft.rows * ROW_BYTES},  # each row's digest is in PATHS
    }
    _fsync(files)
    manifest = {
        "format": FORMAT,
        "generation": generation,
        "spec": draft.spec,
        "count": int(draft.index.ntotal),
        "rows": draft.rows,
        "kept": draft.kept,
        "trained": draft.trained,
        "files": records,
        "sources": [stamp(s) for s in sources],
    }
    _swap(folder, manifest)
    _say(progress, f"swapped in {generation}")
    return generation


def _append(
    draft: _Draft,
    store: Any,
    sources: list[Source],
    want: dict[str, str],
    fresh: set[str],
    progress: bool,
) -> None:
    """Add each ``fresh`` path's newest row to ``draft``'s index and to ``store`` (its
    ``rescore.f16``), at the next ids, with its digest."""
    from tqdm import tqdm

    bar = tqdm(total=len(fresh), unit="vec", desc="index", disable=not progress)
    for paths, row_keys, matrix in rows_of(sources):
        take = []
        for j, (path, key) in enumerate(zip(paths, row_keys)):
            if path in fresh and want[path] == key:
                take.append(j)
                fresh.discard(path)  # a path's first row at its newest key, once
        if not take:
            continue
        ids = np.arange(draft.rows, draft.rows + len(take), dtype=np.int64)
        draft.index.add_with_ids(np.ascontiguousarray(matrix[take]), ids)
        half = matrix[take].astype(np.float16)
        store.write(half.tobytes())
        for id_, j, row in zip(ids.tolist(), take, half):
            draft.names[id_], draft.keys[id_] = paths[j], row_keys[j]
            draft.digests[id_] = row_digest(row)
        draft.rows += len(take)
        bar.update(len(take))
    bar.close()


def _flushed(path: Path, fill: Callable[[Callable[[Any], int]], object]) -> dict:
    """A new file ``path``, its bytes written by ``fill(write)`` and flushed to disk; the
    manifest's record of it (bytes, sha256)."""
    digest, size = hashlib.sha256(), 0
    with path.open("xb") as f:

        def write(chunk: Any) -> int:
            nonlocal size
            digest.update(chunk)
            size += memoryview(chunk).nbytes
            return f.write(chunk)

        fill(write)
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": size, "sha256": digest.hexdigest()}


def _fsync(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _swap(folder: Path, manifest: dict) -> None:
    """Replace ``folder``'s manifest, the one file readers follow, with ``manifest``: written
    and flushed under a temporary name first, the rename flushed after."""
    tmp = folder / f"{MANIFEST}.tmp-{uuid.uuid4().hex[:8]}"
    _flushed(tmp, lambda write: write(json.dumps(manifest, indent=1).encode()))
    os.replace(tmp, folder / MANIFEST)
    _fsync(folder)


LEGACY = {VECTORS, PATHS, RESCORE, f"{VECTORS}.tmp", f"{PATHS}.tmp"}  # format 2's, in FOLDER


def _sweep(folder: Path, keep: str | None) -> None:
    """Remove what builds left in ``folder`` besides its manifest and the build folder ``keep``
    (the manifest's): other build folders (replaced ones, killed builds'), temporary
    manifests and, once a manifest of this format names ``keep``, format 2's files. Nothing
    else in the folder is touched."""
    if not folder.is_dir():
        return
    for entry in os.scandir(folder):
        if entry.is_dir(follow_symlinks=False) and entry.name.startswith(GENERATION):
            if entry.name != keep:
                shutil.rmtree(entry.path)
        elif entry.name.startswith(f"{MANIFEST}.tmp") or (keep and entry.name in LEGACY):
            os.unlink(entry.path)


def _say(progress: bool, text: str) -> None:
    """A step of the build on stderr, when it shows progress."""
    if progress:
        sys.stderr.write(f"index: {text}\n")
        sys.stderr.flush()


def _near(
    opened: FaissIndex, vectors: np.ndarray, threshold: float
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(ids, cosines) of each vector's candidate pairs: from an exact index, its range search
    at ``threshold``, ``RANGE_BATCH`` vectors at a time (each may find every vector: at most
    RANGE_BATCH x EXACT_BELOW results, 38 MB); from an approximate one, its
    ``PAIR_CANDIDATES`` nearest, re-scored (512 vectors at a time: 64 MB of float32
    candidates)."""
    if not opened.approximate:
        for start in range(0, len(vectors), RANGE_BATCH):
            lims, scores, ids = opened.index.range_search(
                vectors[start : start + RANGE_BATCH], threshold
            )
            for n in range(len(lims) - 1):
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


def _rescored(opened: FaissIndex, query: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Cosine of ``query`` (unit) with the stored vectors of ``ids``."""
    return _stored(opened, ids) @ query


def _stored(opened: FaissIndex, ids: np.ndarray) -> np.ndarray:
    """The float16 vectors of ``ids`` as float32 rows, read from disk in id order; a live row
    is checked against its digest the first time this reader reads it (``CorruptIndex``)."""
    order = np.argsort(ids)
    half = opened.rescore[ids[order]]
    for n in np.flatnonzero(opened.unchecked[ids[order]]).tolist():
        id_ = int(ids[order][n])
        if row_digest(half[n]) != opened.digests[id_]:
            raise CorruptIndex(
                f"the index in {opened.folder} is corrupt: row {id_} of {RESCORE} does not "
                "match its digest"
            )
        opened.unchecked[id_] = False
    rows = np.empty((len(ids), EMBEDDING_DIM), np.float32)
    rows[order] = half
    return rows


def pairs_of(
    batches: Iterable[tuple[list[str], np.ndarray]],
    near: Callable[[np.ndarray], Iterator[tuple[list[str], np.ndarray]]],
    threshold: float,
) -> Iterator[tuple[str, str, float]]:
    """The pairs at cosine >= ``threshold``, each once: every held vector (``batches`` of
    paths and unit vectors) asked of ``near`` (for a batch of unit vectors, each one's
    candidate paths and cosines), whatever index answers it."""
    seen: set[tuple[str, str]] = set()
    for paths, matrix in batches:
        for mine, (found, scores) in zip(paths, near(np.ascontiguousarray(matrix))):
            for other, score in zip(found, scores):
                pair = (min(mine, other), max(mine, other))
                if score >= threshold and mine != other and pair not in seen:
                    seen.add(pair)  # each pair once: a's search and b's may both find it
                    yield pair[0], pair[1], float(score)
