"""The test corpus: good images in every accepted format (with the RGB pixels each must decode
to, computed independently of the handler), and bad inputs with the status, error type and
message each must get."""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from tests import imagegen

W, H = 96, 64  # small: decoding cost is not what these tests measure


def _source(seed: int = 7) -> Image.Image:
    return imagegen.photo(W, H, seed=seed)


def _save(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


@dataclass
class Good:
    """``data`` must decode to exactly ``expected`` (H x W x 3 uint8)."""

    data: bytes
    expected: np.ndarray


def _plain(data: bytes) -> np.ndarray:
    """Lossy formats: what PIL's decoder gives for the same bytes, stored orientation, RGB.
    (The pixels the decoder produces are PIL's business; ours is what we do with them.)"""
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _lossy(data: bytes, rotate_cw: bool = False) -> Good:
    expected = _plain(data)
    return Good(data, np.rot90(expected, k=-1) if rotate_cw else expected)


def _rgba_on_white(rgba: np.ndarray) -> np.ndarray:
    alpha = rgba[..., 3:4].astype(np.float64) / 255.0
    return np.round(rgba[..., :3] * alpha + 255.0 * (1.0 - alpha)).astype(np.uint8)


def good_images() -> dict[str, Good]:
    source = _source()
    rgb = np.asarray(source)
    rgba = np.dstack([rgb, np.tile(np.linspace(0, 255, W, dtype=np.uint8), (H, 1))])
    palette = source.quantize(colors=32)
    gray16 = np.arange(W * H, dtype=np.uint32).reshape(H, W) * 65535 // (W * H - 1)
    gray16 = gray16.astype(np.uint16)
    frame2 = Image.new("RGB", (W, H), (255, 0, 0)).quantize(colors=2)
    oriented = Image.fromarray(rgb)
    exif = oriented.getexif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    cmyk_source = source.convert("CMYK")
    return {
        "jpeg-baseline": _lossy(_save(source, "JPEG", quality=95)),
        "jpeg-progressive": _lossy(_save(source, "JPEG", quality=95, progressive=True)),
        "jpeg-cmyk": _lossy(_save(cmyk_source, "JPEG", quality=95)),
        "jpeg-grayscale": _lossy(_save(source.convert("L"), "JPEG", quality=95)),
        "png-rgb": Good(_save(source, "PNG"), rgb),
        "png-rgba": Good(_save(Image.fromarray(rgba, "RGBA"), "PNG"), _rgba_on_white(rgba)),
        "png-palette": Good(_save(palette, "PNG"), np.asarray(palette.convert("RGB"))),
        "png-grayscale": Good(
            _save(source.convert("L"), "PNG"),
            np.repeat(np.asarray(source.convert("L"))[..., None], 3, 2),
        ),
        "png-16bit-grayscale": Good(
            _save(Image.fromarray(gray16), "PNG"),
            np.repeat(np.round(gray16 / 257.0).astype(np.uint8)[..., None], 3, 2),
        ),
        "png-exif-rotated": Good(_save(oriented, "PNG", exif=exif), np.rot90(rgb, k=-1)),
        "webp-lossless": Good(_save(source, "WEBP", lossless=True), rgb),
        "webp-lossy": _lossy(_save(source, "WEBP", quality=95)),
        "gif-first-frame": Good(
            _save(palette, "GIF", save_all=True, append_images=[frame2]),
            np.asarray(palette.convert("RGB")),
        ),
        "bmp": Good(_save(source, "BMP"), rgb),
        "tiff": Good(_save(source, "TIFF"), rgb),
        "tiff-lzw": Good(_save(source, "TIFF", compression="tiff_lzw"), rgb),
        "jpeg-exif-rotated": _lossy(_save(oriented, "JPEG", quality=95, exif=exif), rotate_cw=True),
        "jpeg-1x1": _lossy(_save(Image.new("RGB", (1, 1), (10, 200, 30)), "JPEG")),
    }


@dataclass
class Bad:
    """A bad request: sent as ``form`` (raw / json / multipart), expected status/type/message.

    ``body`` is bytes for raw, an object (or raw text in ``text``) for json; ``fields`` are
    multipart form fields besides the image."""

    form: str
    status: int
    kind: str
    message: str
    body: object = None
    text: str | None = None
    fields: dict = field(default_factory=dict)
    model: str = "resnet50-tagger"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def bad_inputs(max_image_bytes: int = 30 * 1024 * 1024) -> dict[str, Bad]:
    jpeg = _save(_source(), "JPEG", quality=90)
    png = _save(_source(), "PNG")
    gif = _save(_source().quantize(colors=16), "GIF")
    bomb = _save(Image.new("1", (10_000, 10_000)), "PNG")  # 100 MP in a few KB
    webp = _save(_source(), "WEBP")

    def other(fmt: str) -> bytes:
        return _save(_source(), fmt)

    not_image = "not a JPEG, PNG, WebP, GIF, BMP or TIFF image"
    truncated = "truncated or corrupt"
    unsupported = "images are not supported; send JPEG, PNG, WebP, GIF, BMP or TIFF"

    def v2(**k) -> dict:
        return {
            "inputs": [
                {"name": "images", "shape": [1], "datatype": "BYTES", "data": [b64(jpeg)], **k}
            ]
        }

    return {
        "empty-body": Bad("raw", 400, "InvalidRequest", "empty", body=b""),
        "random-bytes": Bad(
            "raw",
            400,
            "InvalidImage",
            not_image,
            body=bytes(np.random.default_rng(3).integers(0, 256, 4096, dtype=np.uint8)),
        ),
        "plain-text": Bad(
            "raw", 400, "InvalidImage", not_image, body=b"hello, this is text and not an image"
        ),
        "jpeg-truncated": Bad("raw", 400, "InvalidImage", truncated, body=jpeg[: len(jpeg) // 2]),
        "jpeg-header-only": Bad("raw", 400, "InvalidImage", truncated, body=jpeg[:400]),
        "png-truncated": Bad("raw", 400, "InvalidImage", truncated, body=png[: len(png) // 2]),
        "png-corrupt-data": Bad(
            "raw", 400, "InvalidImage", truncated, body=png[:60] + bytes(200) + png[260:]
        ),
        "gif-truncated": Bad("raw", 400, "InvalidImage", truncated, body=gif[:100]),
        "webp-truncated": Bad("raw", 400, "InvalidImage", "", body=webp[:60]),
        "svg": Bad(
            "raw",
            415,
            "UnsupportedMediaType",
            "SVG " + unsupported,
            body=b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>',
        ),
        "pdf": Bad(
            "raw",
            415,
            "UnsupportedMediaType",
            "PDF " + unsupported,
            body=b"%PDF-1.4\n1 0 obj<<>>endobj\ntrailer<<>>\n%%EOF",
        ),
        "ico": Bad("raw", 415, "UnsupportedMediaType", "ICO " + unsupported, body=other("ICO")),
        "ppm": Bad("raw", 415, "UnsupportedMediaType", "PPM " + unsupported, body=other("PPM")),
        "avif": Bad("raw", 415, "UnsupportedMediaType", "AVIF " + unsupported, body=other("AVIF")),
        "heic-signature": Bad(
            "raw",
            415,
            "UnsupportedMediaType",
            "HEIC " + unsupported,
            body=b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00" + bytes(64),
        ),
        "decompression-bomb": Bad(
            "raw",
            413,
            "PayloadTooLarge",
            "10000x10000 = 100000000 pixels, more than the limit",
            body=bomb,
        ),
        "too-many-bytes": Bad(
            "raw",
            413,
            "PayloadTooLarge",
            f"more than the limit of {max_image_bytes} bytes",
            body=jpeg + bytes(max_image_bytes),
        ),
        "json-malformed": Bad(
            "json", 400, "InvalidRequest", "malformed JSON body", text='{"data": "abc'
        ),
        "json-no-data": Bad(
            "json",
            400,
            "InvalidRequest",
            "JSON body must have 'data' (base64 image), 'instances'",
            body={"image": b64(jpeg)},
        ),
        "json-not-object": Bad(
            "json", 400, "InvalidRequest", "JSON body must be an object", body=[b64(jpeg)]
        ),
        "json-bad-base64": Bad(
            "json",
            400,
            "InvalidRequest",
            "data is not valid base64",
            body={"data": "@@not base64@@"},
        ),
        "json-data-not-string": Bad(
            "json", 400, "InvalidRequest", "data must be a base64 string, got int", body={"data": 5}
        ),
        "json-base64-of-text": Bad(
            "json", 400, "InvalidImage", not_image, body={"data": b64(b"just some text, no pixels")}
        ),
        "json-empty-data": Bad("json", 400, "InvalidRequest", "data is empty", body={"data": ""}),
        "topk-zero": Bad(
            "multipart",
            400,
            "InvalidParameter",
            "topk must be a positive integer, got '0'",
            body=jpeg,
            fields={"topk": "0"},
        ),
        "topk-unicode-digit": Bad(
            "multipart",
            400,
            "InvalidParameter",
            "topk must be a positive integer, got '²'",
            body=jpeg,
            fields={"topk": "²"},
        ),
        "v1-too-many-images": Bad(
            "json",
            413,
            "PayloadTooLarge",
            "request carries 9 images, more than the limit of 8",
            body={"instances": [{"data": b64(jpeg)}] * 9},
        ),
        "topk-json-bool": Bad(
            "json",
            400,
            "InvalidParameter",
            "topk must be a positive integer, got True",
            body={"data": b64(jpeg), "topk": True},
        ),
        "unknown-form-field": Bad(
            "multipart",
            400,
            "InvalidParameter",
            "unknown request parameter(s) ['size']",
            body=jpeg,
            fields={"size": "large"},
        ),
        "v1-empty-instances": Bad(
            "json", 400, "InvalidRequest", "body.instances is empty", body={"instances": []}
        ),
        "v1-instances-not-list": Bad(
            "json",
            400,
            "InvalidRequest",
            "body.instances must be a list",
            body={"instances": {"data": b64(jpeg)}},
        ),
        "v1-bad-instance": Bad(
            "json",
            400,
            "InvalidRequest",
            "instances[1].data is not valid",
            body={"instances": [{"data": b64(jpeg)}, {"data": "%%%"}]},
        ),
        "v1-second-image-corrupt": Bad(
            "json",
            400,
            "InvalidImage",
            not_image,
            body={"instances": [{"data": b64(jpeg)}, {"data": b64(b"nope")}]},
        ),
        "v2-wrong-datatype": Bad(
            "json",
            400,
            "InvalidRequest",
            'datatype must be "BYTES" (base64-encoded images) or "UINT8" (crops, shape '
            "[n, 224, 224, 3]), got 'FP32'",
            body={"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [0.5]}]},
        ),
        "v2-shape-mismatch": Bad(
            "json", 400, "InvalidRequest", "shape must be [n]", body=v2(shape=[3])
        ),
        "v2-no-inputs": Bad(
            "json",
            400,
            "InvalidRequest",
            "body.inputs must hold exactly one input tensor",
            body={"inputs": []},
        ),
        "v2-unknown-output": Bad(
            "json",
            400,
            "InvalidRequest",
            "outputs[0].name must be one of ['embedding', 'tags']",
            body={**v2(), "outputs": [{"name": "logits"}]},
        ),
        "v2-id-not-string": Bad(
            "json", 400, "InvalidRequest", "body.id must be a string", body={**v2(), "id": 42}
        ),
        "v2-bad-topk": Bad(
            "json",
            400,
            "InvalidParameter",
            "topk must be an integer from 1 to 1000 (the model's classes), got 5000",
            body={**v2(), "parameters": {"topk": 5000}},
        ),
        "v2-binary-output-not-bool": Bad(
            "json",
            400,
            "InvalidParameter",
            "body.parameters.binary_data_output must be true or false, got 'yes'",
            body={**v2(), "parameters": {"binary_data_output": "yes"}},
        ),
        "v2-binary-data-not-bool": Bad(
            "json",
            400,
            "InvalidParameter",
            "outputs[0].parameters.binary_data must be true or false, got 1",
            body={**v2(), "outputs": [{"name": "tags", "parameters": {"binary_data": 1}}]},
        ),
    }


def flat_webp(size: int = 6000) -> bytes:
    """A single-colour square WebP: about 60 KB of header and body for 36 MP of pixels."""
    return _save(Image.new("RGB", (size, size), (120, 30, 200)), "WEBP", quality=80)


def hostile_inputs() -> dict[str, Bad]:
    """Requests that used to hurt other clients (issue #8): JSON nested far deeper than any
    request needs, and cheap bytes that decode to billions of pixels. Each must get its own 4xx
    before any pixel is decoded."""
    flood = b64(flat_webp())
    return {
        "json-nested-5000": Bad(
            "json",
            400,
            "InvalidRequest",
            "JSON body is nested more than 16 levels deep (handler.max_json_depth)",
            text='{"data": ' + "[" * 5000 + "]" * 5000 + "}",
        ),
        "json-nested-30": Bad(
            "json",
            400,
            "InvalidRequest",
            "nested more than 16 levels deep",
            text='{"data": ' + "[" * 30 + "]" * 30 + "}",
        ),
        "v2-pixel-flood": Bad(
            "json",
            413,
            "PayloadTooLarge",
            "request would decode 288000000 pixels (8 image(s)), more than "
            "the limit of 100000000 (handler.max_request_pixels)",
            body={
                "inputs": [
                    {"name": "images", "shape": [8], "datatype": "BYTES", "data": [flood] * 8}
                ]
            },
        ),
    }


def json_text(case: Bad) -> str:
    return case.text if case.text is not None else json.dumps(case.body)


def handler_row(case: Bad) -> dict:
    """The input dict TorchServe 0.12 hands a handler for this request (its JSON bodies arrive
    parsed, or as the raw bytes when they are not valid JSON; form fields as bytes)."""
    if case.form == "raw":
        return {"body": case.body}
    if case.form == "multipart":
        return {"data": case.body, **{k: v.encode() for k, v in case.fields.items()}}
    try:
        return {"body": json.loads(json_text(case))}
    except (ValueError, RecursionError):  # TorchServe forwards what it cannot parse as bytes
        return {"body": json_text(case).encode()}
