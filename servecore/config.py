"""Typed handler settings, read once from the ``handler:`` section of model-config.yaml.

Frontend keys (``batchSize``, ``maxBatchDelay``, ...) stay at the top of that YAML, where
TorchServe reads them and tritonrepo turns them into Triton's config.pbtxt; only what the model
itself uses lives under ``handler:``, and the explanation settings under ``handler: explain:``.
This module is the one source of every default.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from model_files.artifacts import PRECISIONS

DEVICES = ("auto", "cpu", "cuda")
GPU_DECODE = ("auto", "off")
# What TorchServe and Triton accept as a model name (a bulk lane is registered under one).
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
EXPLAIN_METHODS = ("gradcam", "ig", "occlusion")  # computed in servecore/explain/compute.py


class Output(enum.Enum):
    """What a model can answer; both come from the same forward pass. A model's ``task`` is
    its default output."""

    EMBEDDING = "embedding"
    TAGS = "tags"


TASKS = tuple(output.value for output in Output)


class ConfigError(ValueError):
    """A model-config.yaml ``handler:`` section that cannot be used; the model fails to load."""


@dataclass(frozen=True)
class ExplainConfig:
    """``handler: explain:``, the explanation defaults and bounds.

    method: used when a request names none: ``gradcam`` (one forward + backward), ``ig``
        (``n_steps`` of them) or ``occlusion`` (49 forwards).
    n_steps / max_n_steps: Integrated Gradients steps, default and the most a request may ask
        for (400 above).
    internal_batch_size: IG / occlusion rows per forward pass (a memory bound).
    max_targets: classes one image may have explained in one request (400 above).
    png_max_side: longer side of the PNG heatmap, in pixels.
    max_passes_per_batch: forward(+backward) passes of explanation work one batch may run;
        the requests that do not fit get 503 with ``Retry-After`` (so explanations cannot
        starve predictions), a request that costs more on its own gets 400.
    """

    method: str = "gradcam"
    n_steps: int = 32
    max_n_steps: int = 64
    internal_batch_size: int = 8
    max_targets: int = 5
    png_max_side: int = 448
    max_passes_per_batch: int = 64

    def check(self) -> None:
        if self.method not in EXPLAIN_METHODS:
            raise ConfigError(
                f"handler.explain.method must be one of {EXPLAIN_METHODS}, got {self.method!r}"
            )
        _check_ranges(
            self,
            "handler.explain.",
            (
                ("n_steps", 1, self.max_n_steps),
                ("max_n_steps", 1, 1024),
                ("internal_batch_size", 1, 64),
                ("max_targets", 1, 1000),
                ("png_max_side", 16, 2048),
                ("max_passes_per_batch", 1, 1_000_000),
            ),
        )


@dataclass(frozen=True)
class HandlerConfig:
    """What one archive serves and how.

    task: ``embedding`` answers ``{"embedding": [2048 floats]}``; ``tags`` the top-k ImageNet
        labels.
    top_k: default number of tags when a request does not give ``topk`` (1..1000).
    normalize_embedding: L2-normalise embeddings (cosine similarity == dot product).
    device: ``auto`` takes the GPU the engine assigns to the worker, else CPU.
    half_precision: run the eager backend in float16 on GPU (ignored on CPU).
    threads: intra-op threads per worker; 0 keeps the runtime's default (all cores).
    decode_threads: threads decoding a batch's images; 0 = one per usable core (the pod's CPU
        limit, not the node's cores), at most 4 on a CPU worker, uncapped on a GPU worker.
    gpu_decode: ``auto`` decodes JPEGs on a CUDA worker's GPU (batched nvJPEG, resize and crop
        there; ``servecore/gpudecode.py``); PNG, WebP, progressive or CMYK JPEGs and any image
        nvJPEG refuses take the CPU path, alone. ``off``: every image on the CPU. Ignored on a
        CPU worker.
    onnx_spinning: let ONNX Runtime's threads busy-wait between operators; off, because in a
        server those cycles belong to the frontend and the decode threads.
    precision: ``auto`` times every precision the archive can run here at worker start and
        serves the fastest within fidelity (servecore/precision.py; docs/backends.md, "Precision");
        ``f32``, ``bf16`` or ``int8`` (an archive built with QUANTIZE=int8) force one on an
        OpenVINO archive, unmeasured. Other backends accept only ``auto`` or ``f32``.
    auto_int8: ``auto`` may choose the int8 IR when the archive carries one that passed its
        fidelity gate.
    precision_cache: file remembering the last ``auto`` choice per host and archive, so a
        restart keeps it unless the timings clearly differ; "" is
        ``$XDG_CACHE_HOME/resnet50-serve/precision.json`` (``~/.cache``), ``off`` none.
    max_image_pixels / max_image_bytes: one image's decoded pixels / encoded bytes (413 above).
    max_images_per_request: images one v1/v2 request may carry, counted before any is read
        (413 above). Each costs a full forward row whatever its size, and an engine's queue is
        first come, first served: a photo waits for the rows of every request ahead of it, so
        8 (16 flooding clients: 128 rows, a few seconds on 2 cores).
    max_batch_images: images (forward rows) one server-side batch may run; requests are
        admitted fewest images first, the rest get 503 with ``Retry-After``. Each image costs a
        full 224x224 row whatever its size, so this, not pixels, bounds a batch's forward time.
    bulk_batch_images: forward rows that ``bulk`` requests (``X-Priority: bulk``, v2
        ``priority`` 2) may take together in one batch while interactive traffic is about
        (``interactive_window_ms``); the bulk requests beyond it get 503 with ``Retry-After``,
        except the first in line, which is always admitted so a collection job keeps moving.
        With no interactive request about, bulk uses the whole batch. 0: no share (bulk is only
        admitted after interactive requests within each budget). 2: the balance measured by
        ``make bench-traffic`` (results/traffic.md): fewer rows, shorter waits for people and a
        slower job while they are about.
    interactive_window_ms: how long after the last interactive request a worker saw it keeps
        holding bulk requests to ``bulk_batch_images``.
    bulk_model: the name of a second registration of this archive that serves bulk traffic
        (the bulk lane, ``servecore/lanes.py``): its workers run under ``SCHED_IDLE``, so the
        kernel pre-empts them whenever this model's workers have work, and clients that send
        ``bulk`` send it there when it is served. "" (the default): none, bulk shares this
        registration under ``bulk_batch_images``. ``make config`` and ``make triton-repo``
        register it beside the model.
    forward_rows: rows per forward pass (0: the model's ``batchSize``); a batch runs in chunks
        of this many, so a worker's peak memory does not grow with what arrives.
    max_response_bytes: one JSON answer's size, checked where an edge writes JSON
        (TorchServe's; Triton's sends tensors, bounded by ``max_images_per_request``); an
        answer over it gets 413 alone (TorchServe's frontend drops the worker's whole batch for
        one answer over ``max_response_size``, which this must not exceed).
    max_request_pixels: pixels one request may make the worker decode, read from the image
        headers before anything is decoded (413 above); JPEGs count at their draft size.
    max_batch_pixels: pixels one server-side batch may decode; requests are admitted smallest
        first, the rest get 503 with ``Retry-After``. 200 MP is about 3 s of decoding on 2 cores.
    max_json_depth: nesting depth of a JSON body (400 above); a KServe v2 request needs 4.
    max_json_bytes: size of a JSON body the handler parses (413 above).
    draft_decode: let JPEG decoding downscale in the DCT while the shorter side stays >= the
        resize size (much faster on large photos, near-identical output).
    cache_bytes: the content cache's bound in bytes (``servecore/cache.py``; LRU, one per
        worker): an image answered before (same bytes, model, version, precision, ``topk``
        and outputs) is answered again without decoding or computing it. 0, the default, is
        off: its hit marker tells anyone who can call the model that someone sent these exact
        bytes before, and each worker holds its own copy (docs/operations.md, "Content cache").
    explain: the explanation settings (``ExplainConfig``).
    """

    task: str = "tags"
    top_k: int = 5
    normalize_embedding: bool = True
    device: str = "auto"
    half_precision: bool = False
    threads: int = 0
    decode_threads: int = 0
    gpu_decode: str = "auto"
    onnx_spinning: bool = False
    precision: str = "auto"
    auto_int8: bool = True
    precision_cache: str = ""
    max_image_pixels: int = 40_000_000
    max_image_bytes: int = 30 * 1024 * 1024
    max_images_per_request: int = 8
    max_batch_images: int = 64
    bulk_batch_images: int = 2
    interactive_window_ms: int = 1000
    bulk_model: str = ""
    forward_rows: int = 0
    max_response_bytes: int = 32 * 1024 * 1024
    max_request_pixels: int = 100_000_000
    max_batch_pixels: int = 200_000_000
    max_json_depth: int = 16
    max_json_bytes: int = 32 * 1024 * 1024
    draft_decode: bool = True
    cache_bytes: int = 0
    explain: ExplainConfig = field(default_factory=ExplainConfig)

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
        if self.task not in TASKS:
            raise ConfigError(f"handler.task must be one of {TASKS}, got {self.task!r}")
        if self.device not in DEVICES:
            raise ConfigError(f"handler.device must be one of {DEVICES}, got {self.device!r}")
        if self.gpu_decode not in GPU_DECODE:
            raise ConfigError(
                f"handler.gpu_decode must be one of {GPU_DECODE}, got {self.gpu_decode!r}"
            )
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"handler.precision must be one of {PRECISIONS}, got {self.precision!r}"
            )
        _check_ranges(
            self,
            "handler.",
            (
                ("top_k", 1, 1000),
                ("threads", 0, 1024),
                ("decode_threads", 0, 64),
                ("max_image_pixels", 1, 1_000_000_000),
                ("max_image_bytes", 1, 1 << 31),
                ("max_images_per_request", 1, 4096),
                ("max_batch_images", 1, 4096),
                ("bulk_batch_images", 0, 4096),
                ("interactive_window_ms", 0, 3_600_000),
                ("forward_rows", 0, 4096),
                ("max_response_bytes", 1024, 1 << 31),
                ("max_request_pixels", 1, 10_000_000_000),
                ("max_batch_pixels", 1, 100_000_000_000),
                ("max_json_depth", 4, 1000),
                ("max_json_bytes", 1, 1 << 31),
                ("cache_bytes", 0, 1 << 40),
            ),
        )
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


def _check_ranges(config, prefix: str, ranges) -> None:
    for name, low, high in ranges:
        value = getattr(config, name)
        if not low <= value <= high:
            raise ConfigError(f"{prefix}{name} must be in {low}..{high}, got {value}")
