"""The runtime image in a real container (``make kserve-image-test``): built by
``make kserve-image`` (``kserve_tools.image``), started as the pod would start it
(``kserve_tools.container``): the rendered ClusterServingRuntime's command, args, env,
``securityContext`` and limits, ``/mnt/models`` the bundle of ``make kserve-bundle`` mounted
read-only, the port published on 127.0.0.1. Answers are compared with the local server's (the
session ``torchserve``), as in tests/test_kserve_runtime.py. Last, the same runtime reads that
bundle from its modelcar image (``make kserve-modelcar``) as KServe wires a pod for
``storageUri: oci://`` (``ModelcarPod``: one process namespace, the files through the modelcar
process's root)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess

import pytest
import requests

from buildsteps.configgen import repo_models
from kserve_tools import modelcar
from kserve_tools.bundle import build
from kserve_tools.container import MODELCAR_ARGS, MOUNT, ModelcarPod, RuntimeContainer
from kserve_tools.lint import RUNTIME_DIR
from kserve_tools.render import render
from tests import imagegen
from tests.corpus import b64
from tests.reference import Agreement, rel_error
from tests.served import inside, raw_answer

pytestmark = [pytest.mark.integration, pytest.mark.container]
IMAGES = [imagegen.jpeg(400, 300, seed=500 + i) for i in range(3)]
TOPK = 3


@pytest.fixture(scope="module")
def container():
    """Our runtime's kserve-container, as kubectl apply -k kserve/runtime would create it."""
    [runtime] = render(RUNTIME_DIR)
    return runtime.obj["spec"]["containers"][0]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, model_store):
    return build(tmp_path_factory.mktemp("kserve-bundle"), model_store=model_store)


@pytest.fixture(scope="module")
def pod(runtime_image, container, bundle):
    """The image running the bundle; removed whatever happens (the stop test stops it first)."""
    server = RuntimeContainer(container, runtime_image, bundle.folder)
    try:
        server.start()
        yield server
    finally:
        server.remove()
        shutil.rmtree(bundle.folder, ignore_errors=True)


def _worker_states(pod) -> dict[str, list[str]]:
    """Each model's worker states, asked of the loopback management API inside the container."""
    code = (
        "import json, urllib.request as u\n"
        "b = 'http://127.0.0.1:8081/models/'\n"
        f"print(json.dumps({{m: [w['status'] for w in json.load(u.urlopen(b + m))[0]"
        f"['workers']] for m in {sorted(repo_models())!r}}}))"
    )
    return json.loads(inside(pod, code))


# ------------------------------------------------------------------ what only a container shows


def test_container_runs_as_uid_1000_with_java_17_and_a_read_only_bundle(pod):
    assert pod.exec(["id", "-u"], timeout=30).stdout.strip() == "1000"
    java = pod.exec(["java", "-version"], timeout=60)
    assert 'version "17.' in java.stderr, java.stderr
    touched = pod.exec(["touch", f"{MOUNT}/config/written"], timeout=30)
    assert touched.returncode != 0 and "Read-only file system" in touched.stderr


def test_readiness_probe_fails_until_every_worker_is_loaded(pod):
    """The probe's exact command, run inside the container every second from `run` on: it
    failed first (nothing answering, then workers still loading) and passed only at its last
    run; once it passed every model had its minWorkers workers READY."""
    assert pod.readiness[-1] and not any(pod.readiness[:-1]), pod.readiness
    assert pod.readiness[0] is False
    # Some failures came from the management API itself: models registered, workers loading.
    assert any("workers loaded" in r or "no model registered" in r for r in pod.reasons), (
        pod.reasons
    )
    assert _worker_states(pod) == {
        name: ["READY"] * settings["minWorkers"] for name, settings in repo_models().items()
    }
    assert pod.probe("readinessProbe") and pod.probe("livenessProbe")
    print(f"\ncold start (container run -> readinessProbe passes): {pod.ready_after:.1f} s")


# ------------------------------------------------------------------ answers through the port


@pytest.fixture(scope="module")
def agree(pod, torchserve) -> Agreement:
    """How closely the pod's answers must follow the local server's (each measured its own
    precision)."""
    return Agreement.between(pod, torchserve, IMAGES[0])


@pytest.fixture(scope="module")
def local_answers(torchserve):
    return [
        (
            raw_answer(torchserve, "resnet50-embedding", image)["embedding"],
            raw_answer(torchserve, "resnet50-tagger", image, **{"X-Top-K": str(TOPK)}),
        )
        for image in IMAGES
    ]


def test_v1_and_v2_answers_equal_the_local_server(pod, local_answers, agree):
    for image, (embedding, tags) in zip(IMAGES, local_answers):
        v1 = requests.post(
            f"{pod.inference_url}/v1/models/resnet50-tagger:predict",
            json={"instances": [{"data": b64(image)}], "parameters": {"topk": TOPK}},
            timeout=120,
        )
        assert v1.status_code == 200, v1.text
        agree.tags(v1.json()["predictions"][0], tags)
        v2 = requests.post(
            f"{pod.inference_url}/v2/models/resnet50-embedding/infer",
            json={
                "id": "r-1",
                "parameters": {"topk": TOPK},
                "inputs": [
                    {"name": "images", "shape": [1], "datatype": "BYTES", "data": [b64(image)]}
                ],
                "outputs": [{"name": "embedding"}, {"name": "tags"}],
            },
            timeout=120,
        )
        assert v2.status_code == 200, v2.text
        outputs = {o["name"]: o for o in v2.json()["outputs"]}
        assert v2.json()["id"] == "r-1"
        assert rel_error(outputs["embedding"]["data"], embedding) <= agree.embedding
        agree.tags([json.loads(s) for s in outputs["tags"]["data"]], tags)


@pytest.mark.parametrize("data", ["not base64!", b64(b"GIF89a but not an image")])
def test_a_bad_image_gets_the_local_server_s_4xx(pod, torchserve, data):
    body = {"instances": [{"data": data}]}
    url = "/v1/models/resnet50-tagger:predict"
    got = requests.post(pod.inference_url + url, json=body, timeout=120)
    local = requests.post(
        torchserve.inference_url + url,
        json=body,
        timeout=120,
        headers=torchserve.keys.inference_headers(),
    )
    assert 400 <= got.status_code < 500, got.text
    assert (got.status_code, got.json()["type"]) == (local.status_code, local.json()["type"])


# ------------------------------------------------------------------ the kubelet's stop (last)


def test_sigterm_stops_torchserve_cleanly_within_the_grace_period(pod):
    code, seconds = pod.stop()
    state = pod.state()
    assert not state.get("OOMKilled"), state
    assert code == 0, f"exit code {code} after SIGTERM ({seconds:.1f} s):\n{pod.logs()}"
    assert seconds < pod.grace, f"{seconds:.1f} s: SIGKILL was needed"


# ------------------------------------------------------------------ the bundle from a modelcar


@pytest.fixture(scope="module")
def modelcar_pod(runtime_image, container, bundle):
    """The runtime beside the bundle's modelcar (``make kserve-modelcar``'s image when it holds
    this bundle: the key is the content; the tests above stopped the first pod); removed
    whatever happens."""
    server = ModelcarPod(container, runtime_image, modelcar.build(bundle.folder))
    try:
        server.start()
        yield server
    finally:
        server.remove()


def test_the_runtime_reads_the_modelcar_s_files_through_its_process_root(modelcar_pod, bundle):
    """/mnt/models is the modelcar shell's link to /proc/<its pid>/root/models, made after the
    runtime started (it waited: MODEL_INIT_MODE=async); through it the runtime reads the
    bundle byte for byte, and cannot change it."""
    link = modelcar_pod.exec(["readlink", MOUNT], timeout=30).stdout.strip()
    pid = link.removeprefix("/proc/").removesuffix("/root/models")
    assert pid.isdigit(), link
    cmdline = modelcar_pod.exec(["cat", f"/proc/{pid}/cmdline"], timeout=30).stdout
    assert cmdline.rstrip("\0").split("\0") == MODELCAR_ARGS
    started = {
        name: subprocess.run(
            [*modelcar_pod.engine, "inspect", "--format", "{{.State.StartedAt}}", name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for name in (modelcar_pod.name, modelcar_pod.sidecar)
    }
    assert started[modelcar_pod.name] < started[modelcar_pod.sidecar], started
    listing = modelcar_pod.exec(
        ["sh", "-c", f"cd {MOUNT}/ && find . -type f | sort | xargs sha256sum"], timeout=120
    )
    assert listing.returncode == 0, listing.stderr
    local = {
        f"./{path.relative_to(bundle.folder)}": hashlib.sha256(path.read_bytes()).hexdigest()
        for path in modelcar.files(bundle.folder)
    }
    assert dict(reversed(line.split()) for line in listing.stdout.splitlines()) == local
    touched = modelcar_pod.exec(["touch", f"{MOUNT}/config/written"], timeout=30)
    assert touched.returncode != 0 and "Permission denied" in touched.stderr


def test_the_runtime_answers_from_the_modelcar_as_the_local_server(
    modelcar_pod, torchserve, local_answers
):
    agree = Agreement.between(modelcar_pod, torchserve, IMAGES[0])
    for image, (_, tags) in zip(IMAGES, local_answers):
        v1 = requests.post(
            f"{modelcar_pod.inference_url}/v1/models/resnet50-tagger:predict",
            json={"instances": [{"data": b64(image)}], "parameters": {"topk": TOPK}},
            timeout=120,
        )
        assert v1.status_code == 200, v1.text
        agree.tags(v1.json()["predictions"][0], tags)
    assert modelcar_pod.readiness[-1] and not any(modelcar_pod.readiness[:-1])
    print(f"\ncold start, modelcar (first container -> ready): {modelcar_pod.ready_after:.1f} s")
