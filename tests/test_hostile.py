"""Hostile requests against the handler, without a server (issue #8): none may fail or stall
another request. Deep JSON and pixel floods are refused from headers and bytes, before any
decoding; the batch's decoding work is bounded; an unexpected failure is one request's 500."""
from __future__ import annotations

import json

import pytest
from PIL import Image

from handlers import intake, parse
from handlers.batch import admit
from handlers.images import open_image
from tests import corpus, imagegen
from tests.handler_context import make_handler, run_batch
from tests.reference import assert_same_tags

GOOD = imagegen.png(300, 240, seed=5)
HOSTILE = corpus.hostile_inputs()


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
        self.decode = handler.intake.preprocessor.decode

    def __call__(self, opened):
        self.calls += 1
        return self.decode(opened)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_request_is_refused_alone_without_decoding(tagger, alone, name, monkeypatch):
    handler, context = tagger
    case = HOSTILE[name]
    counter = DecodeCounter(handler)
    monkeypatch.setattr(handler.intake.preprocessor, "decode", counter)
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
    assert "more than the limit of 1000 (handler.max_json_bytes)" in json.loads(
        responses[0])["message"]


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
    handler, context = make_handler(weights_dir, max_batch_pixels=1_000_000,
                                    max_request_pixels=1_000_000)
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


@pytest.mark.parametrize("costs, budget, expected", [
    ([5, 1, 1], 3, [False, True, True]),
    ([5], 3, [True]),  # a lone request always fits
    ([2, 2, 2], 4, [True, True, False]),
    ([], 10, []),
    ([0, 10, 0], 9, [True, True, True]),  # the first costly one is the cheapest left
])
def test_admission_rule(costs, budget, expected):
    assert admit(costs, budget) == expected


def test_unexpected_failure_is_a_500_for_that_request_only(tagger, alone, monkeypatch, caplog):
    handler, context = tagger
    decode = handler.intake.preprocessor.decode

    def broken(opened):
        if opened.image.size == (64, 48):
            raise RuntimeError("simulated bug")
        return decode(opened)

    monkeypatch.setattr(handler.intake.preprocessor, "decode", broken)
    odd = imagegen.png(64, 48, seed=1)
    with caplog.at_level("ERROR"):
        responses, statuses, _ = run_batch(handler, context, [{"body": GOOD}, {"body": odd}])
    assert statuses[0] == (200, None) and statuses[1][0] == 500
    error = json.loads(responses[1])
    assert error == {"code": 500, "type": "InternalError", "message":
                     "unexpected error while decoding this request (RuntimeError); "
                     "request id req-1"}
    assert any("request req-1: unexpected RuntimeError while decoding" in r.getMessage()
               for r in caplog.records)
    assert_same_tags(json.loads(responses[0]), alone)


def test_unexpected_parse_failure_is_a_500_for_that_request_only(tagger, monkeypatch):
    handler, context = tagger
    real = parse.parse_request

    def broken(row, **kwargs):
        if "topk" in row:
            raise KeyError("simulated bug")
        return real(row, **kwargs)

    monkeypatch.setattr(intake, "parse_request", broken)
    responses, statuses, _ = run_batch(handler, context,
                                       [{"data": GOOD, "topk": b"3"}, {"body": GOOD}])
    assert statuses[0][0] == 500 and json.loads(responses[0])["type"] == "InternalError"
    assert statuses[1] == (200, None)


def test_describe_reports_the_limits(tagger):
    handler, _ = tagger
    limits = json.loads(handler.describe_handle())["handler"]
    assert {k: limits[k] for k in ("max_request_pixels", "max_batch_pixels", "max_json_depth",
                                   "max_json_bytes")} == {
        "max_request_pixels": handler.config.max_request_pixels,
        "max_batch_pixels": handler.config.max_batch_pixels,
        "max_json_depth": 16, "max_json_bytes": 32 * 1024 * 1024}
