"""The collection's vectors in Milvus (``tsctl index build --out URI``): a Milvus server
(``http://HOST:19530``: Standalone, or Distributed on Kubernetes, kserve/milvus/) or Milvus Lite
(a local ``NAME.db``), through pymilvus's ``MilvusClient``: the same code, only the URI changes.
A server with authentication on (kserve/milvus/) is sent the caller's token (``user:password``,
which tsctl reads from a file or ``$MILVUS_TOKEN``, never from argv); a refusal is a
``MilvusTokenError``.

One Milvus collection per embed output (``collection_for``): ``path`` (the primary key, as the
embed output stores it), ``key`` (the row's "size:mtime") and ``embedding`` (the float32 unit
vector), indexed ``FLAT`` under ``faissindex.EXACT_BELOW`` vectors and ``IVF_SQ8`` (one byte a
dimension, inner product) above. Milvus keeps the float32 vectors beside its index: candidates
are re-scored with them, so the scores are exact cosines as the folder index's are.
``duplicates`` reads its queries from the collection too: a search needs no sources on the
machine, only the manifest's check that none changed (an ``s3://`` source asked of its store).

The manifest (the sources' stamps, the count, the index) is a property of the collection
(``tsctl.manifest``) and is checked as the folder index's is: a source changed since the build
is a ``StaleIndex``; a collection whose rows are not the count its manifest records, or which
has no manifest, a ``CorruptIndex``; neither is answered from. A build brings the collection up
to date as the collection job resumes: photos added or changed are upserted, those no source
holds any more deleted (a deleted path is never answered again). Each row's primary key is
a hash of its path (``_id``), so no path is ever quoted into a Milvus expression.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from serveclient import objectstore
from serveclient.search import VectorSearch, faissindex, normalised, require_stored
from serveclient.search.faissindex import Built, CorruptIndex
from serveclient.vectors import EMBEDDING_DIM

PROPERTY = "tsctl.manifest"
FORMAT = 1
NPROBE = 32  # as the folder index (results/search.md measures Milvus's recall too)
RESCORE_EXTRA = 10  # candidates past k re-scored per query, with the float32 vectors it holds
BATCH = 2000  # rows an insert or delete carries (a gRPC message of some 16 MB)
PAIR_MARGIN = 0.01  # duplicates: candidates down to threshold - this, then re-scored exactly
PATH_BYTES = 4096


def is_uri(target: str | Path) -> bool:
    """Whether ``--out``/``--vindex`` names Milvus (a server URI or Milvus Lite's ``.db``)
    rather than the folder index."""
    text = str(target)
    return "://" in text or text.endswith(".db")


def collection_for(parquet: Path) -> str:
    """The default collection of an embed output: its name, in the letters Milvus accepts."""
    name = re.sub(r"\W", "_", parquet.name.removesuffix(".parquet"), flags=re.ASCII)
    return name if re.match(r"[A-Za-z_]", name) else f"c_{name}"


@dataclass
class MilvusIndex(VectorSearch):
    """A checked Milvus collection."""

    client: Any  # pymilvus.MilvusClient
    uri: str
    collection: str
    manifest: dict

    @property
    def where(self) -> str:
        return f"{self.collection} at {self.uri}"

    @property
    def approximate(self) -> bool:
        return self.manifest["spec"] != "FLAT"

    def nearest(
        self, queries: np.ndarray, k: int = 10, exclude: list[str | None] | None = None
    ) -> list[list[tuple[str, float]]]:
        """Milvus's top ``k + RESCORE_EXTRA`` re-scored with the float32 vectors it holds."""
        import os

        queries = normalised(np.atleast_2d(queries))
        exclude = [os.path.abspath(p) if p else None for p in (exclude or [None] * len(queries))]
        fields = ["path", "embedding"]
        found = []
        for query, hits, skip in zip(
            queries, _search(self, queries, k + RESCORE_EXTRA, fields), exclude
        ):
            paths = [hit["entity"]["path"] for hit in hits]
            vectors = np.asarray([hit["entity"]["embedding"] for hit in hits], np.float32)
            ranked = _ranked(paths, vectors, query)
            found.append([(p, s) for p, s in ranked if os.path.abspath(p) != skip][:k])
        return found

    def stored(self, paths: list[str]) -> np.ndarray:
        """Asked ``BATCH`` paths at a time."""
        rows = []
        for start in range(0, len(paths), BATCH):
            chunk = paths[start : start + BATCH]
            rows += self.client.get(
                self.collection,
                ids=[_id(p) for p in chunk],
                output_fields=["path", "embedding"],
                consistency_level="Strong",
            )
        held = {row["path"]: row["embedding"] for row in rows}
        require_stored(paths, held, self.where)
        return normalised(np.asarray([held[p] for p in paths], np.float32))

    def pairs(self, threshold: float) -> Iterator[tuple[str, str, float]]:
        """Each vector it holds asks for its ``faissindex.PAIR_CANDIDATES`` nearest
        (``PAIR_NPROBE`` lists), as the folder index does; those down to ``threshold -
        PAIR_MARGIN`` by Milvus's scores are re-scored with the float32 vectors it holds.
        (Milvus Lite's range search measured some 14 ms a vector here against 1.1 for a top
        16: hours at a million.)"""

        def near(vectors: np.ndarray) -> Iterator[tuple[list[str], np.ndarray]]:
            found = _search(
                self, vectors, faissindex.PAIR_CANDIDATES, ["path"], nprobe=faissindex.PAIR_NPROBE
            )
            floor = threshold - PAIR_MARGIN
            candidates = [
                [hit["entity"]["path"] for hit in hits if hit["distance"] >= floor]
                for hits in found
            ]
            wanted = sorted({p for paths in candidates for p in paths})
            held = dict(zip(wanted, _vectors(self, wanted)))
            for vector, paths in zip(vectors, candidates):
                rows = np.asarray([held[p] for p in paths], np.float32).reshape(-1, EMBEDDING_DIM)
                ranked = _ranked(paths, rows, vector)
                yield [p for p, _ in ranked], np.asarray([s for _, s in ranked], np.float32)

        yield from faissindex.pairs_of(_batches(self), near, threshold)


# pymilvus pings every 10 s, calls or not; a gRPC server on its defaults (Milvus Lite's Python
# grpc.server among them) takes a ping without data once per 5 minutes and answers the second
# early one with GOAWAY "too many pings". A pytest process whose connection sat idle through
# other tests then failed to reconnect to Milvus Lite with that error (fresh-clone runs,
# 2026-11-28): ping no more than the server allows. pymilvus shares one connection per address
# within a process, made with its first client's options: every client here passes these.
KEEPALIVE = {"grpc.keepalive_time_ms": 300_000, "grpc.keepalive_permit_without_calls": False}


def connect(uri: str, token: str | None = None) -> Any:
    """A ``MilvusClient`` for ``uri`` that sends ``token`` (``user:password``; None: none, for a
    Milvus without authentication) with every call; ``MilvusTokenError`` when Milvus refuses
    the token or its absence, ``UsageError`` when nothing answers there."""
    from pymilvus import MilvusClient
    from pymilvus.exceptions import MilvusException

    from serveclient.errors import MilvusTokenError, UsageError

    try:
        return MilvusClient(uri=uri, token=token or "", timeout=30, grpc_options=KEEPALIVE)
    except MilvusException as exc:
        # pymilvus says only "Fail connecting"; the gRPC status it wraps (a grpc.Call) says why.
        cause: Any = exc.__cause__
        if getattr(getattr(cause, "code", lambda: None)(), "name", None) == "UNAUTHENTICATED":
            what = "refused the token" if token else "needs a token (authentication is on)"
            raise MilvusTokenError(
                f"Milvus at {uri} {what}: {cause.details()}",
                "put the token (user:password) in a file and pass --milvus-token-file PATH, "
                "or set $MILVUS_TOKEN (on Kubernetes: the Secret milvus-auth, kserve/README.md)",
            ) from None
        raise UsageError(
            f"no Milvus at {uri}: {exc}",
            "start it (kserve/milvus/, or `milvus-lite server`) or name another --out/--vindex",
        ) from exc


def _id(path: str) -> str:
    """A path's primary key: a hash in hex, so no filter or iterator of Milvus or pymilvus ever
    quotes a path (neither escapes every character a file name may hold)."""
    return hashlib.blake2b(path.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()


def _manifest(client: Any, collection: str, uri: str) -> dict:
    text = client.describe_collection(collection).get("properties", {}).get(PROPERTY)
    if not text:
        raise CorruptIndex(f"the collection {collection} at {uri} has no {PROPERTY}")
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        raise CorruptIndex(f"the collection {collection} at {uri}: {PROPERTY}: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise CorruptIndex(
            f"the collection {collection} at {uri} is format {found}, this tsctl reads {FORMAT}"
        )
    if not {"spec", "count", "sources"} <= manifest.keys():
        raise CorruptIndex(f"the collection {collection} at {uri}: {PROPERTY} is incomplete")
    return manifest


def _count(client: Any, collection: str) -> int:
    rows = client.query(
        collection, filter="", output_fields=["count(*)"], consistency_level="Strong"
    )
    return int(rows[0]["count(*)"])


def open_index(
    uri: str, collection: str, check_sources: bool = True, token: str | None = None
) -> MilvusIndex:
    """The collection, checked against its manifest (and its sources' stamps); ``token`` as
    for ``connect``."""
    client = connect(uri, token)
    try:
        if not client.has_collection(collection):
            raise CorruptIndex(f"no collection {collection} at {uri}")
        manifest = _manifest(client, collection, uri)
        opened = MilvusIndex(client, uri, collection, manifest)
        client.load_collection(collection)  # a server counts and searches loaded ones only
        count = _count(client, collection)
        if count != manifest["count"]:
            raise CorruptIndex(
                f"the collection {opened.where} holds {count} vectors, "
                f"its manifest {manifest['count']}"
            )
        if check_sources:
            faissindex.check_fresh(manifest, f"the collection {opened.where}")
    except BaseException:
        client.close()
        raise
    return opened


def _spec_for(count: int) -> str:
    if count < faissindex.EXACT_BELOW:
        return "FLAT"
    return f"IVF_SQ8,nlist={int(2 ** round(np.log2(4 * np.sqrt(count))))}"


def _index_params(client: Any, spec: str) -> Any:
    params = client.prepare_index_params()
    kind, _, nlist = spec.partition(",nlist=")
    params.add_index(
        field_name="embedding",
        index_type=kind,
        metric_type="IP",
        params={"nlist": int(nlist)} if nlist else {},
    )
    return params


def _create(client: Any, collection: str, spec: str) -> None:
    from pymilvus import DataType, MilvusClient

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=32)
    schema.add_field("path", DataType.VARCHAR, max_length=PATH_BYTES)
    schema.add_field("key", DataType.VARCHAR, max_length=64)
    schema.add_field("embedding", DataType.FLOAT_VECTOR, dim=EMBEDDING_DIM)
    client.create_collection(collection, schema=schema, index_params=_index_params(client, spec))


def _held(client: Any, collection: str) -> dict[str, str]:
    """path -> key of every row the collection holds."""
    held: dict[str, str] = {}
    iterator = client.query_iterator(collection, batch_size=10_000, output_fields=["path", "key"])
    try:
        while batch := iterator.next():
            held.update((row["path"], row["key"]) for row in batch)
    finally:
        iterator.close()
    return held


def build(
    inputs: list[Path | str],
    uri: str,
    collection: str,
    progress: bool = True,
    work_dir: Path = objectstore.WORK_DIR,
    token: str | None = None,
) -> Built:
    """Bring ``collection`` at ``uri`` up to date with the Parquet ``inputs`` (``s3://`` ones
    fetched into ``work_dir``; the collection created on first use): upsert the photos it
    lacks or holds at an older size/mtime, delete those gone. ``token`` as for ``connect``
    (refused before any shard is fetched)."""
    client = connect(uri, token)
    try:
        sources = faissindex.sources_of(inputs, work_dir)
        want = faissindex.wanted(sources)
        return _build(client, sources, want, uri, collection, progress)
    finally:
        client.close()


def _build(
    client: Any,
    sources: list[faissindex.Source],
    want: dict[str, str],
    uri: str,
    collection: str,
    progress: bool,
) -> Built:
    from tqdm import tqdm

    spec = _spec_for(len(want))
    trained = not client.has_collection(collection)
    if trained:
        _create(client, collection, spec)
    try:
        old_spec = None if trained else _manifest(client, collection, uri)["spec"]
    except CorruptIndex:
        old_spec = None  # a killed build, or another's: the index is set anew below
    if old_spec is not None and not (old_spec == "FLAT" and spec != "FLAT"):
        spec = old_spec  # an IVF index keeps its lists as the collection grows
    elif not trained:  # outgrown (the IVF index trains anew) or unknown: set it to spec
        client.release_collection(collection)
        for name in client.list_indexes(collection):
            client.drop_index(collection, name)
        client.create_index(collection, _index_params(client, spec))
        trained = True
    client.load_collection(collection)
    held = _held(client, collection)
    gone = [path for path, key in held.items() if want.get(path) != key]
    for start in range(0, len(gone), BATCH):
        client.delete(collection, ids=[_id(p) for p in gone[start : start + BATCH]])
    fresh = {path for path, key in want.items() if held.get(path) != key}
    added = len(fresh)
    bar = tqdm(total=len(fresh), unit="vec", desc="index", disable=not progress)
    for paths, keys, matrix in faissindex.rows_of(sources):
        rows = [
            {"id": _id(p), "path": p, "key": k, "embedding": matrix[j]}
            for j, (p, k) in enumerate(zip(paths, keys))
            if p in fresh and want[p] == k
        ]
        for start in range(0, len(rows), BATCH):
            client.upsert(collection, rows[start : start + BATCH])  # a rerun: the same id
        fresh -= {row["path"] for row in rows}  # a path's first row at its newest key, once
        bar.update(len(rows))
    bar.close()
    client.flush(collection)
    manifest = {
        "format": FORMAT,
        "spec": spec,
        "count": len(want),
        "sources": [faissindex.stamp(s) for s in sources],
    }
    client.alter_collection_properties(collection, properties={PROPERTY: json.dumps(manifest)})
    count = _count(client, collection)
    if count != len(want):
        raise CorruptIndex(f"the collection {collection} at {uri} holds {count}, not {len(want)}")
    return Built(added, len(gone), count, spec, trained)


def _search(
    opened: MilvusIndex, vectors: np.ndarray, limit: int, fields: list[str], **extra: float
) -> list[list[dict]]:
    params: dict[str, Any] = {"nprobe": NPROBE, **extra} if opened.approximate else {}
    return opened.client.search(
        opened.collection,
        data=list(vectors),
        limit=limit,
        output_fields=fields,
        search_params={"metric_type": "IP", "params": params},
        consistency_level="Strong",
    )


def _ranked(paths: list[str], vectors: np.ndarray, query: np.ndarray) -> list[tuple[str, float]]:
    """``paths`` by exact cosine of their ``vectors`` with ``query`` (unit), best first."""
    if not paths:
        return []
    scores = normalised(vectors) @ query
    order = np.argsort(-scores, kind="stable")
    return [(paths[i], float(scores[i])) for i in order]


def _vectors(opened: MilvusIndex, paths: list[str]) -> np.ndarray:
    """The held float32 vectors of ``paths`` (every one held), in order."""
    return opened.stored(paths) if paths else np.zeros((0, EMBEDDING_DIM), np.float32)


def _batches(opened: MilvusIndex) -> Iterator[tuple[list[str], np.ndarray]]:
    """(paths, unit vectors) of every row the collection holds, a batch at a time: the
    duplicates' queries come from Milvus itself, so no machine needs the sources for them."""
    iterator = opened.client.query_iterator(
        opened.collection, batch_size=2000, output_fields=["path", "embedding"]
    )
    try:
        while batch := iterator.next():
            vectors = np.asarray([row["embedding"] for row in batch], np.float32)
            yield [row["path"] for row in batch], normalised(vectors)
    finally:
        iterator.close()
