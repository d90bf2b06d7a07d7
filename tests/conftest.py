"""Shared fixtures: weights, archives, the reference model, one TorchServe and one Triton per
session, and the runtime image the container tests start."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from buildsteps.configgen import bulk_lanes, model_names
from tests.reference import Reference

REPO = Path(__file__).resolve().parent.parent
MODELS = tuple(model_names())  # resnet50-embedding, resnet50-tagger
# What a local TorchServe and Triton register: the models and their bulk lanes
# (resnet50-embedding-bulk); KServe's runtimes register MODELS only.
SERVED = tuple(sorted((*MODELS, *bulk_lanes())))


@pytest.fixture(scope="session", autouse=True)
def precision_cache(tmp_path_factory):
    """Workers started by tests (in process or by a TorchServe) remember their precision
    choice in a folder of this session, not in the user's ~/.cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield


@pytest.fixture(scope="session")
def weights_dir(tmp_path_factory) -> Path:
    """The weights the archives were built from (``make weights``), else seeded ones."""
    built = REPO / "build" / "weights"
    if (built / "weights_info.json").is_file() and (built / "resnet50.pt").is_file():
        return built
    from buildsteps.weights import build

    out = tmp_path_factory.mktemp("weights")
    build("seeded", out)
    return out


@pytest.fixture(scope="session")
def reference(weights_dir) -> Reference:
    return Reference(weights_dir / "resnet50.pt")


@pytest.fixture(scope="session")
def model_store() -> Path:
    store = REPO / "model-store"
    missing = [m for m in MODELS if not (store / f"{m}.mar").is_file()]
    if missing:
        pytest.fail(
            f"archives {missing} missing from {store}: run `make archives` (or `make test`)"
        )
    return store


@pytest.fixture(scope="session")
def torchserve(tmp_path_factory, model_store):
    """One real TorchServe with both models, shared by every integration test, always stopped."""
    from devtools.server import LocalTorchServe

    server = LocalTorchServe(tmp_path_factory.mktemp("torchserve"), model_store)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="session")
def triton(tmp_path_factory, model_store):
    """One real Triton with every model (the repository pinned to f32, its APIs open), shared by
    the modules that need no other settings (a module with its own ``triton`` fixture, e.g. a
    key file or a cache, keeps it), always stopped. A test that kills a stub waits until the
    model answers again before it ends."""
    from tests.served import local_triton

    # A short exit timeout: stopping it does not wait 30 s for the clients' idle connections.
    with local_triton(tmp_path_factory.mktemp("triton"), model_store, exit_timeout=2) as server:
        yield server


HEAD_PER_LABEL = 12  # photos of each of devtools/scenes.py's four kinds: 9 trained on, 3 held out


@pytest.fixture(scope="session")
def head_photos(tmp_path_factory) -> Path:
    """A labelled set made here (devtools/scenes.py: four kinds of synthetic scene, a folder
    each), what test_head and test_own_served train heads on."""
    from devtools.scenes import labelled_set

    photos = tmp_path_factory.mktemp("head-photos") / "photos"
    labelled_set(photos, HEAD_PER_LABEL, seed=4800)
    return photos


@pytest.fixture(scope="session")
def trained_head(head_photos, torchserve, weights_dir, tmp_path_factory):
    """``tsctl head train`` through the session's TorchServe on ``head_photos``: (photos
    folder, the training's output folder, its JSON answer). test_head checks the training."""
    from tests.served import train_head

    photos = head_photos
    out = tmp_path_factory.mktemp("head") / "tagger"
    run = train_head(torchserve, photos, out, weights_dir)
    assert run.returncode == 0, run.stderr
    return photos, out, json.loads(run.stdout)


@pytest.fixture(scope="module")
def runtime_image() -> str:
    """The runtime image `make kserve-image` tagged last (both KServe runtimes run it); the test
    fails, saying what to run, when podman or docker or the image is missing. Under `make test`
    the image builds beside the tests: this waits for that build's exit status first."""
    from kserve_tools.engine import EngineMissing, engine
    from kserve_tools.image import NAME, image_id, version

    if status := os.environ.get("KSERVE_IMAGE_STATUS"):
        built_in_background(REPO / status)
    image = f"{NAME}:{version()}"
    try:
        engine()
    except EngineMissing as exc:
        pytest.fail(f"{exc} (make kserve-image-test installs podman where it can)")
    if image_id(image) is None:
        pytest.fail(f"no image {image}: run `make kserve-image` first")
    return image


def built_in_background(status: Path, limit_s: float = 1800) -> None:
    """Wait until `make test`'s background `make kserve-image` has written its exit status to
    ``status`` (at most ``limit_s``); a build that failed fails the test with its log's end."""
    deadline = time.monotonic() + limit_s
    while not (code := status.read_text().strip() if status.exists() else ""):
        if time.monotonic() > deadline:
            pytest.fail(f"make kserve-image wrote no exit status to {status} in {limit_s:.0f} s")
        time.sleep(1)
    if code != "0":
        log = status.with_suffix(".log")
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
        pytest.fail(f"make kserve-image failed (exit {code}); the end of {log}:\n{tail}")
