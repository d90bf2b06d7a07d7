"""The KServe data path on this machine, with KServe's own code: the bundle of
``make kserve-bundle`` downloaded by ``kserve-storage`` (the storage initializer's library) from
``file://`` and from ``s3://`` (a local moto S3), folder and ``.tar.gz``; TorchServe started
with the command, args and env of our ClusterServingRuntime (``kserve_tools.pod``); driven by
KServe's ``InferenceRESTClient`` (v1, v2) and ``tritonclient`` (v2) at once, with server-side
batching on. Answers are compared with the local server's (the session ``torchserve``)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import javaproperties
import numpy as np
import pytest
import requests

from buildsteps.configgen import repo_models
from devtools.server import free_port
from kserve_tools.bundle import build
from kserve_tools.lint import RUNTIME_DIR, bundle_findings
from kserve_tools.pod import MOUNT, RuntimePod
from kserve_tools.render import render
from model_files.artifacts import read_manifest
from tests import imagegen
from tests.conftest import MODELS, REPO
from tests.corpus import b64
from tests.reference import Agreement, rel_error
from tests.served import handled, raw_answer, settled

pytestmark = pytest.mark.integration
IMAGES = [imagegen.jpeg(400, 300, seed=300 + i) for i in range(6)]
TOPK = 3
BUCKET = "models"


def tree(root: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under ``root`` (symlinks followed, as a reader)."""
    out = {}
    for dirpath, _, files in os.walk(root, followlinks=True):
        for name in files:
            path = Path(dirpath) / name
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


# ------------------------------------------------------------------ fixtures, once per module


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, model_store):
    return build(tmp_path_factory.mktemp("kserve-bundle"), model_store=model_store)


@pytest.fixture(scope="module")
def s3(bundle):
    """A local S3 (moto's server on a free loopback port) holding the bundle as a folder under
    s3://models/resnet50-serve/ and as s3://models/archives/resnet50-serve.tar.gz. The
    environment is what KServe's controller gives the storage initializer for an S3 endpoint
    (AWS_ENDPOINT_URL, credentials), restored afterwards."""
    import boto3
    from moto.server import ThreadedMotoServer

    endpoint = f"http://127.0.0.1:{free_port()}"
    with pytest.MonkeyPatch.context() as env:
        for key, value in {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "S3_VERIFY_SSL": "0",
        }.items():
            env.setenv(key, value)
        server = ThreadedMotoServer(
            ip_address="127.0.0.1", port=int(endpoint.rsplit(":", 1)[1]), verbose=False
        )
        server.start()
        try:
            client = boto3.client("s3", endpoint_url=endpoint)
            client.create_bucket(Bucket=BUCKET)
            for rel in tree(bundle.folder):
                client.upload_file(str(bundle.folder / rel), BUCKET, f"{bundle.folder.name}/{rel}")
            client.upload_file(str(bundle.tarball), BUCKET, f"archives/{bundle.tarball.name}")
            yield f"s3://{BUCKET}"
        finally:
            server.stop()


def _uri(kind: str, bundle, s3_root: str) -> str:
    return {
        "file-folder": f"file://{bundle.folder}",
        "file-tgz": f"file://{bundle.tarball}",
        "s3-folder": f"{s3_root}/{bundle.folder.name}/",
        "s3-tgz": f"{s3_root}/archives/{bundle.tarball.name}",
    }[kind]


def download(uri: str, out: Path) -> Path:
    """What the storage-initializer container does with ``storageUri``."""
    from kserve_storage import Storage

    return Path(Storage.download(uri, str(out)))


@pytest.fixture(scope="module")
def container():
    """Our runtime's kserve-container, as kubectl apply -k kserve/runtime would create it."""
    [runtime] = render(RUNTIME_DIR)
    return runtime.obj["spec"]["containers"][0]


@pytest.fixture(scope="module")
def pod(tmp_path_factory, bundle, container):
    """The bundle's .tar.gz, unpacked by kserve-storage, served as the runtime starts it. (From
    ``file://``: the S3 download tests show S3 gives the same tree, and the pod then does not
    wait for another 500 MB through the in-process S3.)"""
    mount = download(_uri("file-tgz", bundle, "unused"), tmp_path_factory.mktemp("mnt-models"))
    server = RuntimePod(container, mount, tmp_path_factory.mktemp("pod"))
    server.start()
    try:
        server.workers_when_ready = _worker_states(server)  # right after the probe passed
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def agree(pod, torchserve) -> Agreement:
    """How closely the pod's answers must follow the local server's (each measured its own
    precision)."""
    return Agreement.between(pod, torchserve, IMAGES[0])


@pytest.fixture(scope="module")
def local_answers(torchserve):
    """Each image's embedding and top-3 tags from the local server, one request at a time."""
    return [
        (
            raw_answer(torchserve, "resnet50-embedding", image)["embedding"],
            raw_answer(torchserve, "resnet50-tagger", image, **{"X-Top-K": str(TOPK)}),
        )
        for image in IMAGES
    ]


# ------------------------------------------------------------------ storage


def test_bundle_is_consistent_and_lints_clean(bundle):
    assert sorted(p.name for p in (bundle.folder / "model-store").iterdir()) == sorted(
        f"{m}.mar" for m in MODELS
    )
    assert bundle_findings(bundle.folder) == []


@pytest.mark.parametrize("kind", ["file-folder", "file-tgz", "s3-folder", "s3-tgz"])
def test_kserve_storage_downloads_the_bundle(kind, bundle, s3, tmp_path):
    got = download(_uri(kind, bundle, s3), tmp_path / "mnt-models")
    try:
        assert got == tmp_path / "mnt-models"
        assert tree(got) == tree(bundle.folder)  # byte for byte: config/ and model-store/ on top
    finally:
        shutil.rmtree(got, ignore_errors=True)  # 190 MB a copy; pytest keeps tmp_path around


def test_canary_bundle_archives_the_store_backend_at_another_version(model_store, tmp_path):
    """``make kserve-bundle KSERVE_MODEL_VERSION=2.0`` (the canary overlay's storageUri):
    every archive at 2.0, with the backend and QUANTIZE of the archives in the store."""
    canary = build(tmp_path, version="2.0", model_store=model_store)
    assert canary.folder.name == "resnet50-serve-2.0"
    for model in MODELS:
        stored = read_manifest(model_store / f"{model}.mar")
        archived = read_manifest(canary.folder / "model-store" / f"{model}-2.0.mar")
        assert archived["modelVersion"] == "2.0"
        assert archived["serializedFile"] == stored["serializedFile"]
    assert bundle_findings(canary.folder) == []


def test_bundle_with_a_renamed_archive_fails_the_lint(bundle, tmp_path):
    copy = download(_uri("file-tgz", bundle, "unused"), tmp_path / "copy")
    (copy / "model-store" / "resnet50-tagger.mar").rename(copy / "model-store" / "tagger.mar")
    problems = [str(f) for f in bundle_findings(copy)]
    assert any(
        "models.resnet50-tagger.1.0.marName: resnet50-tagger.mar holds nothing" in p
        for p in problems
    ), problems


# ------------------------------------------------------------------ the runtime's command


def test_pod_runs_the_manifest_command_with_only_mount_and_ports_changed(pod, container):
    words = container["command"] + container["args"]
    assert pod.command() == [
        f"--ts-config={pod.config_path}"
        if w.startswith("--ts-config=")
        else w.replace(MOUNT, str(pod.mount))
        for w in words
    ]
    assert pod.bundle_config == pod.mount / "config" / "config.properties"
    shipped = javaproperties.loads(pod.bundle_config.read_text().replace(MOUNT, str(pod.mount)))
    running = javaproperties.loads(pod.config_path.read_text())
    changed = {k for k in shipped.keys() | running.keys() if shipped.get(k) != running.get(k)}
    assert changed <= set(pod.port_overrides), changed
    assert running["disable_token_authorization"] == "true"
    env = pod.env()
    for item in container["env"]:
        assert env[item["name"]] == item["value"]


def _worker_states(pod) -> dict[str, list[str]]:
    return {
        name: [
            w["status"]
            for w in requests.get(f"{pod.management_url}/models/{name}", timeout=30).json()[0][
                "workers"
            ]
        ]
        for name in MODELS
    }


def test_readiness_probe_passes_only_once_every_worker_is_loaded(pod):
    """The kubelet's view of start-up: the probe never passed before its last run, and when it
    first passed every model had its minWorkers workers READY (described right then)."""
    assert pod.readiness[-1] and not any(pod.readiness[:-1]), pod.readiness
    assert pod.workers_when_ready == {
        name: ["READY"] * settings["minWorkers"] for name, settings in repo_models().items()
    }
    assert pod.probe("livenessProbe")


def test_readiness_probe_fails_while_a_required_worker_loads(pod):
    scale = f"{pod.management_url}/models/resnet50-tagger"
    # One more required worker, started in the background: it needs seconds to load.
    assert (
        requests.put(
            scale, params={"min_worker": 2, "max_worker": 2, "synchronous": "false"}, timeout=30
        ).status_code
        == 202
    )
    try:
        assert not pod.probe("readinessProbe")
        # What the probe does not use: /ping and /v2/health/ready pass meanwhile.
        assert requests.get(f"{pod.inference_url}/ping", timeout=10).status_code == 200
        assert requests.get(f"{pod.inference_url}/v2/health/ready", timeout=10).json() == {
            "ready": True
        }
        pod.wait_ready(timeout=300)
        assert _worker_states(pod)["resnet50-tagger"] == ["READY", "READY"]
    finally:
        requests.put(
            scale, params={"min_worker": 1, "max_worker": 1, "synchronous": "true"}, timeout=300
        )
    assert pod.probe("readinessProbe")


# ------------------------------------------------------------------ KServe's and Triton's clients


def _kserve_sdk(*args: str) -> dict:
    """KServe's SDK in a process of its own (``tests/kserve_sdk.py`` says why): its JSON."""
    run = subprocess.run(
        [sys.executable, "-m", "tests.kserve_sdk", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def _kserve_calls(url: str, folder: Path) -> tuple[list, list, dict]:
    """v1 tags and v2 embedding+tags for every image, and one bad v1 request, all in flight
    at once through KServe's SDK."""
    files = []
    for i, image in enumerate(IMAGES):
        files.append(folder / f"{i}.jpg")
        files[-1].write_bytes(image)
    answers = _kserve_sdk("calls", url, str(TOPK), *map(str, files))
    return answers["v1"], answers["v2"], answers["bad"]


def _triton_call(url: str, image: bytes | None):
    """One tritonclient v2 request for the tagger; ``None``: a FP32 input (a 400)."""
    import tritonclient.http as triton
    from tritonclient.utils import InferenceServerException

    client = triton.InferenceServerClient(url=url.removeprefix("http://"), network_timeout=300)
    try:
        if image is None:
            data = triton.InferInput("images", [1], "FP32")
            data.set_data_from_numpy(np.array([1.0], dtype=np.float32), binary_data=False)
        else:
            data = triton.InferInput("images", [1], "BYTES")
            data.set_data_from_numpy(np.array([b64(image)], dtype=object), binary_data=False)
        result = client.infer(
            "resnet50-tagger",
            [data],
            parameters={"topk": TOPK},
            outputs=[triton.InferRequestedOutput("tags", binary_data=False)],
        )
        return [json.loads(s) for s in result.as_numpy("tags").reshape(-1)]
    except InferenceServerException as exc:
        return exc
    finally:
        client.close()


def test_kserve_and_triton_clients_get_the_local_answers_concurrently(
    pod, local_answers, agree, tmp_path
):
    before = {m: handled(pod, m) for m in MODELS}
    with ThreadPoolExecutor(max_workers=len(IMAGES) + 1) as pool:
        triton = pool.map(lambda image: _triton_call(pod.inference_url, image), [*IMAGES, None])
        v1, v2, bad_v1 = _kserve_calls(pod.inference_url, tmp_path)
        *triton_tags, bad_triton = list(triton)
    for i, (embedding, tags) in enumerate(local_answers):
        assert len(v1[i]["predictions"]) == 1
        agree.tags(v1[i]["predictions"][0], tags)
        outputs = v2[i]["outputs"]
        assert v2[i]["id"] == f"r-{i}" and v2[i]["model_name"] == "resnet50-embedding"
        assert outputs["embedding"]["shape"] == [1, len(embedding)]
        assert rel_error(outputs["embedding"]["data"], embedding) <= agree.embedding
        agree.tags([json.loads(s) for s in outputs["tags"]["data"]], tags)
        agree.tags(triton_tags[i], tags)
    # Per-request errors stay 4xx through both clients, and the requests around them succeed.
    assert bad_v1["status"] == 400
    assert bad_v1["body"]["type"] == "InvalidRequest"
    assert bad_triton.status() == "400"
    assert json.loads(bad_triton.debug_details())["type"] == "InvalidRequest"
    # Batching was on: fewer batches than requests for the models that got them at once.
    expected = 2 * len(IMAGES) + 2  # v1 and triton, each with one bad request
    after = settled(
        lambda: {m: handled(pod, m) for m in MODELS},
        lambda now: now["resnet50-tagger"][0] - before["resnet50-tagger"][0] >= expected,
    )
    tagger_requests = after["resnet50-tagger"][0] - before["resnet50-tagger"][0]
    tagger_batches = after["resnet50-tagger"][1] - before["resnet50-tagger"][1]
    assert tagger_requests == expected
    assert tagger_batches < tagger_requests


def test_v2_health_and_unknown_model_through_the_kserve_client(pod):
    answer = _kserve_sdk("health", pod.inference_url)
    assert answer == {"live": True, "ready": True, "unknown_model": 404}


def test_served_models_are_the_repository_models(pod):
    listed = requests.get(f"{pod.management_url}/models", timeout=30).json()["models"]
    assert sorted(m["modelName"] for m in listed) == sorted(repo_models())
