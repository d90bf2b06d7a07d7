"""Priority classes and deadlines (#37) in the core and on TorchServe: an expired request is
answered 504 without being parsed or decoded; interactive requests are admitted before bulk
ones in every budget; bulk requests are held to ``handler.bulk_batch_images`` only while
interactive traffic is about; the class comes from ``X-Priority`` or a body's
``parameters.priority``; a bad header fails its own request. Clocks are injected, never slept
on; then the headers against the session's real TorchServe."""

from __future__ import annotations

import json
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from ts.context import RequestProcessor

from handlers.routing import incoming
from servecore.admission import Admission, Budget
from servecore.config import HandlerConfig
from servecore.edges.bodies import headers_of, status_of
from servecore.edges.http import HttpRequest, parse_http
from servecore.errors import InvalidParameter
from servecore.priority import Priority
from servecore.request import ParsedRequest, Protocol
from servecore.stages import Failed, Incoming, Opened, Placed
from tests import imagegen
from tests.corpus import b64
from tests.handler_context import make_handler, run_batch

NOW = 1_764_067_200.0  # the injected clock's time (Unix seconds)
PHOTOS = [imagegen.png(64, 48, seed=seed) for seed in range(4)]
ROWS = Budget("max_batch_images", "images", 6, lambda r: r.image_count)
SHARE = Budget("bulk_batch_images", "bulk rows", 2, lambda r: r.image_count)


class Clock:
    """A clock the test sets."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def v2(count: int, **parameters) -> dict:
    body: dict = {
        "inputs": [
            {
                "name": "images",
                "datatype": "BYTES",
                "shape": [count],
                "data": [b64(p) for p in PHOTOS[:count]],
            }
        ]
    }
    if parameters:
        body["parameters"] = parameters
    return body


def opened(name: str, images: int, priority: Priority = Priority.INTERACTIVE) -> Opened:
    request = ParsedRequest(Protocol.V2, [name.encode() * 10] * images)
    return Opened(name, request, images=(None,) * images, priority=priority)


def fits(states) -> list[bool]:
    return [isinstance(s, Opened) for s in states]


@pytest.fixture
def tagger(weights_dir):
    """A tagger whose batches run 8 rows, 2 of them for bulk while interactive traffic is
    about (1 s), on an injected clock."""
    handler, context = make_handler(
        weights_dir,
        task="tags",
        max_images_per_request=4,
        max_batch_images=8,
        bulk_batch_images=2,
        interactive_window_ms=1000,
    )
    clock = Clock(NOW)
    handler.model.intake.clock = clock
    return handler, context, clock


# ------------------------------------------------------------------------ deadlines


def test_an_expired_request_is_answered_504_without_being_parsed_or_decoded(tagger):
    handler, _, _ = tagger
    intake = handler.model.intake
    parsed, decoded = [], []
    decode = intake.preprocessor.decode
    intake.preprocessor.decode = lambda image, out=None: decoded.append(image) or decode(image, out)

    class Payload(HttpRequest):
        """A request whose parsing is counted."""

        def parse(self, config) -> ParsedRequest:
            parsed.append(True)
            return ParsedRequest(Protocol.PLAIN, [PHOTOS[0]])

    late, on_time, due_now = intake.prepare(
        [
            Incoming("late", Payload(), deadline=NOW - 1.5),
            Incoming("on-time", Payload(), deadline=NOW + 0.5),
            Incoming("due-now", Payload(), deadline=NOW),
        ]
    ).requests
    assert isinstance(late, Failed) and isinstance(due_now, Failed)
    assert status_of(late.error) == 504 and late.error.kind == "DeadlineExceeded"
    assert "passed 1.500 s before" in late.error.message
    assert isinstance(on_time, Placed)
    assert (len(parsed), len(decoded)) == (1, 1)  # the on-time request's only


def test_x_deadline_through_the_handler(tagger):
    handler, context, _ = tagger
    rows = [{"body": PHOTOS[0]}] * 3
    headers = [{"X-Deadline": str(NOW - 0.25)}, {"x-deadline": str(NOW + 30)}, {}]
    responses, statuses, _ = run_batch(handler, context, rows, headers)
    assert [s for s, _ in statuses] == [504, 200, 200]
    assert json.loads(responses[0])["type"] == "DeadlineExceeded"
    assert json.loads(responses[1]) == json.loads(responses[2])


# ------------------------------------------------------------------------ classes


def test_bulk_is_refused_before_interactive_when_both_exceed_a_budget():
    # Cheapest first alone would admit the 2-row bulk request and refuse an interactive one.
    states = [
        opened("person-a", 3),
        opened("job", 2, Priority.BULK),
        opened("person-b", 3),
    ]
    result = Admission().within(states, ROWS)
    assert fits(result) == [True, False, True]
    assert status_of(result[1].error) == 503 and "Retry-After" in headers_of(result[1].error)


def test_a_bulk_request_refused_earlier_still_waits_behind_interactive_ones():
    admission = Admission()
    job = opened("job", 2, Priority.BULK)
    admission.within([opened("a", 3), job, opened("b", 3)], ROWS)
    again = admission.within([opened("c", 3), job, opened("d", 3)], ROWS)
    assert fits(again) == [True, False, True]


def test_the_bulk_share_holds_only_while_interactive_traffic_is_about():
    admission = Admission()
    jobs = [opened(f"job-{k}", 2, Priority.BULK) for k in range(3)]
    # Nobody about: a collection job has the whole batch.
    assert fits(admission.bulk_share(jobs, SHARE, 1.0, NOW)) == [True, True, True]
    # A person in this batch: bulk together gets 2 rows.
    held = admission.bulk_share([opened("person", 1), *jobs], SHARE, 1.0, NOW + 10)
    assert fits(held) == [True, True, False, False]
    assert "handler.bulk_batch_images" in held[2].error.message
    assert status_of(held[2].error) == 503 and headers_of(held[2].error) == {"Retry-After": "1"}
    # Within the window after the last person: still held.
    assert fits(admission.bulk_share(jobs, SHARE, 1.0, NOW + 11)).count(True) == 1
    # After it: the whole batch again.
    assert fits(admission.bulk_share(jobs, SHARE, 1.0, NOW + 11.01)) == [True, True, True]


def test_the_first_bulk_request_in_line_always_runs_and_0_is_no_share():
    admission = Admission()
    big = opened("big-job", 3, Priority.BULK)  # more than the share on its own
    assert fits(admission.bulk_share([opened("person", 1), big], SHARE, 1.0, NOW)) == [True] * 2
    none = Budget("bulk_batch_images", "bulk rows", 0, lambda r: r.image_count)
    jobs = [opened("person", 1)] + [opened(f"job-{k}", 2, Priority.BULK) for k in range(3)]
    assert fits(admission.bulk_share(jobs, none, 1.0, NOW)) == [True] * 4


def test_the_bulk_share_through_the_handler_on_its_clock(tagger):
    handler, context, clock = tagger
    bulk = {"X-Priority": "bulk"}
    rows = [{"body": v2(1)}, {"body": v2(2)}, {"body": v2(2)}]
    _, statuses, _ = run_batch(handler, context, rows, [{}, bulk, bulk])
    assert [s for s, _ in statuses] == [200, 200, 503]
    clock.now = NOW + 0.9  # a second's window after the person
    _, statuses, _ = run_batch(handler, context, rows[1:], [bulk, bulk])
    assert sorted(s for s, _ in statuses) == [200, 503]
    clock.now = NOW + 1.1
    _, statuses, _ = run_batch(handler, context, rows[1:], [bulk, bulk])
    assert [s for s, _ in statuses] == [200, 200]


def test_the_class_from_the_header_and_from_the_body_which_wins(tagger):
    handler, context, _ = tagger
    intake = handler.model.intake
    header_bulk = {"X-Priority": "bulk"}
    cases = [
        ({"body": PHOTOS[0]}, {}, Priority.INTERACTIVE),
        ({"body": PHOTOS[0]}, header_bulk, Priority.BULK),
        ({"body": PHOTOS[0]}, {"x-priority": "2"}, Priority.BULK),
        ({"body": v2(1, priority=2)}, {}, Priority.BULK),
        ({"body": v2(1, priority=1)}, header_bulk, Priority.INTERACTIVE),  # the body wins
        ({"body": v2(1, priority=0)}, header_bulk, Priority.INTERACTIVE),  # Triton's default
        (
            {"body": {"instances": [b64(PHOTOS[0])], "parameters": {"priority": "bulk"}}},
            {},
            Priority.BULK,
        ),
    ]
    for row, headers, expected in cases:
        context.request_processor = [RequestProcessor(headers)]
        context.request_ids = {0: "req-0"}
        state = intake.open(incoming(handler.edge, context, 0, row))
        assert isinstance(state, Opened) and state.priority == expected, (row, headers)


def test_a_body_timeout_is_refused_naming_the_header():
    body = json.dumps(v2(1, timeout=500_000))
    with pytest.raises(InvalidParameter, match="X-Deadline"):
        parse_http(HttpRequest(body=body), HandlerConfig())


def test_a_bad_header_fails_its_own_request_alone(tagger):
    handler, context, _ = tagger
    rows = [{"body": PHOTOS[0]}] * 4
    headers = [{"X-Priority": "urgent"}, {"X-Deadline": "tomorrow"}, {"X-Deadline": "-5"}, {}]
    responses, statuses, _ = run_batch(handler, context, rows, headers)
    assert [s for s, _ in statuses] == [400, 400, 400, 200]
    bodies = [json.loads(r) for r in responses[:3]]
    assert [b["type"] for b in bodies] == ["InvalidParameter"] * 3
    assert "urgent" in bodies[0]["message"] and "X-Deadline" in bodies[1]["message"]


# ------------------------------------------------------------------------ a real TorchServe


@pytest.mark.integration
def test_deadlines_and_classes_on_torchserve(torchserve):
    url = f"{torchserve.inference_url}/predictions/resnet50-tagger"
    auth = torchserve.keys.inference_headers()

    def post(**headers) -> requests.Response:
        return requests.post(url, data=PHOTOS[0], headers={**auth, **headers}, timeout=120)

    late = post(**{"X-Deadline": f"{time.time() - 5:.3f}"})
    assert late.status_code == 504, late.text
    assert late.json()["type"] == "DeadlineExceeded"
    on_time = post(**{"X-Deadline": f"{time.time() + 60:.3f}"})
    assert on_time.status_code == 200, on_time.text
    bulk = post(**{"X-Priority": "bulk"})
    assert bulk.status_code == 200, bulk.text
    assert bulk.json() == on_time.json() == post().json()
    metrics = requests.get(f"{torchserve.metrics_url}/metrics", timeout=30).text
    counted = [
        sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "resnet50_errors_total"
        and sample.labels.get("model") == "resnet50-tagger"
        and sample.labels.get("error_type") == "DeadlineExceeded"
    ]
    assert counted and counted[0] >= 1, "no DeadlineExceeded count on /metrics"
