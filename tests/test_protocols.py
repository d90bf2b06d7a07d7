"""Every request form through a real TorchServe with server-side batching: KServe v1 and v2,
good images in every format, and the whole bad-input corpus, alone and inside batches."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests import corpus, imagegen
from tests.corpus import b64
from tests.reference import assert_same_tags, rel_error
from tests.served import raw_answer, served_precision, variant_server

pytestmark = pytest.mark.integration
TOLERANCE = 1e-4
IMAGES = [imagegen.jpeg(300 + 20 * i, 240, seed=200 + i) for i in range(6)]
GOOD = corpus.good_images()
BAD = corpus.bad_inputs()


def send(ts, case: corpus.Bad) -> requests.Response:
    """Send one corpus case to /predictions/{model} the way a client would."""
    url = f"{ts.inference_url}/predictions/{case.model}"
    headers = ts.keys.inference_headers()
    if case.form == "raw":
        return requests.post(url, data=case.body, headers=headers, timeout=120)
    if case.form == "multipart":
        return requests.post(
            url,
            files={"data": ("upload", case.body)},
            data=case.fields,
            headers=headers,
            timeout=120,
        )
    return requests.post(
        url,
        data=corpus.json_text(case).encode(),
        timeout=120,
        headers={**headers, "Content-Type": "application/json"},
    )


@pytest.fixture(scope="module")
def singles(torchserve):
    """Raw-body answers for each image, one request at a time: what batched answers must equal."""
    return {
        i: (
            raw_answer(torchserve, "resnet50-embedding", image)["embedding"],
            raw_answer(torchserve, "resnet50-tagger", image, **{"X-Top-K": "10"}),
        )
        for i, image in enumerate(IMAGES)
    }


# ------------------------------------------------------------------------------- KServe v1


def test_kserve_v1_concurrent_requests_with_several_instances(torchserve, singles):
    plans = [[i % 6, (i + 1) % 6, (i + 3) % 6][: 1 + i % 3] for i in range(12)]

    def call(plan, model):
        body = {
            "instances": [
                {"data": b64(IMAGES[i])} if n % 2 else {"image": {"b64": b64(IMAGES[i])}}
                for n, i in enumerate(plan)
            ],
            "parameters": {"topk": 10},
        }
        return requests.post(
            f"{torchserve.inference_url}/v1/models/{model}:predict",
            json=body,
            headers=torchserve.keys.inference_headers(),
            timeout=120,
        )

    with ThreadPoolExecutor(12) as pool:
        embedding = list(pool.map(lambda p: call(p, "resnet50-embedding"), plans))
        tags = list(pool.map(lambda p: call(p, "resnet50-tagger"), plans))
    assert max(int(r.headers["x-batch-size"]) for r in embedding + tags) > 1
    for plan, e, t in zip(plans, embedding, tags):
        assert e.status_code == 200 and t.status_code == 200, (e.text, t.text)
        e_predictions, t_predictions = e.json()["predictions"], t.json()["predictions"]
        assert len(e_predictions) == len(t_predictions) == len(plan)
        for i, e_answer, t_answer in zip(plan, e_predictions, t_predictions):
            assert rel_error(e_answer["embedding"], singles[i][0]) <= TOLERANCE
            assert_same_tags(t_answer, singles[i][1])


# ------------------------------------------------------------------------------- KServe v2


def v2_request(plan, request_id=None, outputs=None, parameters=None):
    body = {
        "inputs": [
            {
                "name": "images",
                "shape": [len(plan)],
                "datatype": "BYTES",
                "data": [b64(IMAGES[i]) for i in plan],
            }
        ]
    }
    if request_id is not None:
        body["id"] = request_id
    if outputs is not None:
        body["outputs"] = outputs
    if parameters is not None:
        body["parameters"] = parameters
    return body


def test_kserve_v2_concurrent_requests_ids_outputs_and_values(torchserve, singles):
    cases = []
    for n in range(12):
        plan = [n % 6, (n + 2) % 6, (n + 5) % 6][: 1 + n % 3]
        model = ("resnet50-embedding", "resnet50-tagger")[n % 2]
        outputs = [
            None,
            [{"name": "embedding"}, {"name": "tags", "parameters": {"topk": 10}}],
            [{"name": "tags"}],
        ][n % 3]
        cases.append((model, plan, f"req-{n}", outputs))

    def call(case):
        model, plan, request_id, outputs = case
        return requests.post(
            f"{torchserve.inference_url}/v2/models/{model}/infer",
            json=v2_request(plan, request_id, outputs, {"topk": 10}),
            headers=torchserve.keys.inference_headers(),
            timeout=120,
        )

    with ThreadPoolExecutor(12) as pool:
        responses = list(pool.map(call, cases))
    assert max(int(r.headers["x-batch-size"]) for r in responses) > 1
    for (model, plan, request_id, outputs), response in zip(cases, responses):
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["id"] == request_id and body["model_name"] == model
        assert body["model_version"] == "1.0"
        names = (
            [o["name"] for o in outputs]
            if outputs
            else ["embedding" if model.endswith("embedding") else "tags"]
        )
        by_name = {o["name"]: o for o in body["outputs"]}
        assert sorted(by_name) == sorted(names)
        if "embedding" in by_name:
            out = by_name["embedding"]
            assert out["datatype"] == "FP32" and out["shape"] == [len(plan), 2048]
            assert len(out["data"]) == len(plan) * 2048
            for row, i in enumerate(plan):
                assert (
                    rel_error(out["data"][row * 2048 : (row + 1) * 2048], singles[i][0])
                    <= TOLERANCE
                )
        if "tags" in by_name:
            out = by_name["tags"]
            assert out["datatype"] == "BYTES" and out["shape"] == [len(plan), 10]
            for row, i in enumerate(plan):
                tags = [json.loads(s) for s in out["data"][row * 10 : (row + 1) * 10]]
                assert_same_tags(tags, singles[i][1])


def test_kserve_v2_without_id_has_no_id(torchserve):
    response = requests.post(
        f"{torchserve.inference_url}/v2/models/resnet50-tagger/infer",
        json=v2_request([0]),
        headers=torchserve.keys.inference_headers(),
        timeout=120,
    )
    assert response.status_code == 200 and "id" not in response.json()
    assert response.json()["outputs"][0]["shape"] == [1, 5]


# ------------------------------------------------------------------------ formats and errors


def test_every_good_format_is_served(torchserve):
    headers = torchserve.keys.inference_headers()
    for name, case in GOOD.items():
        response = requests.post(
            f"{torchserve.inference_url}/predictions/resnet50-tagger",
            data=case.data,
            headers=headers,
            timeout=120,
        )
        assert response.status_code == 200, (name, response.text)
        assert len(response.json()) == 5


def _worker_pids(ts, model="resnet50-tagger"):
    described = requests.get(
        f"{ts.management_url}/models/{model}", headers=ts.keys.management_headers(), timeout=30
    ).json()[0]
    return sorted(w["pid"] for w in described["workers"])


def test_every_bad_input_alone_gets_its_status_and_message(torchserve):
    pids = _worker_pids(torchserve)
    for name, case in BAD.items():
        response = send(torchserve, case)
        assert response.status_code == case.status, (name, response.text)
        error = response.json()
        assert error["code"] == case.status and error["type"] == case.kind, (name, error)
        assert case.message in error["message"], (name, error)
    assert _worker_pids(torchserve) == pids  # no worker died or was restarted
    assert raw_answer(torchserve, "resnet50-tagger", IMAGES[0])


@pytest.fixture(scope="module")
def slow_batching_server(tmp_path_factory, model_store, torchserve):
    """A second TorchServe whose tagger waits up to 30 s to fill a batch of 8: a group of 8
    concurrent requests is then one batch, which every answer's X-Batch-Size proves. A full
    batch goes at once, so the long wait costs nothing; it only keeps slow uploads of large
    bodies on a loaded machine from splitting a group. Pinned to the precision the session's
    server serves, whose single answers the batched ones must equal."""
    with variant_server(
        tmp_path_factory,
        model_store,
        "resnet50-tagger",
        handler={"precision": served_precision(torchserve, "resnet50-tagger")},
        batchSize=8,
        maxBatchDelay=30000,
    ) as server:
        yield server


def test_bad_inputs_inside_full_batches_fail_alone(slow_batching_server, singles):
    """Groups of 8 concurrent requests, 3 bad and 5 good: each group is one batch (X-Batch-Size
    8 on every answer); bad ones get their own status, good ones the single-request answer."""
    ts = slow_batching_server
    names = [n for n in BAD if n != "too-many-bytes"]  # 30 MB bodies: checked alone above
    pids = _worker_pids(ts)
    for start in range(0, len(names), 3):
        group = names[start : start + 3]
        goods = [i % 6 for i in range(start, start + 8 - len(group))]

        def call(item):
            if isinstance(item, str):
                return send(ts, BAD[item])
            return requests.post(
                f"{ts.inference_url}/predictions/resnet50-tagger",
                data=IMAGES[item],
                timeout=120,
                headers={**ts.keys.inference_headers(), "X-Top-K": "10"},
            )

        items = group + goods
        with ThreadPoolExecutor(len(items)) as pool:
            responses = list(pool.map(call, items))
        assert [r.headers.get("x-batch-size") for r in responses] == ["8"] * 8, group
        for item, response in zip(items, responses):
            if isinstance(item, str):
                case = BAD[item]
                assert response.status_code == case.status, (item, response.text)
                assert response.json()["type"] == case.kind, item
                assert case.message in response.json()["message"], item
            else:
                assert response.status_code == 200, response.text
                assert_same_tags(response.json(), singles[item][1])
    assert _worker_pids(ts) == pids


def test_hostile_requests_in_a_full_batch_hurt_no_one(slow_batching_server, singles):
    """One batch of 8 (issue #8): deep JSON (parsed by TorchServe or not), a 288-megapixel flood
    of cheap WebPs, three heavy but allowed requests (2 x 36 MP each) and two ordinary photos.
    The photos get their single-request answers, each hostile request its own 4xx, the batch's
    decoding budget (200 MP) admits two heavy requests and answers the third 503 with
    Retry-After, all within a bounded time, and no worker dies."""
    ts = slow_batching_server
    hostile = corpus.hostile_inputs()
    heavy = {
        "inputs": [
            {
                "name": "images",
                "shape": [2],
                "datatype": "BYTES",
                "data": [b64(corpus.flat_webp())] * 2,
            }
        ]
    }
    url = f"{ts.inference_url}/predictions/resnet50-tagger"
    headers = ts.keys.inference_headers()
    pids = _worker_pids(ts)

    def call(item):
        if item == "deep-as-bytes":  # not application/json: TorchServe forwards the bytes
            return requests.post(
                url,
                data=corpus.json_text(hostile["json-nested-5000"]),
                headers=headers,
                timeout=120,
            )
        if item in hostile:
            return send(ts, hostile[item])
        if item == "heavy":
            return requests.post(url, json=heavy, headers=headers, timeout=120)
        return requests.post(
            url, data=IMAGES[item], timeout=120, headers={**headers, "X-Top-K": "10"}
        )

    items = ["json-nested-5000", "deep-as-bytes", "v2-pixel-flood", "heavy", "heavy", "heavy", 0, 1]
    started = time.monotonic()
    with ThreadPoolExecutor(len(items)) as pool:
        responses = list(pool.map(call, items))
    elapsed = time.monotonic() - started
    assert [r.headers.get("x-batch-size") for r in responses] == ["8"] * 8
    for item, response in zip(items[:3], responses[:3]):
        case = hostile["json-nested-5000" if item == "deep-as-bytes" else item]
        assert response.status_code == case.status, (item, response.text)
        assert case.message in response.json()["message"], item
    heavy_statuses = sorted(r.status_code for r in responses[3:6])
    assert heavy_statuses == [200, 200, 503], [r.text[:200] for r in responses[3:6]]
    refused = next(r for r in responses[3:6] if r.status_code == 503)
    assert refused.json()["type"] == "Overloaded" and refused.headers["Retry-After"] == "1"
    for item, response in zip(items[6:], responses[6:]):
        assert response.status_code == 200, response.text
        assert_same_tags(response.json(), singles[item][1])
    # Uploading and decoding 144 MP in one full batch (no batching delay once 8 are in):
    # far below the 120 s responseTimeout.
    assert elapsed < 60, elapsed
    assert _worker_pids(ts) == pids


# ------------------------------------------------------------------------------- precision


def test_every_answer_says_which_precision_computed_it(torchserve):
    """``X-Precision`` on every protocol and on explanations, equal to what describe reports
    (issue #27: replicas that chose differently are told apart by their answers)."""
    base, headers = torchserve.inference_url, torchserve.keys.inference_headers()
    image = IMAGES[0]
    calls = {
        "raw": lambda m: requests.post(
            f"{base}/predictions/{m}", data=image, headers=headers, timeout=120
        ),
        "multipart": lambda m: requests.post(
            f"{base}/predictions/{m}",
            headers=headers,
            files={"data": ("a.jpg", image)},
            timeout=120,
        ),
        "v1": lambda m: requests.post(
            f"{base}/v1/models/{m}:predict",
            headers=headers,
            json={"instances": [{"data": b64(image)}]},
            timeout=120,
        ),
        "v2": lambda m: requests.post(
            f"{base}/v2/models/{m}/infer",
            headers=headers,
            json={
                "inputs": [
                    {"name": "images", "datatype": "BYTES", "shape": [1], "data": [b64(image)]}
                ]
            },
            timeout=120,
        ),
        "explain": lambda m: requests.post(
            f"{base}/explanations/{m}", data=image, headers=headers, timeout=120
        ),
    }
    client = torchserve.client()
    for model in ("resnet50-embedding", "resnet50-tagger"):
        served = client.describe(model, customized=True)[0]["customizedMetadata"]["precision"]
        for name, call in calls.items():
            response = call(model)
            assert response.status_code == 200, (name, response.text[:200])
            assert response.headers["X-Precision"] == served, (model, name)
    bad = requests.post(
        f"{base}/predictions/resnet50-tagger", data=b"not an image", headers=headers, timeout=120
    )
    assert bad.status_code == 400 and "X-Precision" not in bad.headers  # nothing computed
