"""Write sample photos for the README's curl examples, the tests and the benchmark.

    python -m devtools.samples [--out build/samples]

``chelsea.jpg`` (451x300, a tabby cat) and ``coffee.jpg`` are scikit-image's bundled sample
photos (public domain / CC0, shipped inside the scikit-image wheel), re-encoded as JPEG;
``chelsea-12mp.jpg`` is the cat upscaled to 4242x2828 (12 MP), the size a phone camera writes;
``chelsea-12mp-noisy.jpg`` is the same with seeded Gaussian sensor noise, which a phone photo
has and which JPEG compresses badly (about 3 MB at quality 90 against 0.8 MB smooth).

    python -m devtools.samples --heldout build/heldout

writes other bundled scikit-image photos, never used for calibration, for the int8 gate
(buildsteps/quantize.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

TWELVE_MP = (4242, 2828)
NOISE_SIGMA = 8.0  # grey levels; phone sensors at indoor ISO show 4-10
# Not ``cat``: it is chelsea again.
HELDOUT = ("astronaut", "rocket", "hubble_deep_field", "immunohistochemistry", "camera")


def photo(name: str) -> Image.Image:
    """A scikit-image sample photo (``chelsea``, ``coffee``, ``astronaut``) as a PIL image."""
    import skimage.data

    return Image.fromarray(getattr(skimage.data, name)())


def write_samples(out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "chelsea": out / "chelsea.jpg",
        "coffee": out / "coffee.jpg",
        "chelsea-12mp": out / "chelsea-12mp.jpg",
        "chelsea-12mp-noisy": out / "chelsea-12mp-noisy.jpg",
    }
    if all(p.exists() for p in paths.values()):
        return paths
    photo("chelsea").save(paths["chelsea"], quality=90)
    photo("coffee").save(paths["coffee"], quality=90)
    big = photo("chelsea").resize(TWELVE_MP, Image.Resampling.BICUBIC)
    big.save(paths["chelsea-12mp"], quality=90)
    noise = np.random.default_rng(12).normal(0.0, NOISE_SIGMA, (TWELVE_MP[1], TWELVE_MP[0], 3))
    noisy = np.clip(np.asarray(big, np.float32) + noise, 0, 255).astype(np.uint8)
    Image.fromarray(noisy).save(paths["chelsea-12mp-noisy"], quality=90)
    return paths


def write_heldout(out: Path) -> list[Path]:
    """Bundled photos the int8 gate checks against and never calibrates on (RGB JPEGs)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.jpg" for name in HELDOUT]
    for name, path in zip(HELDOUT, paths):
        if not path.exists():
            photo(name).convert("RGB").save(path, quality=90)
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/samples"))
    parser.add_argument("--heldout", type=Path, help="also write the held-apart photos here")
    args = parser.parse_args()
    for name, path in write_samples(args.out).items():
        print(f"{name}: {path}")
    for path in write_heldout(args.heldout) if args.heldout else []:
        print(f"held apart: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
