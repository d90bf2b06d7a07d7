"""JPEG bytes -> the served input's uint8 crops on the worker's GPU: batched nvJPEG
(``torchvision.io.decode_jpeg`` on CUDA), then the weights' resize and centre crop there.

Only a JPEG that nvJPEG decodes as PIL does is sent (``accepts``, read from the header PIL
already parsed: baseline JPEG/MPO in RGB or grayscale, complete, its EXIF orientation
readable); the rest (PNG, WebP, progressive or CMYK JPEG, ...) stay on the CPU path, and so
does any image nvJPEG refuses (``DeviceDecoder`` answers None for it), which the CPU path
then decodes or fails with its own error. The pixels differ slightly from PIL's (nvJPEG's
IDCT and chroma upsampling; the resize in float32, rounded once: at most one level from the
uint8 resize PIL's path runs, measured on CPU): answers stay within the fidelity bound
(tests/test_gpudecode.py).
"""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence

import torch
from PIL import ExifTags, Image

from model_files.recipe import CROP, RESIZE
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
Decode = Callable[..., list[torch.Tensor]]  # torchvision.io.decode_jpeg's list form
# Pixels resized in one call, counted in the input or the resized copy, whichever is larger:
# bounds its float32 working memory to about 200 MB each (3 channels, 4 bytes a value). A
# group of 451x300 photos is resized 124 at a time, a 12 MP photo alone.
GROUP_PIXELS = 2**24


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
    as the CPU path would: a baseline JPEG (or MPO) in RGB or grayscale, ending in its
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
    ):
        return None
    return orientation(opened.image) if header.tagged else 1


def stored_pixels(opened: OpenedImage) -> int:
    """Pixels nvJPEG decodes: the stored size, before the CPU path's draft scaling (an upper
    bound: a drafted side is rounded up)."""
    return opened.pixels * opened.header.scale**2


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

    def __str__(self) -> str:
        return f"{self.device} (nvJPEG; other images on the CPU)"

    def __call__(
        self, images: Sequence[OpenedImage], orientations: Sequence[int] | None = None
    ) -> list[torch.Tensor | None]:
        """``images`` (accepted ones) and their ``orientations`` (what ``accepts`` answered;
        None: read again) -> their crops."""
        turns = list(orientations) if orientations is not None else [accepts(i) for i in images]
        crops: list[torch.Tensor | None] = []
        for chunk in _chunks(images, self.chunk_pixels):
            decoded = self.decoded([_encoded(image.data) for image in chunk])
            crops += self.crops(
                decoded, [t or 1 for t in turns[len(crops) : len(crops) + len(chunk)]]
            )
        return crops

    def crops(
        self, decoded: list[torch.Tensor | None], turns: list[int]
    ) -> list[torch.Tensor | None]:
        """The crop of each decoded image (None stays None), in order. Images of one size and
        orientation are resized together, ``GROUP_PIXELS`` at most at once: on a GPU each
        resize call is about six kernel launches, 90 µs of the worker's CPU, and a batched
        call's rows are each the image's own crop, bit for bit (measured on an H200: 64
        small JPEGs 6.0 -> 0.6 ms). A group that fails is cropped one image at a time."""
        out: list[torch.Tensor | None] = [None] * len(decoded)
        groups: dict[tuple[tuple[int, ...], int], list[tuple[int, torch.Tensor]]] = {}
        for i, pixels in enumerate(decoded):
            if pixels is not None:
                groups.setdefault((tuple(pixels.shape), turns[i]), []).append((i, pixels))
        for (shape, turn), members in groups.items():
            height, width = shape[-2:]
            resized = RESIZE * RESIZE * max(height, width) // min(height, width)
            step = max(1, GROUP_PIXELS // max(height * width, resized))
            for start in range(0, len(members), step):
                part = members[start : start + step]
                batch = torch.stack([p for _, p in part]) if len(part) > 1 else part[0][1][None]
                for (i, _), crop in zip(part, self._resized(batch, turn)):
                    out[i] = crop
        return out

    def decoded(self, encoded: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """RGB uint8 [3, H, W] per image, on the device: one batched call; when that fails
        (nvJPEG fails the whole call for one bad file), one call per image, None for each
        that fails."""
        if self.device.type == "cuda":
            # The decoder writes on its own stream into memory the caller's stream may still be
            # reading (pytorch/vision#9606): nothing may be queued when it starts.
            torch.cuda.current_stream(self.device).synchronize()
        try:
            return list(self.decode(encoded, mode=self.rgb, device=self.device))
        except Exception:  # noqa: BLE001 - some file in the batch; find which below
            if len(encoded) == 1:
                return [None]
        return [self.one(data) for data in encoded]

    def one(self, data: torch.Tensor) -> torch.Tensor | None:
        try:
            return self.decode([data], mode=self.rgb, device=self.device)[0]
        except Exception as exc:  # noqa: BLE001 - refused: the CPU path decides
            logger.debug("device decoder refused an image, CPU path: %s", exc)
            return None

    def _resized(self, pixels: torch.Tensor, turn: int) -> list[torch.Tensor | None]:
        """``_crop`` of a group, one crop per image; when the device fails the group (out of
        memory, say), each image alone, None for one it fails (the CPU path decodes it)."""
        try:
            return list(_crop(pixels, turn))
        except Exception as exc:  # noqa: BLE001 - e.g. out of device memory
            if len(pixels) > 1:
                return [crop for one in pixels for crop in self._resized(one[None], turn)]
            logger.warning("device resize failed, decoding on the CPU: %s", exc)
            return [None]


def _crop(pixels: torch.Tensor, turn: int) -> torch.Tensor:
    """uint8 [N, 3, H, W] -> [N, 3, 224, 224]: upright by EXIF orientation ``turn``, then the
    weights' resize (bilinear, antialiased; in float32, rounded once, as torchvision resizes
    uint8 on a GPU) and centre crop."""
    from torchvision.transforms import InterpolationMode  # a GPU worker's, imported once
    from torchvision.transforms.v2 import functional as F

    upright = _ORIENT.get(turn, _same)(pixels)
    resized = F.resize(upright.float(), [RESIZE], InterpolationMode.BILINEAR, antialias=True)
    return F.center_crop(resized, [CROP]).round_().clamp_(0, 255).to(torch.uint8)


def for_worker(setting: str, device: torch.device, chunk_pixels: int) -> DeviceDecoder | None:
    """``handler.gpu_decode``: ``auto`` decodes JPEGs on a CUDA worker's GPU when a probe
    JPEG decodes there (torchvision built with nvJPEG), else (``off``, a CPU worker, no
    nvJPEG) None: every image on the CPU path."""
    if setting == "off" or device.type != "cuda":
        return None
    decoder = DeviceDecoder(device, chunk_pixels)
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (90, 120, 150)).save(buffer, "JPEG")
    if decoder.decoded([_encoded(buffer.getvalue())])[0] is None:
        logger.warning("gpu_decode: nvJPEG decoding fails on %s; decoding on the CPU", device)
        return None
    return decoder


def assemble(crops: Sequence[torch.Tensor], device: torch.device | None) -> torch.Tensor:
    """The batch of crops in order: on ``device`` when any crop is there (the CPU crops
    copied over in one transfer), else on the CPU (the backend stages it)."""
    if device is None or all(c.device.type == "cpu" for c in crops):
        return torch.stack(list(crops))
    batch = torch.empty((len(crops), *crops[0].shape), dtype=torch.uint8, device=device)
    on_cpu = [i for i, c in enumerate(crops) if c.device.type == "cpu"]
    on_device = [i for i, c in enumerate(crops) if c.device.type != "cpu"]
    if on_cpu:
        batch[on_cpu] = torch.stack([crops[i] for i in on_cpu]).to(device)
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
