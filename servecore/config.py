"""Typed handler settings, read once from the ``handler:`` section of model-config.yaml.

Frontend keys (``batchSize``, ``maxBatchDelay``, ...) stay at the top of that YAML, where
TorchServe reads them and tritonrepo turns them into Triton's config.pbtxt; only what the model
itself uses lives under ``handler:``, and the explanation settings under ``handler: explain:``.
This module is the one source of every default, range and description: each field declares
them beside itself (``setting``), ``check`` reads them, and ``python -m buildsteps.reference``
writes them into docs/configuration.md.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from model_files.artifacts import PRECISIONS

DEVICES = ("auto", "cpu", "cuda")
GPU_DECODE = ("auto", "nvimgcodec", "nvjpeg", "off")
# What TorchServe and Triton accept as a model name (a bulk lane is registered under one).
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
EXPLAIN_METHODS = ("gradcam", "ig", "occlusion")  # computed in servecore/explain/compute.py
# Decode threads of a CPU worker when ``decode_threads`` is 0: the forward needs the cores too.
MAX_DECODE_THREADS = 4
T = TypeVar("T")


class Output(enum.Enum):
    """What a model can answer; both come from the same forward pass. A model's ``task`` is
    its default output."""

    EMBEDDING = "embedding"
    TAGS = "tags"


TASKS = tuple(output.value for output in Output)


# A sanity bound on class counts before the model is known; the model's own labels bound
# top_k and explain.max_targets when it loads (servecore/service.py).
MAX_CLASSES = 100_000


class ConfigError(ValueError):
    """A model-config.yaml ``handler:`` section that cannot be used; the model fails to load."""


def setting(
    default: T,
    doc: str,
    *,
    bounds: tuple[int, int | str] | None = None,
    choices: tuple[str, ...] | None = None,
    unit: str = "",
) -> T:
    """A field with its description (``doc``, Markdown as docs/configuration.md shows it) and
    what ``check`` accepts: an int in ``bounds`` (inclusive; a bound may name another field)
    or one of ``choices``. ``unit`` ("bytes") says how the docs write its numbers."""
    metadata = {"doc": doc, "range": bounds, "choices": choices, "unit": unit}
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class ExplainConfig:
    """``handler: explain:``, the explanation defaults and bounds (docs/explanations.md)."""

    method: str = setting(
        "gradcam",
        "method when a request names none: `gradcam` (one forward + backward), `ig` "
        "(`n_steps` of them) or `occlusion` (a forward per window position)",
        choices=EXPLAIN_METHODS,
    )
    n_steps: int = setting(
        32, "Integrated Gradients steps when a request names none", bounds=(1, "max_n_steps")
    )
    max_n_steps: int = setting(
        64, "the most IG steps a request may ask for (400 above)", bounds=(1, 1024)
    )
    internal_batch_size: int = setting(
        8,
        "rows per Captum pass, GradCAM too (a memory bound); a request may lower it, never "
        "raise it",
        bounds=(1, 64),
    )
    max_targets: int = setting(
        5,
        "classes one image may have explained in one request (400 above); a model with fewer "
        "classes serves all of them (logged when it loads)",
        bounds=(1, MAX_CLASSES),
    )
    png_max_side: int = setting(448, "longer side of the PNG heatmap, in pixels", bounds=(16, 2048))
    max_passes_per_batch: int = setting(
        64,
        "forward(+backward) passes of explanation work one batch may run; the requests that "
        "do not fit get 503 with `Retry-After` (so explanations cannot starve predictions), "
        "a request that costs more on its own gets 400",
        bounds=(1, 1_000_000),
    )

    def check(self) -> None:
        _check_fields(self, "handler.explain.")


@dataclass(frozen=True)
class HandlerConfig:
    """What one archive serves and how: each field's description and accepted values are
    declared beside it (docs/configuration.md, "Handler settings", is written from them)."""

    task: str = setting(
        "tags",
        "what the model answers (both come from one forward pass): `embedding` the embedding "
        "vector, `tags` the top-k of the model's labels ([api.md](api.md#answers))",
        choices=TASKS,
    )
    top_k: int = setting(
        5,
        "tags when a request gives no `topk`; a model with fewer classes answers all of them "
        "(logged when it loads)",
        bounds=(1, MAX_CLASSES),
    )
    normalize_embedding: bool = setting(
        True,
        "L2-normalise embeddings, so cosine similarity is a dot product ([api.md](api.md#answers))",
    )
    device: str = setting(
        "auto", "`auto` takes the GPU the engine assigns to the worker, else CPU", choices=DEVICES
    )
    half_precision: bool = setting(
        False, "run the eager backend in float16 on GPU (ignored on CPU)"
    )
    threads: int = setting(
        0,
        "intra-op threads per worker; 0 keeps the runtime's default (all cores)",
        bounds=(0, 1024),
    )
    decode_threads: int = setting(
        0,
        "threads decoding a batch's images; 0 = one per usable core (the cgroup CPU quota, so "
        f"a pod's CPU limit, not the node's cores), at most {MAX_DECODE_THREADS} on a CPU "
        "worker, uncapped on a GPU worker",
        bounds=(0, 64),
    )
    gpu_decode: str = setting(
        "auto",
        "JPEGs on a CUDA worker's GPU, decoded there in one batched call, resized and cropped "
        "there: `auto` takes the first that works of nvImageCodec (its hardware JPEG engines "
        "where the GPU has them; `requirements-gpu.txt`), torchvision's nvJPEG, the CPU; "
        "`nvimgcodec` or `nvjpeg` starts that list there; `off`: every image on the CPU. What "
        "was chosen and why: describe's `gpu`. PNG, WebP, progressive, CMYK or RGB-coded JPEGs "
        "and any image the GPU refuses (counted: `resnet50_gpu_refused_total`) take the CPU "
        "path, alone; ignored on a CPU worker "
        "([backends.md](backends.md#decoding-on-the-gpu))",
        choices=GPU_DECODE,
    )
    gpu_overlap_chunks: int = setting(
        2,
        "a CUDA worker decodes a batch in this many parts, each part's forward queued on the "
        "GPU before the next part is decoded (on a stream of its own), the answers copied back "
        "once; 1 = off: the whole batch decoded, then run ([backends.md](backends.md#overlap-"
        "and-cuda-graphs-on-the-gpu)); ignored on a CPU worker",
        bounds=(1, 16),
    )
    cuda_graphs: bool = setting(
        True,
        "an eager CUDA worker captures one CUDA graph of the forward per padded batch size "
        "when it loads and replays it (no kernel launches from Python); a capture that fails "
        "is logged and that worker runs eagerly (describe's `gpu`); ignored on a CPU worker",
    )
    onnx_spinning: bool = setting(
        False,
        "let ONNX Runtime's threads busy-wait between operators; off: one-client p50 was 3-4 ms "
        "lower without it at equal throughput ([history](../results/history.md#figures-the-"
        "docs-quote-from-runs-that-left-no-report))",
    )
    precision: str = setting(
        "auto",
        "arithmetic of an OpenVINO archive: `auto` times every precision the archive can run "
        "here at worker start and serves the fastest within fidelity; `f32`, `bf16` or `int8` "
        "(an archive built with `QUANTIZE=int8`) force one, unmeasured; other backends accept "
        "only `auto` or `f32` ([backends.md](backends.md#precision-measured-on-the-host-not-"
        "guessed-from-cpu-flags))",
        choices=PRECISIONS,
    )
    auto_int8: bool = setting(
        True,
        "`auto` may choose the int8 IR when the archive carries one that passed its fidelity gate",
    )
    precision_cache: str = setting(
        "",
        "file keeping the `auto` choice per host, archive and library versions: every later "
        "worker (restarted, scaled up, the next start) serves it without measuring again; "
        '"" is `$XDG_CACHE_HOME/resnet50-serve/precision.json` (`~/.cache`), `off` none '
        "(every start measures)",
    )
    max_image_pixels: int = setting(
        40_000_000,
        "decoded pixels of one image (413 above; decompression bombs)",
        bounds=(1, 1_000_000_000),
    )
    max_image_bytes: int = setting(
        30 * 1024 * 1024,
        "encoded bytes of one image (413 above)",
        bounds=(1, 1 << 31),
        unit="bytes",
    )
    max_images_per_request: int = setting(
        8,
        "images in one v1/v2 request, counted before any is read (413 above); at most "
        "`max_batch_images`; [why 8](api.md#limits-no-request-can-fail-or-stall-another)",
        bounds=(1, 4096),
    )
    max_batch_images: int = setting(
        64,
        "images (forward rows) one server-side batch may run; requests are admitted fewest "
        "images first, the rest get 503 with `Retry-After`. Each image costs a full crop "
        "row whatever its size, so this, not pixels, bounds a batch's forward time",
        bounds=(1, 4096),
    )
    bulk_batch_images: int = setting(
        2,
        "forward rows that `bulk` requests ([api.md](api.md#priority-classes-and-deadlines)) "
        "may take together in one batch while interactive traffic is about; the rest of the "
        "bulk requests get 503 with `Retry-After` (the first in line always runs, so a job "
        "keeps moving); with nobody about, bulk has the whole batch; 0 = no share (bulk only "
        "goes after interactive requests in each budget); the default is the balance "
        "`make bench-traffic` measured ([results/traffic.md](../results/traffic.md))",
        bounds=(0, 4096),
    )
    interactive_window_ms: int = setting(
        1000,
        "how long after the last interactive request a worker saw it keeps bulk to "
        "`bulk_batch_images`",
        bounds=(0, 3_600_000),
    )
    bulk_model: str = setting(
        "",
        "the model's bulk lane: a second registration of its archive under this name whose "
        "worker runs under `SCHED_IDLE`, where bulk jobs send "
        "([operations.md](operations.md#the-bulk-lane-the-kernel-pre-empts-the-job)); "
        "`make config` and `make triton-repo` register it, KServe does not; "
        '"" = none (bulk shares this registration under `bulk_batch_images`)',
    )
    forward_rows: int = setting(
        0,
        "rows per forward pass; 0 = the model's `batchSize`: a batch runs in chunks, so a "
        "worker's memory does not grow with what arrives",
        bounds=(0, 4096),
    )
    max_response_bytes: int = setting(
        32 * 1024 * 1024,
        "one JSON answer's size, checked where an edge writes JSON (TorchServe's; Triton's "
        "sends tensors); an answer over it gets 413 alone; at most the server's "
        "`max_response_size` (a test checks: TorchServe's frontend drops the worker's whole "
        "batch for one answer over it)",
        bounds=(1024, 1 << 31),
        unit="bytes",
    )
    max_request_pixels: int = setting(
        100_000_000,
        "pixels one request may make the worker decode, all its images together, read from "
        "the image headers before anything is decoded (413 above; JPEGs count at their draft "
        "size); at most `max_batch_pixels`",
        bounds=(1, 10_000_000_000),
    )
    max_batch_pixels: int = setting(
        200_000_000,
        "pixels one batch may decode; requests are admitted smallest first, the rest get 503 "
        "with `Retry-After` ([api.md](api.md#limits-no-request-can-fail-or-stall-another))",
        bounds=(1, 100_000_000_000),
    )
    max_json_depth: int = setting(
        16, "nesting depth of a JSON body (400 above); KServe v2 needs 4", bounds=(4, 1000)
    )
    max_json_bytes: int = setting(
        32 * 1024 * 1024,
        "size of a JSON body the handler parses (413 above)",
        bounds=(1, 1 << 31),
        unit="bytes",
    )
    draft_decode: bool = setting(
        True,
        "let JPEG decoding downscale in the DCT while the shorter side stays at least the "
        "resize size ([api.md](api.md#images))",
    )
    cache_bytes: int = setting(
        0,
        "the content cache's bound in bytes, per worker (LRU): an image answered before (same "
        "bytes, model, version, precision, `topk` and outputs) is answered again without "
        "decoding or computing it; 0 = off, since its hit marker tells anyone who can call "
        "the model that someone sent these exact bytes before "
        "([operations.md](operations.md#content-cache))",
        bounds=(0, 1 << 40),
        unit="bytes",
    )
    explain: ExplainConfig = field(
        default_factory=ExplainConfig,
        metadata={"doc": "explanations ([explanations.md](explanations.md)), one nested section"},
    )

    @classmethod
    def from_mapping(cls, section: Mapping[str, Any] | None) -> HandlerConfig:
        """Build and check a config from the YAML ``handler:`` mapping (None = defaults)."""
        section = dict(section or {})
        if "explain" in section:
            explain = section["explain"]
            if not isinstance(explain, Mapping):
                raise ConfigError(f"handler.explain must be a mapping, got {explain!r}")
            section["explain"] = _typed(ExplainConfig, explain, "handler.explain.")
        config = _typed(cls, section, "handler.")
        config.check()
        return config

    def check(self) -> None:
        _check_fields(self, "handler.")
        if self.bulk_model and not MODEL_NAME.fullmatch(self.bulk_model):
            raise ConfigError(
                f"handler.bulk_model must be a model name (letters, digits, '_', '-', '.'), "
                f"got {self.bulk_model!r}"
            )
        if self.max_images_per_request > self.max_batch_images:
            raise ConfigError(
                f"handler.max_images_per_request ({self.max_images_per_request}) must not "
                f"exceed handler.max_batch_images ({self.max_batch_images}): a request alone "
                "must fit in a batch"
            )
        if self.max_request_pixels > self.max_batch_pixels:
            raise ConfigError(
                f"handler.max_request_pixels ({self.max_request_pixels}) must not exceed "
                f"handler.max_batch_pixels ({self.max_batch_pixels}): a request alone must fit "
                "in a batch"
            )
        self.explain.check()


def _typed(cls, section: Mapping[str, Any], prefix: str):
    """``cls(**section)`` after refusing unknown keys and values of another type than the
    field's default (bool is an int subclass: exact types, so ``top_k: true`` is refused)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(section) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown {prefix.rstrip('.')} setting(s) {unknown} in "
            f"model-config.yaml; known: {sorted(fields)}"
        )
    for name, value in section.items():
        default = fields[name].default
        if default is dataclasses.MISSING:  # a nested section, already built
            continue
        if type(value) is not type(default):
            raise ConfigError(f"{prefix}{name} must be {type(default).__name__}, got {value!r}")
    return cls(**section)


def _bounds(config, field: dataclasses.Field) -> tuple[int, int] | None:
    """The inclusive range ``field`` of ``config`` must be in (a bound naming another field
    read from ``config``), or None."""
    declared = field.metadata.get("range")
    if declared is None:
        return None
    low, high = (getattr(config, b) if isinstance(b, str) else b for b in declared)
    return low, high


def _check_fields(config, prefix: str) -> None:
    """Each field's declared ``choices`` and ``range``, in the order the fields are declared;
    a range bounded by another field after that field's own."""
    fields = dataclasses.fields(config)
    relative = [f for f in fields if any(isinstance(b, str) for b in f.metadata.get("range") or ())]
    for f in [*(f for f in fields if f not in relative), *relative]:
        value = getattr(config, f.name)
        choices = f.metadata.get("choices")
        if choices is not None and value not in choices:
            raise ConfigError(f"{prefix}{f.name} must be one of {choices}, got {value!r}")
        limits = _bounds(config, f)
        if limits is not None and not limits[0] <= value <= limits[1]:
            raise ConfigError(f"{prefix}{f.name} must be in {limits[0]}..{limits[1]}, got {value}")
