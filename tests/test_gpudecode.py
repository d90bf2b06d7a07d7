"""Decoding on the GPU (``servecore/gpudecode.py``): which images go to the device decoder,
what it gives back against the CPU path, and how the intake falls back, one image at a time.

Without a GPU the device decoder runs its own code on ``device=cpu`` (torchvision's libjpeg
decode_jpeg standing in for nvJPEG), wrapped to record what it is handed; the CUDA tests at
the end skip without one."""

from __future__ import annotations

import importlib.util
import io
import json
import re

import pytest
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as F  # what servecore.gpudecode resizes with

from model_files.artifacts import SERIALIZED
from servecore.backends import load_backend
from servecore.config import HandlerConfig
from servecore.gpuchoice import DecoderChoice, for_worker
from servecore.gpudecode import DeviceDecoder, accepts, assemble
from servecore.precision import FIDELITY_BOUND
from servecore.preprocessor import Preprocessor
from tests import imagegen
from tests.handler_context import make_handler, run_batch
from tests.reference import rel_error

CPU = torch.device("cpu")
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
FULL = Preprocessor(HandlerConfig(draft_decode=False))  # the reference decodes at full size
SERVED = Preprocessor(HandlerConfig())  # what a worker runs: JPEG draft decoding on


def saved(image: Image.Image, fmt: str = "JPEG", **options) -> bytes:
    return imagegen.encode(image, fmt, **options)


def oriented(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return saved(imagegen.photo(300, 200, seed=orientation), exif=exif)


def corrupt_jpeg() -> bytes:
    """A JPEG whose header opens and which ends in its end marker, its Huffman table garbage:
    PIL refuses it (400) and so does libjpeg (the device decoder)."""
    good = imagegen.jpeg(320, 240, seed=9)
    table = good.index(b"\xff\xc4")
    return good[: table + 4] + b"\xff" * 30 + good[table + 34 :]


JPEG = imagegen.jpeg(320, 240, seed=1)
GRAY = saved(imagegen.photo(280, 300, seed=2).convert("L"))
LARGE = imagegen.jpeg(2000, 1500, seed=3)  # drafted to 1/4 on the CPU path
PNG = imagegen.png(320, 240, seed=4)
WEBP = saved(imagegen.photo(320, 240, seed=5), "WEBP")
PROGRESSIVE = saved(imagegen.photo(320, 240, seed=6), progressive=True)
CMYK = saved(imagegen.photo(320, 240, seed=7).convert("CMYK"))
TRUNCATED = JPEG[: len(JPEG) // 2]
CORRUPT = corrupt_jpeg()
RGB_CODED = saved(imagegen.photo(320, 240, seed=12), keep_rgb=True)  # Adobe transform 0


NAMES = {
    JPEG: "jpeg",
    GRAY: "gray",
    LARGE: "large",
    PNG: "png",
    WEBP: "webp",
    PROGRESSIVE: "progressive",
    CMYK: "cmyk",
    CORRUPT: "corrupt",
}


def named(calls: list[list[bytes]]) -> list[list[str]]:
    return [[NAMES.get(data, "other") for data in call] for call in calls]


def mpo() -> bytes:
    first, second = imagegen.photo(320, 240, seed=8), imagegen.photo(320, 240, seed=10)
    buffer = io.BytesIO()
    first.save(buffer, "MPO", save_all=True, append_images=[second], quality=92)
    return buffer.getvalue()


class Recording:
    """torchvision's decode_jpeg, recording each call's images (by their bytes)."""

    def __init__(self, decode):
        self.decode = decode
        self.calls: list[list[bytes]] = []

    def __call__(self, encoded, **options):
        self.calls.append([bytes(t.numpy()) for t in encoded])
        return self.decode(encoded, **options)


def stand_in(refuse: tuple[bytes, ...] = ()) -> tuple[DeviceDecoder, Recording]:
    """The device decoder on the CPU; it also refuses ``refuse`` (as nvJPEG fails a batched
    call: the whole call raises)."""
    from torchvision.io import decode_jpeg

    def decode(encoded, **options):
        if any(bytes(t.numpy()) in refuse for t in encoded):
            raise RuntimeError("nvjpeg: bitstream not supported")
        return decode_jpeg(encoded, **options)

    recording = Recording(decode)
    return DeviceDecoder(CPU, 200_000_000, recording), recording


@pytest.mark.parametrize(
    ("name", "data", "expected"),
    [
        ("baseline jpeg", JPEG, True),
        ("grayscale jpeg", GRAY, True),
        ("mpo", mpo(), True),
        ("png", PNG, False),
        ("webp", WEBP, False),
        ("progressive jpeg", PROGRESSIVE, False),
        ("cmyk jpeg", CMYK, False),
        ("truncated jpeg", TRUNCATED, False),
        ("rgb-coded jpeg", RGB_CODED, False),  # nvJPEG would convert it as if YCbCr
    ],
)
def test_the_header_decides_what_goes_to_the_device(name, data, expected):
    """``accepts`` answers the orientation to apply (1 here: none) or None: not the device's."""
    assert accepts(SERVED.open(data)) == (1 if expected else None), name
    assert accepts(SERVED.open(oriented(6))) == 6  # read once, handed to the decoder


@pytest.mark.parametrize("name", ["jpeg", "gray", "mpo", "large"])
def test_a_device_crop_is_the_cpu_crop_within_one_level(name):
    """Same IDCT here (libjpeg both ways): what remains is the resize, float32 rounded once
    against PIL's fixed-point uint8: measured at most 1 level, on ~10% of the pixels."""
    data = {"jpeg": JPEG, "gray": GRAY, "mpo": mpo(), "large": LARGE}[name]
    decoder, _ = stand_in()
    [crop] = decoder([FULL.open(data)])
    expected = FULL.decode(FULL.open(data))
    assert crop is not None and crop.dtype == torch.uint8 and crop.shape == (3, 224, 224)
    difference = (crop.int() - expected.int()).abs()
    assert int(difference.max()) <= 1
    assert float((difference > 0).float().mean()) < 0.2


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied_as_pil_does(orientation):
    data = oriented(orientation)
    decoder, _ = stand_in()
    [crop] = decoder([FULL.open(data)])
    expected = FULL.decode(FULL.open(data))
    assert crop is not None and int((crop.int() - expected.int()).abs().max()) <= 1


def test_a_refused_image_is_found_by_halves_and_the_others_decoded():
    """nvJPEG fails a whole call for one bad file: the call is halved until the file is alone
    (one bad file among 16 costs 9 calls, not 17), the others decoded, the refusal counted."""
    decoder, recording = stand_in(refuse=(LARGE,))
    crops = decoder([SERVED.open(data) for data in (JPEG, LARGE, GRAY)])
    assert [c is None for c in crops] == [False, True, False]
    assert named(recording.calls) == [["jpeg", "large", "gray"], ["jpeg"], ["large", "gray"],
                                      ["large"], ["gray"]]  # fmt: skip
    images = [JPEG] * 11 + [LARGE] + [GRAY] * 4
    recording.calls.clear()
    crops = decoder([SERVED.open(data) for data in images])
    assert [i for i, c in enumerate(crops) if c is None] == [11]
    assert len(recording.calls) == 9
    assert decoder.refusals.as_dict() == {"images": 2, "of": 19}


def test_device_memory_is_bounded_by_decoding_in_chunks():
    """Chunks of at most ``chunk_pixels`` stored pixels (not the drafted ones the budgets
    count): 2000x1500 is 3 MP stored, 0.19 MP drafted."""
    decoder, recording = stand_in()
    decoder.chunk_pixels = 3_050_000
    crops = decoder([SERVED.open(data) for data in (JPEG, LARGE, JPEG, GRAY)])
    assert all(c is not None for c in crops)
    assert named(recording.calls) == [["jpeg"], ["large"], ["jpeg", "gray"]]


def test_images_of_one_size_are_resized_together_each_as_if_alone(monkeypatch):
    """A batch mixing sizes and orientations: each crop is bit for bit the crop of its image
    decoded alone; the resize ran once per size and orientation, not once per image, and a
    group the device fails is resized one image at a time (a failing image: CPU path)."""
    images = [JPEG, oriented(6), GRAY, JPEG, oriented(6), JPEG, LARGE]
    decoder, _ = stand_in()
    alone = [decoder([SERVED.open(data)])[0] for data in images]
    resized: list[int] = []
    fail_groups = [False]
    real_resize = F.resize

    def counting(pixels, *args, **kwargs):
        resized.append(len(pixels))
        if len(pixels) > 1 and fail_groups[0]:
            raise RuntimeError("CUDA out of memory")
        return real_resize(pixels, *args, **kwargs)

    monkeypatch.setattr(F, "resize", counting)
    for fail, calls in ((False, [3, 2, 1, 1]), (True, [3, 1, 1, 1, 2, 1, 1, 1, 1])):
        fail_groups[0], resized[:] = fail, []
        crops = decoder([SERVED.open(data) for data in images])
        assert sorted(resized, reverse=True) == sorted(calls, reverse=True)
        assert all(torch.equal(c, a) for c, a in zip(crops, alone, strict=True))


def test_a_mixed_batch_is_assembled_in_order():
    a, b = torch.full((3, 2, 2), 1, dtype=torch.uint8), torch.full((3, 2, 2), 2, dtype=torch.uint8)
    batch = assemble([a, b, a], CPU)
    assert batch.shape == (3, 3, 2, 2) and batch[:, 0, 0, 0].tolist() == [1, 2, 1]


def test_the_setting_turns_it_on_only_on_a_cuda_worker():
    assert for_worker("auto", CPU, 1) == (None, DecoderChoice("cpu", "a CPU worker"))
    off = for_worker("off", torch.device("cuda"), 1)
    assert off == (None, DecoderChoice("cpu", "handler.gpu_decode is off"))


@pytest.fixture(scope="module")
def eager(weights_dir):
    return load_backend("eager", weights_dir / SERIALIZED["eager"], CPU, precision="f32")


def test_device_decoded_answers_are_the_cpu_paths_within_the_fidelity_bound(eager):
    """Measured on build/heldout and build/samples (512x512 to 12 MP): at most 1 level on
    5-18% of the pixels; the embedding within 0.06% relative error of the CPU path's decoded at
    full size (held here to 0.1%), and against a worker's default CPU path, which draft-decodes
    a large JPEG at 1/2 to 1/8 of its size, as far as draft decoding itself moves it: up to
    1.3%, cosine 0.99999, the same top class (held here to the fidelity bound)."""
    images = [JPEG, oriented(6), LARGE]
    decoder, _ = stand_in()
    device_embedding, device_logits = eager(
        torch.stack(decoder([SERVED.open(data) for data in images]))
    )
    cpu_embedding, cpu_logits = eager(torch.stack([*map(FULL, images), SERVED(LARGE)]))
    for device, full in zip(device_embedding, cpu_embedding):
        assert rel_error(device, full) <= 1e-3
    cosine = torch.nn.functional.cosine_similarity(device_embedding[2], cpu_embedding[3], dim=0)
    assert float(cosine) >= FIDELITY_BOUND["embedding_cosine_min"]
    assert int(device_logits[2].argmax()) == int(cpu_logits[3].argmax())
    top1 = (device_logits.argmax(1) == cpu_logits[:3].argmax(1)).float().mean()
    assert float(top1) >= FIDELITY_BOUND["top1_agreement"]


@pytest.fixture(scope="module")
def embedder(weights_dir):
    return make_handler(
        weights_dir,
        task="embedding",
        normalize_embedding=False,
        max_batch_pixels=600_000,
        max_request_pixels=600_000,
    )


def run_with(embedder, decoder, bodies):
    handler, context = embedder
    handler.model.intake.device_decoder = decoder
    try:
        responses, statuses, batch = run_batch(handler, context, [{"body": b} for b in bodies])
    finally:
        handler.model.intake.device_decoder = None
    return [json.loads(r) for r in responses], statuses, batch


def test_the_intake_routes_each_image_and_a_refused_one_fails_alone(embedder, monkeypatch):
    """JPEGs to the device decoder in one call; PNG, WebP, progressive and CMYK JPEGs to the
    CPU path; a corrupt JPEG the device refuses is retried alone, then decoded on the CPU path,
    which answers 400 as it does without a device decoder; the rest answer 200."""
    handler, _ = embedder
    cpu_decoded: list[bytes] = []
    decode = handler.model.intake.preprocessor.decode

    def counted(opened, out=None):
        cpu_decoded.append(opened.data)
        return decode(opened, out)

    monkeypatch.setattr(handler.model.intake.preprocessor, "decode", counted)
    bodies = [JPEG, PNG, CORRUPT, PROGRESSIVE, GRAY, WEBP, CMYK]
    decoder, recording = stand_in()
    answers, statuses, batch = run_with(embedder, decoder, bodies)
    assert named(recording.calls) == [
        ["jpeg", "corrupt", "gray"],
        ["jpeg"],
        ["corrupt", "gray"],
        ["corrupt"],
        ["gray"],
    ]
    assert sorted(named([cpu_decoded])[0]) == ["cmyk", "corrupt", "png", "progressive", "webp"]
    assert [s for s, _ in statuses] == [200, 200, 400, 200, 200, 200, 200]
    cpu_answers, cpu_statuses, _ = run_with(embedder, None, [CORRUPT])
    assert statuses[2] == cpu_statuses[0] and answers[2] == cpu_answers[0]
    assert answers[2]["type"] == "InvalidImage"
    # The batch in request order: the CPU path's crops as they are, the device's within the
    # level its resize may differ by (answers: the fidelity test above).
    rows = [SERVED(data) for i, data in enumerate(bodies) if i != 2]
    pixels = batch.prepared.pixels
    for row, data in zip(pixels, [b for i, b in enumerate(bodies) if i != 2]):
        expected = SERVED(data)
        if data in (JPEG, GRAY):
            assert int((row.int() - expected.int()).abs().max()) <= 1
        else:
            assert torch.equal(row, expected)
    assert len(pixels) == len(rows)


def test_refusals_are_counted_per_batch_in_describe_and_warned_about_once_a_minute(
    embedder, caplog
):
    """Each batch's JPEGs the GPU's decoder gave back to the CPU path (nvImageCodec answers
    None for every image when it fails inside, without raising): counted into
    ``resnet50_gpu_refused_total`` and describe's ``gpu.refused``; a tenth or more refused is
    one warning a minute, not one a batch. A worker without a device decoder records none."""
    from servecore.gpudecode import Refusals

    handler, context = embedder
    decoder, _ = stand_in()
    now = [0.0]
    decoder.refusals = Refusals(decoder, clock=lambda: now[0])
    bodies = [{"body": b} for b in (JPEG, CORRUPT, GRAY, PNG)]
    handler.model.intake.device_decoder = decoder
    try:
        with caplog.at_level("INFO"):
            for now[0] in (0.0, 30.0, 61.0, 90.0):
                run_batch(handler, context, bodies)
            gpu = handler.model.describe()["gpu"]
    finally:
        handler.model.intake.device_decoder = None
    with caplog.at_level("INFO"):
        run_batch(handler, context, bodies)
    text = "\n".join(r.getMessage() for r in caplog.records)
    refused = re.findall(r"\[METRICS\]resnet50_gpu_refused_total\.\w+:([0-9.]+)\|", text)
    assert refused == ["1"] * 4  # the corrupt JPEG of each batch; none without the decoder
    assert gpu["refused"] == {"images": 4, "of": 12}
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1, warned
    assert "refused 3 of the 9 JPEGs it was handed in the last 61 s" in warned[0]


def test_budgets_are_applied_before_the_device_decodes(embedder):
    """max_batch_pixels (600 000 here), from the headers, smallest first: a 320x240 JPEG and
    two 450x460 ones (207 000 pixels each, too small to draft) fit, a third does not and gets
    503 without reaching any decoder."""
    decoder, recording = stand_in()
    large = imagegen.jpeg(450, 460, seed=11)
    answers, statuses, _ = run_with(embedder, decoder, [large, JPEG, large, large])
    assert sorted(s for s, _ in statuses) == [200, 200, 200, 503]
    assert "max_batch_pixels" in answers[[s for s, _ in statuses].index(503)]["message"]
    assert sorted(named(recording.calls)[0]) == ["jpeg", "other", "other"]
    assert len(recording.calls) == 1


def test_describe_says_where_images_are_decoded(embedder):
    handler, _ = embedder
    assert handler.model.describe()["decode"] == "cpu"
    handler.model.intake.device_decoder = stand_in()[0]
    try:
        assert handler.model.describe()["decode"] == "cpu (nvJPEG; other images on the CPU)"
    finally:
        handler.model.intake.device_decoder = None


@CUDA
def test_nvjpeg_crops_answer_as_the_cpu_path(weights_dir):
    """On a GPU: nvJPEG's crops within a few levels of its CPU stand-in's (nvJPEG's IDCT and
    chroma upsampling differ from libjpeg's) and answering as the CPU path's, within the
    fidelity bound."""
    device = torch.device("cuda")
    decoder, _ = for_worker("nvjpeg", device, 200_000_000)
    assert decoder is not None
    images = [JPEG, GRAY, LARGE, oriented(6), mpo()]
    crops = decoder([SERVED.open(data) for data in images])
    assert all(c is not None and c.device.type == "cuda" for c in crops)
    for crop, expected in zip(crops, stand_in()[0]([SERVED.open(d) for d in images])):
        assert float((crop.cpu().float() - expected.float()).abs().mean()) < 2.0
    backend = load_backend("eager", weights_dir / SERIALIZED["eager"], device, precision="f32")
    embedding, logits = backend(assemble(crops, device))
    cpu_embedding, cpu_logits = backend(torch.stack([SERVED(data) for data in images]))
    cosine = torch.nn.functional.cosine_similarity(embedding, cpu_embedding)
    assert float(cosine.min()) >= FIDELITY_BOUND["embedding_cosine_min"]
    top1 = (logits.argmax(1) == cpu_logits.argmax(1)).float().mean()
    assert float(top1) >= FIDELITY_BOUND["top1_agreement"]


@CUDA
def test_nvjpeg_refuses_a_corrupt_jpeg_alone(embedder):
    """nvJPEG refuses the corrupt JPEG (None: the CPU path then decides) and decodes the others
    of the same call; served, it is the CPU path's 400, its neighbours answered."""
    decoder, _ = for_worker("nvjpeg", torch.device("cuda"), 200_000_000)
    assert decoder is not None
    crops = decoder([SERVED.open(data) for data in (JPEG, CORRUPT, GRAY)])
    assert crops[1] is None
    assert crops[0] is not None and crops[2] is not None
    answers, statuses, _ = run_with(embedder, decoder, [JPEG, CORRUPT, GRAY])
    cpu_answers, cpu_statuses, _ = run_with(embedder, None, [CORRUPT])
    assert [s for s, _ in statuses] == [200, cpu_statuses[0][0], 200] == [200, 400, 200]
    assert answers[1] == cpu_answers[0] and answers[1]["type"] == "InvalidImage"


def test_a_crop_the_request_carried_never_goes_to_the_device_decoder(embedder):
    """A v2 ``crops`` request beside a JPEG: the JPEG to the device, the crop is the input as
    it came (issue #44's crops and the GPU decode share the intake)."""
    from tests.test_crops import crops_body

    crop = SERVED(JPEG)  # uint8 [3, 224, 224]: the CPU path's crop of the same photo
    body = json.dumps(crops_body(crop.permute(1, 2, 0).numpy()[None])).encode()
    decoder, recording = stand_in()
    _, statuses, batch = run_with(embedder, decoder, [JPEG, body])
    assert [s for s, _ in statuses] == [200, 200]
    assert named(recording.calls) == [["jpeg"]]
    assert torch.equal(batch.prepared.pixels[1], crop)


# ------------------------------------------------ regions, nvImageCodec and the choice at start


@pytest.mark.parametrize(("width", "height"), [(2000, 1500), (1500, 2000), (3000, 1000)])
@pytest.mark.parametrize("turn", [1, 3, 6, 8])
def test_a_region_crop_is_the_whole_images_crop_to_rounding(width, height, turn):
    """A photo the resize shrinks at least twofold is decoded only where its crop falls (a
    4:3 photo: 71% of it here, 63% at 12 MP), the crop computed from the weights the whole
    image's resize gives it: at most 1 level from the whole image's crop, on a few pixels."""
    from torchvision.io import ImageReadMode, decode_jpeg

    from servecore.gpudecode import _crop, window

    data = imagegen.jpeg(width, height, seed=width + turn)
    whole = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), ImageReadMode.RGB)
    region = window(width, height, turn)
    assert region is not None and window(451, 300, turn) is None  # too small to cut
    top, left, bottom, right = region.stored(width, height, turn)
    assert (bottom - top) * (right - left) < 0.75 * width * height
    cut = _crop(whole[None, :, top:bottom, left:right].contiguous(), turn, region)[0]
    difference = (cut.int() - _crop(whole[None], turn)[0].int()).abs()
    assert int(difference.max()) <= 1 and float((difference > 0).float().mean()) < 1e-3


class FakeCodec:
    """nvImageCodec's Python API as servecore.nvimgdecode calls it, on the CPU: libjpeg
    (torchvision) decodes, a region is a slice of the whole; ``refuse``: bytes it answers None
    for, ``raising``: the whole call raises; ``hardware``: whether a decoder of the hardware
    backend alone decodes anything."""

    __version__ = "0.9.0-fake"
    ColorSpec = type("ColorSpec", (), {"SRGB": "srgb"})
    ImageBufferKind = type("ImageBufferKind", (), {"STRIDED_HOST": "host"})
    # nvJPEG's CUDA decoder is filed under HYBRID_CPU_GPU; no JPEG decoder is GPU_ONLY.
    BackendKind = type("BackendKind", (), {"HW_GPU_ONLY": "hw", "HYBRID_CPU_GPU": "cuda"})
    LoadHintPolicy = type("LoadHintPolicy", (), {"ADAPTIVE_MINIMIZE_IDLE_TIME": "adaptive"})

    def __init__(self, refuse=(), hardware=True):
        self.refuse, self.hardware, self.raising = refuse, hardware, False
        self.calls: list[list[tuple[str, tuple | None]]] = []
        self.decoders: list[list] = []

    def DecodeParams(self, **params):  # noqa: N802 - the library's name
        assert params == {"apply_exif_orientation": False, "color_spec": "srgb"}
        return params

    def Backend(self, kind, *hint):  # noqa: N802 - the library's name
        return (kind, *hint)

    def Region(self, *box):  # noqa: N802 - the library's name
        return box

    def CodeStream(self, data):  # noqa: N802 - the library's name
        image = Image.open(io.BytesIO(data))  # raises for what PIL cannot read: as the library
        return FakeStream(data, image.width, image.height)

    def Decoder(self, device_id, max_num_cpu_threads, backends, options):  # noqa: N802
        assert device_id == 0  # the worker's GPU index (a CPU's: none, so 0)
        assert max_num_cpu_threads == 4  # not one per core on top of the decode threads
        # libjpeg's (PIL's) upsampling, also in a region (0.9 refuses that unless told)
        assert options.split() == [":fancy_upsampling=1", ":enable_roi_fancy_upsampling=1"]
        self.decoders.append(backends)
        return FakeDecoder(self, backends)


class FakeStream:
    def __init__(self, data, width, height, region=None):
        self.data, self.width, self.height, self.region = data, width, height, region

    def get_sub_code_stream(self, region):
        return FakeStream(self.data, self.width, self.height, region)


class FakeImage:
    buffer_kind = "host"

    def __init__(self, pixels):
        self.pixels = pixels

    def __array__(self, dtype=None, copy=None):
        return self.pixels


class FakeDecoder:
    def __init__(self, codec, backends):
        self.codec, self.backends = codec, backends

    def decode(self, streams, params=None, cuda_stream=0):
        from torchvision.io import ImageReadMode, decode_jpeg

        codec = self.codec
        codec.calls.append([(NAMES.get(s.data, "other"), s.region) for s in streams])
        if codec.raising:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if [b[0] for b in self.backends] == ["hw"] and not codec.hardware:
            return [None] * len(streams)
        out = []
        for s in streams:
            if s.data in codec.refuse:
                out.append(None)
                continue
            hwc = decode_jpeg(torch.frombuffer(bytearray(s.data), dtype=torch.uint8),
                              mode=ImageReadMode.RGB).permute(1, 2, 0)  # fmt: skip
            if s.region is not None:
                top, left, bottom, right = s.region
                hwc = hwc[top:bottom, left:right]
            out.append(FakeImage(hwc.contiguous().numpy()))
        return out


def nvimg(codec, chunk_pixels=200_000_000):
    from servecore import nvimgdecode

    decoder, why = nvimgdecode.load(CPU, chunk_pixels, codec)
    assert decoder is not None, why
    return decoder, why


def test_nvimagecodec_decodes_a_chunk_in_one_call_a_large_photo_in_its_region():
    """One call for the chunk; the large photo sent as its crop's region (the window's box in
    stored pixels); an image the library refuses is None alone (the CPU path then decides); the
    crops are the nvJPEG decoder's (the same resize), the large one's to rounding."""
    from servecore.gpudecode import window

    codec = FakeCodec(refuse=(CORRUPT,))
    decoder, _ = nvimg(codec)
    images = [JPEG, LARGE, CORRUPT, oriented(6), GRAY]
    opened = [SERVED.open(data) for data in images]
    crops = decoder(opened)
    box = window(2000, 1500, 1).stored(2000, 1500, 1)
    assert codec.calls[-1] == [
        ("jpeg", None), ("large", box), ("corrupt", None), ("other", None), ("gray", None)
    ]  # fmt: skip
    assert [c is None for c in crops] == [False, False, True, False, False]
    expected = stand_in()[0](opened)
    for crop, want in zip(crops, expected):
        if want is not None:
            assert int((crop.int() - want.int()).abs().max()) <= 1
    assert str(decoder) == (
        "cpu (nvImageCodec: hardware JPEG engines, then CUDA; other images on the CPU)"
    )


def test_nvimagecodec_failing_a_whole_call_is_asked_one_image_at_a_time():
    codec = FakeCodec()
    decoder, _ = nvimg(codec)
    codec.raising = True
    assert decoder([SERVED.open(JPEG), SERVED.open(GRAY)]) == [None, None]
    calls = [[name for name, _ in call] for call in codec.calls[-3:]]
    assert calls == [["jpeg", "gray"], ["jpeg"], ["gray"]]


def test_nvimagecodec_takes_the_hardware_engines_only_where_a_probe_finds_them(monkeypatch):
    from servecore import nvimgdecode

    with_hardware, why = nvimg(FakeCodec(hardware=True))
    assert with_hardware.decoder.backends == [("hw", 0.9, "adaptive"), ("cuda",)]
    assert "the hardware JPEG engines of cpu" in why
    without, why = nvimg(FakeCodec(hardware=False))
    assert without.decoder.backends == [("cuda",)] and "has no hardware JPEG decoder" in why
    broken = FakeCodec()
    broken.Decoder = lambda **_: (_ for _ in ()).throw(RuntimeError("CUDA Runtime failure: '#35'"))
    assert nvimgdecode.load(CPU, 1, broken) == (
        None, "failed to start on cpu (RuntimeError: CUDA Runtime failure: '#35')"
    )  # fmt: skip

    def missing(name):
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(nvimgdecode.importlib, "import_module", missing)
    found, why = nvimgdecode.load(CPU, 1)
    assert found is None and "is not installed" in why and "requirements-gpu.txt" in why


@pytest.mark.parametrize(
    ("setting", "nvimgcodec", "nvjpeg", "chosen", "why"),
    [
        ("auto", True, True, "nvimgcodec", "the probe's reason"),
        ("auto", False, True, "nvjpeg", "nvImageCodec is not installed; torchvision's nvJPEG"),
        ("nvimgcodec", False, False, "cpu", "nvImageCodec is not installed; torchvision's "
         "nvJPEG fails to decode a probe JPEG on cuda"),
        ("nvjpeg", True, True, "nvjpeg", "torchvision's nvJPEG"),
    ],
)  # fmt: skip
def test_a_gpu_worker_takes_the_first_decoder_that_works_and_says_why(
    monkeypatch, setting, nvimgcodec, nvjpeg, chosen, why
):
    """nvImageCodec, then torchvision's nvJPEG, then the CPU, each passed over saying why."""
    from servecore import gpudecode, nvimgdecode

    asked = []

    def load(device, chunk_pixels):
        asked.append(device)
        return ("decoder", "the probe's reason") if nvimgcodec else (None, "is not installed")

    monkeypatch.setattr(nvimgdecode, "load", load)
    monkeypatch.setattr(gpudecode, "quiet", lambda device: None)
    probe = [torch.zeros(3, 8, 8) if nvjpeg else None]
    monkeypatch.setattr(DeviceDecoder, "decoded", lambda self, encoded: probe)
    decoder, choice = for_worker(setting, torch.device("cuda"), 1)
    assert choice == DecoderChoice(chosen, why)
    assert (decoder is None) == (chosen == "cpu")
    assert bool(asked) == (setting != "nvjpeg")


nvimgcodec_installed = pytest.mark.skipif(
    importlib.util.find_spec("nvidia") is None
    or importlib.util.find_spec("nvidia.nvimgcodec") is None,
    reason="nvImageCodec not installed (requirements-gpu.txt)",
)


@nvimgcodec_installed
def test_nvimagecodec_itself_on_its_cpu_decoder_crops_as_the_cpu_path():
    """The library's own API (code streams, regions, one batched call, None for a corrupt
    file), on its CPU decoder (libjpeg-turbo; no GPU needed): crops within one level of the CPU
    path's decoded at full size, the corrupt JPEG refused alone."""
    from nvidia import nvimgcodec

    from servecore.nvimgdecode import OPTIONS, NvImageCodecDecoder

    cpu_only = nvimgcodec.Decoder(
        device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY,
        backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.CPU_ONLY)],
        options=OPTIONS,
    )
    decoder = NvImageCodecDecoder(CPU, 200_000_000, nvimgcodec, cpu_only, "CPU")
    images = [JPEG, GRAY, LARGE, oriented(6), CORRUPT, mpo()]
    crops = decoder([SERVED.open(data) for data in images])
    assert [c is None for c in crops] == [False, False, False, False, True, False]
    for crop, data in zip(crops, images):
        if crop is not None:
            assert int((crop.int() - FULL(data).int()).abs().max()) <= 1
