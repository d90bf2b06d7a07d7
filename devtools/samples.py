"""Write sample photos for the README's curl examples, the tests and the benchmark.

    python -m devtools.samples [--out build/samples]

``chelsea.jpg`` (451x300, a tabby cat) and ``coffee.jpg`` are scikit-image's bundled sample
photos (public domain / CC0, shipped inside the scikit-image wheel), re-encoded as JPEG;
``chelsea-12mp.jpg`` is the cat upscaled to 4242x2828 (12 MP), the size a phone camera writes.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from PIL import Image

TWELVE_MP = (4242, 2828)


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
    }
    if all(p.exists() for p in paths.values()):
        return paths
    photo("chelsea").save(paths["chelsea"], quality=90)
    photo("coffee").save(paths["coffee"], quality=90)
    photo("chelsea").resize(TWELVE_MP, Image.Resampling.BICUBIC).save(
        paths["chelsea-12mp"], quality=90)
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/samples"))
    for name, path in write_samples(parser.parse_args().out).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
