"""``handler.precision: auto`` in a real TorchServe: describe reports a measured choice, every
worker of a model serves the one the first worker measured, ``tsctl describe`` shows it in one
line, and the worker log carries a line an operator can grep."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.conftest import REPO
from tests.served import tsctl

pytestmark = pytest.mark.integration
MODEL = "resnet50-tagger"
BATCH_SIZE = yaml.safe_load((REPO / "config" / "models" / f"{MODEL}.yaml").read_text())["batchSize"]
# TorchServe prefixes each worker's output with the worker's thread name, W-<port>-<model>_<v>.
LOG_LINE = re.compile(rf"(W-\d+-{MODEL}_[\d.]+)-std\w+ MODEL_LOG - .*precision_choice (.*)$")


@pytest.fixture(scope="module")
def server(torchserve):
    """The session's TorchServe (both archives, the shipped settings): what this module scales
    it puts back in a ``finally``."""
    return torchserve


def choice_of(ts) -> dict:
    return ts.client().describe(MODEL, customized=True)[0]["customizedMetadata"]


def logged_choices(ts) -> dict[str, set[str]]:
    """Worker -> the precision_choice lines it logged."""
    lines = (ts.workdir / "logs" / "model_log.log").read_text().splitlines()
    found: dict[str, set[str]] = {}
    for match in filter(None, map(LOG_LINE.search, lines)):
        found.setdefault(match.group(1), set()).add(match.group(2))
    return found


def test_describe_reports_a_measured_choice(server):
    meta = choice_of(server)
    choice = meta["precision_choice"]
    assert choice["requested"] == "auto" and choice["measured"] is True
    assert choice["choice"] == meta["precision"]
    served = next(c for c in choice["candidates"] if c["precision"] == choice["choice"])
    assert set(served["ms_per_batch"]) == {"1", str(BATCH_SIZE)}
    assert all(ms > 0 for ms in served["ms_per_batch"].values())
    # Measured by a worker of this host: this one, or an earlier one whose choice it serves
    # from the host's store (servecore.autoprecision).
    assert choice["source"].startswith(("worker pid ", "stored on this host at "))
    assert "worker pid " in choice["source"]


def test_every_worker_of_a_model_serves_one_choice(server):
    client = server.client()
    first = choice_of(server)["precision_choice"]
    try:
        client.scale(MODEL, 2)
        workers = client.describe(MODEL)[0]["workers"]
        assert len(workers) == 2 and {w["status"] for w in workers} == {"READY"}
        logged = logged_choices(server)
        assert len(logged) >= 2, logged
        # One line, word for word (who measured, the timings), from every worker.
        assert {line for lines in logged.values() for line in lines} == {first["summary"]}
        # Whichever worker answers describe, the same choice.
        assert {choice_of(server)["precision_choice"]["summary"] for _ in range(4)} == {
            first["summary"]
        }
    finally:
        client.scale(MODEL, 1)


def test_tsctl_describe_shows_the_choice_in_one_line(server):
    run = tsctl(server, "describe", MODEL)
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stdout.splitlines() if line.strip().startswith("precision ")]
    assert lines == [f"  precision {choice_of(server)['precision_choice']['summary']}"]
