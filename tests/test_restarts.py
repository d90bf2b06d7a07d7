"""A worker's restarts in its slot (``servecore.restarts``), counted per server process and
exported as ``resnet50_worker_restarts``; the engines' own kills are in tests/test_faults.py."""

from __future__ import annotations

import subprocess
import sys

import psutil

from servecore.metrics import WORKER_RESTARTS, BatchMetrics
from servecore.restarts import mark_start, server_key


def test_a_slot_counts_the_starts_before_this_one_under_one_server(tmp_path):
    server = psutil.Process()
    starts = [mark_start("tagger", "/tmp/.ts.sock.9000", tmp_path, server) for _ in range(3)]
    assert starts == [0, 1, 2]
    # Another slot (a scale-up) and another model start at 0.
    assert mark_start("tagger", "/tmp/.ts.sock.9001", tmp_path, server) == 0
    assert mark_start("resnet50-embedding", "resnet50-embedding_0_0", tmp_path, server) == 0


def test_a_new_server_counts_afresh_and_an_exited_ones_marks_are_removed(tmp_path):
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    gone = psutil.Process(exited.pid)
    key = server_key(gone)
    exited.wait()
    assert mark_start("tagger", "9000", tmp_path, gone) == 0
    assert (tmp_path / key).is_dir()
    # This process as the next server: its own count, and the exited server's folder gone.
    assert mark_start("tagger", "9000", tmp_path, psutil.Process()) == 0
    assert not (tmp_path / key).exists()


def test_a_temp_folder_it_cannot_write_counts_zero_not_a_failed_load(tmp_path, caplog):
    """A writable folder counts the second start as 1; one it cannot write answers 0 for every
    start (no exception: the model still loads) and warns that restarts are not counted."""
    server = psutil.Process()
    writable = tmp_path / "writable"
    assert [mark_start("tagger", "9000", writable, server) for _ in range(2)] == [0, 1]
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with caplog.at_level("WARNING", logger="servecore.restarts"):
        assert [mark_start("tagger", "9000", blocked, server) for _ in range(2)] == [0, 0]
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and all(m.startswith("tagger: restarts not counted") for m in warned)
    assert blocked.read_text() == "not a folder"


class Sink:
    def __init__(self) -> None:
        self.added: list[tuple[str, float, tuple[str, ...]]] = []

    def add(self, metric, value, labels=()):
        self.added.append((metric.name, value, labels))

    def flush(self):
        pass


def test_restarts_are_set_when_the_worker_loads_and_with_every_batch():
    sink = Sink()
    metrics = BatchMetrics(sink, "f32", "resnet50-tagger_0_0", 2)
    assert sink.added == [(WORKER_RESTARTS.name, 2, ("resnet50-tagger_0_0",))]
    metrics.batch(requests=1, images=1, open_ms=0.1, decode_ms=0.2)
    assert (WORKER_RESTARTS.name, 2, ("resnet50-tagger_0_0",)) in sink.added[1:]
