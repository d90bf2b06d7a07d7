"""tsctl (the installed console script) against the session's real TorchServe: every read-only
command, tag/embed of many files at once, refused registrations and the metrics summary.
Commands that change keys or models run on their own server (tests/test_ops.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
import yaml

from buildsteps.configgen import bulk_lanes
from serveclient import errors
from serveclient.vectors import read_matrix
from tests import imagegen
from tests.conftest import REPO, SERVED
from tests.reference import rel_error
from tests.served import marker_model, settled, tsctl

pytestmark = pytest.mark.integration


def _yaml(model: str) -> dict:
    """The YAML of ``model``, or of the model a bulk lane registers again."""
    model = bulk_lanes().get(model, model)
    return yaml.safe_load((REPO / "config" / "models" / f"{model}.yaml").read_text())


def test_list_describe_and_health(torchserve):
    listed = tsctl(torchserve, "--json", "list")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert sorted(r["model"] for r in rows) == list(SERVED)
    for row in rows:
        assert row["default"] and row["version"] == "1.0"
        assert row["batchSize"] == _yaml(row["model"])["batchSize"]
    human = tsctl(torchserve, "list").stdout
    assert human.splitlines()[0].split() == [
        "model",
        "version",
        "default",
        "workers",
        "batch",
        "delay",
        "ms",
    ]
    described = tsctl(torchserve, "--json", "describe", "resnet50-tagger")
    assert described.returncode == 0, described.stderr
    meta = json.loads(described.stdout)[0]["customizedMetadata"]
    assert meta["handler"]["top_k"] == _yaml("resnet50-tagger")["handler"]["top_k"]
    assert "weights" in tsctl(torchserve, "describe", "resnet50-tagger", "1.0").stdout
    health = tsctl(torchserve, "health")
    assert health.returncode == 0, health.stderr
    assert "server: Healthy" in health.stdout and "resnet50-tagger/1.0: 1 READY" in health.stdout


def test_unknown_model_exits_5_with_a_hint(torchserve):
    for argv in (
        ["describe", "no-such-model"],
        ["scale", "no-such-model", "--min", "1"],
        ["describe", "resnet50-tagger", "9.9"],
    ):
        result = tsctl(torchserve, *argv)
        assert result.returncode == 5, (argv, result.stderr)
        assert "hint: `tsctl list`" in result.stderr


def test_tag_and_embed_many_files_at_once(torchserve, tmp_path):
    images = []
    for i in range(6):
        path = tmp_path / f"img{i}.jpg"
        path.write_bytes(imagegen.jpeg(400, 300, seed=200 + i))
        images.append(str(path))
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not an image")

    tagged = tsctl(
        torchserve, "--json", "tag", *images, str(broken), "--topk", "3", "--concurrency", "4"
    )
    assert tagged.returncode == 7, tagged.stderr  # some files failed
    answers = json.loads(tagged.stdout)
    assert list(answers) == [*images, str(broken)]
    assert all(len(answers[p]) == 3 for p in images)
    assert "InvalidImage" in answers[str(broken)]["error"]

    out = tmp_path / "emb.parquet"
    embedded = tsctl(torchserve, "embed", *images, "--out", str(out))
    assert embedded.returncode == 0, embedded.stderr
    summary = f"wrote {out}: 6 rows (6 done, 0 failed, 0 already done, 0 dropped as no longer"
    assert summary in embedded.stdout
    paths, matrix = read_matrix(out)
    client = torchserve.client()
    for row, path in zip(matrix, paths):
        single = client.predict("resnet50-embedding", Path(path).read_bytes())["embedding"]
        assert rel_error(row.tolist(), single) <= 1e-4
    assert sorted(paths) == sorted(images)


def test_json_is_accepted_after_the_command_too(torchserve):
    for argv in (["list", "--json"], ["--json", "list"], ["describe", "resnet50-tagger", "--json"]):
        result = tsctl(torchserve, *argv)
        assert result.returncode == 0, (argv, result.stderr)
        assert isinstance(json.loads(result.stdout), list)
    error = tsctl(torchserve, "describe", "no-such-model", "--json")
    assert error.returncode == 5 and json.loads(error.stdout)["hint"]


def test_registration_is_off_and_a_path_registration_runs_no_code(torchserve, tmp_path):
    """The shipped config (enable_model_api=false): registering and unregistering answer 405,
    so a management key cannot load a folder from the server's disk (TorchServe 0.12 would
    run its handler, tests/test_ops.py shows it); listing and scaling still work."""
    marker = tmp_path / "marker.txt"
    folder = marker_model(tmp_path / "folder", marker)
    raw = requests.post(
        f"{torchserve.management_url}/models",
        params={"url": folder, "initial_workers": 1, "synchronous": "true"},
        headers=torchserve.keys.management_headers(),
        timeout=120,
    )
    assert raw.status_code == 405, raw.text
    for argv in (
        ["register", "resnet50-tagger.mar", "--name", "again"],
        ["unregister", "resnet50-embedding"],
    ):
        refused = tsctl(torchserve, *argv)
        assert refused.returncode == 6, (argv, refused.stderr)
        assert "make serve MODEL_API=1" in refused.stderr
    path = tsctl(torchserve, "register", folder)  # tsctl refuses paths before sending
    assert path.returncode == 2 and "copy it into the server's model store" in path.stderr
    # No worker can import the handler without a registered model, and the raw registration
    # was synchronous: TorchServe answers it only once its workers have loaded (so had it been
    # accepted, the marker would be there now; tests/test_ops.py shows it is with the API on).
    assert sorted(m["modelName"] for m in torchserve.client().list_models()) == list(SERVED)
    assert not marker.exists()
    assert tsctl(torchserve, "scale", "resnet50-tagger", "--min", "1").returncode == 0


def _handler_counts(server, model: str) -> dict:
    return json.loads(tsctl(server, "--json", "metrics").stdout)["models"].get(model, {})


def test_metrics_counts_batches_errors_and_time(torchserve):
    model = "resnet50-tagger"
    before = _handler_counts(torchserve, model)
    bodies = [imagegen.jpeg(300, 300, seed=300 + i) for i in range(3)] + [b"junk"]
    client = torchserve.client()
    for body in bodies[:-1]:
        assert len(client.predict(model, body)) == 5
    with pytest.raises(errors.ApiError) as junk:
        client.predict(model, bodies[-1])
    assert junk.value.status == 400 and junk.value.type == "InvalidImage"

    def delta(now: dict, key: str) -> int:
        return now.get(key, 0) - before.get(key, 0)

    def invalid_images(counts: dict) -> int:
        return counts.get("errors", {}).get("InvalidImage", 0)

    # The batch counts, images and errors are written at different points of a batch.
    after = settled(
        lambda: _handler_counts(torchserve, model),
        lambda now: (
            delta(now, "requests_in_batches") >= 4
            and delta(now, "images") >= 3
            and invalid_images(now) - invalid_images(before) >= 1
        ),
    )
    assert delta(after, "requests_in_batches") == 4
    assert delta(after, "images") == 3
    assert invalid_images(after) - invalid_images(before) == 1
    assert sum(after["batch_sizes"].values()) == after["batches"]
    assert after["mean_batch_size"] >= 1 and after["decode_ms_per_image"] > 0
    assert after["forward_ms_per_batch"] > 0 and after["mean_latency_ms"] > 0
    text = requests.get(f"{torchserve.metrics_url}/metrics", timeout=30).text
    assert (
        'resnet50_batches_by_size_total{model="resnet50-tagger",engine="torchserve",batch_size="'
    ) in text
    human = tsctl(torchserve, "metrics")
    assert human.returncode == 0 and "mean batch size" in human.stdout
    statuses = json.loads(tsctl(torchserve, "--json", "metrics").stdout)["statuses"]
    assert statuses["2XX"] >= 3 and statuses["4XX"] >= 1
