"""The frame of a plain JPEG read from its header in a few microseconds, without PIL.

PIL's ``Image.open`` parses every marker before the first scan in Python (quantisation tables
included): about 60 us an image here, most of the null model's CPU per image on Triton and
the GPU worker's whole "open" step (issue #49), though decoding needs none of it until the
pool or nvJPEG decodes. ``frame(data)`` reads what serving needs before decoding (size,
components, progressive) for the JPEGs that make up most traffic and returns None for any
other, which PIL then opens as before. It is deliberately narrow: it accepts a header only
where PIL's own parser would accept it with the same size and mode, so no answer changes:

- markers back to back from SOI to SOS, each segment whole (PIL skips junk and padding: None);
- one frame, SOF0, SOF1 or SOF2, 8 bits, 1 or 3 components, both sides above 0;
- quantisation tables whole (PIL refuses a short one);
- no APP1 block: EXIF (PIL's ``open`` reads it, and a broken one can fail it) or XMP, either
  of which may hold the orientation; and no MPF block (PIL opens those as MPO).

``rgb_coded(data)`` says whether a colour JPEG's components are R, G and B rather than YCbCr,
as libjpeg decides it (a GPU worker asks, before it sends a JPEG to nvJPEG, which would
convert such colours as if YCbCr).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

SOI = b"\xff\xd8\xff"
_SEGMENT = struct.Struct(">BBH")  # a segment's start: 0xFF, its marker, its length
_SOS = 0xDA
_DQT = 0xDB
_FRAMES = {0xC0: False, 0xC1: False, 0xC2: True}  # marker -> progressive
_ANY_FRAME = set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # SOF0-SOF15 (not DHT, JPG, DAC)
_APP0, _APP14 = 0xE0, 0xEE
# Markers with a length that may come before the frame and scan and that PIL reads or skips
# without a check of their contents: DHT, DAC, DNL, DRI, EXP, APPn but APP1/APP2 (read below),
# COM.
_SKIPPED = {0xC4, 0xCC, 0xDC, 0xDD, 0xDF, *range(0xE0, 0xF0), 0xFE} - {0xE1, 0xE2}


@dataclass(frozen=True)
class Frame:
    """A JPEG's frame: its stored ``size`` (width, height), ``components`` (1 grey, 3 colour)
    and whether it is ``progressive``."""

    size: tuple[int, int]
    components: int
    progressive: bool

    @property
    def mode(self) -> str:
        """PIL's mode for it: L or RGB."""
        return "L" if self.components == 1 else "RGB"


def frame(data: bytes) -> Frame | None:
    """``data``'s frame when it is a plain JPEG as the module docstring says, else None."""
    if not data.startswith(SOI):
        return None
    found: Frame | None = None
    at, end = 2, len(data)
    while at + 4 <= end:
        # One unpack per segment (marker byte, marker, length): this loop runs for every image
        # a request carries, so it is kept to a few operations per segment.
        ff, marker, length = _SEGMENT.unpack_from(data, at)
        stop = at + 2 + length
        if ff != 0xFF or length < 2 or stop > end:
            return None
        if marker in _SKIPPED:
            at = stop
            continue
        if marker == _SOS:
            return found
        if marker in _FRAMES:
            if found is not None:
                return None
            found = _frame(data[at + 4 : stop], _FRAMES[marker])
            if found is None:
                return None
        elif marker == _DQT:
            if not _whole_tables(data, at + 4, stop):
                return None
        elif marker == 0xE1:  # EXIF or XMP: an orientation may be there
            return None
        elif marker != 0xE2 or data.startswith(b"MPF\0", at + 4):
            return None  # a marker PIL reads otherwise, or an MPF block (PIL opens it as MPO)
        at = stop
    return None


def _frame(segment: bytes, progressive: bool) -> Frame | None:
    if len(segment) < 6:
        return None
    bits, components = segment[0], segment[5]
    height = (segment[1] << 8) | segment[2]
    width = (segment[3] << 8) | segment[4]
    if bits != 8 or components not in (1, 3) or len(segment) != 6 + 3 * components:
        return None
    if width == 0 or height == 0:
        return None
    return Frame((width, height), components, progressive)


def _whole_tables(data: bytes, at: int, stop: int) -> bool:
    """Whether the DQT segment ``data[at:stop]`` is whole tables: each 1 + 64 bytes, or 1 + 128
    at 16 bits."""
    while at < stop:
        at += 65 if data[at] >> 4 == 0 else 129
    return at == stop


def rgb_coded(data: bytes) -> bool:
    """Whether the 3-component JPEG ``data`` stores R, G and B, not YCbCr, as libjpeg (PIL's
    decoder) reads it (``jdapimin.c``): never with a JFIF APP0 block; with an Adobe APP14
    block, when its transform is 0; else when the frame's component ids are 'R', 'G', 'B'.
    Also True when the segments before the scan cannot be walked (junk between markers,
    which PIL skips): what this cannot read is not sent to the GPU."""
    jfif, transform, ids = False, None, b""
    at, end = 2, len(data)
    while at + 4 <= end:
        ff, marker, length = _SEGMENT.unpack_from(data, at)
        if ff != 0xFF or length < 2:
            return True
        if marker == _SOS:
            break
        body = data[at + 4 : at + 2 + length]
        if marker == _APP0 and len(body) >= 14 and body.startswith(b"JFIF\0"):
            jfif = True
        elif marker == _APP14 and len(body) >= 12 and body.startswith(b"Adobe"):
            transform = body[11]
        elif marker in _ANY_FRAME:
            ids = body[6:15:3]
        at += 2 + length
    else:
        return True
    if jfif:
        return False
    return transform == 0 if transform is not None else ids == b"RGB"
