"""int8 OpenVINO IR by NNCF post-training quantisation, written only if it agrees with float32.

    python -m buildsteps.quantize [--weights build/weights] [--calibration build/samples]
                                   [--heldout build/heldout] [--gate config/int8_gate.yaml]

Calibrates on the photos in ``--calibration`` (as they are, then random crops, flips, colour
jitter of them: ``--size`` tensors in all), compares the int8 model with the float32 IR (run
with f32 precision) on the photos in ``--heldout`` (as they are and mirrored, plus augmentations
of the calibration photos with another seed), and writes ``resnet50_dual_int8.xml``/``.bin``
and ``resnet50_dual_int8.fidelity.json`` (the figures, the thresholds, the photo counts) only
when every figure meets its threshold in ``--gate``. Below threshold it writes nothing and
exits 1 naming the figures that failed.

The figures compare int8 with float32 on the same weights: they bound what quantisation
changes, not the model's accuracy. With untrained (seeded) weights every photo gets nearly the
same embedding and the same top-1 class, so agreement there is easy and says nothing about
ImageNet; with trained weights, run this on your own labelled photos (``--heldout``) and check
accuracy of the archive against your labels as well.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from PIL import Image, ImageEnhance, ImageOps

from model_files.artifacts import QUANTIZED, checkpoint_sha256, companions, fidelity_record
from servecore.backends import load_backend
from servecore.precision import agreement, failures
from model_files.resnet_dual import WEIGHTS

TARGET = QUANTIZED[("openvino", "int8")]
GATE = Path(__file__).resolve().parent.parent / "config" / "int8_gate.yaml"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")


class FidelityError(RuntimeError):
    """The int8 model disagrees with float32 beyond the gate's thresholds."""


def load_photos(folder: Path) -> list[Image.Image]:
    """Every image file directly in ``folder`` (sorted by name), as RGB."""
    paths = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not paths:
        raise FileNotFoundError(f"no photos ({', '.join(IMAGE_SUFFIXES)}) in {folder}")
    photos = []
    for path in paths:
        with Image.open(path) as image:
            image.draft("RGB", (1024, 1024))  # 12 MP JPEGs: decode at 1/4 in the DCT
            photos.append(ImageOps.exif_transpose(image).convert("RGB"))
    return photos


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
    """The images as the served model sees them (the weights' own transform), stacked."""
    transform = WEIGHTS.transforms()
    return torch.stack([transform(image) for image in images])


def calibration_set(photos: list[Image.Image], size: int, seed: int = 0) -> torch.Tensor:
    """``size`` preprocessed tensors: each photo as it is, then augmentations in turn."""
    rng = np.random.default_rng(seed)
    return _model_inputs(photos[:size] + [augment(photos[i % len(photos)], rng)
                                          for i in range(max(0, size - len(photos)))])


def heldout_set(heldout: list[Image.Image], calibration: list[Image.Image],
                augmented: int = 24) -> torch.Tensor:
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


def quantize(weights_dir: Path, calibration: list[Image.Image], heldout: list[Image.Image],
             thresholds: dict, size: int = 200, subset_size: int | None = None) -> Path:
    """Write the int8 IR beside the float32 one and return its path, or raise FidelityError
    (nothing written) when it disagrees with float32 beyond ``thresholds``."""
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
        ov.Core().read_model(str(fp32)), dataset, preset=nncf.QuantizationPreset.PERFORMANCE,
        target_device=nncf.TargetDevice.CPU, subset_size=subset_size or size,
        advanced_parameters=AdvancedQuantizationParameters(
            activations_range_estimator_params=RangeEstimatorParametersSet.MINMAX))
    # Staged beside the weights (same file system: the final moves are renames); whatever
    # fails, the staging folder goes and nothing half-written reaches weights_dir.
    with tempfile.TemporaryDirectory(prefix="int8.", dir=weights_dir) as tmp:
        staging = Path(tmp)
        candidate = staging / TARGET
        ov.save_model(quantized, str(candidate), compress_to_fp16=False)

        probe = heldout_set(heldout, calibration)
        figures = agreement(_run(fp32, "f32", probe), _run(candidate, "auto", probe))
        failed = failures(figures, thresholds)
        if failed:
            raise FidelityError(
                f"int8 model refused: {'; '.join(failed)} (against float32 on "
                f"{figures['photos']} held-apart photos). Nothing written. Calibrate on photos "
                "like the ones you serve (--calibration), or keep BACKEND=openvino at "
                "precision auto/f32.")
        record = {
            "precision": "int8", "method": "NNCF post-training quantisation, MINMAX ranges",
            "nncf": nncf.__version__, "openvino": ov.get_version(),
            "calibration_tensors": size, "calibration_photos": len(calibration),
            "heldout_photos": len(heldout), "fidelity_vs_f32": figures,
            "thresholds": thresholds, "checkpoint_sha256": checkpoint_sha256(weights_dir),
            "note": "agreement with float32 on the same weights, not ImageNet accuracy",
            "build_s": round(time.monotonic() - started, 1),
        }
        (staging / fidelity_record(TARGET)).write_text(json.dumps(record, indent=2) + "\n")
        for name in [TARGET, *companions(TARGET)]:
            (staging / name).replace(weights_dir / name)
    return weights_dir / TARGET


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", type=Path, default=Path("build/weights"))
    parser.add_argument("--calibration", type=Path, default=Path("build/samples"),
                        help="folder of photos like the ones you serve")
    parser.add_argument("--heldout", type=Path, default=Path("build/heldout"),
                        help="folder of other photos, never calibrated on")
    parser.add_argument("--gate", type=Path, default=GATE, help="thresholds (YAML)")
    parser.add_argument("--size", type=int, default=200, help="calibration tensors")
    args = parser.parse_args(argv)
    target, record_path = args.weights / TARGET, args.weights / fidelity_record(TARGET)
    thresholds = yaml.safe_load(args.gate.read_text())["thresholds"]
    if target.is_file() and record_path.is_file():
        built = json.loads(record_path.read_text())
        if (built["checkpoint_sha256"], built["thresholds"]) == (
                checkpoint_sha256(args.weights), thresholds):
            return 0  # up to date
    try:
        quantize(args.weights, load_photos(args.calibration), load_photos(args.heldout),
                 thresholds, args.size)
    except FidelityError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    record = json.loads(record_path.read_text())
    print(f"quantised: {target} {json.dumps(record['fidelity_vs_f32'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
