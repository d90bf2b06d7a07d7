"""The same models on Triton (issue #28): the server from the nvidia-pytriton wheel on a
repository generated from the archives (``tritonrepo``), asked over HTTP as a client would.

One Triton for the module, on free loopback ports, the repository pinned to f32 so its answers
can be held to the float32 reference (tests/reference.py) as tightly as f32 allows, with keys
on its restricted APIs as ``make serve-triton`` starts it; stopped at the end (the last test
checks that it stops cleanly). Skipped, saying why, when ``make triton-server`` could not
install the wheel.
"""

from __future__ import annotations

import base64
import importlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

import numpy as np
import psutil
import pytest
import requests
import torch

from buildsteps.configgen import bulk_lanes, frontend_settings, job_queue_size, repo_models
from serveclient import metrics as tsclient_metrics
from servecore.answers import Tag
from servecore.config import HandlerConfig
from servecore.edges.bodies import tag_json
from servecore.edges.tensor import parse_tensor
from servecore.errors import InvalidParameter, InvalidRequest, PayloadTooLarge
from servecore.preprocessor import Preprocessor
from servecore.request import Protocol
from serveshared.keys import TRITON_KEY_FILE, Keys
from tests.conftest import SERVED
from tests.handler_context import make_handler, run_batch
from tests.imagegen import jpeg, png
from tests.reference import assert_same_tags, rel_error, tolerance
from tests.served import local_triton, v2_body, variant_server
from tests.served import v2_infer as infer
from tritonrepo.generate import config_pbtxt
from tritonrepo.server import Triton, server_keys

REPO = Path(__file__).resolve().parent.parent
EMBEDDING, TAGGER = "resnet50-embedding", "resnet50-tagger"
HOST = "127.0.0.1"
GRPC_KEY = "triton-grpc-protocol-authorization"  # Triton's gRPC name of the Authorization key
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
            # A model with several heads names each tag's head, after the probability.
            named = {"label": label, "index": index, "probability": p, "head": "mine"}
            assert tag_json(Tag(label, index, p, "mine")) == json.dumps(named)


class FakeTensor:
    """``pb_utils.Tensor``: a name and its numpy array."""

    def __init__(self, name: str, array: np.ndarray) -> None:
        self.name, self.array = name, array

    def as_numpy(self) -> np.ndarray:
        return self.array


class FakeInput:
    """An input ``pb_utils.Tensor`` as the adapter reads it: its name is a method."""

    def __init__(self, name: str, array: np.ndarray) -> None:
        self.given, self.array = name, array

    def name(self) -> str:
        return self.given

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

    def __init__(
        self,
        images: list[bytes],
        parameters: str = "{}",
        request_id: str = "",
        outputs: tuple[str, ...] = (),
    ) -> None:
        self.images = np.array([[image] for image in images], dtype=object)
        self.text, self.id, self.outputs = parameters, request_id, outputs

    def request_id(self) -> str:
        return self.id

    def inputs(self) -> list[FakeInput]:
        return [FakeInput("images", self.images)]

    def requested_output_names(self) -> list[str]:
        """The outputs the client named (none: Triton then hands over every output)."""
        return list(self.outputs)

    def parameters(self) -> str:
        return self.text


@pytest.fixture
def fake_pb_utils(monkeypatch):
    """The Python backend's ``triton_python_backend_utils`` as far as tritonrepo/model.py uses
    it, so that the adapter runs without a Triton server."""
    module = types.ModuleType("triton_python_backend_utils")
    module.Tensor, module.TritonError = FakeTensor, FakeError
    module.InferenceResponse, module.MetricFamily = FakeResponse, NoMetricFamily
    module.triton_string_to_numpy = {
        "TYPE_FP32": np.float32,
        "TYPE_STRING": np.object_,
        "TYPE_BOOL": np.bool_,
    }.__getitem__
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", module)
    monkeypatch.delitem(sys.modules, "tritonrepo.model", raising=False)
    yield importlib.import_module("tritonrepo.model")
    sys.modules.pop("tritonrepo.model", None)


def triton_model(
    module, weights_dir: Path, task: str, serialized: str = "resnet50_dual.xml", **settings
):
    """The adapter's model, initialised as Triton would with a generated config (f32) and
    the ``handler:`` ``settings`` given."""
    output = {
        "embedding": {"name": "embedding", "data_type": "TYPE_FP32", "dims": [2048]},
        "tags": {"name": "tags", "data_type": "TYPE_STRING", "dims": [-1]},
    }[task]
    handler = {"task": task, "precision": "f32", "draft_decode": False, **settings}
    config = {
        "name": task,
        "max_batch_size": 8,
        "output": [output],
        "parameters": {
            "serialized_file": {"string_value": serialized},
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
    JSON on the path is reading each request's parameters (not even that for Triton's empty
    "{}")."""
    tagger = triton_model(fake_pb_utils, weights_dir, "tags")
    embedder = triton_model(fake_pb_utils, weights_dir, "embedding")
    labels = tagger.model.answers.classes.labels
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
    assert loaded == ['{"topk": 3}'] * 2
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


def test_the_triton_adapter_answers_every_head_of_a_model_with_several(
    fake_pb_utils, weights_dir, tmp_path
):
    """ImageNet's head and a 3-class head on the same backbone (buildsteps.weights
    --add-head): the tags tensor holds each head's top k, each element naming its head."""
    from buildsteps import weights

    state = torch.load(weights_dir / "resnet50.pt", weights_only=True)
    torch.save({**state, "fc.weight": state["fc.weight"][:3], "fc.bias": state["fc.bias"][:3]},
               tmp_path / "mine.pt")  # fmt: skip
    (tmp_path / "mine.txt").write_text("receipt\nscreenshot\nwhiteboard\n")
    added = weights.AddedHead("mine", tmp_path / "mine.pt", tmp_path / "mine.txt")
    weights.build(str(weights_dir / "resnet50.pt"), tmp_path / "1", heads=[added])
    tagger = triton_model(fake_pb_utils, tmp_path / "1", "tags", serialized="resnet50.pt")
    (answer,) = tagger.execute([FakeRequest(PHOTOS[:1], '{"topk": 2}', "a")])
    assert answer.error is None
    assert answer.tensors["tags"].shape == (1, 4)
    tags = [json.loads(t) for t in answer.tensors["tags"][0]]
    assert [t["head"] for t in tags] == ["imagenet", "imagenet", "mine", "mine"]
    assert {t["label"] for t in tags[2:]} <= {"receipt", "screenshot", "whiteboard"}
    assert all(1000 <= t["index"] < 1003 for t in tags[2:])


def test_the_triton_adapter_marks_each_image_the_cache_answered(fake_pb_utils, weights_dir):
    """Issue #37: the ``cached`` output, one bool per image: False everywhere with the cache
    off; with it on, True for the image answered before, whose tags are the same tensors."""
    off = triton_model(fake_pb_utils, weights_dir, "tags")
    on = triton_model(fake_pb_utils, weights_dir, "tags", cache_bytes=1 << 24)
    for model in (off, on):
        model.edge.dtypes["cached"] = np.bool_  # as the generated config.pbtxt declares it
    first = on.execute([FakeRequest(PHOTOS[:1])])[0]
    both = on.execute([FakeRequest(PHOTOS[:2])])[0]
    plain = off.execute([FakeRequest(PHOTOS[:2])])[0]
    assert first.tensors["cached"].tolist() == [[False]]
    assert both.tensors["cached"].tolist() == [[True], [False]]
    assert both.tensors["cached"].dtype == np.bool_
    assert plain.tensors["cached"].tolist() == [[False], [False]]
    assert both.tensors["tags"][0].tolist() == first.tensors["tags"][0].tolist()


def test_the_triton_adapter_builds_only_the_outputs_a_request_names(fake_pb_utils, weights_dir):
    """Issue #49: a request naming its outputs gets those (Triton would drop the rest); one
    naming none gets every declared output, as Triton hands it over then."""
    tagger = triton_model(fake_pb_utils, weights_dir, "tags")
    tagger.edge.dtypes["precision"] = np.object_  # as the generated config.pbtxt declares it
    declared = set(tagger.edge.dtypes)
    tags_only, with_precision, every = tagger.execute(
        [
            FakeRequest(PHOTOS[:1], outputs=("tags",)),
            FakeRequest(PHOTOS[:1], outputs=("tags", "precision")),
            FakeRequest(PHOTOS[:1]),
        ]
    )
    assert set(tags_only.tensors) == {"tags"}
    assert set(with_precision.tensors) == {"tags", "precision"}
    assert set(every.tensors) == declared
    assert tags_only.tensors["tags"].tolist() == every.tensors["tags"].tolist()
    assert with_precision.tensors["precision"].tolist() == every.tensors["precision"].tolist()


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


class CountingFamily:
    """``pb_utils.MetricFamily`` that sums what every series of every family is told into
    ``counted``, keyed by the metric's name and its own labels' values."""

    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    counted: ClassVar[dict[tuple[str, tuple[str, ...]], float]] = {}

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name = name

    def Metric(self, labels: dict, buckets=None):  # noqa: N802 - pb_utils' name
        own = tuple(v for k, v in labels.items() if k not in ("model", "engine", "Hostname"))
        key = (self.name, own)

        def add(value: float) -> None:
            self.counted[key] = self.counted.get(key, 0.0) + value

        return types.SimpleNamespace(increment=add, set=add, observe=add)


def torchserve_counted(records) -> dict[tuple[str, tuple[str, ...]], float]:
    """The same sums from the lines TorchServe's metric objects emit (``[METRICS]name.Unit:
    value|#model:...,engine:torchserve,label:value|...``)."""
    counted: ClassVar[dict[tuple[str, tuple[str, ...]], float]] = {}
    for record in records:
        for name, value, dims in re.findall(
            r"\[METRICS\](resnet50_\w+)\.\w+:([0-9.]+)\|#([^|]*)\|", record.getMessage()
        ):
            own = tuple(d.split(":", 1)[1] for d in dims.split(",")[2:])
            counted[(name, own)] = counted.get((name, own), 0.0) + float(value)
    return counted


def test_a_batch_counts_the_same_on_both_engines(fake_pb_utils, weights_dir, caplog, monkeypatch):
    """One batch (a photo, a broken image, a photo) through TorchServe's handler and Triton's
    adapter: the same requests, images and errors by type counted, and the answer time
    recorded by both (the core times answering with each edge's writing, on either engine)."""
    monkeypatch.setattr(CountingFamily, "counted", {})
    monkeypatch.setattr(fake_pb_utils.pb_utils, "MetricFamily", CountingFamily)
    tagger = triton_model(fake_pb_utils, weights_dir, "tags")
    images = [PHOTOS[0], b"\xff\xd8\xff\xe0 not a JPEG", PHOTOS[1]]
    tagger.execute([FakeRequest([image]) for image in images])
    handler, context = make_handler(weights_dir, task="tags", precision="f32", draft_decode=False)
    with caplog.at_level("INFO", logger="ts.metrics"):
        run_batch(handler, context, [{"body": image} for image in images])
    on_torchserve, on_triton = torchserve_counted(caplog.records), CountingFamily.counted
    for key in (
        ("resnet50_requests_total", ()),
        ("resnet50_images_total", ()),
        ("resnet50_errors_total", ("InvalidImage",)),
    ):
        assert on_torchserve[key] == on_triton[key], key
    assert on_triton[("resnet50_images_total", ())] == 2
    answer_ms = ("resnet50_answer_ms_total", ())
    assert on_torchserve[answer_ms] > 0 and on_triton[answer_ms] > 0


@pytest.mark.parametrize("model", [EMBEDDING, TAGGER])
def test_config_pbtxt_carries_the_model_yaml(model):
    yaml_path = REPO / "config" / "models" / f"{model}.yaml"
    settings = frontend_settings(yaml_path)
    text = config_pbtxt(model, settings, {"task": "tags"}, "resnet50_dual.xml", queue_size=16)
    assert f"max_batch_size: {settings['batchSize']}\n" in text
    assert f"max_queue_delay_microseconds: {settings['maxBatchDelay'] * 1000} " in text
    assert f"count: {settings['minWorkers']} kind: KIND_CPU" in text
    assert 'string_value: "{\\"task\\": \\"tags\\"}"' in text
    assert "EXECUTION_ENV_PATH" not in text
    # Overload is refused, not queued: the bound, and a request queued past responseTimeout.
    assert (
        "default_queue_policy { max_queue_size: 16 timeout_action: REJECT "
        f"default_timeout_microseconds: {settings['responseTimeout'] * 1_000_000} }}"
    ) in text
    assert (
        'output [ { name: "tags" data_type: TYPE_STRING dims: [ -1 ] }, '
        '{ name: "precision" data_type: TYPE_STRING dims: [ 1 ] }, '
        '{ name: "describe" data_type: TYPE_STRING dims: [ 1 ] }, '
        '{ name: "explanations" data_type: TYPE_STRING dims: [ 1 ] }, '
        '{ name: "cached" data_type: TYPE_BOOL dims: [ 1 ] } ]' in text
    )
    with pytest.raises(ValueError, match="at least 1"):
        config_pbtxt(model, settings, {"task": "tags"}, "resnet50_dual.xml", queue_size=0)
    packed = config_pbtxt(
        model, settings, {"task": "tags"}, "resnet50_dual.xml", "env.tar.gz", queue_size=16
    )
    assert (
        'key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" }'
    ) in packed


def test_config_pbtxt_queues_interactive_before_bulk_each_with_its_bound():
    """Issue #37: two priority levels, interactive (1) the default; each level REJECTs after
    responseTimeout unless the request's own ``timeout`` is shorter; bulk holds what a
    collection job keeps in flight (2 x batchSize x workers: 2 x 16 x 1)."""
    settings = {"batchSize": 16, "maxBatchDelay": 10, "responseTimeout": 120, "minWorkers": 1}
    text = config_pbtxt(TAGGER, settings, {"task": "tags"}, "resnet50_dual.xml", queue_size=16)
    policy = "timeout_action: REJECT default_timeout_microseconds: 120000000"
    assert (
        "priority_levels: 2 default_priority_level: 1 "
        f"default_queue_policy {{ max_queue_size: 16 {policy} }} "
        f"priority_queue_policy {{ key: 1 value: {{ max_queue_size: 16 {policy} "
        "allow_timeout_override: true } } "
        f"priority_queue_policy {{ key: 2 value: {{ max_queue_size: 32 {policy} "
        "allow_timeout_override: true } } }"
    ) in text
    roomy = config_pbtxt(TAGGER, settings, {"task": "tags"}, "x.xml", queue_size=64)
    assert "key: 2 value: { max_queue_size: 64 " in roomy  # never below the interactive bound


def test_the_adapter_fails_a_bad_forwarded_header_alone(fake_pb_utils, weights_dir):
    """``X-Priority`` / ``X-Deadline`` reach the adapter as request parameters (HTTP: the name
    as sent, gRPC: lower case); a value the core cannot read is that request's 400."""
    tagger = triton_model(fake_pb_utils, weights_dir, "tags")
    responses = tagger.execute(
        [
            FakeRequest([PHOTOS[0]], '{"X-Priority": "urgent"}'),
            FakeRequest([PHOTOS[1]], '{"x-deadline": "tomorrow"}'),
            FakeRequest([PHOTOS[2]], '{"x-priority": "bulk"}'),
        ]
    )
    for response, name in zip(responses, ("priority", "X-Deadline")):
        body = json.loads(response.error.message)
        assert (response.error.code, body["code"], body["type"]) == (
            FakeError.INVALID_ARG,
            400,
            "InvalidParameter",
        )
        assert body["message"].startswith(f"{name} must be")
    assert responses[2].error is None and responses[2].tensors["tags"].shape == (1, 5)


def test_the_launcher_restricts_each_api_group_to_its_key_from_a_kept_key_file(tmp_path):
    """``Triton.command()``: inference and metadata want the inference key, the repository,
    configuration, statistics, trace, logging and shared-memory APIs the management key, over
    HTTP and gRPC; health is left open. The key file (0600) survives a restart; ``new`` (the
    launcher's --new-keys) replaces it; no key file: every API open."""
    key_file = tmp_path / "key_file.json"
    keys = Triton(tmp_path, key_file=key_file).keys
    assert key_file.stat().st_mode & 0o777 == 0o600 and keys == Keys.read(key_file)
    inference = "inference,metadata"
    management = "model-repository,model-config,statistics,trace,logging,shared-memory"
    restricted = [f for f in Triton(tmp_path, key_file=key_file).command() if "restricted" in f]
    assert restricted == [
        f"--http-restricted-api={inference}:Authorization=Bearer {keys.inference}",
        f"--grpc-restricted-protocol={inference}:authorization=Bearer {keys.inference}",
        f"--http-restricted-api={management}:Authorization=Bearer {keys.management}",
        f"--grpc-restricted-protocol={management}:authorization=Bearer {keys.management}",
    ]
    assert keys.inference != keys.management and keys.expires("inference") is None
    rotated = server_keys(key_file, new=True)
    assert rotated.inference != keys.inference and rotated.management != keys.management
    assert not any("restricted" in f for f in Triton(tmp_path).command())


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
    work = tmp_path_factory.mktemp("triton")
    with local_triton(work, model_store, key_file=work / "key_file.json") as server:
        yield server


def output(response: requests.Response, name: str) -> np.ndarray:
    """Output ``name`` of a 200 answer, which names its precision for every image."""
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o for o in response.json()["outputs"]}
    out = outputs[name]
    assert outputs["precision"]["data"] == ["f32"] * out["shape"][0]  # the pinned precision
    return np.array(
        out["data"], dtype=object if out["datatype"] == "BYTES" else np.float32
    ).reshape(out["shape"])


def stats(triton, model: str) -> dict:
    """Triton's statistics of ``model`` (a management API: the management key)."""
    answer = requests.get(
        f"{triton.url}/v2/models/{model}/stats",
        timeout=30,
        headers=triton.keys.management_headers(),
    )
    assert answer.status_code == 200, answer.text
    return answer.json()["model_stats"][0]


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
        meta = requests.get(
            f"{triton.url}/v2/models/{model}", timeout=30, headers=triton.keys.inference_headers()
        ).json()
        assert meta["inputs"] == [
            {"name": "images", "datatype": "BYTES", "shape": [-1, 1]},
            {"name": "crops", "datatype": "UINT8", "shape": [-1, 224, 224, 3]},  # issue #44
        ]
        assert meta["outputs"] == [{"name": out, "datatype": datatype, "shape": shape}] + [
            {"name": name, "datatype": "BYTES", "shape": [-1, 1]}  # tests/test_triton_ops.py
            for name in ("precision", "describe", "explanations")
        ] + [{"name": "cached", "datatype": "BOOL", "shape": [-1, 1]}]
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
    result = client.infer(
        TAGGER, [tensor], parameters={"topk": 3}, headers=triton.keys.inference_headers()
    )
    binary = result.as_numpy("tags")
    assert result.as_numpy("precision").tolist() == [[b"f32"]] * len(PHOTOS)
    assert [[json.loads(t)["index"] for t in row] for row in binary] == [
        [json.loads(t)["index"] for t in row] for row in from_json
    ]


@pytest.mark.parametrize(("model", "name"), [(EMBEDDING, "embedding"), (TAGGER, "tags")])
def test_binary_outputs_read_back_as_the_json_answer(triton, model, name):
    """Triton writes binary outputs itself (the extension's ``binary_data``): the same float32
    values and tags as its JSON answer, as on TorchServe (tests/test_binary_outputs.py)."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(triton.url.removeprefix("http://"))
    tensor = httpclient.InferInput("images", [len(PHOTOS), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[p] for p in PHOTOS], dtype=object), binary_data=True)
    asked = [httpclient.InferRequestedOutput(name, binary_data=True)]
    result = client.infer(model, [tensor], outputs=asked, headers=triton.keys.inference_headers())
    assert "binary_data_size" in result.get_output(name)["parameters"]
    plain = requests.post(
        f"{triton.url}/v2/models/{model}/infer",
        json={**v2_body(PHOTOS, {}), "outputs": [{"name": name}, {"name": "precision"}]},
        headers=triton.keys.inference_headers(),
        timeout=300,
    )
    if name == "embedding":
        np.testing.assert_array_equal(result.as_numpy(name), output(plain, name))
    else:
        assert [[json.loads(t) for t in row] for row in result.as_numpy(name)] == [
            [json.loads(t) for t in row] for row in output(plain, name)
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
    sizes = {
        b["batch_size"]: b["compute_infer"]["count"] for b in stats(triton, TAGGER)["batch_stats"]
    }
    assert max(sizes) > 1, sizes


def test_tsctl_tags_and_embeds_through_triton_unchanged(triton, tmp_path, reference):
    """The v2 commands with ``--url``: a broken file fails alone, the rest are answered."""
    import pyarrow.parquet as pq

    from serveclient.vectors import read_matrix

    paths = []
    for i, photo in enumerate(PHOTOS):
        paths.append(tmp_path / f"p{i}.img")
        paths[-1].write_bytes(photo)
    (tmp_path / "broken.jpg").write_bytes(b"not an image")
    # This checkout's client; --url takes a bearer token from TSCTL_TOKEN: the inference key.
    env = dict(os.environ, PYTHONPATH=str(REPO), TSCTL_TOKEN=triton.keys.inference)

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
    # Every row names the precision that computed it, as from TorchServe's X-Precision.
    assert pq.read_table(out, columns=["precision"]).column(0).to_pylist() == ["f32"] * len(paths)
    names, matrix = read_matrix(out)
    for name, row in zip(names, matrix):
        expected = reference(PHOTOS[[str(p) for p in paths].index(name)])[0]
        assert rel_error(row / np.linalg.norm(row), expected / expected.norm()) <= 1e-4


def grpc_client(triton):
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(f"{HOST}:{triton.ports['grpc']}")


def grpc_headers(keys_headers: dict) -> dict:
    """Triton's gRPC restriction reads the same value under its own metadata name."""
    return {GRPC_KEY: keys_headers["Authorization"]}


def grpc_infer(triton, model: str, images: list[bytes], **parameters):
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput("images", [len(images), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[i] for i in images], dtype=object))
    return grpc_client(triton).infer(
        model,
        [tensor],
        parameters=parameters or None,
        headers=grpc_headers(triton.keys.inference_headers()),
    )


@pytest.mark.parametrize(("model", "name"), [(EMBEDDING, "embedding"), (TAGGER, "tags")])
def test_grpc_answers_equal_http_answers(triton, model, name):
    """NVIDIA's gRPC client (KServe's Triton runtime serves gRPC on 9000): the same tensors as
    the JSON body over HTTP, each answer naming its precision, ``topk`` honoured."""
    topk = {"topk": 3} if name == "tags" else {}
    over_http = output(infer(triton, model, PHOTOS, **topk), name)
    over_grpc = grpc_infer(triton, model, PHOTOS, **topk)
    assert over_grpc.as_numpy("precision").tolist() == [[b"f32"]] * len(PHOTOS)
    if name == "embedding":
        np.testing.assert_array_equal(over_grpc.as_numpy(name), over_http)
    else:
        tags = over_grpc.as_numpy(name)
        assert tags.shape == (len(PHOTOS), 3)
        assert [[json.loads(t) for t in row] for row in tags] == [
            [json.loads(t) for t in row] for row in over_http
        ]


def test_a_broken_image_fails_alone_over_grpc_too(triton):
    from tritonclient.utils import InferenceServerException

    bodies = [[PHOTOS[0]], [b"\xff\xd8\xff\xe0 this is not a JPEG"], [PHOTOS[1]], [PHOTOS[2]]]
    start = threading.Barrier(len(bodies))

    def send(images):
        start.wait()
        try:
            return grpc_infer(triton, TAGGER, images)
        except InferenceServerException as exc:
            return exc

    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(send, bodies))
    refused = answers.pop(1)
    assert isinstance(refused, InferenceServerException)
    assert refused.status() == "StatusCode.INVALID_ARGUMENT"
    error = json.loads(refused.message())  # the core's own error body, as over HTTP
    assert error["type"] == "InvalidImage" and error["code"] == 400
    for answer in answers:
        assert answer.as_numpy("tags").shape == (1, 5)
        assert answer.as_numpy("precision").tolist() == [[b"f32"]]


def photo_crops() -> np.ndarray:
    """``PHOTOS`` as the served recipe crops them, as a client holds them: [n, 224, 224, 3]."""
    crop = Preprocessor(HandlerConfig())
    return np.stack([crop(p).permute(1, 2, 0).numpy() for p in PHOTOS])


@pytest.mark.parametrize(("model", "name"), [(EMBEDDING, "embedding"), (TAGGER, "tags")])
def test_crops_are_answered_bit_for_bit_as_the_encoded_images(triton, model, name):
    """Issue #44: the ``crops`` UINT8 input as a JSON body, as HTTP binary data and over gRPC
    gets the same numbers as the same photos sent encoded, in a request of the same size."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    topk = {"topk": 3} if name == "tags" else {}
    encoded = output(infer(triton, model, PHOTOS, **topk), name)
    crops = photo_crops()
    tensor = {"name": "crops", "datatype": "UINT8", "shape": list(crops.shape)}
    body = {"inputs": [{**tensor, "data": crops.reshape(-1).tolist()}], "parameters": topk}
    headers = triton.keys.inference_headers()
    url = f"{triton.url}/v2/models/{model}/infer"
    as_json = output(requests.post(url, json=body, headers=headers, timeout=300), name)
    np.testing.assert_array_equal(as_json, encoded)
    http_input = httpclient.InferInput("crops", list(crops.shape), "UINT8")
    http_input.set_data_from_numpy(crops, binary_data=True)
    client = httpclient.InferenceServerClient(triton.url.removeprefix("http://"))
    binary = client.infer(model, [http_input], parameters=topk or None, headers=headers)
    np.testing.assert_array_equal(plain(binary.as_numpy(name)), encoded)
    grpc_input = grpcclient.InferInput("crops", list(crops.shape), "UINT8")
    grpc_input.set_data_from_numpy(crops)
    over_grpc = grpc_client(triton).infer(
        model, [grpc_input], parameters=topk or None, headers=grpc_headers(headers)
    )
    np.testing.assert_array_equal(plain(over_grpc.as_numpy(name)), encoded)


def plain(answer: np.ndarray) -> np.ndarray:
    """tritonclient's BYTES elements as the JSON body's text (floats unchanged)."""
    return np.vectorize(bytes.decode, otypes=[object])(answer) if answer.dtype == object else answer


def test_a_wrong_crop_request_fails_alone_beside_good_ones(triton):
    """Channels first is Triton's own 400 (its config declares [224, 224, 3]); both inputs at
    once is the model's 400; encoded and crop requests around them are answered."""
    crops = photo_crops()[:1]
    tensor = {"name": "crops", "datatype": "UINT8"}
    good = {"inputs": [{**tensor, "shape": [1, 224, 224, 3], "data": crops.ravel().tolist()}]}
    channels_first = {
        "inputs": [{**tensor, "shape": [1, 3, 224, 224], "data": crops.ravel().tolist()}]
    }
    both = {"inputs": [*good["inputs"], *v2_body([PHOTOS[0]], {})["inputs"]]}
    bodies = [good, channels_first, v2_body([PHOTOS[0]], {}), both]
    start = threading.Barrier(len(bodies))

    def send(body):
        start.wait()
        return requests.post(
            f"{triton.url}/v2/models/{TAGGER}/infer",
            json=body,
            headers=triton.keys.inference_headers(),
            timeout=300,
        )

    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(send, bodies))
    assert [a.status_code for a in answers] == [200, 400, 200, 400]
    assert "[-1,224,224,3]" in answers[1].text.replace(" ", "")
    assert "send one input: 'images'" in answers[3].text
    assert output(answers[0], "tags").tolist() == output(answers[2], "tags").tolist()


def test_the_keys_guard_inference_and_management_and_leave_health_open(triton):
    """Triton's restricted APIs with the key file's keys: no key or the other kind's is refused
    (HTTP 403 naming the header; gRPC UNAVAILABLE), the right one answered; health and metrics
    need none."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    keys = triton.keys
    body = {
        "inputs": [
            {
                "name": "images",
                "datatype": "BYTES",
                "shape": [1, 1],
                "data": [base64.b64encode(PHOTOS[0]).decode()],
            }
        ]
    }
    infer_url = f"{triton.url}/v2/models/{TAGGER}/infer"
    index_url = f"{triton.url}/v2/repository/index"
    refusal = {"error": "This API is restricted, expecting header 'Authorization'"}
    for url, right, wrong in (
        (infer_url, keys.inference_headers(), keys.management_headers()),
        (index_url, keys.management_headers(), keys.inference_headers()),
    ):
        for headers in ({}, wrong, {"Authorization": "Bearer not-the-key"}):
            refused = requests.post(url, json=body, headers=headers, timeout=60)
            assert (refused.status_code, refused.json()) == (403, refusal), url
        assert requests.post(url, json=body, headers=right, timeout=60).status_code == 200
    assert requests.get(f"{triton.url}/v2/models/{TAGGER}/config", timeout=30).status_code == 403
    # Triton's own 400 echoes an unknown input name whole (docs/triton.md): without the key a
    # 1 MB name is refused before the body is read, in a short answer.
    long_name = {"inputs": [{**body["inputs"][0], "name": "x" * (1 << 20)}]}
    refused = requests.post(infer_url, json=long_name, timeout=60)
    assert (refused.status_code, refused.json()) == (403, refusal)
    echoed = requests.post(
        infer_url, json=long_name, headers=keys.inference_headers(), timeout=60
    )  # with it, Triton's 400 (no code of ours runs)
    assert echoed.status_code == 400 and len(echoed.content) > 1 << 20
    for open_url in (
        f"{triton.url}/v2/health/ready",
        f"{triton.url}/v2/models/{TAGGER}/ready",
        triton.metrics_url,
    ):
        assert requests.get(open_url, timeout=30).status_code == 200, open_url

    client = grpc_client(triton)
    assert client.is_server_ready() and client.is_model_ready(TAGGER)  # health: no key
    tensor = grpcclient.InferInput("images", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[PHOTOS[0]]], dtype=object))
    for headers in ({}, grpc_headers(keys.management_headers())):
        with pytest.raises(InferenceServerException) as refused:
            client.infer(TAGGER, [tensor], headers=headers)
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        assert (
            f"This protocol is restricted, expecting header '{GRPC_KEY}'" in refused.value.message()
        )
    answered = client.infer(TAGGER, [tensor], headers=grpc_headers(keys.inference_headers()))
    assert answered.as_numpy("tags").shape == (1, 5)
    with pytest.raises(InferenceServerException):
        client.get_model_repository_index(headers=grpc_headers(keys.inference_headers()))
    index = client.get_model_repository_index(
        headers=grpc_headers(keys.management_headers()), as_json=True
    )
    assert sorted(m["name"] for m in index["models"]) == list(SERVED)


def test_an_open_loop_flood_is_refused_at_the_queue_bound_not_queued(triton):
    """A few hundred requests at once, beyond the queue bound (TorchServe's job_queue_size):
    the excess is answered 503 at once instead of queued, so the last answer comes back long
    before a queue holding them all would have drained; a request right after is answered."""
    bound = job_queue_size()
    config = (triton.repository / TAGGER / "config.pbtxt").read_text()
    assert f"max_queue_size: {bound} timeout_action: REJECT" in config
    max_batch = frontend_settings(REPO / "config" / "models" / f"{TAGGER}.yaml")["batchSize"]
    before = stats(triton, TAGGER)
    flood = 300
    body = {
        "inputs": [
            {
                "name": "images",
                "datatype": "BYTES",
                "shape": [1, 1],
                "data": [base64.b64encode(jpeg(64, 64, seed=7)).decode()],
            }
        ]
    }
    start = threading.Barrier(flood)

    def send(_):
        session = requests.Session()  # connected before the barrier: the flood is the posts
        session.get(f"{triton.url}/v2/health/live", timeout=60)
        start.wait()
        began = time.monotonic()
        answer = session.post(
            f"{triton.url}/v2/models/{TAGGER}/infer",
            json=body,
            headers=triton.keys.inference_headers(),
            timeout=300,
        )
        return answer.status_code, answer.json(), time.monotonic() - began

    with ThreadPoolExecutor(flood) as pool:
        answers = list(pool.map(send, range(flood)))
    refused = [a for a in answers if a[0] != 200]
    served = [a for a in answers if a[0] == 200]
    assert refused and served
    assert {(status, body["error"].split("] ", 1)[-1]) for status, body, _ in refused} == {
        (503, "Exceeds maximum queue size")
    }
    # Triton's own statistics: what it ran for the flood, batch by batch.
    after = stats(triton, TAGGER)
    batches = after["execution_count"] - before["execution_count"]
    compute_s = (
        after["inference_stats"]["compute_infer"]["ns"]
        - before["inference_stats"]["compute_infer"]["ns"]
    ) / 1e9
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"][
        "count"
    ] == len(served)
    # Queued without a bound, the last of them would wait for every batch before it:
    # flood / max_batch batches at least, each as long as this flood's batches took.
    drained_s = flood / max_batch * compute_s / batches
    assert max(seconds for _, _, seconds in served) < drained_s / 2, (drained_s, len(served))
    assert output(infer(triton, TAGGER, PHOTOS[:2]), "tags").shape == (2, 5)


def post(triton, model: str, images: list[bytes], headers: dict, **parameters):
    """``v2_body(images, parameters)`` to ``triton``'s v2 route with ``headers`` beside the key."""
    return requests.post(
        f"{triton.url}/v2/models/{model}/infer",
        json=v2_body(images, parameters),
        headers={**triton.keys.inference_headers(), **headers},
        timeout=300,
    )


def rejected(triton, model: str) -> float:
    """Triton's ``nv_inference_request_failure{reason="REJECTED"}`` of ``model``."""
    text = requests.get(triton.metrics_url, timeout=30).text
    return sum(
        value
        for name, labels, value in tsclient_metrics.samples(text)
        if name == "nv_inference_request_failure"
        and labels.get("model") == model
        and labels.get("reason") == "REJECTED"
    )


def test_bulk_requests_are_answered_by_parameter_and_by_header(triton):
    """Issue #37: ``priority: 2`` (Triton's own level, taken by its queue) and the forwarded
    ``X-Priority: bulk`` (what the core reads) are answered like interactive ones; a class
    the core cannot read is refused in its words, so the header did reach the model."""
    assert output(infer(triton, TAGGER, PHOTOS[:1], priority=2), "tags").shape == (1, 5)
    bulk = post(triton, TAGGER, PHOTOS[:2], {"X-Priority": "bulk"}, priority=2)
    assert output(bulk, "tags").shape == (2, 5)
    wrong = post(triton, TAGGER, PHOTOS[:1], {"X-Priority": "urgent"})
    assert wrong.status_code == 400
    body = json.loads(wrong.json()["error"])
    assert (body["type"], body["message"]) == (
        "InvalidParameter",
        "priority must be 1 or 'interactive', 2 or 'bulk' (0: the default, interactive), "
        "got 'urgent'",
    )


def test_a_past_x_deadline_is_refused_as_unavailable_with_the_cores_504_body(triton):
    """The core's DeadlineExceeded (504) has no Triton code of its own: HTTP 503, as Triton
    answers its own expired ``timeout``, the core's body in the message."""
    late = post(triton, TAGGER, PHOTOS[:1], {"X-Deadline": "1000000000"})
    assert late.status_code == 503
    body = json.loads(late.json()["error"])
    assert (body["code"], body["type"]) == (504, "DeadlineExceeded")
    assert output(post(triton, TAGGER, PHOTOS[:1], {"X-Deadline": "4102444800"}), "tags").shape == (
        1,
        5,
    )


def test_a_timeout_shorter_than_the_queue_is_refused_by_triton_before_the_model(triton):
    """A v2 ``timeout`` of 1 microsecond while the one instance computes an explanation:
    Triton's queue refuses it (503 "Request timeout expired", counted as REJECTED) and the
    model never sees it; the explanation is answered."""
    photo = (REPO / "build" / "samples" / "chelsea.jpg").read_bytes()
    before, stats_before = rejected(triton, TAGGER), stats(triton, TAGGER)
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(infer, triton, TAGGER, [photo], explain=True, n_steps=64)
        late = infer(triton, TAGGER, PHOTOS[:1], timeout=1)
        assert slow.result().status_code == 200
    assert late.status_code == 503
    assert late.json()["error"].split("] ", 1)[-1] == "Request timeout expired"
    assert rejected(triton, TAGGER) == before + 1
    after = stats(triton, TAGGER)
    success = after["inference_stats"]["success"]["count"]
    assert success == stats_before["inference_stats"]["success"]["count"] + 1


def test_tsctl_finds_tritons_key_file_where_make_serve_triton_writes_it(triton, tmp_path):
    """``tsctl tag --url`` against a Triton, run from a folder holding the key file where
    ``make serve-triton`` writes it (build/triton-key_file.json), needs no ``--key-file``."""
    (tmp_path / "build").mkdir()
    shutil.copy(triton.key_file, tmp_path / TRITON_KEY_FILE)
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(PHOTOS[0])
    tagged = subprocess.run(
        [str(REPO / ".venv" / "bin" / "tsctl"), "--json", "tag", str(photo), "--url", triton.url],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "TSCTL_KEY_FILE"}
        | {"PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tagged.returncode == 0, tagged.stderr
    (tags,) = json.loads(tagged.stdout).values()
    assert len(tags) == HandlerConfig().top_k and all(tag["label"] for tag in tags)


def test_tsctl_lists_checks_and_reads_triton_and_says_what_it_cannot(triton):
    """``list``, ``health``, ``metrics`` and ``describe`` with ``--url`` read Triton's
    repository, readiness, metrics and the model's own describe, with the key file's keys (the
    configuration by the management key, the describe request by the inference key);
    TorchServe's management commands say they are not available there."""

    def tsctl(*argv):
        return subprocess.run(
            [str(REPO / ".venv" / "bin" / "tsctl"), "--key-file", str(triton.key_file), *argv],
            env=dict(os.environ, PYTHONPATH=str(REPO)),
            capture_output=True,
            text=True,
            timeout=300,
        )

    infer(triton, TAGGER, PHOTOS[:2])  # something for the metrics to count
    listed = tsctl("--json", "list", "--url", triton.url)
    assert listed.returncode == 0, listed.stderr
    for row in json.loads(listed.stdout):
        model = bulk_lanes().get(row["model"], row["model"])  # a lane has its model's settings
        settings = frontend_settings(REPO / "config" / "models" / f"{model}.yaml")
        assert (row["version"], row["workers"], row["ready"], row["state"]) == (
            "1",
            settings["minWorkers"],
            settings["minWorkers"],
            "READY",
        )
        assert (row["batchSize"], row["maxBatchDelay"], row["maxQueueSize"]) == (
            settings["batchSize"],
            settings["maxBatchDelay"],
            job_queue_size(),
        )
    assert sorted(r["model"] for r in json.loads(listed.stdout)) == list(SERVED)
    health = tsctl("health", "--url", triton.url)
    assert health.returncode == 0, health.stderr
    assert health.stdout.splitlines() == [
        "server: ready (Triton)",
        *(f"{model}/1: READY" for model in SERVED),
    ]
    metrics_base = triton.metrics_url.removesuffix("/metrics")  # tsctl's URLs are bases
    read = tsctl("--metrics-url", metrics_base, "--json", "metrics", "--url", triton.url)
    assert read.returncode == 0, read.stderr
    tagger = json.loads(read.stdout)["models"][TAGGER]
    assert tagger["requests"] == stats(triton, TAGGER)["inference_stats"]["success"]["count"]
    assert tagger["images"] >= 2 and tagger["batches"] >= 1
    described = tsctl("--json", "describe", TAGGER, "--url", triton.url)
    assert described.returncode == 0, described.stderr
    [entry] = json.loads(described.stdout)
    assert (
        entry["batchSize"]
        == frontend_settings(REPO / "config" / "models" / f"{TAGGER}.yaml")["batchSize"]
    )
    assert entry["customizedMetadata"]["precision"] == "f32"  # the repository's pinned one

    keyless = subprocess.run(
        [str(REPO / ".venv" / "bin" / "tsctl"), "list", "--url", triton.url],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert keyless.returncode == 4  # a refused key
    assert "This API is restricted" in keyless.stderr and "--key-file" in keyless.stderr

    for argv in (
        ["register", "x.mar"],
        ["scale", TAGGER, "--min", "2"],
        ["set-default", TAGGER, "1"],
        ["unregister", TAGGER],
        ["keys", "--rotate", "inference"],
    ):
        refused = tsctl(*argv, "--url", triton.url)
        assert refused.returncode == 6, (argv, refused.stderr)
        assert f"error: not available on Triton: {argv[0]}" in refused.stderr
    # Pointed at Triton through TorchServe's own address options: the same, after its 404.
    behind = tsctl("--management-url", triton.url, "scale", TAGGER, "--min", "2")
    assert behind.returncode == 6 and "not available on Triton: scale" in behind.stderr


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


def test_the_launcher_forwards_exactly_the_cores_traffic_headers():
    """The launcher runs without servecore on its path (the KServe image), so it writes the
    header names out: they must be servecore.priority's and the W3C trace context's, in any
    capitalisation, and no others."""
    import re

    from servecore.stages import TRACEPARENT, TRACESTATE
    from serveshared.wire import DEADLINE_HEADER, PRIORITY_HEADER
    from tritonrepo.server import FORWARDED_HEADERS

    pattern = re.compile(FORWARDED_HEADERS)
    for name in (PRIORITY_HEADER, DEADLINE_HEADER, TRACEPARENT, TRACESTATE):
        assert pattern.search(name) and pattern.search(name.lower()), name
    for other in ("Authorization", "X-Top-K", "X-Priority-Extra", "x-deadlines", "baggage"):
        assert not pattern.search(other), other
