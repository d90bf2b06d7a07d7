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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from bench.layout import EMBEDDING, IMAGES, MODEL_STORE, RESULTS, SAMPLES, cli, parse
from bench.loadgen import Endpoint, closed_loop, v2_binary
from bench.machine import dated
from bench.markdown import document, publish, table
from bench.stats import summarize
from bench.triton import missing, triton_serving
from devtools.server import LocalTorchServe
from servecore.config import HandlerConfig
from servecore.preprocessor import Preprocessor
from serveshared.v2binary import binary_body, binary_tensor
from tritonrepo.generate import generate

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


@contextmanager
def serving(engine: str, work: Path) -> Iterator[tuple]:
    """The engine serving the embedding model: how it is sent a photo (TorchServe: the raw
    body on ``/predictions``; Triton: the ``images`` BYTES tensor, binary), its v2 route and
    auth headers."""
    if engine == "torchserve":
        models = [f"{EMBEDDING}.mar"]
        with LocalTorchServe(work / "torchserve", MODEL_STORE, load_models=models) as server:
            auth, url = server.keys.inference_headers(), server.inference_url
            yield (lambda data: Endpoint(f"{url}/predictions/{EMBEDDING}", auth, data),
                   f"{url}/v2/models/{EMBEDDING}/infer", auth)  # fmt: skip
        return
    generate(work / "repository", model_store=MODEL_STORE, lanes=False)
    with triton_serving(work / "repository", work / "triton.log") as triton:
        url = f"{triton.url}/v2/models/{EMBEDDING}/infer"

        def jpeg(data: bytes) -> Endpoint:
            body, headers = v2_binary([data], ["embedding"], binary_out=False)
            return Endpoint(url, headers, body)

        yield jpeg, url, {}


def engine_rows(engine: str, photos: dict[str, bytes], work: Path, seconds: float) -> dict:
    """Each photo's JPEG and crop rows on ``engine``."""
    with serving(engine, work) as (jpeg, v2_url, auth):
        endpoints = {}
        for name, data in photos.items():
            endpoints[f"{engine} {name} jpeg"] = jpeg(data)
            body, headers = crops_request(crop_of(data))
            endpoints[f"{engine} {name} crop"] = Endpoint(v2_url, {**auth, **headers}, body)
        return measure(endpoints, seconds)


def main(argv: list[str] | None = None) -> int:
    parser = cli("python -m bench.crops", __doc__, out=RESULTS / "crops.md")
    parser.add_argument("--seconds", type=float, default=12.0, help="per measured row")
    args = parse(parser, argv)
    photos = {name: (SAMPLES / IMAGES[name]).read_bytes() for name in PHOTOS}
    engines = ["torchserve"]
    if why := missing():
        print(f"no Triton rows: {why}", file=sys.stderr)
    else:
        engines.append("triton")
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-crops.") as tmp:
        for engine in engines:
            rows |= engine_rows(engine, photos, Path(tmp) / engine, args.seconds)
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
