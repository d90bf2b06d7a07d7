"""Which decoder a GPU worker's JPEGs go to, chosen once when it starts, and why:
nvImageCodec (``servecore.nvimgdecode``), else torchvision's nvJPEG
(``servecore.gpudecode.DeviceDecoder``), else the CPU path (``handler.gpu_decode``)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import torch

from servecore import nvimgdecode
from servecore.gpudecode import DeviceDecoder, _encoded, probe_jpeg

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecoderChoice:
    """Which decoder a worker's JPEGs go to (``nvimgcodec``, ``nvjpeg`` or ``cpu``) and why,
    in describe's ``gpu``: each decoder passed over says what it lacked."""

    decoder: str
    why: str

    def as_dict(self) -> dict:
        return asdict(self)


def for_worker(
    setting: str, device: torch.device, chunk_pixels: int
) -> tuple[DeviceDecoder | None, DecoderChoice]:
    """``handler.gpu_decode`` on a worker of ``device``: the decoder its JPEGs go to (None: the
    CPU path) and why, chosen once. ``auto`` and ``nvimgcodec``: nvImageCodec when it is
    installed and decodes a probe JPEG on this GPU, else what ``nvjpeg`` gives: torchvision's
    nvJPEG when it decodes the probe, else the CPU (each step logged)."""
    if device.type != "cuda":
        return None, DecoderChoice("cpu", "a CPU worker")
    if setting == "off":
        return None, DecoderChoice("cpu", "handler.gpu_decode is off")
    passed: list[str] = []
    if setting in ("auto", "nvimgcodec"):
        found, why = nvimgdecode.load(device, chunk_pixels)
        if found is not None:
            return found, DecoderChoice("nvimgcodec", why)
        logger.warning("gpu_decode: nvImageCodec %s; trying torchvision's nvJPEG", why)
        passed.append(f"nvImageCodec {why}")
    decoder = DeviceDecoder(device, chunk_pixels)
    if decoder.decoded([_encoded(probe_jpeg())])[0] is not None:
        return decoder, DecoderChoice("nvjpeg", "; ".join([*passed, "torchvision's nvJPEG"]))
    logger.warning("gpu_decode: nvJPEG decoding fails on %s; decoding on the CPU", device)
    passed.append(f"torchvision's nvJPEG fails to decode a probe JPEG on {device}")
    return None, DecoderChoice("cpu", "; ".join(passed))
