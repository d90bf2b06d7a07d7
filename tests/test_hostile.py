"""Hostile requests against the handler, without a server (issues #8 and #16): none may fail
or stall another request. Deep JSON and pixel floods are refused from headers and bytes, before
any decoding; the batch's decoding work and rows are bounded and run in bounded chunks; an
unexpected failure is one request's 500; nothing a client sends is echoed without bound; an
answer too large for the frontend fails alone; explanation memory stays under the configured
ceiling; decode threads follow the CPU quota."""

from __future__ import annotations

import dataclasses
import gc
import json
import re

import pytest
from PIL import Image

from handlers import routing
from servecore import host
from servecore.admission import admit
from servecore.config import HandlerConfig
from servecore.edges import http as httpedge
from servecore.edges.bodies import status_of
from servecore.errors import MESSAGE_CHARS, InvalidRequest, PayloadTooLarge
from servecore.images import open_image
from tests import corpus, imagegen
from tests.corpus import b64
from tests.handler_context import make_handler, run_batch
from tests.reference import assert_same_tags

GOOD = imagegen.png(300, 240, seed=5)
TINY = imagegen.encode(Image.new("RGB", (8, 8), (30, 200, 30)), "PNG")
FULL = imagegen.jpeg(400, 300, seed=70)
CUT = FULL[: len(FULL) // 3]  # its header reads; decoding it fails
HOSTILE = corpus.hostile_inputs()
CONFIG = HandlerConfig()


def parse_row(row: dict):
    """A TorchServe row through its adapter into the core's parser."""
    return httpedge.parse_http(routing.http_request(row), config=CONFIG)


@pytest.fixture(scope="module")
def tagger(weights_dir):
    return make_handler(weights_dir, task="tags")


@pytest.fixture(scope="module")
def alone(tagger):
    handler, context = tagger
    (answer,), _, _ = run_batch(handler, context, [{"body": GOOD}])
    return json.loads(answer)


class DecodeCounter:
    """Wraps the handler's decode step to count the images it really decodes."""

    def __init__(self, handler):
        self.calls = 0
        self.decode = handler.model.intake.preprocessor.decode

    def __call__(self, opened, out=None):
        self.calls += 1
        return self.decode(opened, out)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_request_is_refused_alone_without_decoding(tagger, alone, name, monkeypatch):
    handler, context = tagger
    case = HOSTILE[name]
    counter = DecodeCounter(handler)
    monkeypatch.setattr(handler.model.intake.preprocessor, "decode", counter)
    rows = [{"body": GOOD}, corpus.handler_row(case), {"body": GOOD}]
    responses, statuses, _ = run_batch(handler, context, rows)
    error = json.loads(responses[1])
    assert statuses[1][0] == case.status and error["type"] == case.kind, error
    assert case.message in error["message"], error
    assert statuses[0] == statuses[2] == (200, None)
    for i in (0, 2):
        assert_same_tags(json.loads(responses[i]), alone)
    assert counter.calls == 2  # the two good images; nothing of the hostile one


def test_already_parsed_json_is_held_to_the_same_depth(tagger):
    """TorchServe parses application/json bodies up to Python's recursion limit itself; what
    reaches the handler parsed is checked too."""
    handler, context = tagger
    nested: list = []
    for _ in range(20):
        nested = [nested]
    responses, statuses, _ = run_batch(handler, context, [{"body": {"data": nested}}])
    assert statuses[0][0] == 400
    assert "nested more than 16 levels deep" in json.loads(responses[0])["message"]


def test_json_body_size_limit_names_the_setting(weights_dir):
    handler, context = make_handler(weights_dir, max_json_bytes=1000)
    body = json.dumps({"data": "A" * 2000}).encode()
    responses, statuses, _ = run_batch(handler, context, [{"body": body}])
    assert statuses[0][0] == 413
    assert (
        "more than the limit of 1000 (handler.max_json_bytes)"
        in json.loads(responses[0])["message"]
    )


@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "GIF", "TIFF", "BMP"])
def test_decoding_cost_is_read_from_the_header(fmt):
    """Formats whose header is cheap and body expensive are costed at their full size."""
    data = imagegen.encode(Image.new("RGB", (3000, 2000), (9, 9, 9)), fmt)
    opened = open_image(data, max_pixels=40_000_000, max_bytes=1 << 30, draft_size=232)
    assert opened.pixels == 3000 * 2000


def test_jpeg_is_costed_at_its_draft_size():
    data = imagegen.encode(Image.new("RGB", (4000, 3000), (9, 9, 9)), "JPEG")
    opened = open_image(data, max_pixels=40_000_000, max_bytes=1 << 30, draft_size=232)
    assert opened.pixels == 500 * 375  # 1/8 in the DCT keeps the shorter side >= 232
    assert open_image(data, max_pixels=40_000_000, max_bytes=1 << 30).pixels == 12_000_000


def test_batch_budget_admits_cheap_requests_first(weights_dir, alone):
    """Three requests of 1 MP each cannot share a 1 MP batch budget with the cheap ones: they
    get 503 with Retry-After, the cheap ones their normal answer, whatever the order."""
    handler, context = make_handler(
        weights_dir, max_batch_pixels=1_000_000, max_request_pixels=1_000_000
    )
    heavy = imagegen.encode(Image.new("RGB", (1000, 1000), (200, 10, 10)), "PNG")
    rows = [{"body": heavy}, {"body": GOOD}, {"body": heavy}, {"body": GOOD}, {"body": heavy}]
    responses, statuses, _ = run_batch(handler, context, rows)
    assert [s[0] for s in statuses] == [503, 200, 503, 200, 503]
    refused = json.loads(responses[0])
    assert refused["type"] == "Overloaded" and "handler.max_batch_pixels" in refused["message"]
    assert context.get_response_headers(0)["Retry-After"] == "1"
    assert_same_tags(json.loads(responses[1]), alone)
    # Alone, the same heavy request fits.
    _, statuses, _ = run_batch(handler, context, [{"body": heavy}])
    assert statuses == [(200, None)]


@pytest.mark.parametrize(
    ("costs", "budget", "expected"),
    [
        ([5, 1, 1], 3, [False, True, True]),
        ([5], 3, [True]),  # a lone request always fits
        ([2, 2, 2], 4, [True, True, False]),
        ([], 10, []),
        ([0, 10, 0], 9, [True, True, True]),  # the first costly one is the cheapest left
    ],
)
def test_admission_rule(costs, budget, expected):
    assert admit(costs, budget) == expected


def test_unexpected_failure_is_a_500_for_that_request_only(tagger, alone, monkeypatch, caplog):
    handler, context = tagger
    decode = handler.model.intake.preprocessor.decode

    def broken(opened, out=None):
        if opened.image.size == (64, 48):
            raise RuntimeError("simulated bug")
        return decode(opened, out)

    monkeypatch.setattr(handler.model.intake.preprocessor, "decode", broken)
    odd = imagegen.png(64, 48, seed=1)
    with caplog.at_level("ERROR"):
        responses, statuses, _ = run_batch(handler, context, [{"body": GOOD}, {"body": odd}])
    assert statuses[0] == (200, None) and statuses[1][0] == 500
    error = json.loads(responses[1])
    assert error == {
        "code": 500,
        "type": "InternalError",
        "message": "unexpected error while decoding this request (RuntimeError); request id req-1",
    }
    assert any(
        "request req-1: unexpected RuntimeError while decoding" in r.getMessage()
        for r in caplog.records
    )
    assert_same_tags(json.loads(responses[0]), alone)


def test_unexpected_parse_failure_is_a_500_for_that_request_only(tagger, monkeypatch):
    handler, context = tagger
    real = httpedge.parse_http

    def broken(request, config):
        if "topk" in request.form:
            raise KeyError("simulated bug")
        return real(request, config)

    monkeypatch.setattr(httpedge, "parse_http", broken)
    responses, statuses, _ = run_batch(
        handler, context, [{"data": GOOD, "topk": b"3"}, {"body": GOOD}]
    )
    assert statuses[0][0] == 500 and json.loads(responses[0])["type"] == "InternalError"
    assert statuses[1] == (200, None)


def test_failed_requests_leave_no_reference_cycles(tagger):
    """A kept error must not hold the frames it came through: they hold the batch, and a cycle
    through the slot kept every failed request's batch (images, tensors, a 1 MB name) alive
    until a full garbage collection; under bad inputs the worker's RSS rose for minutes (#16).
    With no cycle, a batch's memory is freed when its answers are written."""
    handler, context = tagger
    rows = [
        {"body": b"not an image" * 100},  # decoded alone
        {
            "body": {
                "inputs": [
                    {"name": "n" * 100_000, "datatype": "BYTES", "shape": [2], "data": [b64(TINY)]}
                ]
            }
        },  # refused while parsing
        v2(2, data=[b64(GOOD), b64(b"broken")]),  # two images, the second's header refused
        v2(2, data=[b64(CUT), b64(CUT)]),  # both fail in decode pool tasks; one is never read
        {"data": GOOD, "method": b"nope"},  # an explanation refused
        {"body": GOOD},
    ]
    headers = [{}, {}, {}, {}, {"explain": "True"}, {}]
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        statuses = run_batch(handler, context, rows, headers)[1]  # the batch dropped
        gc.collect()
        garbage = sorted({type(o).__name__ for o in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert [s for s, _ in statuses] == [400, 400, 400, 400, 400, 200]
    assert garbage == []


def test_a_batch_takes_a_pool_task_per_thread_and_a_corrupt_image_fails_alone(tagger, monkeypatch):
    """Issue #49: the batch's images are dealt out to one decode task per thread, not one
    each; a JPEG whose header reads but whose data is cut off fails its own request, and the
    task it opened decodes its other two images (with two threads: the cut one, the largest,
    first in its task, then 240x180 and 160x120); every other image gets its tags alone."""
    handler, context = tagger
    photos = [imagegen.jpeg(160 + 40 * i, 120 + 30 * i, seed=60 + i) for i in range(5)]
    rows = [{"body": photo} for photo in photos[:2]] + [{"body": CUT}]
    rows += [{"body": photo} for photo in photos[2:]]
    intake = handler.model.intake
    tasks = []
    submit = intake.pool.submit
    monkeypatch.setattr(intake, "threads", 2)  # the shares this docstring names, on any host
    monkeypatch.setattr(intake.pool, "submit", lambda *a: tasks.append(a) or submit(*a))
    answers, statuses, _ = run_batch(handler, context, rows)
    monkeypatch.undo()
    assert [len(share) for _, _, share in tasks] == [3, 3]
    assert [s for s, _ in statuses] == [200, 200, 400, 200, 200, 200]
    assert "truncated or corrupt" in json.loads(answers[2])["message"]
    for photo, answer in zip(photos, answers[:2] + answers[3:]):
        (alone,), _, _ = run_batch(handler, context, [{"body": photo}])
        assert_same_tags(json.loads(answer), json.loads(alone))


def test_describe_reports_the_limits(tagger):
    handler, _ = tagger
    limits = json.loads(handler.describe_handle())["handler"]
    assert {
        k: limits[k]
        for k in ("max_request_pixels", "max_batch_pixels", "max_json_depth", "max_json_bytes")
    } == {
        "max_request_pixels": handler.model.config.max_request_pixels,
        "max_batch_pixels": handler.model.config.max_batch_pixels,
        "max_json_depth": 16,
        "max_json_bytes": 32 * 1024 * 1024,
    }


# ---- round two (issue #16): rows, echoes, answer sizes, memory


def v2(count: int, image: bytes = TINY, **tensor) -> dict:
    return {
        "body": {
            "inputs": [
                {
                    "name": "images",
                    "shape": [count],
                    "datatype": "BYTES",
                    "data": [b64(image)] * count,
                    **tensor,
                }
            ]
        }
    }


def test_rows_are_budgeted_per_batch_fewest_first(weights_dir, alone, caplog):
    """Nine requests of 2 one-colour images cannot share a batch's 16 rows with a photo: the
    photo and seven of them run, the other two get 503 with Retry-After, undecoded. (The
    shipped 64 rows and requests of 8 are the same sum at 4x the forward passes.)"""
    handler, context = make_handler(weights_dir, task="tags", max_batch_images=16)
    rows = [v2(2)] * 4 + [{"body": GOOD}] + [v2(2)] * 5
    with caplog.at_level("INFO", logger="ts.metrics"):
        responses, statuses, _ = run_batch(handler, context, rows)
    assert sorted(s[0] for s in statuses) == [200] * 8 + [503] * 2
    assert statuses[4] == (200, None)
    assert_same_tags(json.loads(responses[4]), alone)
    refused = [json.loads(r) for r, s in zip(responses, statuses) if s[0] == 503]
    assert all(
        r["type"] == "Overloaded" and "handler.max_batch_images" in r["message"] for r in refused
    )
    answered = [json.loads(r) for r, s in zip(responses, statuses) if s[0] == 200]
    assert (
        sorted(out["shape"][0] for a in answered if isinstance(a, dict) for out in a["outputs"])
        == [2] * 7
    )
    # The photo and seven requests of 2 reached the model, nothing else: the batch's metric.
    images = re.findall(r"\[METRICS\]resnet50_images_per_batch\.Count:([0-9.]+)\|", caplog.text)
    assert [float(n) for n in images] == [15.0]


def test_forward_runs_in_chunks_with_the_same_answers(weights_dir, alone):
    handler, context = make_handler(weights_dir, task="tags", forward_rows=2)
    calls = []
    backend = handler.model.backend

    def counting(batch):
        calls.append(len(batch))
        return backend(batch)

    handler.model.backend = dataclasses.replace(backend, forward=counting)
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


@pytest.mark.parametrize(
    "row",
    [
        pytest.param(v2(1, name="n" * 1_000_000, shape=[2]), id="v2-name-1MB-bad-shape"),
        pytest.param({"data": GOOD, "topk": b"7" * 1_100_000}, id="topk-1.1MB"),
        pytest.param(
            {
                "body": {
                    "inputs": [
                        {"name": "x" * 1_000_000, "datatype": "FP32", "shape": [1], "data": [1]}
                    ]
                }
            },
            id="v2-datatype",
        ),
        pytest.param({"body": {"data": b64(GOOD), "k" * 1_000_000: 1}}, id="json-field"),
        pytest.param({"body": GOOD, **{f"f{i}" * 1000: b"1" for i in range(50)}}, id="form-fields"),
        pytest.param(
            {
                "body": {
                    "inputs": [
                        {
                            "name": "images",
                            "datatype": "BYTES",
                            "shape": list(range(200_000)),
                            "data": [b64(TINY)],
                        }
                    ]
                }
            },
            id="v2-shape",
        ),
        pytest.param({"body": {"x" * 1_000_000: 1}}, id="json-keys"),
        pytest.param(
            {
                "body": {
                    "inputs": [
                        {"name": "images", "datatype": "BYTES", "shape": [1], "data": [b64(TINY)]}
                    ],
                    "outputs": [{"name": "z" * 1_000_000}],
                }
            },
            id="v2-output-name",
        ),
    ],
)
def test_client_values_are_echoed_short(tagger, row):
    handler, context = tagger
    responses, statuses, _ = run_batch(handler, context, [row, {"body": GOOD}])
    assert 400 <= statuses[0][0] < 500 and statuses[1] == (200, None)
    assert len(responses[0]) < 1000, responses[0][:300]


def test_no_message_grows_with_the_request():
    assert len(PayloadTooLarge("x" * 10**6).message) < MESSAGE_CHARS + 100


def test_a_v2_id_is_capped():
    ok = {
        "body": {
            "id": "i" * 256,
            "inputs": [{"name": "a", "datatype": "BYTES", "shape": [1], "data": [b64(TINY)]}],
        }
    }
    assert parse_row(ok).request_id == "i" * 256
    ok["body"]["id"] = "i" * 257
    with pytest.raises(InvalidRequest) as caught:
        parse_row(ok)
    assert status_of(caught.value) == 400 and "more than 256" in caught.value.message


@pytest.mark.parametrize(
    "body",
    [
        {
            "inputs": [
                {
                    "name": "n" * 1000,
                    "datatype": "BYTES",
                    "shape": [200_000],
                    "data": ["!not base64!"] * 200_000,
                }
            ]
        },
        {"instances": [{"data": "!not base64!"}] * 200_000},
    ],
)
def test_the_image_count_is_checked_before_any_item_is_read(body, monkeypatch):
    """Far too many items (each one bad) fail on the count, before any item is decoded."""
    decoded = []
    monkeypatch.setattr(httpedge, "decode_base64", lambda *args: decoded.append(args))
    with pytest.raises(PayloadTooLarge) as caught:
        parse_row({"body": body})
    assert "request carries 200000 images" in caught.value.message and not decoded


def test_explanation_rows_per_pass_only_go_down(tagger):
    """``internal_batch_size`` bounds autograd's memory: a client may lower it, not raise it."""
    handler, context = tagger
    ceiling = handler.model.config.explain.internal_batch_size
    lower = {"body": GOOD, "internal_batch_size": b"2", "method": b"ig", "n_steps": b"2"}
    higher = {"body": GOOD, "internal_batch_size": str(ceiling + 1).encode()}
    context_headers = [{"explain": "True"}, {"explain": "True"}]
    responses, statuses, _ = run_batch(handler, context, [lower, higher], context_headers)
    assert statuses[0] == (200, None)
    assert statuses[1][0] == 400
    assert (
        f"internal_batch_size must be an integer from 1 to {ceiling}"
        in json.loads(responses[1])["message"]
    )


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"cpu.max": "150000 100000\n"}, 2),
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
)
def test_decode_threads_follow_the_cpu_quota(tmp_path, files, expected):
    """A pod's CPU limit (cgroup v2 or v1), not the node's cores, sets the usable cores."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    unlimited = host.usable_cpus(tmp_path / "absent")
    assert host.usable_cpus(tmp_path) == (min(expected, unlimited) if expected else unlimited)
