"""A KServe predictor pod's cold start: the bundle through the storage initializer, or from a
modelcar.

    python -m bench.coldstart            # -> results/coldstart.md (about 6 minutes on 2 cores)
    python -m bench.coldstart --runs 1   # one start of each kind

Each start is the runtime image run as kserve/runtime's ClusterServingRuntime runs it
(``kserve_tools.container``), timed from the pod's first step to the tagger's first v1
answer: through KServe's storage library downloading the bundle from moto's S3 server on
loopback (no network, so a lower bound), or from ``ModelcarPod`` with the bundle's image
already in the engine's store (bench/README.md). The kinds alternate; the report gives medians.
"""

from __future__ import annotations

import base64
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from bench.layout import IMAGES, REPO, SAMPLES, TAGGER, cli, parse
from bench.machine import dated, describe_machine, host
from bench.markdown import bullets, document, publish, table
from devtools.server import free_port
from kserve_tools import modelcar
from kserve_tools.bundle import bundle_name
from kserve_tools.container import ModelcarPod, RuntimeContainer
from kserve_tools.image import NAME, version
from kserve_tools.lint import RUNTIME_DIR
from kserve_tools.render import render

BUNDLE = REPO / "build" / "kserve" / bundle_name()
KINDS = ("storage initializer", "modelcar")
BUCKET = "models"
LOG = logging.getLogger("bench.coldstart")


@contextmanager
def local_s3(bundle: Path) -> Iterator[str]:
    """moto's S3 server on a free loopback port holding ``bundle`` as a folder, with the
    environment KServe gives the storage initializer for an S3 endpoint; the folder's URI."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "S3_VERIFY_SSL": "0",
    }
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
        client.create_bucket(Bucket=BUCKET)
        for path in modelcar.files(bundle):
            client.upload_file(str(path), BUCKET, f"{bundle.name}/{path.relative_to(bundle)}")
        yield f"s3://{BUCKET}/{bundle.name}/"
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key)
            else:
                os.environ[key] = value


def first_answer(pod: RuntimeContainer, began: float) -> dict:
    """Start ``pod``, ask the tagger once; seconds from ``began`` to ready and to the answer.
    The pod is removed whatever happens."""
    photo = base64.b64encode((SAMPLES / IMAGES["small"]).read_bytes()).decode()
    try:
        pod.start()
        ready = time.monotonic() - began
        answer = requests.post(
            f"{pod.inference_url}/v1/models/{TAGGER}:predict",
            json={"instances": [{"data": photo}]},
            timeout=120,
        )
        answer.raise_for_status()
        return {"ready_s": ready, "answer_s": time.monotonic() - began}
    finally:
        pod.remove()


def start_once(kind: str, container: dict, image: str, car: str, uri: str) -> dict:
    began = time.monotonic()
    if kind == "modelcar":
        return first_answer(ModelcarPod(container, image, car), began)
    from kserve_storage import Storage

    with tempfile.TemporaryDirectory(prefix="bench-coldstart-") as mount:
        Path(mount).chmod(0o755)  # the pod's uid 1000 reads it
        Storage.download(uri, mount)
        downloaded = time.monotonic() - began
        return {
            "download_s": downloaded,
            **first_answer(RuntimeContainer(container, image, Path(mount)), began),
        }


def measure(runs: int, bundle: Path) -> dict[str, list[dict]]:
    """``runs`` starts of each kind, alternating which goes first."""
    [runtime] = render(RUNTIME_DIR)
    container = runtime.obj["spec"]["containers"][0]
    image, car = f"{NAME}:{version()}", modelcar.build(bundle)
    starts: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    with local_s3(bundle) as uri:
        for i in range(runs):
            for kind in KINDS if i % 2 == 0 else reversed(KINDS):
                starts[kind].append(start_once(kind, container, image, car, uri))
                LOG.info("run %d, %s: %s", i + 1, kind, starts[kind][-1])
    return starts


def report(starts: dict[str, list[dict]], machine: dict, bundle: Path) -> str:
    size = sum(p.stat().st_size for p in modelcar.files(bundle)) / 1e6
    rows = []
    for kind, runs in starts.items():
        answers = [r["answer_s"] for r in runs]
        download = [r["download_s"] for r in runs if "download_s" in r]
        rows.append([kind, len(runs), statistics.median(download) if download else "-",
                     statistics.median(r["ready_s"] for r in runs), statistics.median(answers),
                     min(answers), max(answers)])  # fmt: skip
    each = "; ".join(
        kind + " " + ", ".join(f"{r['answer_s']:.1f}" for r in runs)
        for kind, runs in starts.items()
    )
    return document(
        "Cold start: the storage initializer's path and a modelcar",
        "Generated by `python -m bench.coldstart`; bench/coldstart.py says what a start is.",
        bullets([dated(), host(machine).replace(" cores;", " cores shared with other work;"),
                 f"The bundle of `make kserve-bundle` ({size:.0f} MB), the runtime's limits (the "
                 f"ClusterServingRuntime's), {len(starts[KINDS[0]])} start(s) of each kind, "
                 "alternating; seconds from the pod's first step"]),
        table("bundle | starts | download s | ready s | first answer s | min | max", rows,
              "lrrrrrr"),
        f"Each start's first answer, s: {each}.",
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = cli("python -m bench.coldstart", __doc__)
    parser.add_argument("--runs", type=int, default=3, help="starts of each kind")
    parser.add_argument("--bundle", type=Path, default=BUNDLE, help="make kserve-bundle's folder")
    args = parse(parser, argv)
    machine = describe_machine()
    starts = measure(args.runs, args.bundle)
    return publish(args.out / "coldstart.md", report(starts, machine, args.bundle))


if __name__ == "__main__":
    raise SystemExit(main())
