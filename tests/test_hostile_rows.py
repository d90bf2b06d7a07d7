"""Hostile requests, round two (issue #16), against the handler without a server: rows are
budgeted before decoding and run in bounded chunks, nothing a client sends is echoed without
bound, an answer too large for the frontend fails alone, explanation memory stays under the
configured ceiling, and decode threads follow the CPU quota."""
from __future__ import annotations

import json
import time

import pytest
from PIL import Image

from handlers import intake, parse
from handlers.config import HandlerConfig
from handlers.errors import MESSAGE_CHARS, PayloadTooLarge
from tests import imagegen
from tests.corpus import b64
from tests.handler_context import make_handler, run_batch
from tests.reference import assert_same_tags

GOOD = imagegen.png(300, 240, seed=5)
TINY = imagegen.encode(Image.new("RGB", (8, 8), (30, 200, 30)), "PNG")
CONFIG = HandlerConfig()


@pytest.fixture(scope="module")
def tagger(weights_dir):
    return make_handler(weights_dir, task="tags")


@pytest.fixture(scope="module")
def alone(tagger):
    handler, context = tagger
    (answer,), _, _ = run_batch(handler, context, [{"body": GOOD}])
    return json.loads(answer)


def v2(count: int, image: bytes = TINY, **tensor) -> dict:
    return {"body": {"inputs": [{"name": "images", "shape": [count], "datatype": "BYTES",
                                 "data": [b64(image)] * count, **tensor}]}}


def test_rows_are_budgeted_per_batch_fewest_first(tagger, alone):
    """Nine requests of 8 one-colour images cannot share the batch's 64 rows with a photo:
    the photo and seven of them run, the other two get 503 with Retry-After, undecoded."""
    handler, context = tagger
    rows = [v2(8)] * 4 + [{"body": GOOD}] + [v2(8)] * 5
    responses, statuses, prepared = run_batch(handler, context, rows)
    assert sorted(s[0] for s in statuses) == [200] * 8 + [503] * 2
    assert statuses[4] == (200, None)
    assert_same_tags(json.loads(responses[4]), alone)
    refused = [json.loads(r) for r, s in zip(responses, statuses) if s[0] == 503]
    assert all(r["type"] == "Overloaded" and "handler.max_batch_images" in r["message"]
               for r in refused)
    assert len(prepared.pixels) == 57  # the photo and seven requests of 8, nothing else


def test_forward_runs_in_chunks_with_the_same_answers(weights_dir, alone):
    handler, context = make_handler(weights_dir, task="tags", forward_rows=2)
    calls = []
    backend = handler.backend

    def counting(batch):
        calls.append(len(batch))
        return backend(batch)

    handler.backend = counting
    responses, statuses, _ = run_batch(handler, context, [{"body": GOOD}] * 5)
    assert calls == [2, 2, 1]
    assert statuses == [(200, None)] * 5
    for response in responses:
        assert_same_tags(json.loads(response), alone)


def test_an_answer_over_the_response_limit_is_a_413_alone(weights_dir, alone):
    """Embeddings of 4 images (~170 KB of JSON) do not fit a 64 KB answer; the tags of the
    photo beside them do."""
    handler, context = make_handler(weights_dir, task="tags", max_response_bytes=65536)
    big = v2(4, GOOD, parameters={})
    big["body"]["outputs"] = [{"name": "embedding"}]
    responses, statuses, _ = run_batch(handler, context, [big, {"body": GOOD}])
    assert statuses[0][0] == 413 and statuses[1] == (200, None)
    error = json.loads(responses[0])
    assert error["type"] == "PayloadTooLarge" and "handler.max_response_bytes" in error["message"]
    assert len(responses[0]) < 1000
    assert_same_tags(json.loads(responses[1]), alone)


@pytest.mark.parametrize("row", [
    pytest.param(v2(1, name="n" * 1_000_000, shape=[2]), id="v2-name-1MB-bad-shape"),
    pytest.param({"data": GOOD, "topk": b"7" * 1_100_000}, id="topk-1.1MB"),
    pytest.param({"body": {"inputs": [{"name": "x" * 1_000_000, "datatype": "FP32",
                                       "shape": [1], "data": [1]}]}}, id="v2-datatype"),
    pytest.param({"body": {"data": b64(GOOD), "k" * 1_000_000: 1}}, id="json-field"),
    pytest.param({"body": GOOD, **{f"f{i}" * 1000: b"1" for i in range(50)}}, id="form-fields"),
    pytest.param({"body": {"inputs": [{"name": "images", "datatype": "BYTES",
                                       "shape": list(range(200_000)), "data": [b64(TINY)]}]}},
                 id="v2-shape"),
    pytest.param({"body": {"x" * 1_000_000: 1}}, id="json-keys"),
    pytest.param({"body": {"inputs": [{"name": "images", "datatype": "BYTES", "shape": [1],
                                       "data": [b64(TINY)]}],
                           "outputs": [{"name": "z" * 1_000_000}]}}, id="v2-output-name"),
])
def test_client_values_are_echoed_short(tagger, row):
    handler, context = tagger
    responses, statuses, _ = run_batch(handler, context, [row, {"body": GOOD}])
    assert 400 <= statuses[0][0] < 500 and statuses[1] == (200, None)
    assert len(responses[0]) < 1000, responses[0][:300]


def test_no_message_grows_with_the_request():
    assert len(PayloadTooLarge("x" * 10**6).message) < MESSAGE_CHARS + 100


def test_a_v2_id_is_capped():
    ok = {"body": {"id": "i" * 256, "inputs": [{"name": "a", "datatype": "BYTES",
                                                 "shape": [1], "data": [b64(TINY)]}]}}
    assert parse.parse_request(ok, config=CONFIG).request_id == "i" * 256
    ok["body"]["id"] = "i" * 257
    with pytest.raises(Exception) as caught:
        parse.parse_request(ok, config=CONFIG)
    assert caught.value.status == 400 and "more than 256" in caught.value.message


@pytest.mark.parametrize("body", [
    {"inputs": [{"name": "n" * 1000, "datatype": "BYTES", "shape": [200_000],
                 "data": ["!not base64!"] * 200_000}]},
    {"instances": [{"data": "!not base64!"}] * 200_000},
])
def test_the_image_count_is_checked_before_any_item_is_read(body):
    """Far too many items (each one bad) fail on the count, at once, not on the first item."""
    started = time.perf_counter()
    with pytest.raises(Exception) as caught:
        parse.parse_request({"body": body}, config=CONFIG)
    assert caught.value.status == 413 and "request carries 200000 images" in caught.value.message
    assert time.perf_counter() - started < 1.0


def test_explanation_rows_per_pass_only_go_down(tagger):
    """``internal_batch_size`` bounds autograd's memory: a client may lower it, not raise it."""
    handler, context = tagger
    ceiling = handler.config.explain.internal_batch_size
    lower = {"body": GOOD, "internal_batch_size": b"2", "method": b"ig", "n_steps": b"2"}
    higher = {"body": GOOD, "internal_batch_size": str(ceiling + 1).encode()}
    context_headers = [{"explain": "True"}, {"explain": "True"}]
    responses, statuses, _ = run_batch(handler, context, [lower, higher], context_headers)
    assert statuses[0] == (200, None)
    assert statuses[1][0] == 400
    assert f"internal_batch_size must be an integer from 1 to {ceiling}" in json.loads(
        responses[1])["message"]


@pytest.mark.parametrize("files, expected", [
    ({"cpu.max": "150000 100000\n"}, 2),
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({}, None),
])
def test_decode_threads_follow_the_cpu_quota(tmp_path, files, expected):
    """A pod's CPU limit (cgroup v2 or v1), not the node's cores, sets the usable cores."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    unlimited = intake.usable_cpus(tmp_path / "absent")
    assert intake.usable_cpus(tmp_path) == (min(expected, unlimited) if expected
                                            else unlimited)
