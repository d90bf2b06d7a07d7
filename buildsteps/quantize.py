"""int8 OpenVINO IR by NNCF post-training quantisation, written only if it agrees with float32.

    python -m buildsteps.quantize [--weights build/weights] [--calibration build/samples]
                                   [--heldout build/heldout | --gate-photos YOUR_FOLDER]
                                   [--gate config/int8_gate.yaml] [--allow-refusal]

Calibrates on the photos in ``--calibration`` (as they are, then random crops, flips, colour
jitter of them: ``--size`` tensors in all), compares the int8 model with the float32 IR (run
with f32 precision) on the photos in ``--heldout`` (as they are and mirrored, plus augmentations
of the calibration photos with another seed), and writes ``resnet50_dual_int8.xml``/``.bin``
and ``resnet50_dual_int8.fidelity.json`` (the figures, the thresholds, the photo counts) only
when every figure meets its threshold in ``--gate``. Below threshold it writes no model, leaves
``resnet50_dual_int8.refused.json`` (what failed; archive.sh then packs no int8 and says why)
and exits 1 naming the figures that failed, or 0 with ``--allow-refusal`` (``make``: a refusal
is an answer, not a broken build). ``--gate-photos`` judges on your own photos instead of
``--heldout`` (every image under the folder, class subfolders included; ``make weights
GATE_PHOTOS=dir``). Up to date (the same checkpoint, thresholds and photos): nothing is done.

The figures compare int8 with float32 on the same weights: they bound what quantisation
changes, not the model's accuracy. With untrained (seeded) weights every photo gets nearly the
same embedding and the same top-1 class, so agreement there is easy and says nothing about
ImageNet; with trained weights, run this on your own labelled photos (``--heldout``) and check
accuracy of the archive against your labels as well.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from PIL import Image, ImageEnhance, ImageOps

from model_files.artifacts import (
    QUANTIZED,
    SERVED_INPUT,
    ModelFiles,
    checkpoint_sha256,
    companions,
    fidelity_record,
    refusal_record,
)
from model_files.recipe import crop
from servecore.backends import RUNTIME_DEFAULT, load_backend
from servecore.classes import Classes
from servecore.precision import agreement, failures

TARGET = QUANTIZED[("openvino", "int8")]
GATE = Path(__file__).resolve().parent.parent / "config" / "int8_gate.yaml"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")
MAX_GATE_PHOTOS = 1000  # of a user's folder, evenly spread: the gate runs both models on each


class FidelityError(RuntimeError):
    """The int8 model disagrees with float32 beyond the gate's thresholds (``figures``)."""

    def __init__(self, message: str, figures: dict) -> None:
        super().__init__(message)
        self.figures = figures


def photo_paths(folder: Path, recursive: bool = False) -> list[Path]:
    """The image files in ``folder`` (and its subfolders when ``recursive``), sorted."""
    found = Path(folder).rglob("*") if recursive else Path(folder).iterdir()
    paths = sorted(p for p in found if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not paths:
        raise FileNotFoundError(f"no photos ({', '.join(IMAGE_SUFFIXES)}) in {folder}")
    return paths


def load_photos(paths: list[Path]) -> list[Image.Image]:
    """The photos at ``paths``, as RGB, upright."""
    photos = []
    for path in paths:
        with Image.open(path) as image:
            image.draft("RGB", (1024, 1024))  # 12 MP JPEGs: decode at 1/4 in the DCT
            photos.append(ImageOps.exif_transpose(image).convert("RGB"))
    return photos


def spread(paths: list[Path], at_most: int) -> list[Path]:
    """At most ``at_most`` of ``paths``, evenly spread over the sorted list."""
    if len(paths) <= at_most:
        return paths
    return [paths[i * len(paths) // at_most] for i in range(at_most)]


def photo_set_id(paths: list[Path]) -> str:
    """What identifies a set of gate photos between builds: names and sizes."""
    listing = "\n".join(f"{p.name} {p.stat().st_size}" for p in paths)
    return hashlib.sha256(listing.encode()).hexdigest()[:16]


def augment(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    """A random crop (30-100% of the area), maybe a mirror, brightness/contrast/colour jitter."""
    w, h = image.size
    area, aspect = w * h * rng.uniform(0.3, 1.0), np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
    cw, ch = min(w, round((area * aspect) ** 0.5)), min(h, round((area / aspect) ** 0.5))
    left, top = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    image = image.crop((left, top, left + cw, top + ch))
    if rng.random() < 0.5:
        image = ImageOps.mirror(image)
    for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        image = enhance(image).enhance(rng.uniform(0.6, 1.4))
    return image


def _model_inputs(images: list[Image.Image]) -> torch.Tensor:
    """The images as the served model takes them (uint8 crops), stacked."""
    return torch.stack([crop(image) for image in images])


def calibration_set(photos: list[Image.Image], size: int, seed: int = 0) -> torch.Tensor:
    """``size`` preprocessed tensors: each photo as it is, then augmentations in turn."""
    rng = np.random.default_rng(seed)
    return _model_inputs(
        photos[:size]
        + [augment(photos[i % len(photos)], rng) for i in range(max(0, size - len(photos)))]
    )


def heldout_set(
    heldout: list[Image.Image], calibration: list[Image.Image], augmented: int = 24
) -> torch.Tensor:
    """Photos never calibrated on, as they are and mirrored, plus augmentations of the
    calibration photos drawn with another seed."""
    images = [*heldout, *(ImageOps.mirror(p) for p in heldout)]
    rng = np.random.default_rng(12345)
    images += [augment(calibration[i % len(calibration)], rng) for i in range(augmented)]
    return _model_inputs(images)


def _run(path: Path, precision: str, pixels: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The model at ``path`` run exactly as the handler serves it, in batches of 8."""
    backend = load_backend("openvino", path, torch.device("cpu"), precision=precision)
    outputs = [backend(chunk) for chunk in pixels.split(8)]
    return (torch.cat([o[0] for o in outputs]).numpy(), torch.cat([o[1] for o in outputs]).numpy())


@dataclass(frozen=True)
class Calibrated:
    """The int8 model NNCF made from the float32 IR, not yet judged nor written."""

    model: Any  # openvino.Model
    fp32: Path  # the float32 IR it was made from (what the gate compares it with)
    size: int  # calibration tensors
    photos: int  # calibration photos
    seconds: float  # the calibration's wall time


def calibrate(weights_dir: Path, calibration: list[Image.Image], size: int = 200) -> Calibrated:
    """NNCF's post-training quantisation of the float32 IR in ``weights_dir`` (exported first
    when missing) on ``size`` tensors made from the ``calibration`` photos; writes nothing."""
    # NNCF sends usage telemetry unless told otherwise; its documented switch is this variable.
    os.environ.setdefault("NNCF_CI", "1")
    import nncf
    import openvino as ov
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters
    from nncf.quantization.range_estimator import RangeEstimatorParametersSet

    from buildsteps.export import export

    fp32 = export("openvino", weights_dir)
    started = time.monotonic()
    pixels = calibration_set(calibration, size)
    dataset = nncf.Dataset(list(pixels.numpy()), lambda x: {"input": x[None]})
    # MINMAX activation ranges: on this model the default (quantile) estimator gave a worst
    # embedding 5x further from float32 (scratch measurements, 80 held-apart photos).
    quantized = nncf.quantize(
        ov.Core().read_model(str(fp32)),
        dataset,
        preset=nncf.QuantizationPreset.PERFORMANCE,
        target_device=nncf.TargetDevice.CPU,
        subset_size=size,
        advanced_parameters=AdvancedQuantizationParameters(
            activations_range_estimator_params=RangeEstimatorParametersSet.MINMAX
        ),
    )
    return Calibrated(quantized, fp32, size, len(calibration), time.monotonic() - started)


def accept(
    weights_dir: Path,
    calibrated: Calibrated,
    calibration: list[Image.Image],
    heldout: list[Image.Image],
    thresholds: dict,
) -> Path:
    """The fidelity gate: write ``calibrated``'s int8 IR and its record beside the float32 one
    and return its path, or raise FidelityError (nothing written) when it disagrees with float32
    beyond ``thresholds`` on ``heldout`` (and augmentations of ``calibration``)."""
    import nncf
    import openvino as ov

    started = time.monotonic()
    fp32 = calibrated.fp32
    # Staged beside the weights (same file system: the final moves are renames); whatever
    # fails, the staging folder goes and nothing half-written reaches weights_dir.
    with tempfile.TemporaryDirectory(prefix="int8.", dir=weights_dir) as tmp:
        staging = Path(tmp)
        candidate = staging / TARGET
        ov.save_model(calibrated.model, str(candidate), compress_to_fp16=False)

        probe = heldout_set(heldout, calibration)
        heads = Classes.read(ModelFiles.read(weights_dir, fp32.name)).rows
        figures = agreement(
            _run(fp32, "f32", probe), _run(candidate, RUNTIME_DEFAULT, probe), heads
        )
        failed = failures(figures, thresholds)
        if failed:
            raise FidelityError(
                f"int8 model refused by the fidelity gate: {'; '.join(failed)} (against "
                f"float32 on {figures['photos']} held-apart photos); the archives carry no "
                "int8. Calibrate on photos like the ones you serve (--calibration), or judge "
                "on your own (GATE_PHOTOS=dir).",
                figures,
            )
        record = {
            "precision": "int8",
            "method": "NNCF post-training quantisation, MINMAX ranges",
            "nncf": nncf.__version__,
            "openvino": ov.get_version(),
            "calibration_tensors": calibrated.size,
            "calibration_photos": calibrated.photos,
            "heldout_photos": len(heldout),
            "fidelity_vs_f32": figures,
            "thresholds": thresholds,
            "checkpoint_sha256": checkpoint_sha256(weights_dir),
            "input": SERVED_INPUT,
            "note": "agreement with float32 on the same weights, not ImageNet accuracy",
            "build_s": round(calibrated.seconds + time.monotonic() - started, 1),
        }
        (staging / fidelity_record(TARGET)).write_text(json.dumps(record, indent=2) + "\n")
        for name in [TARGET, *companions(TARGET)]:
            (staging / name).replace(weights_dir / name)
    return weights_dir / TARGET


def quantize(
    weights_dir: Path,
    calibration: list[Image.Image],
    heldout: list[Image.Image],
    thresholds: dict,
    size: int = 200,
) -> Path:
    """``calibrate`` then ``accept``: write the int8 IR beside the float32 one and return its
    path, or raise FidelityError (nothing written) when it disagrees with float32 beyond
    ``thresholds``."""
    calibrated = calibrate(weights_dir, calibration, size)
    return accept(weights_dir, calibrated, calibration, heldout, thresholds)


def _clear(weights_dir: Path) -> None:
    """Remove a former int8 IR, its record or its refusal: a new attempt replaces them all,
    so a refusal never leaves an older model behind."""
    for name in [TARGET, *companions(TARGET), refusal_record(TARGET)]:
        (weights_dir / name).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", type=Path, default=Path("build/weights"))
    parser.add_argument(
        "--calibration",
        type=Path,
        default=Path("build/samples"),
        help="folder of photos like the ones you serve",
    )
    parser.add_argument(
        "--heldout",
        type=Path,
        default=Path("build/heldout"),
        help="folder of other photos, never calibrated on",
    )
    parser.add_argument(
        "--gate-photos",
        type=Path,
        default=None,
        help="judge on your own photos: every image under this folder",
    )
    parser.add_argument("--gate", type=Path, default=GATE, help="thresholds (YAML)")
    parser.add_argument("--size", type=int, default=200, help="calibration tensors")
    parser.add_argument(
        "--allow-refusal",
        action="store_true",
        help="a refusal by the gate exits 0 (the archives then carry no int8)",
    )
    args = parser.parse_args(argv)
    target, record_path = args.weights / TARGET, args.weights / fidelity_record(TARGET)
    refused_path = args.weights / refusal_record(TARGET)
    thresholds = yaml.safe_load(args.gate.read_text())["thresholds"]
    heldout = (
        spread(photo_paths(args.gate_photos, recursive=True), MAX_GATE_PHOTOS)
        if args.gate_photos
        else photo_paths(args.heldout)
    )
    key = {
        "checkpoint_sha256": checkpoint_sha256(args.weights),
        "input": SERVED_INPUT,
        "thresholds": thresholds,
        "gate_photos": photo_set_id(heldout),
    }
    for path in (record_path, refused_path):
        if path.is_file() and {k: json.loads(path.read_text()).get(k) for k in key} == key:
            return _report(path, args.allow_refusal)  # up to date
    _clear(args.weights)
    try:
        quantize(
            args.weights,
            load_photos(photo_paths(args.calibration)),
            load_photos(heldout),
            thresholds,
            args.size,
        )
    except FidelityError as error:
        refused_path.write_text(
            json.dumps({**key, "refused": str(error), "fidelity_vs_f32": error.figures}, indent=2)
            + "\n"
        )
    else:
        record = json.loads(record_path.read_text())
        record_path.write_text(json.dumps({**record, **key}, indent=2) + "\n")
    return _report(record_path if target.is_file() else refused_path, args.allow_refusal)


def _report(path: Path, allow_refusal: bool) -> int:
    record = json.loads(path.read_text())
    if "refused" in record:
        print(f"int8: {record['refused']}", file=sys.stderr)
        return 0 if allow_refusal else 1
    figures = {
        k: round(v, 4) if isinstance(v, float) else v for k, v in record["fidelity_vs_f32"].items()
    }
    print(
        f"int8: {TARGET} passed the fidelity gate against float32 (quantised in "
        f"{record['build_s']} s): {json.dumps(figures)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
