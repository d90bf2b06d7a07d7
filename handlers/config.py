"""Typed handler settings, read once from the ``handler:`` section of model-config.yaml.

Frontend keys (``batchSize``, ``maxBatchDelay``, ...) stay at the top of that YAML for
TorchServe; only what the handler itself uses lives under ``handler:``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from handlers.codec import EXPLAIN_METHODS, ExplainLimits, Output, ParseLimits
from model_files.artifacts import PRECISIONS

TASKS = tuple(output.value for output in Output)
DEVICES = ("auto", "cpu", "cuda")


class ConfigError(ValueError):
    """A model-config.yaml ``handler:`` section that cannot be used; the model fails to load."""


@dataclass(frozen=True)
class HandlerConfig:
    """What one archive serves and how.

    task: ``embedding`` answers ``{"embedding": [2048 floats]}``; ``tags`` answers the top-k
        ImageNet labels. Both come from the same forward pass.
    top_k: default number of tags when a request does not give ``topk`` (1..1000).
    normalize_embedding: L2-normalise embeddings (cosine similarity == dot product).
    device: ``auto`` takes the GPU TorchServe assigns to the worker, else CPU.
    half_precision: run the eager backend in float16 on GPU (ignored on CPU).
    threads: intra-op threads per worker; 0 keeps the runtime's default (all cores).
    decode_threads: threads decoding a batch's images; 0 = one per core, at most 4.
    onnx_spinning: let ONNX Runtime's threads busy-wait between operators (its own default).
        Off here: in a server those cycles belong to the frontend, the decode threads and other
        workers; one-client p50 latency was 3-4 ms lower without it at equal throughput.
    precision: arithmetic of an OpenVINO archive: ``auto`` (OpenVINO's choice for the CPU:
        bf16 where it has bf16 units, f32 elsewhere), ``f32``, ``bf16``, or ``int8`` (needs an
        archive built with PRECISION=int8; its unquantised layers run as ``auto``). Other
        backends run f32 on CPU and accept only ``auto`` or ``f32``.
    max_image_pixels: decoded width*height above which a request gets 413.
    max_image_bytes: encoded image size above which a request gets 413.
    max_images_per_request: images one v1/v2 request may carry (413 above): one request must
        not be able to stack an unbounded tensor into a worker.
    max_request_pixels: pixels one request may make the worker decode, all its images
        together, read from the image headers before anything is decoded (413 above). JPEGs
        count at their draft-decoded size, so a 12 MP phone photo costs about 0.2 MP.
    max_batch_pixels: pixels one server-side batch may decode. Requests are admitted smallest
        first; the ones that no longer fit get 503 with ``Retry-After`` (a lone request always
        fits: it is at most ``max_request_pixels``). Decoding and resizing PNG/WebP/GIF/TIFF
        runs at 35-45 MP/s per thread on this project's 2-core machine, so the default 200 MP
        is about 3 s here and stays far below the 120 s ``responseTimeout`` on a machine ten
        times slower.
    max_json_depth: nesting depth of a JSON body (400 above); our deepest document (KServe v2)
        needs 4. Checked on the raw bytes before parsing, never by catching RecursionError.
    max_json_bytes: size of a JSON body the handler parses (413 above).
    draft_decode: let JPEG decoding downscale by 1/2, 1/4, 1/8 in the DCT while keeping the
        shorter side >= the resize size (much faster on large photos, near-identical output).
    explain_method: ``/explanations`` method when a request names none: ``gradcam``
        (one forward + backward), ``ig`` (``explain_n_steps`` of them) or ``occlusion`` (49
        forwards); see handlers/explain.py.
    explain_n_steps / explain_max_n_steps: Integrated Gradients steps, default and the most a
        request may ask for (400 above).
    explain_internal_batch_size: IG / occlusion rows per forward pass (memory bound).
    explain_max_targets: classes one image may have explained in one request (400 above).
    explain_png_max_side: longer side of the PNG heatmap, in pixels.
    max_explain_passes_per_batch: forward(+backward) passes of explanation work one batch may
        run (GradCAM 1 per image and target, IG ``n_steps``, occlusion 49); the requests that do
        not fit get 503 with ``Retry-After``, so explanations cannot starve predictions. A
        request that costs more than this on its own gets 400 (it would never fit).
    """

    task: str = "tags"
    top_k: int = 5
    normalize_embedding: bool = True
    device: str = "auto"
    half_precision: bool = False
    threads: int = 0
    decode_threads: int = 0
    onnx_spinning: bool = False
    precision: str = "auto"
    max_image_pixels: int = 40_000_000
    max_image_bytes: int = 30 * 1024 * 1024
    max_images_per_request: int = 64
    max_request_pixels: int = 100_000_000
    max_batch_pixels: int = 200_000_000
    max_json_depth: int = 16
    max_json_bytes: int = 32 * 1024 * 1024
    draft_decode: bool = True
    explain_method: str = "gradcam"
    explain_n_steps: int = 32
    explain_max_n_steps: int = 64
    explain_internal_batch_size: int = 8
    explain_max_targets: int = 5
    explain_png_max_side: int = 448
    max_explain_passes_per_batch: int = 64

    @classmethod
    def from_mapping(cls, section: Mapping[str, Any] | None) -> "HandlerConfig":
        """Build and check a config from the YAML ``handler:`` mapping (None = defaults)."""
        section = dict(section or {})
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(section) - set(fields))
        if unknown:
            raise ConfigError(
                f"unknown handler setting(s) {unknown} in model-config.yaml; "
                f"known: {sorted(fields)}"
            )
        for name, value in section.items():
            expected = type(fields[name].default)
            # bool is an int subclass: require the exact type so `top_k: true` is rejected.
            if type(value) is not expected:
                raise ConfigError(
                    f"handler.{name} must be {expected.__name__}, got {value!r}"
                )
        config = cls(**section)
        config._check()
        return config

    @property
    def parse_limits(self) -> ParseLimits:
        """What the codec may parse from one request."""
        return ParseLimits(max_images=self.max_images_per_request,
                           max_json_depth=self.max_json_depth,
                           max_json_bytes=self.max_json_bytes)

    @property
    def explain_limits(self) -> ExplainLimits:
        """The explanation defaults and bounds the codec checks requests against."""
        return ExplainLimits(method=self.explain_method, n_steps=self.explain_n_steps,
                             max_n_steps=self.explain_max_n_steps,
                             internal_batch_size=self.explain_internal_batch_size,
                             max_targets=self.explain_max_targets)

    def _check(self) -> None:
        if self.task not in TASKS:
            raise ConfigError(f"handler.task must be one of {TASKS}, got {self.task!r}")
        if self.device not in DEVICES:
            raise ConfigError(f"handler.device must be one of {DEVICES}, got {self.device!r}")
        if self.explain_method not in EXPLAIN_METHODS:
            raise ConfigError(f"handler.explain_method must be one of {EXPLAIN_METHODS}, "
                              f"got {self.explain_method!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"handler.precision must be one of {PRECISIONS}, got {self.precision!r}")
        for name, low, high in (
            ("top_k", 1, 1000),
            ("threads", 0, 1024),
            ("decode_threads", 0, 64),
            ("max_image_pixels", 1, 1_000_000_000),
            ("max_image_bytes", 1, 1 << 31),
            ("max_images_per_request", 1, 4096),
            ("max_request_pixels", 1, 10_000_000_000),
            ("max_batch_pixels", 1, 100_000_000_000),
            ("max_json_depth", 4, 1000),
            ("max_json_bytes", 1, 1 << 31),
            ("explain_n_steps", 1, self.explain_max_n_steps),
            ("explain_max_n_steps", 1, 1024),
            ("explain_internal_batch_size", 1, 64),
            ("explain_max_targets", 1, 1000),
            ("explain_png_max_side", 16, 2048),
            ("max_explain_passes_per_batch", 1, 1_000_000),
        ):
            value = getattr(self, name)
            if not low <= value <= high:
                raise ConfigError(f"handler.{name} must be in {low}..{high}, got {value}")
        if self.max_request_pixels > self.max_batch_pixels:
            raise ConfigError(
                f"handler.max_request_pixels ({self.max_request_pixels}) must not exceed "
                f"handler.max_batch_pixels ({self.max_batch_pixels}): a request alone must fit "
                "in a batch")
