"""tsclient/index.py on small vector sets: build, update (added, changed and removed photos),
stale and corrupt indexes named, and its answers against exact search (tsclient/search.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("faiss")

from tsclient import index, search
from tsclient.vectors import EMBEDDING_DIM, OK, schema


def write(path: Path, names: list[str], matrix: np.ndarray, size: int = 1) -> Path:
    """An embed output as ``tsctl embed`` writes it (the columns the index reads)."""
    n = len(names)
    table = pa.table(
        {
            "path": names,
            "size": [size] * n,
            "mtime": pa.array([0] * n, pa.timestamp("ns", tz="UTC")),
            "sha256": [None] * n,
            "status": [OK] * n,
            "error": [None] * n,
            "precision": ["fp32"] * n,
            "cached": [False] * n,
            "embedding": pa.array(list(matrix), pa.list_(pa.float32(), EMBEDDING_DIM)),
        },
        schema=schema("embedding"),
    )
    pq.write_table(table, path)
    return path


def vectors(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.abs(rng.standard_normal((n, EMBEDDING_DIM))).astype(np.float32)


def test_build_answers_as_exact_search(tmp_path):
    matrix = vectors(200, 0)
    names = [f"p{i}.jpg" for i in range(200)]
    src = write(tmp_path / "e.parquet", names, matrix)
    built = index.build([src], tmp_path / "v", progress=False)
    assert (built.added, built.removed, built.count) == (200, 0, 200)
    opened = index.open_index(tmp_path / "v")
    queries = matrix[:5] + 0.01
    assert [[p for p, _ in hits] for hits in index.nearest(opened, queries, 10)] == [
        [p for p, _ in hits] for hits in search.nearest(src, queries, 10)
    ]


def test_added_changed_and_removed_photos_update_without_rebuild(tmp_path):
    matrix = vectors(300, 1)
    names = [f"p{i}.jpg" for i in range(300)]
    shards = tmp_path / "shards"
    shards.mkdir()
    write(shards / "0.parquet", names[:200], matrix[:200])
    index.build([shards], tmp_path / "v", progress=False)
    # a second shard adds 100; the first loses p0..p9 (removed) and p10 changes (new size)
    write(shards / "1.parquet", names[200:], matrix[200:])
    write(shards / "0.parquet", names[10:200], matrix[10:200])
    write(shards / "2.parquet", ["p11.jpg"], vectors(1, 9), size=2)
    built = index.build([shards], tmp_path / "v", progress=False)
    assert (built.added, built.removed, built.count) == (101, 11, 290)
    opened = index.open_index(tmp_path / "v")
    answered = {p for hits in index.nearest(opened, matrix[:20], 50) for p, _ in hits}
    assert not answered & {f"p{i}.jpg" for i in range(10)}
    hit = index.nearest(opened, matrix[250:251], 1)[0][0]
    assert hit[0] == "p250.jpg" and hit[1] == pytest.approx(1.0, abs=1e-4)
    # p11's newest row (the vector of shard 2) is the one held
    assert index.nearest(opened, vectors(1, 9), 1)[0][0][0] == "p11.jpg"
    assert index.nearest(opened, matrix[11:12], 1)[0][0][0] != "p11.jpg"


def test_stale_and_corrupt_indexes_are_named(tmp_path):
    matrix = vectors(50, 2)
    src = write(tmp_path / "e.parquet", [f"p{i}" for i in range(50)], matrix)
    index.build([src], tmp_path / "v", progress=False)
    write(src, [f"p{i}" for i in range(49)], matrix[:49])
    with pytest.raises(index.StaleIndex, match=r"older than .*e\.parquet") as stale:
        index.open_index(tmp_path / "v")
    assert "--exact" in stale.value.hint
    index.build([src], tmp_path / "v", progress=False)
    assert index.open_index(tmp_path / "v").index.ntotal == 49
    data = bytearray((tmp_path / "v" / index.VECTORS).read_bytes())
    data[-1] ^= 0xFF
    (tmp_path / "v" / index.VECTORS).write_bytes(bytes(data))
    with pytest.raises(index.CorruptIndex, match="sha256"):
        index.open_index(tmp_path / "v")
    manifest = tmp_path / "v" / index.MANIFEST
    manifest.write_text(json.dumps({"format": 99}))
    with pytest.raises(index.CorruptIndex, match="format 99"):
        index.open_index(tmp_path / "v")
    # a build over a corrupt index starts afresh
    assert index.build([src], tmp_path / "v", progress=False).count == 49


def test_duplicates_from_the_index_match_exact(tmp_path):
    matrix = vectors(100, 3)
    matrix[50] = matrix[7] * 1.001
    matrix[60] = matrix[7] + 0.001
    src = write(tmp_path / "e.parquet", [f"p{i:03d}" for i in range(100)], matrix)
    index.build([src], tmp_path / "v", progress=False)
    got = search.group(index.pairs(index.open_index(tmp_path / "v"), 0.97))
    want = search.duplicates(src, 0.97)
    assert [g["paths"] for g in got] == [g["paths"] for g in want] == [["p007", "p050", "p060"]]


def test_ivf_spec_above_the_flat_limit():
    assert index.spec_for(10) == "IDMap2,Flat"
    assert index.spec_for(1_000_000).startswith("PCAR256,IVF4096")
