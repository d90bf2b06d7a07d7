"""The server fed crops against fed JPEGs (#44), on both engines: ``python -m bench.crops``
(``make bench-crops``, about 4 minutes) -> results/crops.md.

A client that decodes and crops on its own cores sends the model's input, a uint8 224x224x3
crop (150,528 bytes), as the v2 ``crops`` tensor in the binary tensor extension; the server
then decodes nothing. Measured here, on the embedding model of the shipped archives, one
engine at a time: closed-loop img/s and p50 of 1-image requests carrying the encoded photo
(TorchServe: the raw body on ``/predictions``; Triton: the ``images`` BYTES tensor, binary)
against the same photo's crop (``/v2/models/{model}/infer``, binary, on both), for a small JPEG
and a noisy 12 MP photo, and the bytes each request puts on the wire (its body; the JSON base64
form a v2 JSON client would send, for scale). On this 2-core host the load generator shares the
cores with the server: read the ratios.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench import report
from bench.layout import EMBEDDING, IMAGES, MODEL_STORE, RESULTS, SAMPLES, publish, setup_cli
from bench.loadgen import Endpoint, closed_loop
from bench.machine import dated
from bench.stats import summarize
from bench.triton import binary_request, triton_serving
from devtools.server import LocalTorchServe
from servecore.config import HandlerConfig
from servecore.preprocessor import Preprocessor
from serveshared.v2binary import binary_body, binary_tensor
from tritonrepo.generate import generate
from tritonrepo.install import NotInstalled, TritonInstall

PHOTOS = ("small", "12mp-noisy")
CLIENTS = 4


def crop_of(data: bytes) -> np.ndarray:
    """The photo as the server would crop it (its default handler settings), HWC uint8."""
    return Preprocessor(HandlerConfig())(data).permute(1, 2, 0).numpy()


def crops_request(crop: np.ndarray) -> tuple[bytes, dict[str, str]]:
    """One crop as the v2 ``crops`` tensor in the binary tensor extension: body, headers."""
    tensor = binary_tensor("crops", "UINT8", [1, *crop.shape], crop.nbytes)
    return binary_body({"inputs": [tensor], "outputs": [{"name": "embedding"}]}, crop.tobytes())


def json_base64_bytes(data: bytes) -> int:
    """The size of the same image in a v2 JSON request (BYTES, base64): what JSON costs."""
    body = {"inputs": [{"name": "images", "shape": [1], "datatype": "BYTES", "data": [""]}]}
    return len(json.dumps(body)) + len(base64.b64encode(data))


def measure(endpoints: dict[str, Endpoint], seconds: float) -> dict[str, dict]:
    """Closed-loop figures per named endpoint (after a short warm-up each)."""
    rows = {}
    for name, endpoint in endpoints.items():
        closed_loop(endpoint, CLIENTS, min(2.0, seconds / 3), 8)
        stats = summarize(closed_loop(endpoint, CLIENTS, seconds, 100_000))
        if stats.errors:
            raise RuntimeError(f"{name}: {stats.errors} errors {stats.error_kinds}")
        rows[name] = {"img_s": stats.throughput, "p50_ms": stats.p50_ms}
        print(f"{name}: {stats.throughput:.1f} img/s", file=sys.stderr)
    return rows


def torchserve_rows(photos: dict[str, bytes], work: Path, seconds: float) -> dict[str, dict]:
    models = [f"{EMBEDDING}.mar"]
    with LocalTorchServe(work / "torchserve", MODEL_STORE, load_models=models) as server:
        assert server.keys is not None
        auth = server.keys.inference_headers()
        endpoints = {}
        for name, data in photos.items():
            url = server.inference_url
            endpoints[f"torchserve {name} jpeg"] = Endpoint(
                f"{url}/predictions/{EMBEDDING}", auth, data
            )
            body, headers = crops_request(crop_of(data))
            endpoints[f"torchserve {name} crop"] = Endpoint(
                f"{url}/v2/models/{EMBEDDING}/infer", {**auth, **headers}, body
            )
        return measure(endpoints, seconds)


def triton_rows(photos: dict[str, bytes], work: Path, seconds: float) -> dict[str, dict]:
    generate(work / "repository", model_store=MODEL_STORE, lanes=False)
    with triton_serving(work / "repository", work / "triton.log") as triton:
        url = f"{triton.url}/v2/models/{EMBEDDING}/infer"
        endpoints = {}
        for name, data in photos.items():
            body, headers = binary_request(data, output="embedding")
            endpoints[f"triton {name} jpeg"] = Endpoint(url, headers, body)
            body, headers = crops_request(crop_of(data))
            endpoints[f"triton {name} crop"] = Endpoint(url, headers, body)
        return measure(endpoints, seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.crops", description=__doc__)
    parser.add_argument("--seconds", type=float, default=12.0, help="per measured row")
    parser.add_argument("--out", type=Path, default=RESULTS / "crops.md")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    setup_cli("crops", args.quiet)
    photos = {name: (SAMPLES / IMAGES[name]).read_bytes() for name in PHOTOS}
    engines: dict[str, Callable[..., dict[str, dict]]] = {"torchserve": torchserve_rows}
    try:
        TritonInstall().check()
        engines["triton"] = triton_rows
    except NotInstalled as exc:
        print(f"no Triton rows: {exc}", file=sys.stderr)
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-crops.") as tmp:
        for engine, run in engines.items():
            rows |= run(photos, Path(tmp) / engine, args.seconds)
    table = []
    for engine in engines:
        for name in photos:
            jpeg, crop = rows[f"{engine} {name} jpeg"], rows[f"{engine} {name} crop"]
            table.append(
                [
                    engine,
                    name,
                    report.fmt(jpeg["img_s"]),
                    report.fmt(crop["img_s"]),
                    f"{crop['img_s'] / jpeg['img_s']:.2f}x",
                    f"{jpeg['p50_ms']:.0f} / {crop['p50_ms']:.0f}",
                ]
            )
    sizes = [
        [
            name,
            f"{len(data):,}",
            f"{json_base64_bytes(data):,}",
            f"{len(crops_request(crop_of(data))[0]):,}",
            f"{json_base64_bytes(data) / len(crops_request(crop_of(data))[0]):.1f}x",
        ]
        for name, data in photos.items()
    ]
    lines = [
        "# The server fed crops against fed JPEGs",
        "",
        "Generated by `make bench-crops` (bench/crops.py): 1-image requests to the embedding "
        f"model, {CLIENTS} closed-loop clients, {args.seconds:g} s a row, one engine at a time.",
        "",
        dated(),
        "",
        *report.table(
            ["engine", "photo", "JPEG img/s", "crop img/s", "crop / JPEG", "p50 ms JPEG / crop"],
            table,
        ),
        "",
        "Bytes on the wire per image (request body):",
        "",
        *report.table(
            ["photo", "the file (raw body)", "v2 JSON, base64", "crop, binary", "JSON / crop"],
            sizes,
        ),
    ]
    text = "\n".join(lines) + "\n"
    return publish(args.out, text)


if __name__ == "__main__":
    raise SystemExit(main())
