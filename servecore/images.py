"""Decode uploaded image bytes into an RGB ``PIL.Image``, safely and fast.

Pure functions, no engine: every client mistake becomes a ``RequestError`` with the status
it deserves (400 not an image / truncated, 415 unsupported format, 413 too large), and nothing a
client sends escapes as another exception.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from servecore import jpegheader
from servecore.errors import (
    InvalidImage,
    InvalidRequest,
    PayloadTooLarge,
    RequestError,
    UnsupportedMediaType,
)

logger = logging.getLogger(__name__)

# PIL format names we decode. PIL's JPEG opener also returns MPO (the multi-picture JPEG many
# phone cameras write), which decodes as its first picture.
ACCEPTED_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
ACCEPTED_TEXT = "JPEG, PNG, WebP, GIF, BMP or TIFF"

# Formats PIL cannot open at all, recognised by their magic bytes so that they get a 415
# ("a real image, not ours") rather than a 400 ("not an image").
_OTHER_MAGIC = (
    (b"%PDF", "PDF"),
    (b"<svg", "SVG"),
    (b"<?xml", "SVG/XML"),
    (b"\x00\x00\x00\x0cjP  ", "JPEG 2000"),
    (b"\xff\x0a", "JPEG XL"),
    (b"\x00\x00\x00\x0cJXL ", "JPEG XL"),
)
_ISOBMFF_BRANDS = {
    b"heic": "HEIC",
    b"heix": "HEIC",
    b"mif1": "HEIF",
    b"msf1": "HEIF",
    b"avif": "AVIF",
    b"avis": "AVIF",
}

# Other formats PIL can identify by a reliable signature (identified only, never decoded).
# Formats with loose signatures (TGA, PCX, ...) are left out so junk is not called an image.
_IDENTIFIABLE = (
    "AVIF",
    "ICO",
    "ICNS",
    "PPM",
    "JPEG2000",
    "SGI",
    "EPS",
    "QOI",
    "DDS",
    "PSD",
    "FITS",
    "BLP",
)

_ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}
_WIDE_GRAY_MODES = {"I", "I;16", "I;16B", "I;16L", "I;16N", "F"}


@dataclass(frozen=True)
class Header:
    """What serving needs to know of an image before decoding it: PIL's ``format`` and
    ``mode``, the ``size`` decoding will produce (after JPEG draft scaling by ``scale``),
    whether it is ``progressive`` and whether it is ``tagged``: an EXIF or XMP block, where an
    orientation may be (PIL reads one from either)."""

    format: str
    mode: str
    size: tuple[int, int]
    scale: int = 1
    progressive: bool = False
    tagged: bool = False

    @classmethod
    def of(cls, image: Image.Image) -> Header:
        """The header of an image PIL opened (and drafted, if it did)."""
        return cls(
            format=image.format or "",
            mode=image.mode,
            size=image.size,
            scale=(getattr(image, "decoderconfig", None) or (1,))[0],
            progressive=bool(image.info.get("progressive") or image.info.get("progression")),
            tagged="exif" in image.info or "xmp" in image.info,
        )


@dataclass(frozen=True)
class OpenedImage:
    """An image whose header has been read and nothing decoded yet. ``header.size``: what
    decoding it will produce (after JPEG draft scaling), and ``pixels`` its product: the work
    it will cost. ``data``: its encoded bytes (what a device decoder reads,
    ``servecore.gpudecode``). ``image``: PIL's opened image, drafted: opened by ``open_image``
    when PIL read the header, else when first asked for (by the decoding thread)."""

    data: bytes
    header: Header
    draft_size: int | None = None
    opened: Image.Image | None = field(default=None, repr=False, compare=False)

    @property
    def pixels(self) -> int:
        return self.header.size[0] * self.header.size[1]

    @cached_property
    def image(self) -> Image.Image:
        if self.opened is not None:
            return self.opened
        image = _open(self.data)
        _draft(image, self.draft_size)
        return image


def decode_image(
    data: bytes, *, max_pixels: int, max_bytes: int, draft_size: int | None = None
) -> Image.Image:
    """Decode ``data`` into an RGB image, upright, alpha flattened on white:
    ``decode(open_image(...))``."""
    return decode(
        open_image(data, max_pixels=max_pixels, max_bytes=max_bytes, draft_size=draft_size)
    )


def open_image(
    data: bytes, *, max_pixels: int, max_bytes: int, draft_size: int | None = None
) -> OpenedImage:
    """Read the header of ``data`` only: format, size, and the decoding cost in pixels. A plain
    JPEG's header is read without PIL (``servecore.jpegheader``: the same size and mode PIL's
    parser finds, and PIL opens it when it is decoded); any other image's by PIL.

    ``draft_size``: for JPEG, let the decoder scale down by a power of two in the DCT as long
    as both sides stay >= ``draft_size`` (the preprocessing resize size), which decodes a 12 MP
    photo several times faster. ``None`` decodes at full size.

    Raises ``InvalidRequest`` (empty), ``PayloadTooLarge`` (bytes or pixels over the limits),
    ``UnsupportedMediaType`` (an image in another format) or ``InvalidImage`` (anything else).
    """
    if not data:
        raise InvalidRequest(
            f"empty image: the request carried no bytes; send a {ACCEPTED_TEXT} file"
        )
    if len(data) > max_bytes:
        raise PayloadTooLarge(
            f"image is {len(data)} bytes, more than the limit of {max_bytes} bytes "
            "(handler.max_image_bytes)"
        )
    plain = jpegheader.frame(data)
    if plain is not None:  # PIL opens it when it is decoded
        _within(plain.size, max_pixels)
        scale = _draft_scale(plain.size, draft_size)
        width, height = plain.size
        size = ((width + scale - 1) // scale, (height + scale - 1) // scale)
        header = Header("JPEG", plain.mode, size, scale, plain.progressive)
        return OpenedImage(data, header, draft_size)
    image = _open(data)
    _within(image.size, max_pixels)
    try:
        _draft(image, draft_size)
    except Exception as exc:  # noqa: BLE001 - a header PIL cannot scale is a bad file
        raise InvalidImage(
            f"JPEG image could not be decoded ({exc}); the file is truncated or corrupt"
        ) from None
    return OpenedImage(data, Header.of(image), draft_size, image)


def _within(size: tuple[int, int], max_pixels: int) -> None:
    """413 ``PayloadTooLarge`` when an image of ``size`` has more than ``max_pixels``."""
    width, height = size
    if width * height > max_pixels:
        raise PayloadTooLarge(
            f"image is {width}x{height} = {width * height} pixels, more than the limit of "
            f"{max_pixels} (handler.max_image_pixels); downscale it before sending"
        )


def _draft(image: Image.Image, draft_size: int | None) -> None:
    """Let PIL's JPEG decoder scale ``image`` down in the DCT (``open_image`` says how far)."""
    if draft_size and image.format in ("JPEG", "MPO"):
        image.draft(None, (draft_size, draft_size))  # sets the size decoding will produce


def _draft_scale(size: tuple[int, int], draft_size: int | None) -> int:
    """The DCT scale PIL's ``draft`` picks for a JPEG of ``size``: the largest of 8, 4, 2 that
    keeps both sides >= ``draft_size``, else 1 (``JpegImageFile.draft``)."""
    if not draft_size:
        return 1
    fits = min(size[0] // draft_size, size[1] // draft_size)
    return 8 if fits >= 8 else 4 if fits >= 4 else 2 if fits >= 2 else 1


def decode(opened: OpenedImage) -> Image.Image:
    """Decode an opened image into RGB, upright, alpha flattened on white. Raises
    ``PayloadTooLarge`` or ``InvalidImage`` for a file that fails while decoding."""
    try:
        image = opened.image
        image.load()
        image = _upright(image)
        return _to_rgb(image)
    except RequestError:
        raise  # PIL refused a header jpegheader read: already the client's error
    except Image.DecompressionBombError as exc:
        raise PayloadTooLarge(f"image rejected as a decompression bomb: {exc}") from None
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - any decoder failure is the client's bad file
        raise InvalidImage(
            f"{opened.header.format} image could not be decoded ({type(exc).__name__}: {exc}); "
            "the file is truncated or corrupt"
        ) from None


def _open(data: bytes) -> Image.Image:
    Image.init()  # registers every plugin once; `formats=` looks names up in that registry
    try:
        image = Image.open(io.BytesIO(data), formats=ACCEPTED_FORMATS)
    except Image.DecompressionBombError as exc:
        raise PayloadTooLarge(f"image rejected as a decompression bomb: {exc}") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        claimed = _accepted_signature(data)
        if claimed:
            # PIL's own text for an unreadable header names the in-memory file object (its
            # address), which differs at every request: say what it means instead.
            why = "its header cannot be read" if isinstance(exc, UnidentifiedImageError) else exc
            raise InvalidImage(
                f"{claimed} image could not be decoded ({why}); the file is truncated or corrupt"
            ) from None
        other = _other_format(data)
        if other:
            raise UnsupportedMediaType(
                f"{other} images are not supported; send {ACCEPTED_TEXT}"
            ) from None
        detail = "" if isinstance(exc, UnidentifiedImageError) else f" ({exc})"
        raise InvalidImage(
            f"the bytes are not a {ACCEPTED_TEXT} image{detail} (starts with {data[:8]!r})"
        ) from None
    return image


_ACCEPTED_SIGNATURES = (
    (b"\xff\xd8\xff", "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"BM", "BMP"),
)


def _accepted_signature(data: bytes) -> str | None:
    """The accepted format whose signature ``data`` starts with, if any."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return next((name for magic, name in _ACCEPTED_SIGNATURES if data.startswith(magic)), None)


def _other_format(data: bytes) -> str | None:
    """Name a real image format we do not accept, or None if the bytes are no known image."""
    head = data[:64].lstrip()
    for magic, name in _OTHER_MAGIC:
        if head.startswith(magic):
            return name
    if data[4:8] == b"ftyp" and data[8:12] in _ISOBMFF_BRANDS:
        return _ISOBMFF_BRANDS[data[8:12]]
    try:
        with Image.open(io.BytesIO(data), formats=_IDENTIFIABLE) as other:
            return other.format
    except Exception:  # noqa: BLE001 - not an image at all
        return None


def _upright(image: Image.Image) -> Image.Image:
    """Apply the EXIF orientation; a corrupt EXIF block leaves the pixels as stored."""
    try:
        return ImageOps.exif_transpose(image)
    except Exception as exc:  # noqa: BLE001 - orientation is best effort, pixels are fine
        logger.warning("ignoring unreadable EXIF orientation: %s", exc)
        return image


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode in _WIDE_GRAY_MODES:
        # PIL's convert() clips 16-bit values to 255 instead of scaling them.
        pixels = np.asarray(image, dtype=np.float32)
        peak = 65535.0 if image.mode != "F" else max(float(pixels.max()), 1.0)
        gray = np.clip(pixels * (255.0 / peak), 0, 255).round().astype(np.uint8)
        return Image.fromarray(gray, "L").convert("RGB")
    if image.mode in _ALPHA_MODES or "transparency" in image.info:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")
