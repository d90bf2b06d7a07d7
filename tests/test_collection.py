"""The collection job's parts without a server: walking (nested folders, extensions, a symlink
loop, stdin), sharding, the Parquet schema, parts, merge and resume index, chunked search, and
the job's pacing and retries against a fake client."""

from __future__ import annotations

import io
import os
import shutil
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from serveclient import errors
from serveclient.batchjob import (
    SERVER_DEFAULTS,
    Job,
    ListSink,
    PartSink,
    Plan,
    ServerDefaults,
    described,
)
from serveclient.client import Answers
from serveclient.collection import Collection, Entry, Shard, shard_of
from serveclient.search.exact import ExactSearch
from serveclient.vectors import EMBEDDING_DIM, Output, Row, batches, metadata, read_matrix

META = {"model": "resnet50-embedding", "model_version": "1.0", "weights_sha256": "abc"}


def _tree(root):
    for rel in (
        "a.jpg",
        "b.PNG",
        "notes.txt",
        "sub/c.jpeg",
        "sub/deeper/d.webp",
        "sub/deeper/e.gif",
        "z/f.tiff",
        "z/readme.md",
    ):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rel.encode())
    return root


# ------------------------------------------------------------------ walking


def test_walk_finds_image_files_in_nested_folders_in_sorted_order(tmp_path):
    root = _tree(tmp_path / "photos")
    paths = [e.path for e in Collection([str(root)]).entries()]
    rel = [os.path.relpath(p, root) for p in paths]
    assert rel == [
        "a.jpg",
        "b.PNG",
        "sub/c.jpeg",
        "sub/deeper/d.webp",
        "sub/deeper/e.gif",
        "z/f.tiff",
    ]
    entry = Collection([str(root)]).entries().__next__()
    assert entry.key == "a.jpg" and entry.size == len(b"a.jpg") and entry.mtime_ns > 0


def test_symlink_loops_and_twice_linked_folders_are_walked_once(tmp_path):
    root = _tree(tmp_path / "photos")
    (root / "sub" / "deeper" / "loop").symlink_to(root)  # back to the top
    (root / "again").symlink_to(root / "sub")  # a second way into sub/
    (root / "dangling.jpg").symlink_to(tmp_path / "missing.jpg")
    entries = list(Collection([str(root)]).entries())
    names = [os.path.basename(e.path) for e in entries]
    assert sorted(names) == sorted(
        ["a.jpg", "b.PNG", "c.jpeg", "d.webp", "e.gif", "f.tiff", "dangling.jpg"]
    )
    [dangling] = [e for e in entries if e.path.endswith("dangling.jpg")]
    assert dangling.size is None and "cannot read" in dangling.error


def test_files_given_are_kept_whatever_their_extension_and_stdin_lists_paths(tmp_path):
    root = _tree(tmp_path / "photos")
    stdin = io.StringIO(f"{root / 'notes.txt'}\n\n{root / 'sub'}\n{tmp_path / 'nope.jpg'}\n")
    collection = Collection([str(root / "z" / "readme.md"), "-"], stdin=stdin)
    first = [(os.path.relpath(e.path, root), e.error is None) for e in collection.entries()]
    assert first == [
        ("z/readme.md", True),
        ("notes.txt", True),
        ("sub/c.jpeg", True),
        ("sub/deeper/d.webp", True),
        ("sub/deeper/e.gif", True),
        ("../nope.jpg", False),
    ]
    again = [(os.path.relpath(e.path, root), e.error is None) for e in collection.entries()]
    assert again == first  # stdin was spooled: a second walk sees the same list


def test_no_sources_is_a_usage_error():
    with pytest.raises(errors.UsageError):
        Collection([])


# ------------------------------------------------------------------ sharding


def test_shards_are_disjoint_and_together_the_whole(tmp_path):
    keys = [f"album{i % 7}/photo{i}.jpg" for i in range(3000)]
    for n in (1, 2, 3, 8):
        owners = [[s for s in range(n) if Shard(s, n).holds(k)] for k in keys]
        assert all(len(o) == 1 for o in owners)
        sizes = np.bincount([o[0] for o in owners], minlength=n)
        assert sizes.min() > 0.8 * len(keys) / n  # roughly even
    assert shard_of("album1/photo1.jpg", 8) == shard_of("album1/photo1.jpg", 8)
    # Stable across processes and versions: a pinned value.
    assert [shard_of(f"p{i}.jpg", 4) for i in range(8)] == [
        int.from_bytes(
            __import__("hashlib").blake2b(f"p{i}.jpg".encode(), digest_size=8).digest(), "big"
        )
        % 4
        for i in range(8)
    ]


def test_shard_keys_are_relative_to_the_folder_so_mount_points_do_not_matter(tmp_path):
    a = _tree(tmp_path / "here" / "photos")
    b = _tree(tmp_path / "elsewhere" / "mnt")
    for n in (2, 3):
        for i in range(n):
            ka = [e.key for e in Collection([str(a)]).entries(Shard(i, n))]
            kb = [e.key for e in Collection([str(b)]).entries(Shard(i, n))]
            assert ka == kb
    every = [e.key for e in Collection([str(a)]).entries()]
    split = [e.key for i in range(3) for e in Collection([str(a)]).entries(Shard(i, 3))]
    assert sorted(split) == sorted(every)


@pytest.mark.parametrize("text", ["3/3", "-1/2", "1", "a/b", "0/0", "1/2/3"])
def test_bad_shards_are_usage_errors(text):
    with pytest.raises(errors.UsageError):
        Shard.parse(text)


# ------------------------------------------------------------------ Parquet


def _rows(n, start=0, fail=()):
    rng = np.random.default_rng(start)
    rows = []
    for i in range(start, start + n):
        vector = rng.normal(size=EMBEDDING_DIM).astype(np.float32)
        rows.append(
            Row(
                f"p/{i:04d}.jpg",
                100 + i,
                1_700_000_000_000_000_000 + i,
                f"{i:064x}",
                "HTTP 400 InvalidImage: bad" if i in fail else None,
                None if i in fail else vector,
            )
        )
    return rows


def test_schema_parts_merge_and_readers(tmp_path):
    out = Output(tmp_path / "v.parquet", "embedding", META)
    out.write_part(_rows(5, fail={3}))
    out.write_part(_rows(4, start=5))
    assert [p.name for p in out.existing()] == ["part-000000.parquet", "part-000001.parquet"]
    out.merge()
    assert not out.parts.exists()
    schema = pq.read_schema(out.out)
    assert schema.field("embedding").type == pa.list_(pa.float32(), EMBEDDING_DIM)
    assert schema.field("mtime").type == pa.timestamp("ns", tz="UTC")
    assert [f.name for f in schema] == [
        "path",
        "path_bytes",
        "size",
        "mtime",
        "sha256",
        "status",
        "error",
        "precision",
        "cached",
        "embedding",
    ]
    assert metadata(out.out)["model"] == "resnet50-embedding"
    assert metadata(out.out)["task"] == "embedding"
    import duckdb
    import pandas as pd
    import polars as pl

    frame = pd.read_parquet(out.out)
    assert len(frame) == 9 and frame["status"].value_counts().to_dict() == {"ok": 8, "error": 1}
    assert len(frame["embedding"][0]) == EMBEDDING_DIM
    assert pl.read_parquet(out.out).shape == (9, 10)
    sql = f"select count(*), max(len(embedding)) from '{out.out}' where status = 'ok'"
    assert duckdb.sql(sql).fetchall() == [(8, EMBEDDING_DIM)]
    paths, matrix = read_matrix(out.out)
    assert matrix.shape == (8, EMBEDDING_DIM) and "p/0003.jpg" not in paths


def test_a_schema_1_output_merges_with_new_rows_its_precision_null(tmp_path):
    """Outputs written before the precision column resume: their rows keep a null precision."""
    out = Output(tmp_path / "v.parquet", "embedding", META)
    old = pa.Table.from_pylist([r.record("embedding") for r in _rows(3)], schema=out.schema)
    pq.write_table(old.drop_columns(["precision"]), out.out)
    out.write_part([Row("new.jpg", 1, 2, "0" * 64, None, [0.5] * EMBEDDING_DIM, "bf16")])
    out.merge()
    rows = {r["path"]: r["precision"] for r in pq.read_table(out.out).to_pylist()}
    assert rows.pop("new.jpg") == "bf16" and len(rows) == 3
    assert set(rows.values()) == {None}


def test_tags_schema(tmp_path):
    out = Output(tmp_path / "t.parquet", "tags", META)
    out.write_part(
        [Row("a.jpg", 1, 2, "0" * 64, None, [{"label": "tabby", "index": 281, "probability": 0.5}])]
    )
    out.merge()
    assert pq.read_schema(out.out).field("tags").type == pa.list_(
        pa.struct([("label", pa.string()), ("index", pa.int32()), ("probability", pa.float32())])
    )
    assert pq.read_table(out.out).column("tags").to_pylist()[0][0]["label"] == "tabby"


def test_done_index_resume_and_newest_row_wins(tmp_path):
    out = Output(tmp_path / "v.parquet", "embedding", META)
    out.write_part(_rows(5, fail={3}))
    out.merge()
    retried = _rows(1, start=3)  # the failed one, answered on a rerun
    out.write_part(retried)
    done = out.done()
    assert len(done) == 5
    assert done.holds("p/0003.jpg", 103, 1_700_000_000_000_000_003)
    assert not done.holds("p/0003.jpg", 104, 1_700_000_000_000_000_003)  # size changed
    assert not done.holds("p/0009.jpg", 109, 1_700_000_000_000_000_009)
    sha = out.done(with_sha256=True)
    assert sha.sha256_of("p/0002.jpg") == f"{2:064x}" and sha.sha256_of("nope") is None
    out.merge()
    table = pq.read_table(out.out)
    assert table.num_rows == 5 and table.column("status").to_pylist().count("ok") == 5


def test_kill_leftovers_are_cleaned_and_other_weights_refused(tmp_path):
    out = Output(tmp_path / "v.parquet", "embedding", META)
    out.write_part(_rows(2))
    (out.parts / ".part-000001.parquet.1234.tmp").write_bytes(b"half a part")
    (tmp_path / ".v.parquet.abcd.tmp").write_bytes(b"half a merge")
    out.clean()
    assert [p.name for p in out.parts.iterdir()] == ["part-000000.parquet"]
    assert not (tmp_path / ".v.parquet.abcd.tmp").exists()
    other = Output(tmp_path / "v.parquet", "embedding", {**META, "weights_sha256": "def"})
    with pytest.raises(errors.UsageError, match="weights_sha256"):
        other.check_identity()


# ------------------------------------------------------------------ search


def test_chunked_nearest_equals_brute_force_and_excludes_the_query(tmp_path):
    out = Output(tmp_path / "v.parquet", "embedding", META)
    rows = _rows(300, fail={7})
    for start in range(0, 300, 64):
        out.write_part(rows[start : start + 64])
    out.merge()
    paths, matrix = read_matrix(out.out)
    unit = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    queries = np.stack([matrix[5], matrix[100] + 0.1 * matrix[200]])
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    for rows_per_chunk in (16, 37, 1000):
        got = ExactSearch(out.out, rows_per_chunk).nearest(queries, k=7)
        for j in range(2):
            expect = np.argsort(-(unit @ q[j]))[:7]
            assert [p for p, _ in got[j]] == [paths[i] for i in expect]
            assert got[j][0][1] == pytest.approx(float(unit[expect[0]] @ q[j]), abs=1e-5)
    own = ExactSearch(out.out, 50).nearest(queries[:1], k=3, exclude=[paths[5]])[0]
    assert paths[5] not in [p for p, _ in own]
    assert sum(1 for _ in batches(out.out, 50)) == 6  # 299 ok rows, 50 at a time


def test_search_cache_is_used_and_follows_a_changed_index(tmp_path, monkeypatch):
    out = Output(tmp_path / "v.parquet", "embedding", META)
    first = _rows(40)
    out.write_part(first)
    out.merge()
    query = first[12].answer
    assert ExactSearch(out.out).nearest(query, k=1)[0][0][0] == "p/0012.jpg"
    cache = tmp_path / "v.parquet.search.npy"
    assert np.load(cache).shape == (40, EMBEDDING_DIM)
    # The second search reads the cache only: the Parquet's vectors are not decoded again.
    import serveclient.search.exact as search

    def no_decoding(*_a, **_k):
        raise AssertionError("the Parquet was decoded although the cache is fresh")

    with monkeypatch.context() as patch:
        patch.setattr(search, "batches", no_decoding)
        assert ExactSearch(out.out).nearest(query, k=1)[0][0][0] == "p/0012.jpg"
    # A rerun adds rows: the next search sees them (the cache is rebuilt, not trusted).
    later = _rows(10, start=40)
    out = Output(tmp_path / "v.parquet", "embedding", META)
    out.write_part(later)
    out.merge()
    assert ExactSearch(out.out).nearest(later[3].answer, k=1)[0][0][0] == "p/0043.jpg"
    assert np.load(cache).shape == (50, EMBEDDING_DIM)
    # A folder that cannot be written is searched from the Parquet itself.
    cache.unlink()
    monkeypatch.setattr(
        search,
        "_write_cache",
        lambda *_a: (_ for _ in ()).throw(PermissionError("read-only folder")),
    )
    assert ExactSearch(out.out).nearest(later[3].answer, k=1)[0][0][0] == "p/0043.jpg"
    assert not cache.exists()


def test_duplicates_groups_chains_across_chunks(tmp_path):
    rng = np.random.default_rng(1)
    base = rng.normal(size=(40, EMBEDDING_DIM)).astype(np.float32)
    rows = [Row(f"{i:03d}.jpg", 1, 1, "0" * 64, None, v) for i, v in enumerate(base)]
    near = lambda v: v + 0.05 * rng.normal(size=EMBEDDING_DIM).astype(np.float32)  # noqa: E731
    rows.append(Row("copy-of-003.jpg", 1, 1, "0" * 64, None, near(base[3])))
    rows.append(Row("copy-of-030.jpg", 1, 1, "0" * 64, None, near(base[30])))
    rows.append(Row("copy2-of-030.jpg", 1, 1, "0" * 64, None, near(base[30])))
    out = Output(tmp_path / "v.parquet", "embedding", META)
    out.write_part(rows)
    out.merge()
    for chunk in (7, 100):
        found = ExactSearch(out.out, chunk).duplicates(0.97)
        groups = found.groups
        assert found.complete and found.pairs == 4  # 003's one, 030's three
        assert [sorted(g["paths"]) for g in groups] == [
            ["030.jpg", "copy-of-030.jpg", "copy2-of-030.jpg"],
            ["003.jpg", "copy-of-003.jpg"],
        ]
        assert all(0.97 <= g["min_score"] <= 1.0 for g in groups)


# ------------------------------------------------------------------ the job, fake server


class FakeClient:
    """``infer`` like TorchServeClient's: a bad image fails a multi-image request whole; the
    first ``busy`` calls get 503 with Retry-After; ``down`` calls raise ServerNotRunning."""

    bytes_sent = 0  # Client's count of request bodies: nothing goes on a wire here

    def __init__(self, busy=0, down=0):
        self.calls, self.busy, self.down = [], busy, down

    def infer_answers(self, model, images, *, output, protocol, topk, traffic):
        self.calls.append(len(images))
        if self.down:
            self.down -= 1
            raise errors.ServerNotRunning("down")
        if self.busy:
            self.busy -= 1
            error = errors.ApiError(503, "Overloaded", "busy")
            error.retry_after = 0.01
            raise error
        if any(image.startswith(b"bad") for image in images):
            raise errors.ApiError(400, "InvalidImage", "image 1: bad")
        return Answers([[float(len(image))] * EMBEDDING_DIM for image in images], "int8+f32")


def _files(tmp_path, n, bad=()):
    entries = []
    for i in range(n):
        path = tmp_path / f"{i:03d}.jpg"
        path.write_bytes((b"bad" if i in bad else b"ok") + bytes(i))
        info = path.stat()
        entries.append(Entry(str(path), path.name, info.st_size, info.st_mtime_ns))
    return entries


def test_a_job_waits_for_a_busy_model_to_describe_it():
    """After a killed job the model's queue is still full of its requests and TorchServe
    answers the customized describe with 503: the next job waits instead of failing."""

    class Busy:
        calls = 0
        bytes_sent = 0

        def describe(self, model, customized=False):
            self.calls += 1
            if self.calls <= 2:
                raise errors.ApiError(503, "ServiceUnavailableException", "no worker")
            return [{"modelName": model}]

    pauses = []
    busy = Busy()
    assert described(busy, "m", sleep=pauses.append) == {"modelName": "m"}
    assert busy.calls == 3 and pauses == [1.0, 2.0]  # the job's own busy pauses
    with pytest.raises(errors.ApiError):  # and not beyond its limit
        described(Busy(), "m", wait_s=0.0, sleep=pauses.append)


def test_a_busy_answer_is_retried_after_its_retry_after():
    """The server's Retry-After wins over the job's own pause, whatever the attempt."""

    class Busy:
        calls = 0
        bytes_sent = 0

        def describe(self, model, customized=False):
            self.calls += 1
            if self.calls <= 3:
                error = errors.ApiError(503, "Overloaded", "budget taken")
                error.retry_after = {1: 7.0, 2: None, 3: 0.0}[self.calls]
                raise error
            return [{"modelName": model}]

    pauses = []
    assert described(Busy(), "m", sleep=pauses.append) == {"modelName": "m"}
    assert pauses == [7.0, 2.0, 0.0]


def test_tritons_full_queue_is_retried_after_growing_pauses():
    """Triton's 503 at its queue bound carries no Retry-After: the job's own pauses, as for
    TorchServe's 503 without one."""
    import json

    import requests

    full = requests.Response()
    full.status_code = 503
    full._content = json.dumps(
        {"error": "[request id: <id_unknown>] Exceeds maximum queue size"}
    ).encode()

    class Busy:
        calls = 0
        bytes_sent = 0

        def describe(self, model, customized=False):
            self.calls += 1
            if self.calls <= 3:
                raise errors.from_response(full, "describe")
            return [{"modelName": model}]

    pauses = []
    assert described(Busy(), "m", sleep=pauses.append) == {"modelName": "m"}
    assert pauses == [1.0, 2.0, 4.0]


def test_a_request_refused_as_busy_is_retried_a_bounded_number_of_times(tmp_path):
    """``max_busy_retries`` retries, then each file of the request is an error row with the
    server's message, and the job goes on."""
    client = FakeClient(busy=10**6)
    sink = ListSink()
    summary = Job(client, "m", "embedding", sink, Plan(1, 2), max_busy_retries=3).run(
        _files(tmp_path, 2)
    )
    assert client.calls == [2] * 4
    assert (summary.done, summary.failed) == (0, 2)
    assert all("503 Overloaded: busy" in row.error for row in sink.rows)


def test_plan_from_describe():
    entry = {
        "batchSize": 16,
        "workers": [{}, {}],
        "customizedMetadata": {"handler": {"max_batch_images": 64, "max_images_per_request": 32}},
    }
    assert Plan.from_describe(entry) == Plan(concurrency=64, per_request=4)
    assert Plan.from_describe(entry, concurrency=3, per_request=1) == Plan(3, 1)
    small = {
        "batchSize": 1,
        "workers": [{}],
        "customizedMetadata": {"handler": {"max_batch_images": 64, "max_images_per_request": 3}},
    }
    assert Plan.from_describe(small) == Plan(2, 3)  # the server's own limit wins
    # Without the handler's settings: the server's defaults (8 images per request), not more.
    assert Plan.from_describe({"batchSize": 1, "workers": [{}]}) == Plan(2, 8)
    assert Plan.from_describe(None) == Plan(32, 4)


def test_a_bulk_jobs_requests_fit_the_servers_bulk_share():
    """While people are about a batch admits ``bulk_batch_images`` bulk rows: a bulk job's
    requests carry no more, so one batch can hold several of them, none refused for size."""
    entry = {
        "batchSize": 16,
        "workers": [{}],
        "customizedMetadata": {"handler": {"max_batch_images": 64, "bulk_batch_images": 1}},
    }
    assert Plan.from_describe(entry, bulk=True) == Plan(32, 1)
    assert Plan.from_describe(entry) == Plan(32, 4)  # interactive: the batch's share
    assert Plan.from_describe(entry, per_request=3, bulk=True) == Plan(32, 3)  # asked for
    off = {"batchSize": 16, "customizedMetadata": {"handler": {"bulk_batch_images": 0}}}
    assert Plan.from_describe(off, bulk=True) == Plan(32, 4)  # no share: the batch's
    assert Plan.from_describe(None, bulk=True) == Plan(32, 2)  # the server's default share


def test_the_clients_fallbacks_are_the_servers_defaults():
    """The client image ships without servecore: its fallbacks are written in
    ``serveclient.batchjob.SERVER_DEFAULTS`` (and the most a file read to send may hold in
    ``collection.MAX_FILE_BYTES``), and must be what the server really defaults to."""
    import yaml

    from servecore.config import ExplainConfig, HandlerConfig
    from tests.conftest import REPO

    handler, explain = HandlerConfig(), ExplainConfig()
    assert (
        ServerDefaults(
            batch_size=SERVER_DEFAULTS.batch_size,  # checked against the shipped models below
            max_images_per_request=handler.max_images_per_request,
            max_batch_images=handler.max_batch_images,
            bulk_batch_images=handler.bulk_batch_images,
            explain_method=explain.method,
            explain_n_steps=explain.n_steps,
            explain_max_passes_per_batch=explain.max_passes_per_batch,
        )
        == SERVER_DEFAULTS
    )
    shipped = {
        yaml.safe_load(path.read_text())["batchSize"]
        for path in (REPO / "config" / "models").glob("*.yaml")
    }
    assert shipped == {SERVER_DEFAULTS.batch_size}
    # A file is read to be sent only up to what one request may carry.
    from serveclient.collection import MAX_FILE_BYTES

    base = (REPO / "config" / "server-base.properties").read_text()
    assert f"\nmax_request_size={MAX_FILE_BYTES}\n" in base


def test_plan_from_a_served_describe(tmp_path):
    """The describe path as tsctl takes it: ``GET /models/{name}?customized=true`` (TorchServe's
    customized describe, its ``customizedMetadata`` a JSON string) decides the plan."""
    import http.server
    import json
    import threading

    from serveclient.client import TorchServeClient
    from serveshared.keys import Keys

    asked = []
    handler_settings = {"max_batch_images": 12, "max_images_per_request": 5}

    class Management(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            body = json.dumps(
                [
                    {
                        "modelName": "m",
                        "modelVersion": "1.0",
                        "batchSize": 2,
                        "workers": [{}],
                        "customizedMetadata": json.dumps({"handler": handler_settings}),
                    }
                ]
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Management)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        client = TorchServeClient(url, url, url, keys=Keys("k", "k"), timeout=10)
        entry = described(client, "m")
    finally:
        server.shutdown()
        server.server_close()
    assert asked == ["/models/m?customized=true"]
    assert entry["customizedMetadata"]["handler"] == handler_settings
    assert Plan.from_describe(entry) == Plan(concurrency=4, per_request=5)  # min(5, 12 // 2)


def test_job_isolates_a_bad_image_and_honours_503(tmp_path):
    client = FakeClient(busy=2)
    sink = ListSink()
    summary = Job(client, "m", "embedding", sink, Plan(2, 4)).run(_files(tmp_path, 10, bad={5}))
    assert (summary.done, summary.failed) == (9, 1)
    rows = {os.path.basename(r.path): r for r in sink.rows}
    assert "InvalidImage" in rows["005.jpg"].error and rows["005.jpg"].answer is None
    assert rows["006.jpg"].answer[0] == len(b"ok") + 6
    # Each answered row carries the precision the server named; a failed one none.
    assert rows["006.jpg"].precision == "int8+f32" and rows["005.jpg"].precision is None
    assert client.calls.count(4) >= 3 and client.calls.count(1) == 4  # 4..7 resent singly


def test_job_retries_an_outage_then_gives_up_and_keeps_what_is_written(tmp_path):
    summary = Job(FakeClient(down=2), "m", "embedding", ListSink(), Plan(1, 4)).run(
        _files(tmp_path, 3)
    )
    assert summary.done == 3
    out = Output(tmp_path / "v.parquet", "embedding", META)
    job = Job(FakeClient(down=10**6), "m", "embedding", PartSink(out), Plan(1, 2), max_outage_s=0.5)
    with pytest.raises(errors.ServerNotRunning):
        job.run(_files(tmp_path, 4))
    assert not out.out.exists()  # not merged: a rerun resumes from the parts


# ------------------------------------------------------------------ names, gone files, one writer


class CliClient(FakeClient):
    """``FakeClient`` as ``tsctl embed``'s own code takes it: no management API to describe."""

    reaches_management = False
    urls: ClassVar[dict[str, str]] = {"inference": "http://127.0.0.1:9"}


def _embed(client, *argv):
    """``tsctl embed ARGV`` in this process: (its ``--json`` summary, its exit status). Sent as
    interactive: a bulk job would leave this test process SCHED_IDLE for good."""
    from serveclient import cli
    from serveclient.cli.batch import cmd_embed

    args = cli.parser().parse_args(["embed", *argv, "--priority", "interactive"])
    data, text, code = cmd_embed(client, args)
    text.encode("utf-8")  # printable, whatever the names
    return data, code


def _album(root, names):
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"ok " + name.encode())


def _stored(out):
    return sorted(pq.read_table(out, columns=["path"]).column("path").to_pylist())


def test_a_file_name_that_is_not_utf8_is_embedded_and_stored_byte_for_byte(tmp_path):
    """Before: the name's surrogates reached a string column, the part raised, every run died
    on it. Now the row is kept: ``path`` a UTF-8 string (the byte as ``\\xe9``), its exact bytes
    in ``path_bytes``, and a rerun matches it by those bytes."""
    import duckdb
    import pandas as pd
    import polars as pl

    root = tmp_path / "photos"
    _album(root, ["plain.jpg"])
    latin1 = os.fsencode(root) + b"/caf\xe9.jpg"  # Latin-1 from an old camera: not UTF-8
    broken = os.fsencode(root) + b"/\xff.jpg"
    with open(latin1, "wb") as handle:
        handle.write(b"ok latin-1")
    with open(broken, "wb") as handle:
        handle.write(b"bad image")
    out = tmp_path / "v.parquet"
    data, code = _embed(CliClient(), str(root), "--out", str(out))
    assert code == 7 and (data["rows"], data["done"], data["failed"]) == (3, 2, 1)
    assert [f["path"] for f in data["failures"]] == [f"{root}/\\xff.jpg"]
    frame = pd.read_parquet(out).sort_values("path").reset_index(drop=True)
    assert frame["path"].tolist() == [
        f"{root}/\\xff.jpg",
        f"{root}/caf\\xe9.jpg",
        f"{root}/plain.jpg",
    ]
    assert frame["path_bytes"].tolist() == [broken, latin1, None]
    assert frame["status"].tolist() == ["error", "ok", "ok"]
    with open(os.fsdecode(frame["path_bytes"][1]), "rb") as handle:  # the way back to the file
        assert handle.read() == b"ok latin-1"
    assert frame["embedding"][1][0] == len(b"ok latin-1")
    assert pl.read_parquet(out)["path"].dtype == pl.String
    assert duckdb.sql(f"select count(*) from '{out}' where path like '%caf%'").fetchall() == [(1,)]
    again, _ = _embed(CliClient(), str(root), "--out", str(out))
    assert (again["rows"], again["skipped"], again["done"], again["failed"]) == (3, 2, 0, 1)


def test_a_value_parquet_cannot_hold_fails_its_row_not_the_part(tmp_path):
    """A server's JSON may carry a lone surrogate (``"\\ud800"``), which no Parquet string
    holds: that row becomes an error row saying so, the rest of the part is written."""
    out = Output(tmp_path / "t.parquet", "tags", META)
    tag = {"label": "tabby", "index": 281, "probability": 0.5}
    out.write_part(
        [
            Row("a.jpg", 1, 2, "0" * 64, None, [tag]),
            Row("b.jpg", 1, 2, "0" * 64, None, [{**tag, "label": "\ud800"}]),
        ]
    )
    rows = {r["path"]: r for r in pq.read_table(out.existing()[0]).to_pylist()}
    assert rows["a.jpg"]["status"] == "ok" and rows["a.jpg"]["tags"] == [tag]
    assert rows["b.jpg"]["status"] == "error" and "cannot be stored" in rows["b.jpg"]["error"]


def test_a_part_that_cannot_be_written_stops_the_job_once_keeping_the_parts_before(
    tmp_path, monkeypatch
):
    """Before: the flush raised, the job's ``finally`` flushed the same rows again and raised
    again, and the user saw a traceback. Now: one ``ServeError`` saying what and how to go on, no
    second attempt, the parts already written kept for the rerun."""
    import errno

    write, attempts = pq.write_table, []

    def disk_full_from_the_third(table, where, **options):
        attempts.append(table.num_rows)
        if len(attempts) >= 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write(table, where, **options)

    monkeypatch.setattr(pq, "write_table", disk_full_from_the_third)
    out = Output(tmp_path / "v.parquet", "embedding", META)
    job = Job(FakeClient(), "m", "embedding", PartSink(out, flush_rows=2), Plan(1, 2))
    with pytest.raises(errors.ServeError, match="No space left on device") as failed:
        job.run(_files(tmp_path, 10))
    assert "rerun" in failed.value.hint and str(out.parts) in failed.value.message
    assert attempts == [2, 2, 2]  # reported once: closing the job wrote nothing again
    assert sum(pq.ParquetFile(p).metadata.num_rows for p in out.existing()) == 4
    assert not out.out.exists() and not list(out.parts.glob(".*.tmp"))


def test_ctrl_c_while_a_part_is_written_keeps_its_rows_for_the_close(tmp_path, monkeypatch):
    """Before: the sink let a part's rows go before writing them, so Ctrl-C landing in that
    write lost rows the progress bar had counted done (and ``tsctl`` said were kept). Now they
    stay held until their part is on disk, and the job's close writes them."""
    write, calls = pq.write_table, []

    def ctrl_c_in_the_first(table, where, **options):
        calls.append(table.num_rows)
        if len(calls) == 1:
            raise KeyboardInterrupt
        write(table, where, **options)

    monkeypatch.setattr(pq, "write_table", ctrl_c_in_the_first)
    out = Output(tmp_path / "v.parquet", "embedding", META)
    job = Job(FakeClient(), "m", "embedding", PartSink(out, flush_rows=2), Plan(1, 2))
    with pytest.raises(KeyboardInterrupt):
        job.run(_files(tmp_path, 10))
    assert calls == [2, 2]  # the interrupted part's rows, written by the close
    assert sum(pq.ParquetFile(p).metadata.num_rows for p in out.existing()) == 2
    assert not out.out.exists() and not list(out.parts.glob(".*.tmp"))


def test_after_a_complete_run_the_output_holds_exactly_the_files_walked(tmp_path):
    """Before: a photo moved from cat/ to dog/ kept both rows, a deleted folder stayed, and
    another FOLDER into the same --out kept the old one's rows."""
    root = tmp_path / "photos"
    _album(root, ["cat/1.jpg", "cat/2.jpg", "dog/3.jpg", "old/4.jpg"])
    out = str(tmp_path / "v.parquet")
    first, _ = _embed(CliClient(), str(root), "--out", out)
    assert (first["rows"], first["gone"]) == (4, 0)
    (root / "cat" / "1.jpg").rename(root / "dog" / "1.jpg")
    shutil.rmtree(root / "old")
    moved, _ = _embed(CliClient(), str(root), "--out", out)
    assert _stored(out) == [str(root / p) for p in ("cat/2.jpg", "dog/1.jpg", "dog/3.jpg")]
    assert (moved["done"], moved["skipped"], moved["gone"]) == (1, 2, 2)
    # A source or folder that cannot be read: the walk cannot say what is gone, nothing goes.
    kept, code = _embed(CliClient(), str(root / "dog"), str(tmp_path / "unmounted"), "--out", out)
    assert code == 7 and kept["gone"] is None
    assert _stored(out) == [
        *(str(root / p) for p in ("cat/2.jpg", "dog/1.jpg", "dog/3.jpg")),
        str(tmp_path / "unmounted"),
    ]
    other, _ = _embed(CliClient(), str(root / "dog"), "--out", out)
    assert (other["rows"], other["skipped"], other["gone"]) == (2, 2, 2)
    assert _stored(out) == [str(root / "dog" / "1.jpg"), str(root / "dog" / "3.jpg")]


def test_two_spellings_of_a_folder_store_the_same_rows(tmp_path, monkeypatch):
    """Before: ``photos`` stored ``photos/a.jpg``, ``~/photos`` the absolute path: each file
    twice. Now every spelling is made absolute (``~`` expanded, ``.``/``..`` resolved); a
    symlink stays a name of its own (not resolved: its paths are where the user sees them)."""
    home = tmp_path / "home"
    _album(home / "photos", ["a.jpg", "sub/b.jpg"])
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(home)
    out = str(tmp_path / "v.parquet")
    _embed(CliClient(), "photos", "--out", out)
    expected = [str(home / "photos" / "a.jpg"), str(home / "photos" / "sub" / "b.jpg")]
    assert _stored(out) == expected
    for spelling in ("~/photos", "./photos/", "photos/sub/..", str(home / "photos")):
        again, _ = _embed(CliClient(), spelling, "--out", out)
        assert (again["rows"], again["skipped"], again["gone"]) == (2, 2, 0), spelling
    (home / "pics").symlink_to(home / "photos")
    linked, _ = _embed(CliClient(), "pics", "--out", out)
    assert (linked["done"], linked["gone"]) == (2, 2)
    assert _stored(out) == [str(home / "pics" / "a.jpg"), str(home / "pics" / "sub" / "b.jpg")]


def _waits_on(lock) -> bool:
    """Whether a process waits for the flock of ``lock`` (a ``->`` line of /proc/locks)."""
    inode = str(os.stat(lock).st_ino)
    with open("/proc/locks") as locks:
        return any(
            "->" in fields and fields[-3].rsplit(":", 1)[-1] == inode
            for fields in (line.split() for line in locks)
        )


def test_embed_holds_its_outputs_lock_for_the_whole_run_refusing_or_waiting(tmp_path):
    import threading
    import time

    from serveclient.outputlock import OutputBusy, hold, lock_path

    root = tmp_path / "photos"
    _album(root, ["a.jpg", "b.jpg", "c.jpg"])
    out = tmp_path / "v.parquet"

    class Watching(CliClient):
        """Tries the output's lock while the job sends: refused each time, as it is held."""

        def __init__(self):
            super().__init__()
            self.held: list[bool] = []

        def infer_answers(self, model, images, **kwargs):
            try:
                with hold(out):
                    self.held.append(False)
            except OutputBusy:
                self.held.append(True)
            return super().infer_answers(model, images, **kwargs)

    client = Watching()
    assert _embed(client, str(root), "--out", str(out))[0]["done"] == 3
    assert client.held and all(client.held)
    with hold(out, what="tsctl embed elsewhere"):
        with pytest.raises(OutputBusy) as refused:
            _embed(CliClient(), str(root), "--out", str(out))
        assert refused.value.exit_code == 8 and "tsctl embed elsewhere" in refused.value.message
        assert "--wait" in refused.value.hint
        result: list = []
        waiter = threading.Thread(
            target=lambda: result.append(
                _embed(CliClient(), str(root), "--out", str(out), "--wait")
            )
        )
        waiter.start()
        deadline = time.monotonic() + 60
        while not _waits_on(lock_path(out)):
            assert waiter.is_alive() and time.monotonic() < deadline, "it did not wait"
            time.sleep(0.02)
        assert result == []
    waiter.join(60)
    assert result and result[0][0]["skipped"] == 3


def test_a_merge_killed_after_its_rename_is_finished_by_the_next_one(tmp_path, monkeypatch):
    """The point a random kill rarely hits: the merged output renamed into place, its parts not
    yet removed. Readers see a whole output; the next merge keeps each path once."""
    from pathlib import Path

    from serveclient.vectors import path_hash

    out = Output(tmp_path / "v.parquet", "embedding", META)
    out.write_part(_rows(4))
    out.write_part(_rows(3, start=2))  # rows 2 and 3 again, newer
    walked = np.array([path_hash(f"p/{i:04d}.jpg") for i in range(1, 5)], np.uint64)
    unlink = Path.unlink

    def killed(self, missing_ok=False):
        if self.name.startswith("part-"):
            raise KeyboardInterrupt  # the process dies here
        unlink(self, missing_ok=missing_ok)

    with monkeypatch.context() as patch:
        patch.setattr(Path, "unlink", killed)
        with pytest.raises(KeyboardInterrupt):
            out.merge(walked)
    assert _stored(out.out) == [f"p/{i:04d}.jpg" for i in range(1, 5)] and len(out.existing()) == 3
    assert out.merge(walked) == 1 and not out.parts.exists()  # p/0000 of the parts, again
    assert _stored(out.out) == [f"p/{i:04d}.jpg" for i in range(1, 5)]


# ------------------------------------------------------------------ files that are no photo


def _in_time(work, fifo):
    """``work()``'s result (or its exception, raised here), or the test fails when it blocks
    (on ``fifo``, which is then given a writer so the thread ends)."""
    from concurrent.futures import ThreadPoolExecutor, TimeoutError

    pool = ThreadPoolExecutor(1)
    try:
        return pool.submit(work).result(timeout=30)
    except TimeoutError:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("blocked reading a FIFO")
    finally:
        pool.shutdown(wait=False)


def test_a_fifo_a_device_and_a_huge_file_are_error_rows_never_a_hang(tmp_path):
    """Before: ``tsctl embed`` read each file whole: a FIFO named ``x.jpg`` blocked the run for
    good, ``/dev/zero`` filled its memory, a huge file was read in and sent. Now each is an
    error row naming why, read no further than ``stat`` (nothing sent), the rest embedded."""
    from serveclient.collection import MAX_FILE_BYTES

    root = tmp_path / "photos"
    _album(root, ["a.jpg", "z.jpg"])
    os.mkfifo(root / "x.jpg")
    with open(root / "huge.jpg", "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: nothing written
    out = tmp_path / "v.parquet"
    client = CliClient()
    data, code = _in_time(
        lambda: _embed(client, str(root), "/dev/zero", "--out", str(out)), root / "x.jpg"
    )
    assert code == 7 and (data["done"], data["failed"]) == (2, 3)
    rows = {r["path"]: r for r in pq.read_table(out).to_pylist()}
    assert {p: r["error"] for p, r in rows.items() if r["status"] == "error"} == {
        f"{root}/x.jpg": "cannot read: a FIFO, not a regular file",
        "/dev/zero": "cannot read: a device, not a regular file",
        f"{root}/huge.jpg": "cannot read: 33,554,433 bytes, over the 32 MiB a request can carry",
    }
    assert sum(client.calls) == 2  # images sent: a.jpg and z.jpg alone


def test_a_file_swapped_for_a_fifo_after_its_stat_is_refused_on_its_descriptor(
    tmp_path, monkeypatch
):
    """Between the ``stat`` and the ``open`` a regular file becomes a FIFO: opened without
    blocking, checked again on the descriptor, refused."""
    from serveclient import collection

    path, stat = tmp_path / "x.jpg", os.stat
    path.write_bytes(b"a photo")

    def swapped(where, *args, **kwargs):
        info = stat(where, *args, **kwargs)
        if str(where) == str(path):
            path.unlink()
            os.mkfifo(path)
        return info

    monkeypatch.setattr(collection.os, "stat", swapped)
    with pytest.raises(ValueError, match=r"^a FIFO, not a regular file$"):
        _in_time(lambda: collection.read_file(path), path)


@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_a_similar_query_that_is_no_photo_file_is_refused_never_a_hang(tmp_path, capsys, kind):
    """Before: ``tsctl similar QUERY`` read the query whole: a FIFO blocked it, ``/dev/zero``
    filled its memory. Now: exit 2 naming why, before a server is asked."""
    from serveclient.cli import main
    from serveclient.collection import MAX_FILE_BYTES

    index = tmp_path / "v.parquet"
    out = Output(index, "embedding", META)
    out.write_part(_rows(3))
    out.merge()
    fifo = tmp_path / "q.jpg"
    os.mkfifo(fifo)
    query = {"fifo": str(fifo), "device": "/dev/zero", "huge": str(tmp_path / "huge.jpg")}[kind]
    with open(tmp_path / "huge.jpg", "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    code = _in_time(lambda: main(["similar", query, "--embeddings", str(index)]), fifo)
    err = capsys.readouterr().err
    assert code == 2
    assert (
        f"error: cannot read {query}: "
        + {
            "fifo": "a FIFO, not a regular file",
            "device": "a device, not a regular file",
            "huge": "33,554,433 bytes, over the 32 MiB a request can carry",
        }[kind]
        in err
    )
    assert "hint: check the file path: an image, a regular file of 32 MiB at most" in err


# ------------------------------------------------------------------ one version of an index


def _version(path, prefix, seed, n=30):
    """An embed output at ``path``: ``n`` random vectors, the last third near copies of the
    first (so ``duplicates`` finds pairs), paths ``PREFIX/NNN.jpg``."""
    rng = np.random.default_rng(seed)
    matrix = rng.normal(size=(n, EMBEDDING_DIM)).astype(np.float32)
    third = n // 3
    matrix[-third:] = matrix[:third] + 0.05 * rng.normal(size=(third, EMBEDDING_DIM))
    out = Output(path, "embedding", META)
    out.write_part(
        [Row(f"{prefix}/{i:03d}.jpg", 1, 1, "0" * 64, None, v) for i, v in enumerate(matrix)]
    )
    out.merge()
    return matrix


@pytest.mark.parametrize("cache", ["cache", "parquet"])
def test_a_search_answers_from_the_file_it_scanned_while_a_merge_replaces_it(
    tmp_path, monkeypatch, cache
):
    """Before: exact ``similar``/``duplicates`` looked the paths up by row number after the scan,
    in whatever file had the name then: an ``embed`` merge renaming a new file over it gave
    other photos' paths, or a KeyError. Now the scan and the paths read the file opened once."""
    import shutil

    import serveclient.search.exact as search

    index, older, newer = tmp_path / "v.parquet", tmp_path / "v1.parquet", tmp_path / "v2.parquet"
    queries = _version(index, "old", seed=0)[[2, 13, 27]]
    _version(newer, "new", seed=1, n=12)  # fewer rows: a row number past its end too
    shutil.copy(index, older)
    want = ExactSearch(index).nearest(queries, k=5), ExactSearch(index).duplicates(0.97)
    assert want[1].pairs == 10
    if cache == "parquet":
        monkeypatch.setattr(search, "_write_cache", lambda *_a: (_ for _ in ()).throw(OSError()))
    paths_at = search._paths_at

    def merged_meanwhile(*args):
        shutil.copy(newer, tmp_path / "merged.tmp")
        os.replace(tmp_path / "merged.tmp", index)  # as ``Output.merge`` renames its output
        return paths_at(*args)

    monkeypatch.setattr(search, "_paths_at", merged_meanwhile)
    searches = (
        lambda: ExactSearch(index).nearest(queries, k=5),
        lambda: ExactSearch(index).duplicates(0.97),
    )
    for run, expected in zip(searches, want):
        shutil.copy(older, index)
        assert run() == expected
        assert _stored(index)[0].startswith("new/")  # the merge did land during the search


def test_a_search_never_maps_the_cache_another_search_wrote_for_a_newer_file(tmp_path, monkeypatch):
    """Two searches while a merge replaces the index: the second writes the new file's cache
    between the first one's check and its mapping. The first sees the matrix changed under it
    and scans the file it opened instead of answering with the other file's vectors."""
    import serveclient.search.exact as search

    index, newer = tmp_path / "v.parquet", tmp_path / "v2.parquet"
    queries = _version(index, "old", seed=0)[[2, 13, 27]]
    _version(newer, "new", seed=1)  # as many rows: only the paths and vectors differ
    want = ExactSearch(index).nearest(queries, k=5)  # writes the cache of the old file
    load, raced = np.load, []

    def another_search_meanwhile(*args, **kwargs):
        if not raced:
            raced.append(True)
            os.replace(newer, index)
            assert ExactSearch(index).nearest(queries, k=1)[0][0][0].startswith("new/")
        return load(*args, **kwargs)

    monkeypatch.setattr(search.np, "load", another_search_meanwhile)
    assert ExactSearch(index).nearest(queries, k=5) == want
    assert raced and np.load(tmp_path / "v.parquet.search.npy").shape == (30, EMBEDDING_DIM)


# ------------------------------------------------------------------ refused options


@pytest.mark.parametrize("value", ["0", "-1"])
def test_part_rows_below_one_is_refused_before_anything_is_asked_or_written(
    tmp_path, capsys, value
):
    from serveclient.cli import main

    out = tmp_path / "v.parquet"
    assert main(["embed", str(tmp_path), "--out", str(out), "--part-rows", value]) == 2
    err = capsys.readouterr().err
    assert f"tsctl embed: error: --part-rows {value}: at least 1" in err
    assert "hint: the default is 1024" in err
    assert list(tmp_path.iterdir()) == []  # no lock, no parts, no output
