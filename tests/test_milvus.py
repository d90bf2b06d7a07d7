"""``tsctl index build --out URI`` and the searches through Milvus (search/milvusindex.py)
against a real Milvus Lite server process (``milvus-lite server`` on a free loopback port,
reached at ``http://127.0.0.1:PORT`` exactly as a Milvus Standalone would be), compared with
exact search over the Parquet (serveclient/search/exact.py); and Milvus Lite's ``NAME.db`` URI. The
token: tsctl reads it from a file or ``$MILVUS_TOKEN`` and sends it to a server that checks it
as Milvus Standalone with authentication on does (Milvus Lite has none: devtools/milvus.py puts
Milvus's check in front); a refusal is named, the token never shown."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

pytest.importorskip("pymilvus")

from devtools.milvus import milvus_lite
from devtools.server import free_port
from serveclient import search
from serveclient.cli import parser
from serveclient.cli.common import TOKEN_BYTES, milvus_token
from serveclient.errors import MilvusTokenError, UsageError
from serveclient.search import faissindex as index
from serveclient.search import milvusindex
from serveclient.search.exact import ExactSearch
from tests.served import tsctl
from tests.test_index import clustered, vectors, write


@pytest.fixture(scope="module")
def milvus(tmp_path_factory):
    """A Milvus Lite server process (devtools/milvus.py); its URI. Stopped after the module."""
    with milvus_lite(tmp_path_factory.mktemp("milvus")) as server:
        yield server.uri


def names_of(found):
    return [[p for p, _ in hits] for hits in found]


def test_a_milvus_collection_answers_as_exact_search_and_updates_in_place(tmp_path, milvus):
    matrix = vectors(300, 1)
    matrix[250] = matrix[17] * 1.001  # a near-copy
    names = [f"p{i:03d}.jpg" for i in range(300)]
    shards = tmp_path / "shards"
    shards.mkdir()
    write(shards / "0.parquet", names[:200], matrix[:200])
    built = milvusindex.build([shards], milvus, "first", progress=False)
    assert (built.added, built.removed, built.count, built.spec) == (200, 0, 200, "FLAT")
    opened = milvusindex.open_index(milvus, "first")
    queries = matrix[:5] + 0.01
    assert names_of(opened.nearest(queries, 10)) == names_of(
        ExactSearch(shards / "0.parquet").nearest(queries, 10)
    )
    # a second shard adds 100; the first loses p000..p009 (removed) and p011 changes
    write(shards / "1.parquet", names[200:], matrix[200:])
    write(shards / "0.parquet", names[10:200], matrix[10:200])
    write(shards / "2.parquet", ["p011.jpg"], vectors(1, 9), size=2)
    built = milvusindex.build([shards], milvus, "first", progress=False)
    assert (built.added, built.removed, built.count, built.trained) == (101, 11, 290, False)
    opened = milvusindex.open_index(milvus, "first")
    answered = {p for hits in opened.nearest(matrix[:20], 50) for p, _ in hits}
    assert not answered & {f"p{i:03d}.jpg" for i in range(10)}
    hit = opened.nearest(matrix[260:261], 1)[0][0]
    assert hit[0] == "p260.jpg" and hit[1] == pytest.approx(1.0, abs=1e-5)
    assert opened.nearest(vectors(1, 9), 1)[0][0][0] == "p011.jpg"
    # stored vectors as queries; a path it lacks is named
    unit = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    assert np.allclose(opened.stored(["p042.jpg"]), unit[[42]], atol=1e-6)
    with pytest.raises(UsageError, match=r"not stored in first at .*p000\.jpg"):
        opened.stored(["p000.jpg"])
    # duplicates: the pairs exact search finds over the same photos
    got = search.group(opened.pairs(0.97)).groups
    want = [["p017.jpg", "p250.jpg"]]
    assert [g["paths"] for g in got] == want


def test_a_stale_or_foreign_collection_is_named_never_answered(tmp_path, milvus):
    from pymilvus import MilvusClient

    matrix = vectors(50, 2)
    odd = ['a"b.jpg', "café.jpg", "it's.jpg", "x\\y\x01.jpg", "ü"]  # never quoted: hashed ids
    names = [f"p{i}" for i in range(45)] + odd
    src = write(tmp_path / "e.parquet", names, matrix)
    milvusindex.build([src], milvus, "second", progress=False)
    opened = milvusindex.open_index(milvus, "second")
    unit = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    assert np.allclose(opened.stored(names[45:]), unit[45:], atol=1e-6)
    write(src, names[:49], matrix[:49])  # "ü" removed, by a filter that must quote it
    with pytest.raises(index.StaleIndex, match=r"second at http.* is older than .*e\.parquet") as e:
        milvusindex.open_index(milvus, "second")
    assert "--exact" in e.value.hint
    assert milvusindex.build([src], milvus, "second", progress=False).removed == 1
    assert milvusindex.open_index(milvus, "second").manifest["count"] == 49
    write(src, names[:45] + names[46:49], np.concatenate([matrix[:45], matrix[46:49]]))  # 'a"b.jpg'
    assert milvusindex.build([src], milvus, "second", progress=False).removed == 1
    write(src, names[:49], matrix[:49])
    assert milvusindex.build([src], milvus, "second", progress=False).added == 1
    client = MilvusClient(uri=milvus)
    client.delete("second", filter='path == "p3"')  # rows changed behind tsctl's back
    with pytest.raises(index.CorruptIndex, match="holds 48 vectors, its manifest 49"):
        milvusindex.open_index(milvus, "second")
    with pytest.raises(index.CorruptIndex, match="no collection nothing_here"):
        milvusindex.open_index(milvus, "nothing_here")
    client.alter_collection_properties("second", properties={milvusindex.PROPERTY: "{}"})
    with pytest.raises(index.CorruptIndex, match="format None"):
        milvusindex.open_index(milvus, "second")
    # a build over it (a killed build's) sets the index anew and brings the rows back
    client.release_collection("second")
    client.drop_index("second", "embedding")
    again = milvusindex.build([src], milvus, "second", progress=False)
    assert (again.added, again.count, again.trained) == (1, 49, True)
    opened = milvusindex.open_index(milvus, "second")
    assert [p for p, _ in opened.nearest(matrix[47:48], 1)[0]] == ["it's.jpg"]


def test_past_the_flat_limit_the_collection_is_ivf_sq8_and_finds_the_exact_neighbours(
    tmp_path, milvus, monkeypatch
):
    monkeypatch.setattr(index, "EXACT_BELOW", 1000)
    matrix = clustered(3000, 4)
    matrix[2500] = matrix[7] * 1.001
    names = [f"p{i:04d}" for i in range(3000)]
    src = write(tmp_path / "e.parquet", names[:500], matrix[:500])
    assert milvusindex.build([src], milvus, "third", progress=False).spec == "FLAT"
    write(src, names, matrix)  # outgrown: the flat index replaced by IVF_SQ8, trained anew
    built = milvusindex.build([src], milvus, "third", progress=False)
    assert built.spec.startswith("IVF_SQ8,nlist=") and built.trained
    assert (built.added, built.count) == (2500, 3000)
    opened = milvusindex.open_index(milvus, "third")
    queries = clustered(20, 5)
    got = opened.nearest(queries, 10)
    want = ExactSearch(src).nearest(queries, 10)
    recall = np.mean([len(set(g) & set(w)) / 10 for g, w in zip(names_of(got), names_of(want))])
    assert recall >= 0.95
    for g, w in zip(got, want):  # re-scored: exact cosines, as the Parquet's
        assert g[0][1] == pytest.approx(w[0][1], abs=1e-5)
    pairs = search.group(opened.pairs(0.99)).groups
    want = ExactSearch(src).duplicates(0.99).groups
    assert [g["paths"] for g in pairs] == [g["paths"] for g in want]


def test_tsctl_builds_and_searches_milvus_by_uri_as_it_does_the_folder_index(tmp_path, milvus):
    """The same commands; only ``--out``/``--index`` change (a server URI, then Milvus
    Lite's local ``.db``)."""
    matrix = vectors(120, 3)
    matrix[99] = matrix[3] * 1.001
    src = write(tmp_path / "photos.parquet", [f"p{i}.jpg" for i in range(120)], matrix)
    for uri in (milvus, str(tmp_path / "lite.db")):
        built = tsctl(None, "index", "build", str(src), "--out", uri, "--no-progress")
        assert built.returncode == 0, built.stderr
        assert f"photos at {uri}: 120 vectors (FLAT), 120 added, 0 removed" in built.stdout
        argv = ["similar", "p5.jpg", "--stored", "--embeddings", str(src), "--index", uri]
        found = tsctl(None, "--json", *argv, "-k", "3")
        assert found.returncode == 0, found.stderr
        hits = json.loads(found.stdout)["p5.jpg"]
        want = ExactSearch(src).nearest(ExactSearch(src).stored(["p5.jpg"]), 3, exclude=["p5.jpg"])[
            0
        ]
        assert [h["path"] for h in hits] == [p for p, _ in want]
        assert [h["score"] for h in hits] == pytest.approx([s for _, s in want], abs=1e-5)
        other = tsctl(None, *argv, "--collection", "other")
        assert other.returncode != 0
        assert "no collection other" in other.stderr and "--exact" in other.stderr
    # a search machine without the Parquet: the collection by name
    alone = tsctl(None, "--json", "duplicates", "--index", milvus, "--collection", "photos")
    assert alone.returncode == 0, alone.stderr
    found = json.loads(alone.stdout)
    assert (found["groups"], found["complete"]) == (ExactSearch(src).duplicates(0.97).groups, True)
    assert [g["paths"] for g in found["groups"]] == [["p3.jpg", "p99.jpg"]]
    # a threshold every pair reaches stops at the pair cap, as exact search and FAISS do
    low = ["--threshold", "0.3", "--max-pairs", "5"]
    capped = tsctl(None, "--json", "duplicates", "--index", milvus, "--collection", "photos", *low)
    assert capped.returncode == 0, capped.stderr
    assert (json.loads(capped.stdout)["pairs"], json.loads(capped.stdout)["complete"]) == (5, False)


@pytest.fixture
def s3(monkeypatch):
    """A local S3 (moto's server on a free loopback port), reached as the collection job's
    pods reach theirs (AWS_ENDPOINT_URL and credentials in the environment); a boto3 client."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    for key, value in {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}")
        client.create_bucket(Bucket="photos")
        yield client
    finally:
        server.stop()


def test_the_shards_an_indexed_job_uploaded_are_indexed_from_s3_and_checked_there(
    tmp_path, milvus, s3
):
    """``tsctl index build s3://BUCKET/PREFIX/ --out URI`` (kserve/milvus/index-job.yaml): the
    shards fetched, the manifest naming the objects; a shard replaced in the bucket makes the
    collection stale wherever it is searched, and the next build fetches it again."""
    matrix = vectors(60, 5)
    names = [f"p{i}.jpg" for i in range(60)]
    for n in range(2):
        write(tmp_path / f"shard-{n}.parquet", names[n::2], matrix[n::2])
        s3.upload_file(str(tmp_path / f"shard-{n}.parquet"), "photos", f"emb/shard-{n}.parquet")
    argv = ["index", "build", "s3://photos/emb/", "--out", milvus, "--collection", "shards"]
    built = tsctl(None, *argv, "--work-dir", str(tmp_path / "work"), "--no-progress")
    assert built.returncode == 0, built.stderr
    assert "shards at http" in built.stdout and "60 vectors (FLAT), 60 added" in built.stdout
    opened = milvusindex.open_index(milvus, "shards")
    assert [s["path"] for s in opened.manifest["sources"]] == [
        "s3://photos/emb/shard-0.parquet",
        "s3://photos/emb/shard-1.parquet",
    ]
    assert opened.nearest(matrix[7:8], 1)[0][0][0] == "p7.jpg"
    write(tmp_path / "shard-1.parquet", names[1::2][:-1], matrix[1::2][:-1])  # p59 gone
    s3.upload_file(str(tmp_path / "shard-1.parquet"), "photos", "emb/shard-1.parquet")
    with pytest.raises(index.StaleIndex, match=r"older than s3://photos/emb/shard-1\.parquet"):
        milvusindex.open_index(milvus, "shards")
    again = milvusindex.build(["s3://photos/emb/"], milvus, "shards", False, tmp_path / "work")
    assert (again.added, again.removed, again.count) == (0, 1, 59)
    opened = milvusindex.open_index(milvus, "shards")
    assert "p59.jpg" not in {p for p, _ in opened.nearest(matrix[59:60], 5)[0]}


def test_the_folder_index_of_s3_shards_needs_its_fetched_copies_for_duplicates(tmp_path, s3):
    """The folder index from ``s3://``: searched wherever the bucket answers; its duplicates
    read the fetched copies, and a work folder emptied since is named, not a crash."""
    matrix = vectors(40, 6)
    matrix[30] = matrix[3] * 1.001
    write(tmp_path / "e.parquet", [f"p{i}.jpg" for i in range(40)], matrix)
    s3.upload_file(str(tmp_path / "e.parquet"), "photos", "emb/e.parquet")
    work = tmp_path / "work"
    index.build(["s3://photos/emb/"], tmp_path / "v", progress=False, work_dir=work)
    opened = index.open_index(tmp_path / "v")
    assert opened.manifest["sources"][0]["path"] == "s3://photos/emb/e.parquet"
    assert search.group(opened.pairs(0.97)).groups[0]["paths"] == ["p3.jpg", "p30.jpg"]
    shutil.rmtree(work)
    with pytest.raises(index.StaleIndex, match=r"copy of s3://photos/emb/e\.parquet .* is not at"):
        list(index.open_index(tmp_path / "v").pairs(0.97))


# ------------------------------------------------------------------ authentication

TOKEN = "root:correct horse 42"  # what the Secret milvus-auth's key token holds: user:password


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A Milvus Lite server with authentication on (devtools/milvus.py: each call's
    authorization header checked as Milvus Standalone checks it, refused with its words);
    its URI. Milvus Lite itself has no authentication."""
    with milvus_lite(tmp_path_factory.mktemp("secured"), token=TOKEN) as server:
        yield server.uri


def test_tsctl_sends_the_token_from_a_file_or_the_environment_and_names_a_refusal(
    tmp_path, secured, monkeypatch
):
    """The index Job's way (a file, as the Secret mounts it, newline and all) and a search
    pod's (``$MILVUS_TOKEN``); without the token or with a wrong one, exit 4 with the reason
    and what to do, no traceback (``--json``: the error object); the token is in no output,
    the wrong one neither."""
    monkeypatch.delenv("MILVUS_TOKEN", raising=False)
    matrix = vectors(40, 7)
    matrix[30] = matrix[3] * 1.001
    src = write(tmp_path / "photos.parquet", [f"p{i}.jpg" for i in range(40)], matrix)
    (tmp_path / "token").write_text(TOKEN + "\n")
    (tmp_path / "wrong").write_text("root:not-the-password")
    build = ["index", "build", str(src), "--out", secured, "--no-progress"]
    built = tsctl(None, *build, "--milvus-token-file", str(tmp_path / "token"))
    assert built.returncode == 0, built.stderr
    assert f"photos at {secured}: 40 vectors (FLAT), 40 added, 0 removed" in built.stdout
    search = ["duplicates", "--index", secured, "--collection", "photos"]
    runs = [built]
    for argv, reason in [
        (["--json", *search], "needs a token (authentication is on): missing authorization"),
        (
            [*search, "--milvus-token-file", str(tmp_path / "wrong")],
            "refused the token: auth check failure, please check username and password",
        ),
    ]:
        refused = tsctl(None, *argv)
        runs.append(refused)
        assert refused.returncode == 4, refused.stderr
        assert f"Milvus at {secured} {reason}" in refused.stderr + refused.stdout
        assert "--milvus-token-file PATH, or set $MILVUS_TOKEN" in refused.stderr
        assert "Traceback" not in refused.stderr and "not-the-password" not in refused.stderr
    monkeypatch.setenv("MILVUS_TOKEN", TOKEN)
    similar = ["similar", "p3.jpg", "--stored", "--index", secured, "--collection", "photos"]
    near = tsctl(None, "--json", *similar, "-k", "1")
    assert near.returncode == 0, near.stderr
    assert [h["path"] for h in json.loads(near.stdout)["p3.jpg"]] == ["p30.jpg"]
    for run in [*runs, near]:
        assert "correct horse" not in run.stdout + run.stderr


def test_the_library_takes_the_token_as_an_argument(tmp_path, secured):
    src = write(tmp_path / "e.parquet", ["a.jpg", "b.jpg"], vectors(2, 8))
    assert milvusindex.build([src], secured, "lib", progress=False, token=TOKEN).count == 2
    assert milvusindex.open_index(secured, "lib", token=TOKEN).manifest["count"] == 2
    with pytest.raises(MilvusTokenError, match="needs a token") as refused:
        milvusindex.open_index(secured, "lib")
    assert refused.value.exit_code == 4


def _token(*argv):
    return milvus_token(parser().parse_args(["duplicates", "--index", "http://m:19530", *argv]))


def test_the_token_file_is_read_bounded_and_never_quoted(tmp_path, monkeypatch):
    monkeypatch.delenv("MILVUS_TOKEN", raising=False)
    assert _token() is None  # a Milvus without authentication
    monkeypatch.setenv("MILVUS_TOKEN", "reader:from-env")
    assert _token() == "reader:from-env"
    (tmp_path / "token").write_text("\n indexer:from-file \r\n")
    assert _token("--milvus-token-file", str(tmp_path / "token")) == "indexer:from-file"
    (tmp_path / "empty").write_text(" \n")
    (tmp_path / "big").write_bytes(b"x" * (TOKEN_BYTES + 1))
    for argv, message in [
        (["--milvus-token-file", str(tmp_path / "empty")], "empty holds nothing, not a Milvus"),
        (["--milvus-token-file", str(tmp_path / "big")], f"more than {TOKEN_BYTES} bytes"),
        (["--milvus-token-file", str(tmp_path)], f"{tmp_path} is not a file"),
        # the token itself given where its file belongs: refused without repeating it
        (["--milvus-token", "root:hunter22"], "--milvus-token-file: the path given is not a file"),
    ]:
        with pytest.raises(MilvusTokenError, match=message) as refused:
            _token(*argv)
        assert "hunter22" not in str(refused.value) and refused.value.exit_code == 4


def test_no_option_takes_the_token_itself():
    """argv is every local user's to read (/proc/PID/cmdline): the commands that open a Milvus
    URI name a file or a variable for their secrets, never the secret."""
    commands = parser()._subparsers._group_actions[0].choices
    for name in ("index", "similar", "duplicates"):
        secret = {
            option
            for action in commands[name]._actions
            for option in action.option_strings
            if re.search("token|password|secret|key", option) and action.dest != "key_file"
        }
        assert secret <= {"--milvus-token-file", "--token-env"}, (name, secret)
        assert "--milvus-token-file" in secret
