"""What ``tsctl similar`` and ``tsctl duplicates`` refuse and where they stop, whatever
answers them (exact search, the FAISS folder index, Milvus; serveclient/cli/similar.py,
serveclient/search/exact.py): ``-k``, ``--threshold`` and ``--max-pairs`` out of range are refused
with exit code 2 before any index is opened, and a low threshold stops at the pair cap,
saying so. Milvus's own duplicates cap is in tests/test_milvus.py."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("faiss")

from serveclient import search
from serveclient.cli import main
from serveclient.search import faissindex as index
from serveclient.search.exact import ExactSearch
from tests.served import tsctl
from tests.test_index import vectors, write

ENGINES = {  # what each search would read: the Parquet, the folder index, a Milvus server
    "exact": ["--exact"],
    "faiss": ["--index", "{folder}"],
    "milvus": ["--index", "http://127.0.0.1:9", "--collection", "c"],  # nothing listens
}
BAD = {
    "-k": ["0", "-1", "nan", "1.5", "1001", "10" * 40],
    "--threshold": ["0", "-0.5", "nan", "inf", "1.01"],
    "--max-pairs": ["0", "-3", "1e3", "1000001"],
}


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    """200 photos (every pair at a cosine near 0.7) and their folder index."""
    root = tmp_path_factory.mktemp("bounds")
    src = write(root / "e.parquet", [f"p{i:03d}" for i in range(200)], vectors(200, 11))
    index.build([src], root / "v", progress=False)
    return src, root / "v"


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize(("option", "value"), [(o, v) for o, vs in BAD.items() for v in vs])
def test_out_of_range_k_threshold_and_pair_caps_are_refused(
    collection, capsys, engine, option, value
):
    src, folder = collection
    command = ["similar", "p001", "--stored"] if option == "-k" else ["duplicates"]
    where = [a.format(folder=folder) for a in ENGINES[engine]]
    with pytest.raises(SystemExit) as refused:
        main([*command, "--embeddings", str(src), *where, f"{option}={value}"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: expected " in err and value in err


def test_tsctl_exits_2_naming_the_range(collection):
    src, _ = collection
    run = tsctl(None, "similar", "p001", "--stored", "--embeddings", str(src), "-k", "0")
    assert run.returncode == 2
    assert "argument -k: expected a whole number from 1 to 1,000, not 0" in run.stderr


@pytest.mark.parametrize("engine", ["exact", "faiss"])
def test_a_low_threshold_stops_at_the_pair_cap_and_says_so(collection, capsys, engine):
    src, folder = collection
    where = [a.format(folder=folder) for a in ENGINES[engine]]
    argv = [
        "duplicates",
        "--embeddings",
        str(src),
        *where,
        "--threshold",
        "0.3",
        "--max-pairs",
        "50",
    ]
    assert main(["--json", *argv]) == 0
    found = json.loads(capsys.readouterr().out)
    assert (found["pairs"], found["complete"]) == (50, False)
    assert sum(len(g["paths"]) for g in found["groups"]) <= 51  # 50 pairs join 51 photos at most
    assert main(argv) == 0
    assert "The search stopped at 50 pairs (--max-pairs)" in capsys.readouterr().out
    # every pair of the 200 (19,900) is at 0.3: the default cap holds them all
    assert main(["--json", *argv[:-2]]) == 0
    assert json.loads(capsys.readouterr().out)["pairs"] == 19_900


def test_the_pair_search_stops_drawing_at_the_cap(collection):
    """``group`` ends the search past ``most``: an index's pairs are not all found first."""
    src, folder = collection
    drawn = []

    def counted(pairs):
        for pair in pairs:
            drawn.append(pair)
            yield pair

    found = search.group(counted(index.open_index(folder).pairs(0.3)), 100)
    assert (found.pairs, found.complete, len(drawn)) == (100, False, 101)
    assert ExactSearch(src).duplicates(0.3, 100).pairs == 100


def test_the_old_spellings_are_read_for_a_release_with_a_warning(collection, capsys):
    """``--index PARQUET`` and ``--vindex INDEX`` of the release before mean ``--embeddings``
    and ``--index``: the same answers, and a warning on stderr naming what was read as what."""
    src, folder = collection
    tail = ["--threshold", "0.3", "--max-pairs", "50"]
    assert (
        main(["--json", "duplicates", "--embeddings", str(src), "--index", str(folder), *tail]) == 0
    )
    new = capsys.readouterr()
    assert new.err == ""
    assert main(["--json", "duplicates", "--index", str(src), "--vindex", str(folder), *tail]) == 0
    old = capsys.readouterr()
    assert old.out == new.out
    assert (
        f"tsctl duplicates: warning: --index {src} names a file, not an index: read as "
        f"--embeddings {src} (--embeddings names the Parquet, --index a vector index;" in old.err
    )
    assert f"warning: --vindex is now --index: read as --index {folder}" in old.err
    # --vindex goes where --index goes: here a Milvus nobody listens at
    argv = ["similar", "p001", "--stored", "--vindex", "http://127.0.0.1:9", "--collection", "c"]
    assert main(argv) != 0
    assert "no Milvus at http://127.0.0.1:9" in capsys.readouterr().err


def test_an_index_folder_without_an_index_and_no_embeddings_is_named(tmp_path, capsys):
    assert main(["similar", "p001", "--stored", "--index", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"tsctl similar: error: no index in {tmp_path}" in err
    assert (
        "hint: name the embed output (Parquet) with --embeddings, or `tsctl index build` it" in err
    )
