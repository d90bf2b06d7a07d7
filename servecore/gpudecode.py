"""JPEG bytes -> the served input's uint8 crops on the worker's GPU: one batched decode, then
the weights' resize and centre crop there. The decoder is chosen once, when the worker starts
(``servecore.gpuchoice``), the first that works of: nvImageCodec (``servecore.nvimgdecode``:
the GPU's hardware JPEG engines where it has them, region decoding), torchvision's nvJPEG
(``torchvision.io.decode_jpeg`` on CUDA: ``DeviceDecoder`` here), the CPU path.

Only a JPEG that nvJPEG decodes as PIL does is sent (``accepts``, read from the header PIL
already parsed: baseline JPEG/MPO in YCbCr or grayscale, complete, its EXIF orientation
readable); the rest (PNG, WebP, progressive, CMYK or RGB-coded JPEG, ...) stay on the CPU
path, and so does any image nvJPEG refuses (``DeviceDecoder`` answers None for it, and
counts it: ``Refusals``), which the CPU path then decodes or fails with its own error. The
pixels differ slightly from PIL's: the resize runs in float32, rounded once (at most one level
from the uint8 resize PIL's path runs, measured on CPU with libjpeg standing in for nvJPEG),
and nvJPEG's IDCT and chroma upsampling are its own. nvImageCodec is asked for the upsampling
libjpeg does (``servecore.nvimgdecode``); torchvision's nvJPEG decoder has no such switch and
upsamples without interpolation, so 4:2:0 and 4:2:2 JPEGs differ from PIL's at colour edges:
how far was never measured on a GPU (``python -m bench.gpucheck``). The answers are held
within the fidelity bound (tests/test_gpudecode.py, its CUDA tests on a GPU).
"""

from __future__ import annotations

import functools
import io
import logging
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from PIL import ExifTags, Image

from model_files.recipe import CROP, RESIZE
from servecore import jpegheader
from servecore.images import OpenedImage

logger = logging.getLogger(__name__)

FORMATS = ("JPEG", "MPO")  # PIL's names for what nvJPEG decodes (MPO: its first picture)
MODES = ("RGB", "L")  # YCbCr and grayscale; CMYK/YCCK open as CMYK and stay on the CPU
_EOI = b"\xff\xd9"
# PIL's ``ImageOps.exif_transpose`` (the CPU path's) as views of a [C, H, W] tensor.
_ORIENT: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    2: lambda t: t.flip(-1),  # FLIP_LEFT_RIGHT
    3: lambda t: t.flip(-2, -1),  # ROTATE_180
    4: lambda t: t.flip(-2),  # FLIP_TOP_BOTTOM
    5: lambda t: t.transpose(-2, -1),  # TRANSPOSE
    6: lambda t: t.transpose(-2, -1).flip(-1),  # ROTATE_270 (90 clockwise)
    7: lambda t: t.transpose(-2, -1).flip(-2, -1),  # TRANSVERSE
    8: lambda t: t.transpose(-2, -1).flip(-2),  # ROTATE_90 (90 anticlockwise)
}
_TRANSPOSED = (5, 6, 7, 8)  # the orientations that swap width and height
Decode = Callable[..., list[torch.Tensor]]  # torchvision.io.decode_jpeg's list form

# Pixels resized in one call, counted in the input or the resized copy, whichever is larger:
# bounds its float32 working memory to about 200 MB each (3 channels, 4 bytes a value). A
# group of 451x300 photos is resized 124 at a time, a 12 MP photo alone.
GROUP_PIXELS = 2**24
# Pixels a region keeps beyond the crop's taps on each side: nvJPEG before 13.2 may get a
# region's outermost pixel wrong when it upsamples chroma with interpolation (nvImageCodec
# 0.9 warns so), and these pixels' weights in the crop are 0.
REGION_EDGE = 2
# A warning when more than this share of the JPEGs sent to the GPU since the last one came
# back refused, at most once every WARN_EVERY_S.
WARN_SHARE, WARN_EVERY_S = 0.1, 60.0
Item = TypeVar("Item")
Result = TypeVar("Result")


def orientation(image: Image.Image) -> int | None:
    """The EXIF orientation the CPU path applies (1: none), from the parsed header; None when
    the EXIF block cannot be read (the CPU path then warns and keeps the pixels as stored)."""
    try:
        value = image.getexif().get(ExifTags.Base.Orientation, 1)
        return value if value in _ORIENT else 1
    except Exception:  # noqa: BLE001 - a broken EXIF block is the CPU path's to judge
        return None


def accepts(opened: OpenedImage) -> int | None:
    """The EXIF orientation to apply (1: none) when the header says nvJPEG decodes this image
    as the CPU path would: a baseline JPEG (or MPO) in YCbCr or grayscale (not RGB-coded:
    nvJPEG would convert its colours as if YCbCr, ``jpegheader.rgb_coded``), ending in its
    end-of-image marker (nvJPEG may decode a truncated file that PIL refuses with 400), with a
    readable EXIF orientation; None when it does not. Read once: the decoder is handed it. An
    image without EXIF or XMP is not opened by PIL here (``servecore.jpegheader``)."""
    header = opened.header
    if not (
        header.format in FORMATS
        and header.mode in MODES
        and not header.progressive
        and min(header.size) > 0
        and opened.data.rstrip(b"\0\r\n\t ").endswith(_EOI)
        and not (header.mode == "RGB" and jpegheader.rgb_coded(opened.data))
    ):
        return None
    return orientation(opened.image) if header.tagged else 1


def stored_pixels(opened: OpenedImage) -> int:
    """Pixels nvJPEG decodes: the stored size, before the CPU path's draft scaling (an upper
    bound: a drafted side is rounded up)."""
    return opened.pixels * opened.header.scale**2


@dataclass(frozen=True)
class Window:
    """The region of an upright image a decoder needs for the crop: ``margins`` (rows off the
    top and off the bottom, columns off each side: symmetric, so it is the same region whatever
    EXIF turn the image takes, its sides swapped by a transposing one), of an upright image of
    ``size`` (rows, columns) that the resize makes ``resized``, whose crop starts at
    ``start``. The crop of the region is computed with the weights the resize of the whole
    image gives the crop's pixels (``_span``): the same pixels to float rounding."""

    margins: tuple[int, int]
    size: tuple[int, int]
    resized: tuple[int, int]
    start: tuple[int, int]

    def stored(self, width: int, height: int, turn: int) -> tuple[int, int, int, int]:
        """The region in the stored image (``width`` x ``height``): top, left, bottom, right."""
        rows, cols = self.margins[::-1] if turn in _TRANSPOSED else self.margins
        return rows, cols, height - rows, width - cols


def window(width: int, height: int, turn: int) -> Window | None:
    """The ``Window`` of a stored ``width`` x ``height`` image taking EXIF turn ``turn``; None
    when the resize does not shrink both sides at least twofold (a region would save little).
    The crop is the CPU path's: shorter side to ``RESIZE`` (the longer ``int(RESIZE * long /
    short)``), centre ``CROP`` at ``round((side - CROP) / 2)``; the region reaches
    ``REGION_EDGE`` pixels beyond the crop's taps."""
    upright = (height, width) if turn not in _TRANSPOSED else (width, height)  # rows, cols
    short, long = min(upright), max(upright)
    resized_long = int(RESIZE * long / short)
    resized = (resized_long, RESIZE) if upright[1] <= upright[0] else (RESIZE, resized_long)
    if any(size < 2 * new for size, new in zip(upright, resized)):
        return None
    starts = tuple(round((new - CROP) / 2) for new in resized)
    margins = []
    for size, new, start in zip(upright, resized, starts):
        first, _ = _taps(size, new, start)
        _, last = _taps(size, new, start + CROP - 1)
        margins.append(max(0, min(first, size - last) - REGION_EDGE))
    return Window((margins[0], margins[1]), upright, resized, (starts[0], starts[1]))


def _taps(size: int, new: int, index: int) -> tuple[int, int]:
    """The source pixels [first, last) torch's antialiased bilinear resize of a side of
    ``size`` to ``new`` (shrinking) reads for output pixel ``index``
    (``aten/src/ATen/native/cpu/UpSampleKernel.cpp``: the support is the scale)."""
    scale = size / new
    center = scale * (index + 0.5)
    return max(int(center - scale + 0.5), 0), min(int(center + scale + 0.5), size)


@functools.lru_cache(maxsize=128)
def _span(size: int, new: int, start: int, margin: int, device: torch.device) -> torch.Tensor:
    """float32 [CROP, size - 2 * margin] on ``device``: the weights of the source pixels
    [margin, size - margin) in output pixels [start, start + CROP) of a side of ``size``
    resized to ``new``, as torch's antialiased bilinear resize computes them (a triangle
    filter as wide as the scale, over the taps ``_taps`` gives, normalised per output pixel);
    kept per photo size, 128 at most (3.5 MB each at 12 MP), copied over from page-locked
    memory without a wait."""
    scale = size / new
    centers = scale * (torch.arange(start, start + CROP, dtype=torch.float64)[:, None] + 0.5)
    first = (centers - scale + 0.5).floor().clamp(min=0)
    last = (centers + scale + 0.5).floor().clamp(max=size)
    taps = first + torch.arange(int((last - first).max()), dtype=torch.float64)  # [CROP, taps]
    triangle = (1 - ((taps - centers + 0.5) / scale).abs()).clamp(min=0) * (taps < last)
    width = size - 2 * margin
    columns = (taps.long() - margin).clamp(0, width - 1)  # a tap past ``last`` adds 0
    share = (triangle / triangle.sum(1, keepdim=True)).float()
    weights = torch.zeros(CROP, width).scatter_add_(1, columns, share)
    if device.type == "cuda":
        weights = weights.pin_memory()
    return weights.to(device, non_blocking=True)


class DeviceDecoder:
    """Accepted JPEGs -> uint8 [3, 224, 224] crops on ``device``, in order, None for each one
    the decoder refused. ``chunk_pixels`` bounds the stored pixels decoded at once (device
    memory: 3 bytes each); ``decode`` is ``torchvision.io.decode_jpeg`` unless a test fakes it.
    The decode returns finished (torchvision waits for nvJPEG); the resize and crop are queued
    on the current stream and finish ahead of the forward that reads them. torchvision is
    imported here, by a GPU worker, not by every worker that imports the intake (seconds of a
    CPU worker's start)."""

    def __init__(self, device: torch.device, chunk_pixels: int, decode: Decode | None = None):
        from torchvision.io import ImageReadMode, decode_jpeg

        self.device = device
        self.chunk_pixels = chunk_pixels
        self.decode = decode or decode_jpeg
        self.rgb = ImageReadMode.RGB
        self.refusals = Refusals(self)

    def __str__(self) -> str:
        return f"{self.device} (nvJPEG; other images on the CPU)"

    def __call__(
        self, images: Sequence[OpenedImage], orientations: Sequence[int] | None = None
    ) -> list[torch.Tensor | None]:
        """``images`` (accepted ones) and their ``orientations`` (what ``accepts`` answered;
        None: read again) -> their crops, the refused ones counted."""
        turns = list(orientations) if orientations is not None else [accepts(i) for i in images]
        crops: list[torch.Tensor | None] = []
        for chunk in _chunks(images, self.chunk_pixels):
            chunk_turns = [t or 1 for t in turns[len(crops) : len(crops) + len(chunk)]]
            decoded = self.decoded_images(chunk, chunk_turns)
            crops += self.crops(decoded, chunk_turns)
        self.refusals.count(len(crops), sum(crop is None for crop in crops))
        return crops

    def decoded_images(
        self, images: Sequence[OpenedImage], turns: Sequence[int]
    ) -> list[tuple[torch.Tensor | None, Window | None]]:
        """Each image's stored pixels (RGB uint8 [3, H, W], or only its ``Window``'s region,
        which nvJPEG cannot decode: always None here), None for one refused."""
        return [(pixels, None) for pixels in self.decoded([_encoded(i.data) for i in images])]

    def crops(
        self,
        decoded: list[tuple[torch.Tensor | None, Window | None]],
        turns: list[int],
    ) -> list[torch.Tensor | None]:
        """The crop of each decoded image (None stays None), in order. Images of one size,
        orientation and window are resized together, ``GROUP_PIXELS`` at most at once: on a
        GPU each resize call is about six kernel launches, 90 µs of the worker's CPU, and a
        batched call's rows are each the image's own crop, bit for bit (measured on an H200: 64
        small JPEGs 6.0 -> 0.6 ms). A group that fails is cropped one image at a time."""
        out: list[torch.Tensor | None] = [None] * len(decoded)
        groups: dict[tuple, list[tuple[int, torch.Tensor]]] = {}
        for i, (pixels, region) in enumerate(decoded):
            if pixels is not None:
                key = (tuple(pixels.shape), turns[i], region)
                groups.setdefault(key, []).append((i, pixels))
        for (shape, turn, region), members in groups.items():
            height, width = shape[-2:]
            resized = RESIZE * RESIZE * max(height, width) // min(height, width)
            step = max(1, GROUP_PIXELS // max(height * width, resized))
            for start in range(0, len(members), step):
                part = members[start : start + step]
                batch = torch.stack([p for _, p in part]) if len(part) > 1 else part[0][1][None]
                for (i, _), crop in zip(part, self._resized(batch, turn, region)):
                    out[i] = crop
        return out

    def decoded(self, encoded: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """RGB uint8 [3, H, W] per image, on the device: one batched call (nvJPEG fails the
        whole call for one bad file: then ``bisected``), None for each that fails alone."""
        return bisected(self._decode_jpegs, encoded)

    def _decode_jpegs(self, encoded: list[torch.Tensor]) -> list[torch.Tensor]:
        quiet(self.device)
        return list(self.decode(encoded, mode=self.rgb, device=self.device))

    def _resized(
        self, pixels: torch.Tensor, turn: int, region: Window | None
    ) -> list[torch.Tensor | None]:
        """``_crop`` of a group, one crop per image; when the device fails the group (out of
        memory, say), each image alone, None for one it fails (the CPU path decodes it)."""
        try:
            return list(_crop(pixels, turn, region))
        except Exception as exc:  # noqa: BLE001 - e.g. out of device memory
            if len(pixels) > 1:
                return [c for one in pixels for c in self._resized(one[None], turn, region)]
            logger.warning("device resize failed, decoding on the CPU: %s", exc)
            return [None]


def quiet(device: torch.device) -> None:
    """Waits for the work queued on ``device``'s current stream (the decode stream, while
    decoding), before torchvision's nvJPEG decodes: it writes from a stream of its own into
    output memory torch's allocator handed out on the current one, which queued work may
    still read (pytorch/vision#9606, meta-pytorch/torchcodec#1634), so nothing may be queued
    when it starts. nvImageCodec needs no wait: it decodes on the stream it is given, into
    memory it allocates there (``servecore.nvimgdecode``). The forward runs on another stream
    and is not waited for (``servecore.overlap``)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def bisected(
    call: Callable[[list[Item]], Sequence[Result | None]], items: list[Item]
) -> list[Result | None]:
    """``call(items)``, one result per item; when it raises (a decoder that fails a whole
    call for one bad file), each half again, down to single items, None for one that fails
    alone: one bad file among n costs about 2 log2(n) calls, not n."""
    try:
        return list(call(items))
    except Exception as exc:  # noqa: BLE001 - some item of the call; found below
        if len(items) == 1:
            logger.debug("device decoder refused an image, CPU path: %s", exc)
            return [None]
    half = len(items) // 2
    return bisected(call, items[:half]) + bisected(call, items[half:])


class Refusals:
    """The images a device decoder was handed (``sent``) and gave back to the CPU path
    (``refused``) since the worker started (describe's ``gpu.refused``; each batch's in
    ``resnet50_gpu_refused_total``), and a warning, at most once every ``WARN_EVERY_S``, when
    more than ``WARN_SHARE`` of those handed over since the last one were refused: a decoder
    failing inside (nvImageCodec answers None for every image then, without raising) leaves
    the CPU to decode everything. ``clock``: monotonic seconds, unless a test gives its own."""

    def __init__(self, decoder: object, clock: Callable[[], float] = time.monotonic) -> None:
        self.decoder, self.clock = decoder, clock
        self.sent = self.refused = 0
        self.since = (clock(), 0, 0)  # the warning's window: its start, sent and refused then

    def count(self, sent: int, refused: int) -> None:
        self.sent, self.refused = self.sent + sent, self.refused + refused
        started, sent_then, refused_then = self.since
        now = self.clock()
        if now - started < WARN_EVERY_S:
            return
        window = (self.sent - sent_then, self.refused - refused_then)
        if window[1] > WARN_SHARE * window[0]:
            logger.warning(
                "gpu_decode: %s refused %d of the %d JPEGs it was handed in the last %.0f s; "
                "the CPU path decoded them instead (describe's gpu.refused, "
                "resnet50_gpu_refused_total)",
                self.decoder, window[1], window[0], now - started,
            )  # fmt: skip
        self.since = (now, self.sent, self.refused)

    def as_dict(self) -> dict:
        return {"images": self.refused, "of": self.sent}


def _crop(pixels: torch.Tensor, turn: int, region: Window | None = None) -> torch.Tensor:
    """uint8 [N, 3, H, W] -> [N, 3, 224, 224]: upright by EXIF orientation ``turn``, then the
    weights' resize (bilinear, antialiased; in float32, rounded once, as torchvision resizes
    uint8 on a GPU) and centre crop; of a ``region`` (its pixels only), the whole image's crop
    computed from the weights the whole image's resize gives it."""
    from torchvision.transforms import InterpolationMode  # a GPU worker's, imported once
    from torchvision.transforms.v2 import functional as F

    upright = _ORIENT.get(turn, _same)(pixels).float()
    if region is None:
        resized = F.resize(upright, [RESIZE], InterpolationMode.BILINEAR, antialias=True)
        cropped = F.center_crop(resized, [CROP])
    else:
        rows, cols = (
            _span(size, new, start, margin, pixels.device)
            for size, new, start, margin in zip(
                region.size, region.resized, region.start, region.margins
            )
        )
        cropped = rows @ upright @ cols.T  # only the crop's pixels are computed
    return cropped.round_().clamp_(0, 255).to(torch.uint8)


def probe_jpeg(size: int = 256) -> bytes:
    """A small baseline 4:2:0 JPEG (what a GPU decoder is tried on at start)."""
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), (90, 120, 150)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def assemble(crops: Sequence[torch.Tensor], device: torch.device | None) -> torch.Tensor:
    """The batch of crops in order: on ``device`` when any crop is there (the CPU crops
    copied over in one transfer, from page-locked memory, queued on the current stream), else
    on the CPU (the backend stages it)."""
    on_cpu = [i for i, c in enumerate(crops) if c.device.type == "cpu"]
    if device is None or len(on_cpu) in (0, len(crops)):  # all on one side: one stack
        return torch.stack(list(crops))
    batch = torch.empty((len(crops), *crops[0].shape), dtype=torch.uint8, device=device)
    staged = torch.stack([crops[i] for i in on_cpu])
    if device.type == "cuda":
        staged = staged.pin_memory()
    batch[on_cpu] = staged.to(device, non_blocking=True)
    on_device = [i for i, c in enumerate(crops) if c.device.type != "cpu"]
    batch[on_device] = torch.stack([crops[i] for i in on_device])
    return batch


def _chunks(images: Sequence[OpenedImage], limit: int) -> Iterator[list[OpenedImage]]:
    """Consecutive runs of ``images`` of at most ``limit`` stored pixels (an image over it
    alone)."""
    chunk: list[OpenedImage] = []
    pixels = 0
    for image in images:
        size = stored_pixels(image)
        if chunk and pixels + size > limit:
            yield chunk
            chunk, pixels = [], 0
        chunk.append(image)
        pixels += size
    if chunk:
        yield chunk


def _encoded(data: bytes) -> torch.Tensor:
    """The request's bytes as the uint8 tensor nvJPEG reads, without a copy: torch warns that
    a ``bytes`` buffer is not writable, and nothing writes to it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(data, dtype=torch.uint8)


def _same(pixels: torch.Tensor) -> torch.Tensor:
    return pixels
