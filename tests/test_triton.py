"""The same models on Triton (issue #28): the server from the nvidia-pytriton wheel on a
repository generated from the archives (``tritonrepo``), asked over HTTP as a client would.

One Triton for the module, on free loopback ports, the repository pinned to f32 so its answers
can be held to the float32 reference (tests/reference.py) as tightly as f32 allows; stopped at
the end (the last test checks that it stops cleanly). Skipped, saying why, when
``make triton-server`` could not install the wheel.
"""

from __future__ import annotations

import base64
import importlib
import json
import math
import os
import sys
import threading
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pytest
import requests
import torch

from buildsteps.configgen import frontend_settings, repo_models
from servecore.answers import Tag
from servecore.config import HandlerConfig
from servecore.encode import tag_json
from servecore.errors import InvalidParameter, InvalidRequest, PayloadTooLarge
from servecore.parse import Protocol, parse_tensor
from tests.imagegen import jpeg, png
from tests.reference import assert_same_tags, rel_error, tolerance
from tests.served import local_triton, variant_server
from tests.served import v2_infer as infer
from tritonrepo.generate import config_pbtxt

REPO = Path(__file__).resolve().parent.parent
EMBEDDING, TAGGER = "resnet50-embedding", "resnet50-tagger"
PHOTOS = [jpeg(320, 240, seed=1), png(300, 300, seed=2), jpeg(500, 280, seed=3)]


def test_a_tensor_element_is_an_image_or_its_base64_text():
    config = HandlerConfig()
    parsed = parse_tensor([PHOTOS[0], base64.b64encode(PHOTOS[1])], top_k=3, config=config)
    assert parsed.images == PHOTOS[:2]
    assert (parsed.protocol, parsed.top_k) == (Protocol.V2, 3)
    with pytest.raises(InvalidParameter, match="topk"):
        parse_tensor([PHOTOS[0]], top_k=0, config=config)
    with pytest.raises(InvalidRequest, match="images\\[0\\] is not valid base64"):
        parse_tensor([b"x"], config=config)
    with pytest.raises(InvalidRequest, match="empty"):
        parse_tensor([], config=config)
    many = config.max_images_per_request + 1
    with pytest.raises(PayloadTooLarge, match=f"{many} images"):
        parse_tensor([PHOTOS[0]] * many, config=config)


def test_a_tag_element_is_the_json_text_json_dumps_writes():
    """Triton's BYTES tags and TorchServe's v2 tags: the same text as ``json.dumps`` of the tag."""
    labels = ["tabby", 'say "cheese"', "back\\slash", "caf\u00e9 cr\u00e8me", "tab\tline\n", ""]
    probabilities = [
        0.4199999868869781,
        1.0,
        0.0,
        1e-45,
        3.4028234663852886e38,
        0.1 + 0.2,
        math.nan,
        math.inf,
    ]
    for index, label in enumerate(labels):
        for p in probabilities:
            tag = Tag(label, index, p)
            assert tag_json(tag) == json.dumps({"label": label, "index": index, "probability": p})


class FakeTensor:
    """``pb_utils.Tensor``: a name and its numpy array."""

    def __init__(self, name: str, array: np.ndarray) -> None:
        self.name, self.array = name, array

    def as_numpy(self) -> np.ndarray:
        return self.array


class FakeError:
    UNAVAILABLE, INVALID_ARG, INTERNAL = "unavailable", "invalid", "internal"

    def __init__(self, message: str, code: str = INTERNAL) -> None:
        self.message, self.code = message, code


class FakeResponse:
    def __init__(self, output_tensors=(), error=None) -> None:
        self.tensors = {t.name: t.array for t in output_tensors}
        self.error = error


class NoMetricFamily:
    """``pb_utils.MetricFamily`` of a server started with ``--allow-metrics=false``: every
    family refused (the adapter's metrics then switch off with a warning)."""

    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

    def __init__(self, **_) -> None:
        raise RuntimeError("metrics not enabled")


class FakeRequest:
    """``pb_utils.InferenceRequest`` as the adapter reads it."""

    def __init__(self, images: list[bytes], parameters: str = "{}", request_id: str = "") -> None:
        self.images = np.array([[image] for image in images], dtype=object)
        self.text, self.id = parameters, request_id

    def request_id(self) -> str:
        return self.id

    def parameters(self) -> str:
        return self.text


@pytest.fixture
def fake_pb_utils(monkeypatch):
    """The Python backend's ``triton_python_backend_utils`` as far as tritonrepo/model.py uses
    it, so that the adapter runs without a Triton server."""
    module = types.ModuleType("triton_python_backend_utils")
    module.Tensor, module.TritonError = FakeTensor, FakeError
    module.InferenceResponse, module.MetricFamily = FakeResponse, NoMetricFamily
    module.triton_string_to_numpy = {"TYPE_FP32": np.float32, "TYPE_STRING": np.object_}.__getitem__
    module.get_input_tensor_by_name = lambda request, name: FakeTensor(name, request.images)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", module)
    monkeypatch.delitem(sys.modules, "tritonrepo.model", raising=False)
    yield importlib.import_module("tritonrepo.model")
    sys.modules.pop("tritonrepo.model", None)


def triton_model(module, weights_dir: Path, task: str):
    """The adapter's model, initialised as Triton would with a generated config (f32)."""
    output = {
        "embedding": {"name": "embedding", "data_type": "TYPE_FP32", "dims": [2048]},
        "tags": {"name": "tags", "data_type": "TYPE_STRING", "dims": [-1]},
    }[task]
    handler = {"task": task, "precision": "f32", "draft_decode": False}
    config = {
        "name": task,
        "max_batch_size": 8,
        "output": [output],
        "parameters": {
            "serialized_file": {"string_value": "resnet50_dual.xml"},
            "handler": {"string_value": json.dumps(handler)},
        },
    }
    model = module.TritonPythonModel()
    model.initialize(
        {
            "model_config": json.dumps(config),
            "model_name": task,
            "model_repository": str(weights_dir.parent),
            "model_version": weights_dir.name,
            "model_instance_kind": "CPU",
        }
    )
    return model


def test_the_triton_adapter_answers_with_tensors_and_no_json(
    fake_pb_utils, weights_dir, reference, monkeypatch
):
    """Issue #34: Triton's answers go from the core's arrays straight into tensors; the only
    JSON on the path is reading each request's parameters."""
    tagger = triton_model(fake_pb_utils, weights_dir, "tags")
    embedder = triton_model(fake_pb_utils, weights_dir, "embedding")
    labels = tagger.model.answers.labels
    requests_ = [FakeRequest(PHOTOS[:2], '{"topk": 3}', "a"), FakeRequest(PHOTOS[2:], "{}", "b")]
    loaded = []

    def loads(text, *args, **kwargs):
        assert text in ('{"topk": 3}', "{}"), "json.loads on Triton's answer path"
        loaded.append(text)
        return json.JSONDecoder().decode(text)

    def dumps(*args, **kwargs):
        raise AssertionError("json.dumps on Triton's answer path")

    with monkeypatch.context() as patch:
        patch.setattr(json, "loads", loads)
        patch.setattr(json, "dumps", dumps)
        tagged = tagger.execute(requests_)
        embedded = embedder.execute(requests_)
    assert sorted(loaded) == sorted(['{"topk": 3}', "{}"] * 2)
    assert [r.error for r in tagged + embedded] == [None] * 4
    assert [r.tensors["tags"].shape for r in tagged] == [(2, 3), (1, 5)]
    for row, photo in zip([*tagged[0].tensors["tags"], *tagged[1].tensors["tags"]], PHOTOS):
        assert_same_tags(
            [json.loads(t) for t in row], expected_tags(reference, labels, photo, len(row))
        )
    for response, photos in zip(embedded, (PHOTOS[:2], PHOTOS[2:])):
        array = response.tensors["embedding"]
        assert list(response.tensors) == ["embedding"]
        assert (array.dtype, array.shape) == (np.float32, (len(photos), 2048))
        for vector, photo in zip(array, photos):
            expected = reference(photo)[0]
            assert rel_error(vector, expected / expected.norm()) <= tolerance("f32")


def test_the_triton_adapter_sends_the_core_error_body(fake_pb_utils, weights_dir):
    """Each failed request gets its own error (the core's JSON error body), the good one its
    tags."""
    tagger = triton_model(fake_pb_utils, weights_dir, "tags")
    responses = tagger.execute(
        [
            FakeRequest([b"\xff\xd8\xff\xe0 not a JPEG"]),
            FakeRequest([PHOTOS[0]], '{"topk": 0}'),
            FakeRequest([PHOTOS[1]]),
        ]
    )
    for response, kind in zip(responses, ("InvalidImage", "InvalidParameter")):
        assert response.tensors == {}
        assert response.error.code == FakeError.INVALID_ARG
        body = json.loads(response.error.message)
        assert (body["code"], body["type"]) == (400, kind)
    assert responses[2].error is None and responses[2].tensors["tags"].shape == (1, 5)


@pytest.mark.parametrize("model", [EMBEDDING, TAGGER])
def test_config_pbtxt_carries_the_model_yaml(model):
    yaml_path = REPO / "config" / "models" / f"{model}.yaml"
    settings = frontend_settings(yaml_path)
    text = config_pbtxt(model, settings, {"task": "tags"}, "resnet50_dual.xml")
    assert f"max_batch_size: {settings['batchSize']}\n" in text
    assert f"max_queue_delay_microseconds: {settings['maxBatchDelay'] * 1000} " in text
    assert f"count: {settings['minWorkers']} kind: KIND_CPU" in text
    assert 'string_value: "{\\"task\\": \\"tags\\"}"' in text
    assert "EXECUTION_ENV_PATH" not in text
    packed = config_pbtxt(model, settings, {"task": "tags"}, "resnet50_dual.xml", "env.tar.gz")
    assert (
        'key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" }'
    ) in packed


def test_the_kserve_triton_manifest_passes_the_lint_and_its_rules_apply():
    """kserve/triton: KServe's Triton runtime on the repository, v2 only, its pods fenced."""
    import copy

    from kserve_tools import lint
    from kserve_tools.render import render

    target = REPO / "kserve" / "triton"
    assert target in lint.default_targets()
    assert lint.lint([target]) == []
    objects = render(target)
    [isvc] = [o for o in objects if o.kind == "InferenceService"]
    model = isvc.obj["spec"]["predictor"]["model"]
    assert (model["runtime"], model["modelFormat"]) == (
        "kserve-tritonserver",
        {"name": "triton", "version": "2"},
    )
    runtimes = {lint.TRITON_RUNTIME.name: lint.TRITON_RUNTIME}
    limits = lint.ServingLimits.from_models(repo_models())
    v1 = copy.deepcopy(isvc)
    v1.obj["spec"]["predictor"]["model"]["protocolVersion"] = "v1"
    assert any(
        "'v1' is not supported by runtime kserve-tritonserver" in str(f)
        for f in lint.inference_service_findings(v1, runtimes, limits)
    )
    no_metrics = copy.deepcopy(objects)
    for o in no_metrics:
        if o.kind == "NetworkPolicy":
            o.obj["spec"]["ingress"].pop(1)
    assert any(
        "port 8002 is admitted from no namespace" in str(f)
        for f in lint.network_policy_findings(no_metrics)
    )


@pytest.fixture(scope="module")
def triton(tmp_path_factory, model_store):
    with local_triton(tmp_path_factory.mktemp("triton"), model_store) as server:
        yield server


def output(response: requests.Response, name: str) -> np.ndarray:
    assert response.status_code == 200, response.text
    out = {o["name"]: o for o in response.json()["outputs"]}[name]
    return np.array(
        out["data"], dtype=object if out["datatype"] == "BYTES" else np.float32
    ).reshape(out["shape"])


def expected_tags(reference, labels: list[str], image: bytes, k: int) -> list[dict]:
    top = torch.softmax(reference(image)[1], dim=0).topk(k)
    return [
        {"label": labels[i], "index": i, "probability": p}
        for i, p in zip(top.indices.tolist(), top.values.tolist())
    ]


def test_health_ready_metadata_and_metrics_answer(triton):
    assert requests.get(f"{triton.url}/v2/health/live", timeout=30).status_code == 200
    assert requests.get(f"{triton.url}/v2/health/ready", timeout=30).status_code == 200
    for model, out, datatype, shape in (
        (EMBEDDING, "embedding", "FP32", [-1, 2048]),
        (TAGGER, "tags", "BYTES", [-1, -1]),
    ):
        assert requests.get(f"{triton.url}/v2/models/{model}/ready", timeout=30).status_code == 200
        meta = requests.get(f"{triton.url}/v2/models/{model}", timeout=30).json()
        assert meta["inputs"] == [{"name": "images", "datatype": "BYTES", "shape": [-1, 1]}]
        assert meta["outputs"] == [{"name": out, "datatype": datatype, "shape": shape}] + [
            {"name": name, "datatype": "BYTES", "shape": [-1, 1]}  # tests/test_triton_ops.py
            for name in ("describe", "explanations")
        ]
    metrics = requests.get(triton.metrics_url, timeout=30)
    assert metrics.status_code == 200
    assert f'nv_inference_count{{model="{TAGGER}",version="1"}}' in metrics.text


def test_embeddings_equal_the_float32_reference(triton, reference):
    embeddings = output(infer(triton, EMBEDDING, PHOTOS), "embedding")
    assert embeddings.shape == (len(PHOTOS), 2048)
    for photo, embedding in zip(PHOTOS, embeddings):
        expected = torch.nn.functional.normalize(reference(photo)[0], dim=0)  # the YAML's L2
        cosine = float(
            torch.nn.functional.cosine_similarity(
                torch.as_tensor(embedding, dtype=torch.float64), expected.double(), dim=0
            )
        )
        assert cosine >= 0.9999
        assert rel_error(embedding, expected) <= tolerance("f32")


def test_tags_match_the_reference_in_json_and_binary_requests(triton, reference, weights_dir):
    import tritonclient.http as httpclient

    labels = [
        json.loads((weights_dir / "index_to_name.json").read_text())[str(i)] for i in range(1000)
    ]
    from_json = output(infer(triton, TAGGER, PHOTOS, topk=3), "tags")
    assert from_json.shape == (len(PHOTOS), 3)
    for photo, row in zip(PHOTOS, from_json):
        assert_same_tags([json.loads(t) for t in row], expected_tags(reference, labels, photo, 3))

    # Raw bytes through Triton's binary tensor extension: the same answer.
    client = httpclient.InferenceServerClient(triton.url.removeprefix("http://"))
    tensor = httpclient.InferInput("images", [len(PHOTOS), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[p] for p in PHOTOS], dtype=object), binary_data=True)
    result = client.infer(TAGGER, [tensor], parameters={"topk": 3})
    binary = result.as_numpy("tags")
    assert [[json.loads(t)["index"] for t in row] for row in binary] == [
        [json.loads(t)["index"] for t in row] for row in from_json
    ]


def test_a_broken_image_fails_alone_beside_three_good_ones(triton):
    bodies = [[PHOTOS[0]], [b"\xff\xd8\xff\xe0 this is not a JPEG"], [PHOTOS[1]], [PHOTOS[2]]]
    start = threading.Barrier(len(bodies))

    def send(images):
        start.wait()
        return infer(triton, TAGGER, images)

    with ThreadPoolExecutor(len(bodies)) as pool:
        responses = list(pool.map(send, bodies))
    assert [r.status_code for r in responses] == [200, 400, 200, 200]
    error = json.loads(responses[1].json()["error"])  # the core's own error body
    assert error["type"] == "InvalidImage" and error["code"] == 400
    for r in responses[:1] + responses[2:]:
        assert output(r, "tags").shape == (1, 5)  # the model's default topk


def test_concurrent_requests_are_batched(triton):
    """Triton's own statistics: under 16 concurrent clients some batch ran more than one."""
    clients = 16
    start = threading.Barrier(clients)

    def send(i):
        start.wait()
        return infer(triton, TAGGER, [jpeg(64, 64, seed=100 + i)]).status_code

    with ThreadPoolExecutor(clients) as pool:
        assert list(pool.map(send, range(clients))) == [200] * clients
    stats = requests.get(f"{triton.url}/v2/models/{TAGGER}/stats", timeout=30).json()
    sizes = {
        b["batch_size"]: b["compute_infer"]["count"] for b in stats["model_stats"][0]["batch_stats"]
    }
    assert max(sizes) > 1, sizes


def test_tsctl_tags_and_embeds_through_triton_unchanged(triton, tmp_path, reference):
    """The v2 commands with ``--url``: a broken file fails alone, the rest are answered."""
    import subprocess

    from tsclient.vectors import read_matrix

    paths = []
    for i, photo in enumerate(PHOTOS):
        paths.append(tmp_path / f"p{i}.img")
        paths[-1].write_bytes(photo)
    (tmp_path / "broken.jpg").write_bytes(b"not an image")
    env = dict(os.environ, PYTHONPATH=str(REPO))  # this checkout's client

    def tsctl(*argv):
        return subprocess.run(
            [str(REPO / ".venv" / "bin" / "tsctl"), *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    tagged = tsctl(
        "--json",
        "tag",
        "--url",
        triton.url,
        "--topk",
        "3",
        *map(str, paths),
        str(tmp_path / "broken.jpg"),
    )
    assert tagged.returncode == 7, tagged.stderr  # some files failed
    answers = json.loads(tagged.stdout)
    assert all(len(answers[str(p)]) == 3 for p in paths)
    assert "InvalidImage" in answers[str(tmp_path / "broken.jpg")]["error"]
    out = tmp_path / "emb.parquet"
    embedded = tsctl("embed", "--url", triton.url, *map(str, paths), "--out", str(out))
    assert embedded.returncode == 0, embedded.stderr
    names, matrix = read_matrix(out)
    for name, row in zip(names, matrix):
        expected = reference(PHOTOS[[str(p) for p in paths].index(name)])[0]
        assert rel_error(row / np.linalg.norm(row), expected / expected.norm()) <= 1e-4


@pytest.mark.slow
@pytest.mark.integration
def test_the_same_json_body_gets_torchserves_answer(triton, tmp_path_factory, model_store):
    """TorchServe at the same precision (f32), the same v2 JSON body to both: the same
    embeddings (cosine >= 0.9999) and the same tags, computed from the same forward."""
    body = {
        "inputs": [
            {
                "name": "images",
                "datatype": "BYTES",
                "shape": [len(PHOTOS), 1],
                "data": [base64.b64encode(i).decode() for i in PHOTOS],
            }
        ]
    }
    with variant_server(
        tmp_path_factory, model_store, EMBEDDING, handler={"precision": "f32"}
    ) as ts:
        ask = {**body, "outputs": [{"name": "embedding"}, {"name": "tags"}]}
        answer = requests.post(
            f"{ts.inference_url}/predictions/{EMBEDDING}",
            json=ask,
            headers=ts.keys.inference_headers(),
            timeout=300,
        )
        assert answer.status_code == 200, answer.text
        assert answer.headers["X-Precision"] == "f32"
    theirs = {o["name"]: o for o in answer.json()["outputs"]}
    ours = output(infer(triton, EMBEDDING, PHOTOS), "embedding")
    expected = np.array(theirs["embedding"]["data"], dtype=np.float64).reshape(ours.shape)
    for mine, their in zip(ours.astype(np.float64), expected):
        assert mine @ their / np.linalg.norm(mine) / np.linalg.norm(their) >= 0.9999
    tags = output(infer(triton, TAGGER, PHOTOS), "tags")
    their_tags = np.array(theirs["tags"]["data"], dtype=object).reshape(theirs["tags"]["shape"])
    assert [[json.loads(t)["index"] for t in row] for row in tags] == [
        [json.loads(t)["index"] for t in row] for row in their_tags
    ]


def test_triton_stops_cleanly(triton):
    """Last in the module: SIGTERM ends Triton with exit code 0 and no model stub left."""
    stubs = psutil.Process(triton.process.pid).children(recursive=True)
    assert stubs  # one Python-backend stub per model instance
    assert triton.stop() == 0
    _, alive = psutil.wait_procs(stubs, timeout=30)
    assert alive == []
