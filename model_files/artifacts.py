"""What a weights folder (``build/weights``) holds, which file each runtime loads, and the one
rule for when a file made from the checkpoint is current.

    python -m model_files.artifacts serialized onnx     # prints resnet50_dual.onnx
    python -m model_files.artifacts files openvino int8 # the int8 IR, then its companions
    python -m model_files.artifacts defaults            # prints "openvino none"

(``archive.sh`` and the Makefile ask this way, so the tables below are the only place that names
the files and the build's defaults. Standard library only: make asks before the venv exists.)
"""
from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

CHECKPOINT = "resnet50.pt"  # torchvision resnet50 state dict
INFO = "weights_info.json"  # provenance: source, trained, sha256 of CHECKPOINT
LABELS = "index_to_name.json"  # class index -> name

# Runtime -> the serialized file an archive carries for it (eager: the checkpoint itself).
SERIALIZED = {
    "eager": CHECKPOINT,
    "torchscript": "resnet50_dual.torchscript.pt",
    "onnx": "resnet50_dual.onnx",
    "openvino": "resnet50_dual.xml",  # OpenVINO IR: graph; its weights are the .bin beside it
}
# (backend, QUANTIZE) -> a serialized file whose weights are quantised at build time
# (buildsteps/quantize.py); without it the precision is chosen when the model is compiled.
QUANTIZED = {("openvino", "int8"): "resnet50_dual_int8.xml"}
# The build's choices (BACKEND, QUANTIZE of archive.sh and make) and their defaults.
DEFAULT_BACKEND = "openvino"  # the fastest on CPU: bf16 where the CPU has it
QUANTIZE = ("none", "int8")
DEFAULT_QUANTIZE = "none"  # int8 must first pass buildsteps/quantize.py's fidelity gate
# The runtime choice, handler.precision in config/models/*.yaml.
PRECISIONS = ("auto", "f32", "bf16", "int8")


def serialized(backend: str, quantize: str = DEFAULT_QUANTIZE) -> str:
    """The file an archive for ``backend`` built with ``quantize`` carries."""
    if quantize not in QUANTIZE:
        raise ValueError(f"QUANTIZE must be one of {QUANTIZE}, got {quantize!r}")
    if quantize == "none":
        return SERIALIZED[backend]
    if (backend, quantize) not in QUANTIZED:
        raise ValueError(f"QUANTIZE={quantize} needs BACKEND=openvino, got {backend!r}")
    return QUANTIZED[(backend, quantize)]


def companions(serialized_file: str) -> list[str]:
    """Files that must sit next to ``serialized_file`` in the archive: an IR's weights (.bin,
    found by name by ``read_model``) and a quantised IR's fidelity record."""
    name = Path(serialized_file)
    if name.suffix != ".xml":
        return []
    files = [name.with_suffix(".bin").name]
    if is_quantised(name.name):
        files.append(fidelity_record(name.name))
    return files


def fidelity_record(serialized_file: str) -> str:
    """The JSON beside a quantised IR holding its measured agreement with float32."""
    return Path(serialized_file).with_suffix(".fidelity.json").name


def read_manifest(mar: Path | zipfile.ZipFile) -> dict:
    """The ``model`` section of an archive's ``MAR-INF/MANIFEST.json`` (modelName,
    modelVersion, serializedFile, handler, ...); ``mar`` a path or an open archive."""
    if isinstance(mar, zipfile.ZipFile):
        return json.loads(mar.read("MAR-INF/MANIFEST.json"))["model"]
    with zipfile.ZipFile(mar) as archive:
        return read_manifest(archive)


def is_quantised(serialized_file: str) -> bool:
    """Whether ``serialized_file`` holds weights quantised at build time."""
    return Path(serialized_file).name in QUANTIZED.values()


def built_quantize(serialized_file: str) -> str:
    """``archive.sh``'s QUANTIZE for an archive carrying ``serialized_file``: ``int8`` for a
    quantised file, else ``none``."""
    return "int8" if is_quantised(serialized_file) else "none"


def backend_of(serialized_file: str) -> str:
    """The runtime whose file is ``serialized_file`` (the archive manifest's name)."""
    for backend, name in [*SERIALIZED.items(), *((b, n) for (b, _), n in QUANTIZED.items())]:
        if Path(serialized_file).name == name:
            return backend
    raise ValueError(f"unknown serialized model file {serialized_file!r}; archive.sh packs one "
                     f"of {sorted([*SERIALIZED.values(), *QUANTIZED.values()])}")


@dataclass(frozen=True)
class ModelFiles:
    """The files one model serves from (an extracted archive, a Triton model version's
    folder): the ``folder``, the name of the ``serialized`` model file in it, and the weights'
    provenance (``INFO``: source, trained, sha256)."""

    folder: Path
    serialized: str
    weights: dict

    @classmethod
    def read(cls, folder: Path, serialized: str) -> "ModelFiles":
        folder = Path(folder)
        return cls(folder, serialized, json.loads((folder / INFO).read_text()))

    @property
    def backend(self) -> str:
        return backend_of(self.serialized)

    @property
    def labels(self) -> list[str]:
        return load_labels(self.folder / LABELS)

    @property
    def checkpoint(self) -> Path:
        return self.folder / CHECKPOINT

    @property
    def quantization(self) -> dict | None:
        """The fidelity record of a quantised serialized file (None for a float one)."""
        record = self.folder / fidelity_record(self.serialized)
        return json.loads(record.read_text()) if record.is_file() else None


def load_labels(path: Path) -> list[str]:
    """The class names of a ``LABELS`` file, in class-index order."""
    mapping = json.loads(Path(path).read_text())
    return [mapping[str(i)] for i in range(len(mapping))]


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
    if args == ["defaults"]:
        print(DEFAULT_BACKEND, DEFAULT_QUANTIZE)
        return 0
    if (len(args) not in (2, 3) or args[0] not in ("serialized", "files")
            or args[1] not in SERIALIZED or args[2:3] and args[2] not in QUANTIZE):
        print(f"usage: python -m model_files.artifacts serialized|files "
              f"{{{','.join(SERIALIZED)}}} [{{{','.join(QUANTIZE)}}}] | defaults",
              file=sys.stderr)
        return 2
    try:
        name = serialized(*args[1:])
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print("\n".join([name, *companions(name)]) if args[0] == "files" else name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
