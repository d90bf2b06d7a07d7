"""What a weights folder (``build/weights``) holds, which file each runtime loads, and the one
rule for when a file made from the checkpoint is current.

    python -m model_files.artifacts serialized onnx     # prints resnet50_dual.onnx

(``archive.sh`` asks this way, so the table below is the only place that names the files.)
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

CHECKPOINT = "resnet50.pt"  # torchvision resnet50 state dict
INFO = "weights_info.json"  # provenance: source, trained, sha256 of CHECKPOINT
LABELS = "index_to_name.json"  # class index -> name

# Runtime -> the serialized file an archive carries for it (eager: the checkpoint itself).
SERIALIZED = {
    "eager": CHECKPOINT,
    "torchscript": "resnet50_dual.torchscript.pt",
    "onnx": "resnet50_dual.onnx",
}


def backend_of(serialized_file: str) -> str:
    """The runtime whose file is ``serialized_file`` (the archive manifest's name)."""
    for backend, name in SERIALIZED.items():
        if Path(serialized_file).name == name:
            return backend
    raise ValueError(f"unknown serialized model file {serialized_file!r}; archive.sh packs one "
                     f"of {sorted(SERIALIZED.values())}")


def sha256_of(path: Path) -> str:
    """The sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def checkpoint_sha256(weights_dir: Path) -> str:
    """The sha256 of the checkpoint, as ``build_weights`` recorded it."""
    return json.loads((Path(weights_dir) / INFO).read_text())["sha256"]


def _stamp(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def is_current(target: Path, source_sha256: str) -> bool:
    """Whether ``target`` exists and was made from the source whose sha256 is given."""
    stamp = _stamp(target)
    return target.is_file() and stamp.is_file() and stamp.read_text().strip() == source_sha256


def mark_current(target: Path, source_sha256: str) -> None:
    """Record that ``target`` (just written) was made from ``source_sha256``."""
    _stamp(target).write_text(source_sha256 + "\n")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "serialized" or args[1] not in SERIALIZED:
        print(f"usage: python -m model_files.artifacts serialized {{{','.join(SERIALIZED)}}}",
              file=sys.stderr)
        return 2
    print(SERIALIZED[args[1]])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
