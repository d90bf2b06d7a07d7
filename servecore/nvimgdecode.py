"""JPEGs decoded on the worker's GPU by NVIDIA's nvImageCodec (``nvidia-nvimgcodec-cu13``,
requirements-gpu.txt): the first choice of ``handler.gpu_decode: auto``
(``servecore.gpudecode.for_worker``).

Why nvImageCodec, not DALI: it is a decoder library called on the batch the worker already
holds (``Decoder.decode(list)``: one call, the images' device arrays back), where DALI is a
pipeline that wants to own the batching, the threads and the memory (its ``external_source``
and pipeline objects around every call); it is a small wheel, and DALI's own image decoder is
built on it. Over torchvision's nvJPEG it brings the GPU's hardware JPEG engines (A100, H100,
H200: Huffman decoding in fixed-function units, not the worker's CPU), per-image fallback
inside one call (the hardware engines, then nvJPEG's CUDA decoder, which nvImageCodec files
under ``HYBRID_CPU_GPU``: Huffman decoding of small images on its CPU threads; a backend kind
not listed is dropped, so both are; an image neither decodes comes back None, not a failed
batch), the chroma upsampling libjpeg does (``OPTIONS``), and region decoding: a large photo
is decoded only where its centre crop falls (``servecore.gpudecode.window``; its long side's
ends are never decoded, a 4:3 photo's crop needs 62% of it). nvJPEG, hardware or CUDA, cannot
decode at a reduced scale (JPEG draft decoding, which the CPU path uses): the region is the
smallest input the GPU can give the resize.

Everything else is the torchvision decoder's (``DeviceDecoder``): which images come here
(``accepts``), the EXIF turn (applied here, as the CPU path reads it: nvImageCodec's own is
switched off), the resize and crop, chunks of stored pixels, the CPU path for what is refused.
The API used is 0.9's (read from the 0.9.0.20 wheel; sources checked at 0.8). No GPU has run
this module yet: tests/test_gpudecode.py runs it on the CPU against a stand-in of the
library, and against the library itself (its CPU decoder) where it is installed;
``python -m bench.gpucheck`` asks a GPU what reading could not settle.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
import torch

from servecore.gpudecode import DeviceDecoder, Window, bisected, probe_jpeg, window
from servecore.images import OpenedImage

logger = logging.getLogger(__name__)

MODULE = "nvidia.nvimgcodec"
INSTALL = "pip install -r requirements-gpu.txt"
# The share of each call the hardware engines start with; ADAPTIVE moves it to keep them and
# the CUDA decoder both busy. DALI's default; the GPU run is to measure it.
HARDWARE_LOAD = 0.9
# Chroma upsampled with interpolation, as libjpeg (PIL) does: nvImageCodec 0.8's Python
# Decoder defaulted to ":fancy_upsampling=0". 0.9 refuses a region so upsampled with nvJPEG
# before 13.2 (its outermost pixel may be wrong) unless told: the region keeps
# ``gpudecode.REGION_EDGE`` pixels the crop does not read.
OPTIONS = ":fancy_upsampling=1 :enable_roi_fancy_upsampling=1"
# nvImageCodec's own CPU threads (parsing, the CUDA decoder's Huffman decoding of small
# images), per worker; 0 would be one per core, on top of the worker's decode threads.
CPU_THREADS = 4
_RELEASE_THRESHOLD = 4  # CU_MEMPOOL_ATTR_RELEASE_THRESHOLD (cuda.h)


class NvImageCodecDecoder(DeviceDecoder):
    """``DeviceDecoder`` with nvImageCodec's ``decoder`` (a ``nvimgcodec.Decoder``) in place of
    nvJPEG, each large photo decoded in its crop's region. ``codec``: the ``nvidia.nvimgcodec``
    module (a test's stand-in); ``label``: its backends, as describe names them."""

    def __init__(
        self, device: torch.device, chunk_pixels: int, codec: ModuleType, decoder: Any, label: str
    ) -> None:
        super().__init__(device, chunk_pixels)
        self.codec, self.decoder, self.label = codec, decoder, label
        # The EXIF turn is the CPU path's (PIL's reading of it, ``accepts``), applied after.
        self.params = codec.DecodeParams(
            apply_exif_orientation=False, color_spec=codec.ColorSpec.SRGB
        )

    def __str__(self) -> str:
        return f"{self.device} (nvImageCodec: {self.label}; other images on the CPU)"

    def decoded_images(
        self, images: Sequence[OpenedImage], turns: Sequence[int]
    ) -> list[tuple[torch.Tensor | None, Window | None]]:
        """One ``decode`` call for the chunk, on the current stream: each image's region
        (its whole when ``window`` gives none) as RGB uint8 [3, h, w] on the device, None for
        one the library refuses (an unreadable header, a decode that failed); when the whole
        call raises, ``bisected``."""
        streams, regions = [], []
        for image, turn in zip(images, turns, strict=True):
            stream, region = self._stream(image.data, turn)
            streams.append(stream)
            regions.append(region)
        sent = [k for k, stream in enumerate(streams) if stream is not None]
        pixels = self._decode([streams[k] for k in sent])
        out: list[tuple[torch.Tensor | None, Window | None]] = [(None, None)] * len(images)
        for k, decoded in zip(sent, pixels, strict=True):
            out[k] = (decoded, regions[k]) if decoded is not None else (None, None)
        return out

    def _stream(self, data: bytes, turn: int) -> tuple[Any, Window | None]:
        """The image's code stream, cut to its crop's region where ``window`` gives one; None
        when its header cannot be read (the CPU path then judges the file)."""
        try:
            stream = self.codec.CodeStream(data)
        except Exception as exc:  # noqa: BLE001 - the library's RuntimeError: not its image
            logger.debug("nvImageCodec refused an image's header, CPU path: %s", exc)
            return None, None
        region = window(stream.width, stream.height, turn)
        if region is None:
            return stream, None
        top, left, bottom, right = region.stored(stream.width, stream.height, turn)
        return stream.get_sub_code_stream(
            region=self.codec.Region(top, left, bottom, right)
        ), region

    def _decode(self, streams: list[Any]) -> list[torch.Tensor | None]:
        if not streams:
            return []
        images = bisected(self._call, streams)
        return [None if image is None else self._tensor(image) for image in images]

    def _call(self, streams: list[Any]) -> list[Any]:
        stream = torch.cuda.current_stream(self.device).cuda_stream if self._cuda else 0
        return list(self.decoder.decode(streams, params=self.params, cuda_stream=stream))

    @property
    def _cuda(self) -> bool:
        return self.device.type == "cuda"

    def _tensor(self, image: Any) -> torch.Tensor:
        """A decoded image (HWC, 3 channels: ``ColorSpec.SRGB`` turns grayscale into RGB too)
        as a [3, H, W] tensor without a copy: DLPack on the device (torch hands it the current
        stream, the one it was decoded on), the array interface for the library's CPU
        decoder."""
        if image.buffer_kind == self.codec.ImageBufferKind.STRIDED_HOST:
            return torch.from_numpy(np.asarray(image)).permute(2, 0, 1)
        return torch.from_dlpack(image).permute(2, 0, 1)


def load(
    device: torch.device, chunk_pixels: int, codec: ModuleType | None = None
) -> tuple[NvImageCodecDecoder | None, str]:
    """The decoder for ``device`` and why, or None and why not: not installed, or its probe
    JPEG not decoded on this GPU. The hardware JPEG engines first where a probe shows them
    (they take ``HARDWARE_LOAD`` of each call to start with, adaptively), the CUDA decoder for
    the rest and where there are none. On a GPU the memory nvImageCodec decodes into stays
    in the device's pool between batches (``keep_pool``). ``codec``: the module, unless a test
    stands in."""
    if codec is None:
        try:
            codec = importlib.import_module(MODULE)
        except ImportError as error:
            return None, f"is not installed ({error}; {INSTALL})"
    kinds = codec.BackendKind
    try:
        hardware = _decodes(codec, device, [codec.Backend(kinds.HW_GPU_ONLY)])
    except Exception as error:  # noqa: BLE001 - no hardware engines: the CUDA decoder alone
        logger.info("nvImageCodec: no hardware JPEG decoding on %s (%s)", device, error)
        hardware = False
    try:
        backends = [codec.Backend(kinds.HYBRID_CPU_GPU)]
        if hardware:
            policy = codec.LoadHintPolicy.ADAPTIVE_MINIMIZE_IDLE_TIME
            backends.insert(0, codec.Backend(kinds.HW_GPU_ONLY, HARDWARE_LOAD, policy))
        decoder = new_decoder(codec, device, backends)
        if not _decodes(codec, device, backends, decoder):
            return None, f"decodes no probe JPEG on {device}"
    except Exception as error:  # noqa: BLE001 - a library that cannot start: the next decoder
        return None, f"failed to start on {device} ({type(error).__name__}: {error})"
    if device.type == "cuda":
        keep_pool(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    label = "hardware JPEG engines, then CUDA" if hardware else "CUDA"
    why = (
        f"{codec.__version__}: the hardware JPEG engines of {name}, its CUDA decoder for the rest"
        if hardware
        else f"{codec.__version__}: its CUDA decoder ({name} has no hardware JPEG decoder)"
    )
    return NvImageCodecDecoder(device, chunk_pixels, codec, decoder, label), why


def new_decoder(
    codec: ModuleType, device: torch.device, backends: list, options: str = OPTIONS
) -> Any:
    """A ``nvimgcodec.Decoder`` of ``device`` with ``backends`` only, as a worker makes it."""
    return codec.Decoder(
        device_id=device.index or 0,
        max_num_cpu_threads=CPU_THREADS,
        backends=backends,
        options=options,
    )


def _decodes(codec: ModuleType, device: torch.device, backends: list, decoder: Any = None) -> bool:
    """Whether ``decoder`` (else a new one of ``backends`` only) decodes the probe JPEG."""
    decoder = decoder or new_decoder(codec, device, backends)
    [image] = decoder.decode([codec.CodeStream(probe_jpeg())])
    return image is not None


def keep_pool(device: torch.device, threshold: int = 2**64 - 1) -> bool:
    """Whether the memory freed to ``device``'s default stream-ordered pool now stays there,
    up to ``threshold`` bytes (all of it), rather than going back to the driver at every
    synchronisation, the wait once a batch included (the pool's default, 0): nvImageCodec
    allocates its output images from that pool, so each batch would map them afresh. Set with
    the CUDA driver API (torch has no call for the default pool); a failure is logged and
    costs only that."""
    try:
        cuda, pool = default_pool(device)
        value = ctypes.c_uint64(threshold)
        _checked(cuda.cuMemPoolSetAttribute(pool, _RELEASE_THRESHOLD, ctypes.byref(value)))
    except OSError as error:
        logger.warning("nvImageCodec: its pool is released every batch on %s (%s)", device, error)
        return False
    return True


def default_pool(device: torch.device) -> tuple[ctypes.CDLL, ctypes.c_void_p]:
    """The CUDA driver library and ``device``'s default memory pool (raises ``OSError``)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    handle, pool = ctypes.c_int(), ctypes.c_void_p()
    _checked(cuda.cuDeviceGet(ctypes.byref(handle), device.index or 0))
    _checked(cuda.cuDeviceGetDefaultMemPool(ctypes.byref(pool), handle))
    return cuda, pool


def _checked(status: int) -> None:
    if status:
        raise OSError(f"CUDA driver error {status}")
