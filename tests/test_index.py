"""serveclient/search/faissindex.py on small vector sets: build, update (added, changed and
removed photos), stale and corrupt indexes named, and its answers against exact search
(serveclient/search/exact.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("faiss")

from serveclient import search
from serveclient.errors import UsageError
from serveclient.search import faissindex as index
from serveclient.search.exact import ExactSearch
from serveclient.vectors import EMBEDDING_DIM, embedding_rows


def write(path: Path, names: list[str], matrix: np.ndarray, size: int = 1) -> Path:
    """An embed output as ``tsctl embed`` writes it (the columns the index reads)."""
    pq.write_table(embedding_rows(names, matrix, size), path)
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
    assert [[p for p, _ in hits] for hits in opened.nearest(queries, 10)] == [
        [p for p, _ in hits] for hits in ExactSearch(src).nearest(queries, 10)
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
    assert (built.added, built.removed, built.count, built.trained) == (101, 11, 290, False)
    opened = index.open_index(tmp_path / "v")
    answered = {p for hits in opened.nearest(matrix[:20], 50) for p, _ in hits}
    assert not answered & {f"p{i}.jpg" for i in range(10)}
    hit = opened.nearest(matrix[250:251], 1)[0][0]
    assert hit[0] == "p250.jpg" and hit[1] == pytest.approx(1.0, abs=1e-4)
    # p11's newest row (the vector of shard 2) is the one held
    assert opened.nearest(vectors(1, 9), 1)[0][0][0] == "p11.jpg"
    assert opened.nearest(matrix[11:12], 1)[0][0][0] != "p11.jpg"


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
    vectors_file = index.open_index(tmp_path / "v").files / index.VECTORS
    data = bytearray(vectors_file.read_bytes())
    data[-1] ^= 0xFF
    vectors_file.write_bytes(bytes(data))
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
    got = search.group(index.open_index(tmp_path / "v").pairs(0.97)).groups
    want = ExactSearch(src).duplicates(0.97).groups
    assert [g["paths"] for g in got] == [g["paths"] for g in want] == [["p007", "p050", "p060"]]


def test_ivf_spec_above_the_flat_limit():
    assert index.spec_for(10) == "IDMap2,Flat"
    assert index.spec_for(1_000_000) == "PROJ256,IVF4096,SQ8"


@pytest.fixture
def small_ivf(monkeypatch):
    """The approximate index on a few thousand vectors: PCA to 64, 8 lists (all visited)."""
    spec = "PROJ64,IVF8,SQ8"
    monkeypatch.setattr(index, "spec_for", lambda count: spec)
    return spec


def clustered(n: int, seed: int) -> np.ndarray:
    """Clusters in a 48-dimensional subspace plus a little noise: what a 64-d projection
    keeps nearly whole, so a test can tell the index's mechanics from its compression."""
    basis = np.random.default_rng(0).standard_normal((48, EMBEDDING_DIM)) / EMBEDDING_DIM**0.5
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((20, 48)) * 3
    latent = centres[rng.integers(0, 20, n)] + rng.standard_normal((n, 48))
    noise = 0.1 * rng.standard_normal((n, EMBEDDING_DIM))
    return (latent @ basis + noise).astype(np.float32)


def test_the_approximate_index_rescored_answers_as_exact_search(tmp_path, small_ivf):
    """Its candidates re-scored with the stored float16 vectors: exact search's top 10 (the
    index's own SQ8 scores alone would not rank them), scores within float16's error."""
    matrix = clustered(3000, 4)
    src = write(tmp_path / "e.parquet", [f"p{i}" for i in range(3000)], matrix)
    index.build([src], tmp_path / "v", progress=False)
    opened = index.open_index(tmp_path / "v")
    assert opened.manifest["spec"] == small_ivf and opened.manifest["rows"] == 3000
    queries = clustered(20, 5)
    got = opened.nearest(queries, 10)
    want = ExactSearch(src).nearest(queries, 10)
    recall = np.mean([len({p for p, _ in g} & {p for p, _ in w}) / 10 for g, w in zip(got, want)])
    assert recall >= 0.95
    for g, w in zip(got, want):
        assert g[0][1] == pytest.approx(w[0][1], abs=2e-3)


def test_approximate_duplicates_are_the_exact_pairs_and_updates_append(tmp_path, small_ivf):
    matrix = clustered(2000, 6)
    matrix[1500] = matrix[7] * 1.001
    matrix[1600] = matrix[9] + 0.001
    shards = tmp_path / "shards"
    shards.mkdir()
    write(shards / "0.parquet", [f"p{i:04d}" for i in range(2000)], matrix)
    assert index.build([shards], tmp_path / "v", progress=False).trained
    got = search.group(index.open_index(tmp_path / "v").pairs(0.99)).groups
    want = ExactSearch(shards / "0.parquet").duplicates(0.99).groups
    assert [g["paths"] for g in got] == [g["paths"] for g in want]
    assert sorted(map(tuple, [g["paths"] for g in want])) == [
        ("p0007", "p1500"),
        ("p0009", "p1600"),
    ]
    # 100 more photos: appended (ids 2000..2099, rows of rescore.f16), found at cosine 1
    extra = clustered(100, 7)
    write(shards / "1.parquet", [f"q{i}" for i in range(100)], extra)
    built = index.build([shards], tmp_path / "v", progress=False)
    assert (built.added, built.count, built.trained) == (100, 2100, False)  # no retraining
    opened = index.open_index(tmp_path / "v")
    assert (opened.manifest["spec"], opened.manifest["rows"]) == (small_ivf, 2100)
    hit = opened.nearest(extra[42:43], 1)[0][0]
    assert hit[0] == "q42" and hit[1] == pytest.approx(1.0, abs=2e-3)


def test_a_short_rescore_file_is_a_corrupt_index(tmp_path, small_ivf):
    src = write(tmp_path / "e.parquet", [f"p{i}" for i in range(600)], clustered(600, 8))
    assert index.build([src], tmp_path / "v", progress=False).spec == small_ivf
    store = index.open_index(tmp_path / "v").files / index.RESCORE
    store.write_bytes(store.read_bytes()[: -index.ROW_BYTES])
    size = 599 * index.ROW_BYTES
    with pytest.raises(index.CorruptIndex, match=rf"rescore\.f16 holds {size} bytes, its manifest"):
        index.open_index(tmp_path / "v")


def test_a_stored_photo_is_a_query_with_or_without_the_index(tmp_path):
    """``tsctl similar --stored``: the vector the collection holds for a path, from the Parquet
    (float32) or from the index (its float16 copy); a path the collection lacks is named."""
    matrix = vectors(120, 3)
    names = [f"p{i}.jpg" for i in range(120)]
    src = write(tmp_path / "e.parquet", names, matrix)
    index.build([src], tmp_path / "v", progress=False)
    opened = index.open_index(tmp_path / "v")
    unit = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    asked = ["p7.jpg", "p42.jpg"]
    exact = ExactSearch(src).stored(asked)
    assert np.allclose(exact, unit[[7, 42]], atol=1e-6)
    assert np.allclose(opened.stored(asked), unit[[7, 42]], atol=1e-3)
    for hits, name in zip(opened.nearest(opened.stored(asked), 3), asked):
        assert hits[0][0] == name and hits[0][1] == pytest.approx(1.0, abs=1e-3)
    for lookup in (lambda: ExactSearch(src).stored(["p7.jpg", "nope.jpg"]),
                   lambda: opened.stored(["nope.jpg"])):  # fmt: skip
        with pytest.raises(UsageError, match=r"not stored in .*nope\.jpg"):
            lookup()


def files_of(folder: Path) -> Path:
    """Where the index in ``folder`` keeps its files: the build folder its manifest names."""
    return folder / json.loads((folder / index.MANIFEST).read_text()).get("generation", "")


def test_every_file_of_an_index_is_checked_against_its_manifest(tmp_path):
    """Another index's paths.parquet (ids mapped to the wrong paths) is refused when opened;
    a changed row of rescore.f16 is refused when a search reads it, the others still answer."""
    for name, prefix in (("x", "p"), ("y", "q")):
        src = write(
            tmp_path / f"{name}.parquet", [f"{prefix}{i}" for i in range(100)], vectors(100, 4)
        )
        index.build([src], tmp_path / name, progress=False)
    mine = files_of(tmp_path / "x") / index.PATHS
    kept = mine.read_bytes()
    shutil.copyfile(files_of(tmp_path / "y") / index.PATHS, mine)
    with pytest.raises(index.CorruptIndex, match=r"paths\.parquet (does not match|holds \d+ b)"):
        index.open_index(tmp_path / "x")
    mine.write_bytes(kept)
    opened = index.open_index(tmp_path / "x")
    row = {path: id_ for id_, path in opened.names.items()}["p5"]
    with (files_of(tmp_path / "x") / index.RESCORE).open("r+b") as f:
        f.seek(row * index.ROW_BYTES + 10)
        f.write(b"\x00\x3c")  # one float16 of p5's row now reads 1.0
    opened = index.open_index(tmp_path / "x")
    assert opened.stored(["p6"]).shape == (1, EMBEDDING_DIM)
    with pytest.raises(index.CorruptIndex, match=rf"row {row} of rescore\.f16 does not match"):
        opened.stored(["p5"])


def test_a_build_removes_what_builds_left_and_nothing_else(tmp_path):
    """A folder of the format before (its files beside the manifest) is rebuilt; what it and
    killed builds left goes, a file of the user's stays."""
    folder = tmp_path / "v"
    (folder / "gen-0123456789ab").mkdir(parents=True)  # a killed build's
    for name in (index.VECTORS, index.PATHS, index.RESCORE, "manifest.json.tmp", "notes.txt"):
        (folder / name).write_text("old")
    (folder / index.MANIFEST).write_text(json.dumps({"format": 2}))
    src = write(tmp_path / "e.parquet", ["a", "b"], vectors(2, 5))
    assert index.build([src], folder, progress=False).count == 2
    generation = files_of(folder).name
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [generation, index.MANIFEST, "notes.txt"]
    )
    with pytest.raises(UsageError, match=r"notes\.txt is a file, not an index folder"):
        index.build([src], folder / "notes.txt", progress=False)


def two_subspaces(first: int, rest: int) -> np.ndarray:
    """``first`` vectors near a 16-dimensional subspace, then ``rest`` of ``clustered``'s: a
    collection whose first rows in folder order are all of one kind."""
    basis = np.random.default_rng(1).standard_normal((16, EMBEDDING_DIM)) / EMBEDDING_DIM**0.5
    rng = np.random.default_rng(2)
    head = rng.standard_normal((first, 16)) * 3 @ basis + 0.1 * rng.standard_normal(
        (first, EMBEDDING_DIM)
    )
    return np.concatenate([head.astype(np.float32), clustered(rest, 4)])


def test_the_quantisers_train_on_a_random_sample_not_the_first_rows(
    tmp_path, small_ivf, monkeypatch
):
    """Trained on the first 300 rows (one kind), the projection would keep their directions
    and lose the others': the other kind's neighbours are found as exact search finds them."""
    monkeypatch.setattr(index, "training_rows", lambda spec: 300)
    matrix = two_subspaces(300, 2700)
    src = write(tmp_path / "e.parquet", [f"p{i:04d}" for i in range(3000)], matrix)
    index.build([src], tmp_path / "v", progress=False)
    opened = index.open_index(tmp_path / "v")
    assert opened.manifest["trained"] == {"count": 3000, "sample": 300, "seed": index.SAMPLE_SEED}
    queries = clustered(20, 5)
    got, want = opened.nearest(queries, 10), ExactSearch(src).nearest(queries, 10)
    recall = np.mean([len({p for p, _ in g} & {p for p, _ in w}) / 10 for g, w in zip(got, want)])
    assert recall >= 0.9


def test_the_training_sample_is_the_same_in_any_folder_order(tmp_path):
    matrix = vectors(400, 6)
    names = [f"p{i:03d}" for i in range(400)]
    forward = index.sources_of([write(tmp_path / "f.parquet", names, matrix)])
    backward = index.sources_of([write(tmp_path / "b.parquet", names[::-1], matrix[::-1])])
    first = index._sample(forward, index.wanted(forward), 50)
    assert np.array_equal(first, index._sample(backward, index.wanted(backward), 50))
    assert first.shape == (50, EMBEDDING_DIM)


def test_an_ivf_index_is_trained_anew_past_the_growth_factor(tmp_path, monkeypatch, capsys):
    """Kept while the collection grows less than RETRAIN_GROWTH times (and tsctl says so),
    trained anew past it, on a sample of the whole."""
    from serveclient.cli import main

    monkeypatch.setattr(index, "spec_for", lambda count: "IVF4,Flat")
    matrix = vectors(500, 8)
    names = [f"p{i:03d}" for i in range(500)]
    src = tmp_path / "e.parquet"
    write(src, names[:100], matrix[:100])
    built = index.build([src], tmp_path / "v", progress=False)
    assert (built.trained, built.trained_at, built.retrain_past) == (True, 100, 200)
    write(src, names[:200], matrix[:200])  # twice as many: not past the factor
    assert main(["index", "build", str(src), "--out", str(tmp_path / "v"), "--no-progress"]) == 0
    assert (
        "200 vectors (IVF4,Flat), 100 added, 0 removed; not retrained (its quantisers were "
        "trained at 100 vectors), trained anew past 200"
    ) in capsys.readouterr().out
    write(src, names[:201], matrix[:201])
    built = index.build([src], tmp_path / "v", progress=False)
    assert (built.trained, built.trained_at, built.retrain_past, built.added) == (
        True,
        201,
        402,
        201,
    )
    opened = index.open_index(tmp_path / "v")
    assert opened.manifest["trained"]["count"] == 201
    hit = opened.nearest(matrix[150:151], 1)[0][0]
    assert hit[0] == "p150" and hit[1] == pytest.approx(1.0, abs=2e-3)
