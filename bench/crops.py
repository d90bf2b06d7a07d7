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

import base64
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.layout import EMBEDDING, IMAGES, MODEL_STORE, RESULTS, SAMPLES, cli, parse
from bench.loadgen import Endpoint, closed_loop
from bench.machine import dated
from bench.markdown import document, publish, table
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
    parser = cli("python -m bench.crops", __doc__, out=RESULTS / "crops.md")
    parser.add_argument("--seconds", type=float, default=12.0, help="per measured row")
    args = parse(parser, argv)
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
    table_rows = []
    for engine, name in ((e, n) for e in engines for n in photos):
        jpeg, crop = rows[f"{engine} {name} jpeg"], rows[f"{engine} {name} crop"]
        table_rows.append([engine, name, jpeg["img_s"], crop["img_s"],
                           f"{crop['img_s'] / jpeg['img_s']:.2f}x",
                           f"{jpeg['p50_ms']:.0f} / {crop['p50_ms']:.0f}"])  # fmt: skip
    sizes = []
    for name, data in photos.items():
        crop_size, json_size = len(crops_request(crop_of(data))[0]), json_base64_bytes(data)
        sizes.append([name, f"{len(data):,}", f"{json_size:,}", f"{crop_size:,}",
                      f"{json_size / crop_size:.1f}x"])  # fmt: skip
    text = document(
        "The server fed crops against fed JPEGs",
        "Generated by `make bench-crops` (bench/crops.py): 1-image requests to the embedding "
        f"model, {CLIENTS} closed-loop clients, {args.seconds:g} s a row, one engine at a time.",
        dated(),
        table("engine | photo | JPEG img/s | crop img/s | crop / JPEG | p50 ms JPEG / crop",
              table_rows),
        "Bytes on the wire per image (request body):",
        table("photo | the file (raw body) | v2 JSON, base64 | crop, binary | JSON / crop", sizes),
    )  # fmt: skip
    return publish(args.out, text)


if __name__ == "__main__":
    raise SystemExit(main())
