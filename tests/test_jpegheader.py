"""``servecore.jpegheader`` reads a plain JPEG's header without PIL (issue #49: PIL's header
parse was most of the core's CPU per image): what it reads must be what PIL reads, and a header
it accepts must be one PIL opens, else the answer would change. Checked against PIL itself:
size, mode, progressive and the drafted size on JPEGs PIL writes in every way it can; None (PIL
decides, as before) for the kinds it leaves to PIL; and, on mutated headers, every header it
accepts opens in PIL with the same frame."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from servecore import jpegheader
from servecore.images import Header, decode, open_image
from tests import imagegen

LIMITS = {"max_pixels": 40_000_000, "max_bytes": 1 << 30}
PLAIN = {
    "small colour": (imagegen.photo(451, 300), {}),
    "odd sides": (imagegen.photo(333, 97, seed=2), {}),
    "grey": (imagegen.photo(320, 240).convert("L"), {}),
    "progressive": (imagegen.photo(640, 480), {"progressive": True}),
    "optimised, 4:4:4": (imagegen.photo(300, 300), {"optimize": True, "subsampling": 0}),
    "restart markers": (imagegen.photo(256, 200), {"restart_marker_rows": 1}),
    "comment and ICC": (
        imagegen.photo(200, 150),
        {"comment": b"hello", "icc_profile": b"\0" * 3000},
    ),
    "12 MP": (Image.new("RGB", (4242, 2828), (90, 120, 30)), {}),
}


def _pil_header(data: bytes, draft_size: int | None) -> Header:
    image = Image.open(io.BytesIO(data))
    if draft_size:
        image.draft(None, (draft_size, draft_size))
    return Header.of(image)


@pytest.mark.parametrize("name", PLAIN)
@pytest.mark.parametrize("draft_size", [None, 224, 232, 1000])
def test_a_plain_jpeg_reads_as_pil_reads_it_and_decodes_alike(name, draft_size):
    image, options = PLAIN[name]
    data = imagegen.encode(image, "JPEG", **options)
    assert jpegheader.frame(data) is not None, name
    opened = open_image(data, draft_size=draft_size, **LIMITS)
    assert opened.opened is None  # PIL has not read it yet
    assert opened.header == _pil_header(data, draft_size)
    decoded = decode(opened)
    reference = Image.open(io.BytesIO(data))
    if draft_size:
        reference.draft(None, (draft_size, draft_size))
    assert decoded.size == opened.header.size
    assert np.array_equal(np.asarray(decoded), np.asarray(reference.convert("RGB")))


def _exif(orientation: int) -> Image.Exif:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif


LEFT_TO_PIL = {
    "EXIF": imagegen.encode(imagegen.photo(), "JPEG", exif=_exif(6)),
    "XMP": imagegen.encode(imagegen.photo(), "JPEG", xmp=b"<x:xmpmeta tiff:Orientation='6'/>"),
    "CMYK": imagegen.encode(imagegen.photo().convert("CMYK"), "JPEG"),
    "MPO": imagegen.encode(
        imagegen.photo(), "MPO", save_all=True, append_images=[imagegen.photo(seed=1)]
    ),
    "PNG": imagegen.png(),
}


@pytest.mark.parametrize("name", LEFT_TO_PIL)
def test_what_it_leaves_to_pil_pil_opens_as_before(name):
    data = LEFT_TO_PIL[name]
    assert jpegheader.frame(data) is None
    opened = open_image(data, draft_size=232, **LIMITS)
    assert opened.opened is not None
    assert opened.header == Header.of(opened.opened)


def _edited(data: bytes, at: int, new: bytes) -> bytes:
    return data[:at] + new + data[at + len(new) :]


def _segment(data: bytes, marker: int) -> int:
    """Where ``data``'s first segment with ``marker`` starts (its 0xFF)."""
    return data.index(bytes([0xFF, marker]), 2)


def test_headers_pil_would_read_otherwise_are_left_to_it():
    data = imagegen.jpeg()
    sof = _segment(data, 0xC0)
    cases = {
        "12-bit samples": _edited(data, sof + 4, b"\x0c"),
        "junk between segments": data[:sof] + b"\x00" + data[sof:],
        "fill bytes before a marker": data[:sof] + b"\xff" + data[sof:],
        "a short quantisation table": _edited(data, _segment(data, 0xDB) + 2, b"\x00\x42"),
        "a second frame": data[:sof] + data[sof : sof + 19] + data[sof:],
        "a lossless frame": _edited(data, sof + 1, b"\xc3"),
        "cut inside the header": data[: sof + 10],
        "no frame before the scan": data[:sof] + data[sof + 19 :],
        "a zero height": _edited(data, sof + 5, b"\x00\x00"),
    }
    for name, broken in cases.items():
        assert jpegheader.frame(broken) is None, name


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_header_it_accepts_pil_opens_with_the_same_frame(data):
    """Mutated headers (bytes changed, cut or inserted before the scan): whatever it accepts,
    PIL opens, with the same size, mode and progressive flag."""
    plain = data.draw(st.sampled_from([imagegen.jpeg(64, 48), PROGRESSIVE]), label="seed")
    head = plain.index(b"\xff\xda")
    at = data.draw(st.integers(2, head), label="at")
    edit = data.draw(st.sampled_from(["set", "cut", "insert"]), label="edit")
    chunk = data.draw(st.binary(min_size=1, max_size=4), label="bytes")
    if edit == "set":
        mutated = _edited(plain, at, chunk)
    elif edit == "cut":
        mutated = plain[:at] + plain[at + len(chunk) :]
    else:
        mutated = plain[:at] + chunk + plain[at:]
    frame = jpegheader.frame(mutated)
    if frame is None:
        return
    # A mutated size can pass PIL's decompression-bomb limit: the frame is what is compared
    # here (the core bounds an image's pixels itself, handler.max_image_pixels).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Image, "MAX_IMAGE_PIXELS", None)
        image = Image.open(io.BytesIO(mutated))
    assert (image.format, image.size, image.mode) == ("JPEG", frame.size, frame.mode)
    assert bool(image.info.get("progressive")) == frame.progressive


PROGRESSIVE = imagegen.encode(imagegen.photo(64, 48), "JPEG", progressive=True)


def _with_ids(data: bytes, ids: bytes) -> bytes:
    """``data`` with its three components renamed ``ids``, in the frame and in the scan."""
    renamed = bytearray(data)
    sof, sos = data.index(b"\xff\xc0"), data.index(b"\xff\xda")
    renamed[sof + 10 : sof + 19 : 3] = ids
    renamed[sos + 5 : sos + 10 : 2] = ids
    return bytes(renamed)


def _rgb_variants() -> dict[str, bytes]:
    """One photo stored as R, G, B (Adobe APP14 transform 0, component ids 'R', 'G', 'B'), its
    markers then changed the ways libjpeg reads differently."""
    stored = imagegen.encode(imagegen.photo(96, 64, seed=5), keep_rgb=True)
    app14 = stored.index(b"\xff\xee")
    no_adobe = stored[:app14] + stored[app14 + 2 + stored[app14 + 3] :]
    jfif = b"\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    transform_1 = bytearray(stored)
    transform_1[app14 + 4 + 11] = 1
    return {
        "adobe transform 0": stored,
        "adobe transform 0, ids 1 2 3": _with_ids(stored, b"\x01\x02\x03"),
        "adobe transform 1": bytes(transform_1),
        "no adobe, ids R G B": no_adobe,
        "no adobe, ids 1 2 3": _with_ids(no_adobe, b"\x01\x02\x03"),
        "jfif and adobe transform 0": stored[:2] + jfif + stored[2:],
    }


@pytest.mark.parametrize("name", list(_rgb_variants()))
def test_an_rgb_coded_jpeg_is_told_as_libjpeg_tells_it(name):
    """``rgb_coded`` against libjpeg itself: the stored R, G, B come out as the photo's colours
    only where PIL's decoder took them as RGB (as YCbCr they are far off); a JPEG PIL writes
    as YCbCr is not RGB-coded, and one whose markers cannot be walked is taken as one."""
    data = _rgb_variants()[name]
    photo = np.asarray(imagegen.photo(96, 64, seed=5), dtype=float)
    decoded = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=float)
    read_as_rgb = float(np.abs(decoded - photo).mean()) < 10
    assert jpegheader.rgb_coded(data) == read_as_rgb, name
    assert not jpegheader.rgb_coded(imagegen.jpeg(96, 64, seed=5))
    assert jpegheader.rgb_coded(data[:4] + b"junk" + data[4:])
