"""``python -m bench.gpucheck``: what reading the GPU path could not settle, asked of the GPU in
seconds, in one Markdown report: each check's question (the findings of the review of issue
#67's GPU path it answers), its lines, and what they decide.

    python -m bench.gpucheck [--weights DIR] [--out PATH] [--quiet]

1. the backend kinds nvImageCodec decodes a JPEG with, each alone, and what a worker chose;
2. its hardware engines on a 12 MP photo whole and by its crop's region, and the crop against
   the CPU path's;
3. a 4:1:1 JPEG (encoded by nvImageCodec on the GPU: PIL cannot write 4:1:1) on the engines
   and through the worker's decoder;
4. chroma upsampling against PIL's pixels: each decoder with and without libjpeg's
   interpolation, and torchvision's nvJPEG;
5. JPEGs corrupt mid-scan through the core: the GPU's status against the CPU path's;
6. a JPEG + PNG batch in two parts through the core, against the same batch in one;
7. a batch's time without and with the decode stream drained before nvImageCodec decodes, with
   its pool kept and released, and torch's device allocations per batch.

On a GPU with nvImageCodec (requirements-gpu.txt) it writes results/gpu-check.md; elsewhere it
is a rehearsal (build/gpu-check.md): what needs CUDA or the library is skipped with a line
saying so, and the core's checks run on the CPU path. Weights: ``--weights`` when it holds a
checkpoint, else seeded ones (the checks compare decoders, not answers' quality).
"""

from __future__ import annotations

import functools
import importlib
import io
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from PIL import Image

from bench.gpu import weights_folder
from bench.gpucore import _jpeg_request, _model
from bench.gpureport import device_line
from bench.layout import BUILD, RESULTS, WEIGHTS, cli, parse
from bench.machine import dated
from bench.markdown import bullets, document, publish, section
from tests import imagegen

log = logging.getLogger("bench.gpucheck")
GPU_REPORT = RESULTS / "gpu-check.md"
ROWS = 16  # the core's batch here: small, so that it loads in seconds
RUNS = 20  # timed batches per variant in check 7


class Skipped(Exception):
    """A check that cannot run here; its message says what it needs."""


@dataclass
class Bench:
    """What the checks share: the device, the weights' folder, the images, and a core (an
    ``ImageModel`` of ``ROWS`` rows, embeddings, f16 on a GPU) loaded when first asked for."""

    device: torch.device
    folder: Path
    images: dict[str, bytes]
    loaded: Any = field(default=None, repr=False)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @functools.cached_property
    def large(self) -> bytes:
        """A 12 MP photo (made when a check first asks: seconds of the CPU)."""
        return imagegen.jpeg(4242, 2828, seed=2)

    def codec(self) -> ModuleType:
        """nvImageCodec, on a GPU; else ``Skipped`` saying what is missing."""
        from servecore import nvimgdecode

        if not self.cuda:
            raise Skipped("needs CUDA (no GPU here)")
        try:
            return importlib.import_module(nvimgdecode.MODULE)
        except ImportError as error:
            why = f"nvImageCodec is not installed ({error}; {nvimgdecode.INSTALL})"
            raise Skipped(why) from None

    def model(self) -> Any:
        if self.loaded is None:
            handler = {"task": "embedding", "precision_cache": str(self.folder / "choice.json")}
            handler |= {"half_precision": True} if self.cuda else {"precision": "f32"}
            work = {"batch": [b""] * ROWS}
            self.loaded = _model(self.folder, self.device, work, handler)[0]
        return self.loaded


def photos() -> dict[str, bytes]:
    """The checks' JPEGs and PNG (tests/imagegen.py), and the corrupt ones of check 5."""
    small = imagegen.jpeg(451, 300, seed=1)
    scan = small.index(b"\xff\xda") + 600  # well inside the entropy-coded data
    noise = bytes(np.random.default_rng(0).integers(0, 256, 64, dtype=np.uint8))
    return {
        "small": small,
        "4:2:2": imagegen.encode(imagegen.photo(451, 300, seed=1), subsampling=1),
        "png": imagegen.png(320, 240, seed=4),
        "a marker mid-scan": small[:scan] + b"\xff\xd8" + small[scan + 2 :],
        "noise mid-scan": small[:scan] + noise + small[scan + 64 :],
    }


def differs(got: torch.Tensor, want: torch.Tensor) -> str:
    """How far two uint8 images (same shape) are apart, in levels."""
    gap = (got.cpu().int() - want.cpu().int()).abs()
    return (
        f"max {int(gap.max())}, mean {float(gap.float().mean()):.3f}, "
        f"{100 * float((gap > 1).float().mean()):.2f}% over 1"
    )


def pil_pixels(data: bytes) -> torch.Tensor:
    return torch.from_numpy(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).copy())


def decoded(codec: ModuleType, decoder: Any, stream: Any) -> torch.Tensor | None:
    """``stream`` decoded as a worker asks (no EXIF turn, sRGB), HWC uint8 where it was
    decoded (the device; the host for nvImageCodec's CPU decoder)."""
    params = codec.DecodeParams(apply_exif_orientation=False, color_spec=codec.ColorSpec.SRGB)
    [image] = decoder.decode([stream], params=params)
    if image is None or image.buffer_kind != codec.ImageBufferKind.STRIDED_HOST:
        return None if image is None else torch.from_dlpack(image)
    return torch.from_numpy(np.asarray(image))


def alone(codec: ModuleType, b: Bench, kind: str, options: str | None = None) -> Any:
    from servecore import nvimgdecode

    backends = [codec.Backend(getattr(codec.BackendKind, kind))]
    return nvimgdecode.new_decoder(codec, b.device, backends, options or nvimgdecode.OPTIONS)


def crop_against_cpu(b: Bench, data: bytes) -> str:
    """The worker's nvImageCodec decoder's crop of ``data`` against the CPU path's at full
    size (PIL, no draft): what the answers see."""
    from servecore import nvimgdecode
    from servecore.config import HandlerConfig
    from servecore.preprocessor import Preprocessor

    decoder, why = nvimgdecode.load(b.device, 200_000_000)
    if decoder is None:
        return f"no decoder ({why})"
    full = Preprocessor(HandlerConfig(draft_decode=False))
    [crop] = decoder([full.open(data)])
    return "refused (the CPU path decodes it)" if crop is None else differs(crop, full(data))


def kinds(b: Bench) -> list[str]:
    codec = b.codec()
    from servecore import nvimgdecode

    lines = []
    for kind in ("HW_GPU_ONLY", "HYBRID_CPU_GPU", "GPU_ONLY"):
        image = decoded(codec, alone(codec, b, kind), codec.CodeStream(b.images["small"]))
        lines.append(f"{kind} alone: {'decodes' if image is not None else 'None'}")
    found, why = nvimgdecode.load(b.device, 200_000_000)
    return [*lines, f"the worker's decoder: {found or 'none'} ({why})"]


def region(b: Bench) -> list[str]:
    codec = b.codec()
    from servecore.gpudecode import window

    stream = codec.CodeStream(b.large)
    box = window(stream.width, stream.height, 1).stored(stream.width, stream.height, 1)
    cut = stream.get_sub_code_stream(region=codec.Region(*box))
    hardware, lines = alone(codec, b, "HW_GPU_ONLY"), []
    for name, part in (("whole", stream), (f"region {box}", cut)):
        image = decoded(codec, hardware, part)
        torch.cuda.synchronize(b.device)
        started = time.perf_counter()
        for _ in range(3):
            decoded(codec, hardware, part)
        torch.cuda.synchronize(b.device)
        ms = 1000 * (time.perf_counter() - started) / 3
        lines.append(
            f"HW_GPU_ONLY, {name}: "
            + (f"{tuple(image.shape)} in {ms:.1f} ms" if image is not None else "None")
        )
    against = crop_against_cpu(b, b.large)
    return [*lines, f"the worker's crop (its region) against the CPU path's: {against}"]


def chroma_411(b: Bench) -> list[str]:
    codec = b.codec()
    photo = torch.from_numpy(np.asarray(imagegen.photo(451, 300, seed=3)).copy()).to(b.device)
    params = codec.EncodeParams(
        quality_type=codec.QualityType.QUALITY,
        quality_value=92,
        chroma_subsampling=codec.ChromaSubsampling.CSS_411,
    )
    stream = codec.Encoder(device_id=b.device.index or 0).encode(photo, "jpeg", params=params)
    if stream is None:
        raise Skipped("nvImageCodec's encoder wrote no 4:1:1 JPEG here (PIL cannot either)")
    data = bytes(memoryview(stream))
    sampling = codec.CodeStream(data).chroma_subsampling
    image = decoded(codec, alone(codec, b, "HW_GPU_ONLY"), codec.CodeStream(data))
    return [
        f"encoded by nvImageCodec: {len(data)} bytes, read back as {sampling}",
        f"HW_GPU_ONLY alone: {'decodes' if image is not None else 'None'}",
        f"the worker's crop against the CPU path's: {crop_against_cpu(b, data)}",
    ]


def upsampling(b: Bench) -> list[str]:
    codec = b.codec()
    from torchvision.io import ImageReadMode, decode_jpeg

    lines = []
    for name in ("small", "4:2:2"):
        data, label = b.images[name], "4:2:0" if name == "small" else name
        want = pil_pixels(data)
        for kind in ("HW_GPU_ONLY", "HYBRID_CPU_GPU"):
            for options in (None, ":fancy_upsampling=0"):
                image = decoded(codec, alone(codec, b, kind, options), codec.CodeStream(data))
                how = "as the worker asks" if options is None else options
                gap = "None" if image is None else differs(image, want)
                lines.append(f"{label}, {kind}, {how}: {gap}")
        encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        nvjpeg = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=b.device).permute(1, 2, 0)
        lines.append(f"{label}, torchvision's nvJPEG: {differs(nvjpeg, want)}")
    return lines


def statuses(b: Bench, names: list[str], gpu: bool = True) -> list[str]:
    """Each named image as a request of one batch through the core: its status (and error's
    kind), with the worker's GPU decoder or (``gpu`` false) without."""
    from servecore.edges.bodies import status_of
    from servecore.stages import Incoming

    model = b.model()
    kept = model.intake.device_decoder
    model.intake.device_decoder = kept if gpu else None
    try:
        incoming = [Incoming(n, _jpeg_request(b.images[n])) for n in names]
        replies = model.run(incoming, lambda reply: (reply, reply))
    finally:
        model.intake.device_decoder = kept
    return [
        "200" if r.error is None else f"{int(status_of(r.error))} {type(r.error).__name__}"
        for r in replies
    ]


def corrupt(b: Bench) -> list[str]:
    names = ["a marker mid-scan", "noise mid-scan"]
    cpu = statuses(b, names, gpu=False)
    decoder = b.model().intake.device_decoder
    gpu = statuses(b, names) if decoder is not None else ["no GPU decoder here"] * len(names)
    return [f"{n}: CPU path {c}; GPU decoder {g}" for n, c, g in zip(names, cpu, gpu)]


def mixed(b: Bench) -> list[str]:
    if not b.cuda:
        raise Skipped("needs CUDA (a CPU worker has no overlap)")
    from servecore.stages import Incoming

    model = b.model()
    bodies = [b.images["small"], b.images["png"]]
    runs = {}
    for chunks in (2, 1):
        model.overlap.chunks = chunks
        incoming = [Incoming(str(i), _jpeg_request(body)) for i, body in enumerate(bodies)]
        runs[chunks] = model.run(incoming, lambda reply: (reply, reply))
    model.overlap.chunks = model.config.gpu_overlap_chunks
    lines = []
    for chunks, replies in runs.items():
        errors = [r.error for r in replies if r.error is not None]
        lines.append(f"{chunks} part(s): {len(replies) - len(errors)} of 2 answered {errors}")
    if all(r.error is None for rs in runs.values() for r in rs):
        gap = max(
            float(np.abs(a.answer.embeddings - s.answer.embeddings).max())
            for a, s in zip(runs[2], runs[1])
        )
        lines.append(f"embeddings, 2 parts against 1: max |difference| {gap:.2e}")
    return lines


def timed_batches(b: Bench, variant: Callable[[], None] = lambda: None) -> tuple[float, Any]:
    """Median ms of ``RUNS`` batches of ``ROWS`` small JPEGs through the core (after
    ``variant()`` set it up), and their embeddings."""
    from servecore.stages import Incoming

    model = b.model()
    variant()
    times, answers = [], []
    for run in range(RUNS + 3):
        incoming = [Incoming(str(i), _jpeg_request(b.images["small"])) for i in range(ROWS)]
        started = time.perf_counter()
        replies = model.run(incoming, lambda reply: (reply, reply))
        if run >= 3:
            times.append(1000 * (time.perf_counter() - started))
            answers.append(np.stack([r.answer.embeddings[0] for r in replies]))
    return statistics.median(times), answers


def drain_and_pool(b: Bench) -> list[str]:
    from servecore import gpudecode, nvimgdecode

    b.codec()
    decoder = b.model().intake.device_decoder
    if not isinstance(decoder, nvimgdecode.NvImageCodecDecoder):
        raise Skipped(f"the worker's decoder is {decoder}, not nvImageCodec")
    cuda, pool = nvimgdecode.default_pool(b.device)
    call, lines = decoder._call, []

    def drained(streams):
        gpudecode.quiet(b.device)
        return call(streams)

    allocs = torch.cuda.memory_stats(b.device).get("num_device_alloc")
    for name, variant in (
        ("as served (no drain, pool kept)", lambda: None),
        ("drained before each decode", lambda: setattr(decoder, "_call", drained)),
        ("no drain, pool released (threshold 0)", lambda: nvimgdecode.keep_pool(b.device, 0)),
    ):
        ms, answers = timed_batches(b, variant)
        decoder._call = call
        reserved = ctypes_u64(cuda.cuMemPoolGetAttribute, pool, 5)  # RESERVED_MEM_CURRENT
        gap = max(float(np.abs(a - answers[0]).max()) for a in answers)
        lines.append(
            f"{name}: {ms:.2f} ms a batch of {ROWS}; pool holds {reserved / 2**20:.1f} MiB "
            f"after it; {RUNS} batches' embeddings differ by up to {gap:.1e}"
        )
    nvimgdecode.keep_pool(b.device)
    after = torch.cuda.memory_stats(b.device).get("num_device_alloc")
    made = "not counted by this torch" if allocs is None else after - allocs
    return [*lines, f"torch's cudaMalloc calls over those {3 * (RUNS + 3)} batches: {made}"]


def ctypes_u64(get: Callable, pool: Any, attribute: int) -> int:
    import ctypes

    value = ctypes.c_uint64()
    get(pool, attribute, ctypes.byref(value))
    return value.value


Check = Callable[[Bench], list[str]]
CHECKS: tuple[tuple[str, str, Check, str], ...] = (
    ("Backend kinds", "2", kinds,
     "HYBRID_CPU_GPU decoding where GPU_ONLY gives None: nvJPEG's CUDA decoder is filed under "
     "HYBRID_CPU_GPU, which the worker lists (it listed GPU_ONLY, so JPEGs the engines refuse "
     "went to PIL). HW_GPU_ONLY None on an H200: no hardware engines found (the CUDA decoder "
     "alone then). The last line is what describe's gpu.why says."),
    ("The hardware engines on a region", "11", region,
     "None for the region: the engines refuse regions, so large photos take the CUDA decoder; "
     "the two times are what a region saves on the engines. The crop's gap is what the answers "
     "see: a few levels at most; tens would mean the region's edge is wrong (0.9 warns of that "
     "with nvJPEG before 13.2, the reason for gpudecode.REGION_EDGE)."),
    ("4:1:1 chroma", "2, 11", chroma_411,
     "HW_GPU_ONLY None and the worker's crop within a few levels: the CUDA decoder takes what "
     "the engines refuse; 'refused' means such JPEGs are decoded by the CPU path."),
    ("Chroma upsampling against PIL", "3", upsampling,
     "As the worker asks (libjpeg's interpolation): about 1 level from PIL's pixels (IDCT "
     "rounding); with :fancy_upsampling=0 more at colour edges. A decoder whose two lines "
     "match ignores the option. torchvision's nvJPEG has no such switch: its line is the "
     "fallback's gap, never measured before."),
    ("JPEGs corrupt mid-scan through the core", "8", corrupt,
     "PIL refuses a marker inside the scan (400): a GPU 200 there means the engines report a "
     "corrupt scan as decoded (garbage answered 200). Noise inside the scan PIL decodes with "
     "warnings: 200 both ways is consistent."),
    ("A JPEG + PNG batch in two parts through the core", "1", mixed,
     "Both answered in 2 parts (the batch failed whole before: its parts on two devices), "
     "the embeddings within f16 noise of the 1-part run's."),
    ("The decode stream's drain and nvImageCodec's pool", "9, 12", drain_and_pool,
     "The drained row's extra ms a batch is what dropping the drain saves (12), and equal "
     "embeddings batch after batch (0) show no race without it; the released row's ms against "
     "the first is what keeping the pool saves (9; its MiB near 0: handed back every batch). "
     "Torch's cudaMalloc calls should be 0 once warm."),
)  # fmt: skip


def run_checks(b: Bench) -> tuple[list[str], int]:
    """Each check's section of the report, and how many failed (not skipped)."""
    sections, failed = [], 0
    for number, (title, findings, check, decides) in enumerate(CHECKS, 1):
        started = time.perf_counter()
        try:
            lines = check(b)
        except Skipped as why:
            lines = [f"skipped: {why}"]
        except Exception as error:  # noqa: BLE001 - one check failing is its line, not the run's
            failed += 1
            lines = [f"**failed**: {type(error).__name__}: {str(error).splitlines()[0][:300]}"]
        took = time.perf_counter() - started
        log.info("%d. %s: %.1f s", number, title, took)
        heading = f"{number}. {title} (review {findings}; {took:.1f} s)"
        sections.append(section(heading, bullets(lines), f"Decides: {decides}"))
    return sections, failed


def report(b: Bench) -> tuple[str, int]:
    import torchvision

    try:
        version = f"nvImageCodec {b.codec().__version__}"
    except Skipped as why:
        version = f"nvImageCodec: {why}"
    sections, failed = run_checks(b)
    head = [f"Device: {device_line(b.device)}", dated()]
    head.append(f"{version}; torch {torch.__version__}, torchvision {torchvision.__version__}")
    title = "The GPU path's open questions, asked of the device (`python -m bench.gpucheck`)"
    return document(title, bullets(head), *sections), failed


def main(argv: list[str] | None = None) -> int:
    parser = cli("python -m bench.gpucheck", __doc__, out=None)
    parser.add_argument("--weights", type=Path, default=WEIGHTS)
    parser.add_argument("--out", type=Path, help="results/gpu-check.md on a GPU, else build/")
    args = parse(parser, argv)
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    out = args.out or (GPU_REPORT if device.type == "cuda" else BUILD / "gpu-check.md")
    if out.resolve() == GPU_REPORT.resolve() and device.type != "cuda":
        parser.error(f"{GPU_REPORT} holds a GPU's answers: give --out for a CPU run")
    with tempfile.TemporaryDirectory(prefix="gpucheck-") as scratch:
        bench = Bench(device, weights_folder(args.weights, Path(scratch)), photos())
        text, failed = report(bench)
    publish(out, text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
