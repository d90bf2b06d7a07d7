"""What a weights folder (``build/weights``) holds, which file each runtime loads, and the one
rule for when a file made from the checkpoint is current.

    python -m model_files.artifacts serialized onnx     # prints resnet50_dual.onnx
    python -m model_files.artifacts files openvino      # the float IR, then its .bin
    python -m model_files.artifacts int8 openvino int8 build/weights
                                                        # the int8 files to pack beside it, if
                                                        # they passed the gate (else: why not)
    python -m model_files.artifacts defaults            # prints "openvino int8"

(``archive.sh`` and the Makefile ask this way, so the tables below are the only place that names
the files and the build's defaults. Standard library only: make asks before the venv exists.)
"""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from collections.abc import Sequence
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
# (backend, QUANTIZE) -> the quantised file an archive carries beside ``SERIALIZED[backend]``
# (buildsteps/quantize.py writes it only when it passes the fidelity gate); ``auto`` measures
# it against the float file of the same weights.
QUANTIZED = {("openvino", "int8"): "resnet50_dual_int8.xml"}
# The build's choices (BACKEND, QUANTIZE of archive.sh and make) and their defaults.
DEFAULT_BACKEND = "openvino"  # the fastest on CPU: bf16 where the CPU has it
QUANTIZE = ("none", "int8")
# int8 where the backend has it (OpenVINO) and the gate passes; else the archive has none.
DEFAULT_QUANTIZE = "int8"
# The served model's input (model_files/resnet_dual.py): uint8 crops, normalised in the model.
# Files made for another input are stale: the exports' stamps and the int8 records name it.
SERVED_INPUT = "uint8-crop-v1"
# The runtime choice, handler.precision in config/models/*.yaml.
PRECISIONS = ("auto", "f32", "bf16", "int8")


def serialized(backend: str) -> str:
    """The model file an archive for ``backend`` names in its manifest (float32 weights)."""
    return SERIALIZED[backend]


def quantized(backend: str, quantize: str) -> str | None:
    """The quantised file an archive for ``backend`` built with ``quantize`` adds, or None
    (``none``, or a backend without one: QUANTIZE applies to OpenVINO only)."""
    if quantize not in QUANTIZE:
        raise ValueError(f"QUANTIZE must be one of {QUANTIZE}, got {quantize!r}")
    return QUANTIZED.get((backend, quantize))


def int8_to_pack(weights_dir: Path, backend: str, quantize: str) -> tuple[list[str], str]:
    """The quantised files an archive should carry from ``weights_dir`` (the IR, its .bin and
    its fidelity record), or ``[]`` and why not: not asked for, refused by the gate, not built,
    or built from other weights."""
    name = quantized(backend, quantize)
    if name is None:
        return [], (
            f"no int8: QUANTIZE={quantize}"
            if quantize == "none"
            else f"no int8: QUANTIZE=int8 applies to BACKEND=openvino, not {backend}"
        )
    record, refused = weights_dir / fidelity_record(name), weights_dir / refusal_record(name)
    made_from = {"checkpoint_sha256": checkpoint_sha256(weights_dir), "input": SERVED_INPUT}
    if refused.is_file() and _made_from(refused) == made_from:
        return [], f"no int8: {json.loads(refused.read_text())['refused']}"
    if not (weights_dir / name).is_file() or not record.is_file():
        return [], f"no int8 in {weights_dir}: run 'make weights' (buildsteps/quantize.py)"
    if _made_from(record) != made_from:
        return [], (
            f"no int8: {name} in {weights_dir} was made from other weights or for another "
            "model input: run 'make weights'"
        )
    return [name, *companions(name)], ""


def _made_from(record: Path) -> dict:
    """The checkpoint and served input a quantisation record (passed or refused) was made
    for (records from before the uint8 input name none)."""
    data = json.loads(record.read_text())
    return {"checkpoint_sha256": data.get("checkpoint_sha256"), "input": data.get("input")}


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


def refusal_record(serialized_file: str) -> str:
    """The JSON left where a quantised IR would be when the fidelity gate refused it."""
    return Path(serialized_file).with_suffix(".refused.json").name


MANIFEST = "MAR-INF/MANIFEST.json"  # torch-model-archiver's manifest inside a .mar


def read_manifest(mar: Path | zipfile.ZipFile) -> dict:
    """The ``model`` section of an archive's ``MAR-INF/MANIFEST.json`` (modelName,
    modelVersion, serializedFile, handler, ...); ``mar`` a path or an open archive."""
    if isinstance(mar, zipfile.ZipFile):
        return json.loads(mar.read(MANIFEST))["model"]
    with zipfile.ZipFile(mar) as archive:
        return read_manifest(archive)


def is_quantised(serialized_file: str) -> bool:
    """Whether ``serialized_file`` holds weights quantised at build time."""
    return Path(serialized_file).name in QUANTIZED.values()


def archive_quantize(names) -> str:
    """``archive.sh``'s QUANTIZE for an archive holding the files ``names``: ``int8`` when it
    carries a quantised file, else ``none``."""
    return "int8" if any(Path(n).name in QUANTIZED.values() for n in names) else "none"


def backend_of(serialized_file: str) -> str:
    """The runtime whose file is ``serialized_file`` (the archive manifest's name)."""
    for backend, name in [*SERIALIZED.items(), *((b, n) for (b, _), n in QUANTIZED.items())]:
        if Path(serialized_file).name == name:
            return backend
    raise ValueError(
        f"unknown serialized model file {serialized_file!r}; archive.sh packs one "
        f"of {sorted([*SERIALIZED.values(), *QUANTIZED.values()])}"
    )


@dataclass(frozen=True)
class ModelFiles:
    """The files one model serves from (an extracted archive, a Triton model version's
    folder): the ``folder``, the name of the ``serialized`` model file in it, and the weights'
    provenance (``INFO``: source, trained, sha256)."""

    folder: Path
    serialized: str
    weights: dict

    @classmethod
    def read(cls, folder: Path, serialized: str) -> ModelFiles:
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
    def int8(self) -> Path | None:
        """The int8 model file in the folder (the serialized one itself, or the one carried
        beside it), None when there is none."""
        if is_quantised(self.serialized):
            return self.folder / self.serialized
        name = QUANTIZED.get((self.backend, "int8"))
        return self.folder / name if name and (self.folder / name).is_file() else None

    @property
    def quantization(self) -> dict | None:
        """The int8 model's fidelity record (None when the folder has no int8 model)."""
        record = self.int8 and self.int8.with_name(fidelity_record(self.int8.name))
        return json.loads(record.read_text()) if record and record.is_file() else None


def load_labels(path: Path) -> list[str]:
    """The class names of a ``LABELS`` file, in class-index order."""
    mapping = json.loads(Path(path).read_text(encoding="utf-8"))
    return [mapping[str(i)] for i in range(len(mapping))]


def labels_problem(names: Sequence[str]) -> str | None:
    """Why ``names`` cannot be a model's labels, or None: the one rule ``make serve``
    (buildsteps/checkpoint.py) and ``tsctl head train`` (its folder names) apply. Every class
    has a name: one line of UTF-8 text, no space around it, not another's ignoring case (a
    target or a folder names a label in any case)."""
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if not name:
            empty = sum(not n for n in names)
            return f"label {i} is empty ({empty} empty in all): every class needs a name"
        if name != name.strip() or "\n" in name or "\r" in name:
            return f"label {i} ({name!r}) is not one line without spaces around it"
        if any("\ud800" <= c <= "\udfff" for c in name):  # what str holds of non-UTF-8 bytes
            return f"label {i} ({name!r}) is not UTF-8 text"
        if name.lower() in seen:
            return (
                f"label {name!r} is repeated (classes {seen[name.lower()]} and {i}, compared "
                "ignoring case): every class needs its own name"
            )
        seen[name.lower()] = i
    return None


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


def model_source(weights_dir: Path) -> str:
    """What a file made for the served model is made from: the checkpoint's sha256 and the
    served input (``recipe.INPUT``); a file stamped otherwise is rebuilt."""
    return f"{checkpoint_sha256(weights_dir)} {SERVED_INPUT}"


def _stamp(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def is_current(target: Path, source_sha256: str) -> bool:
    """Whether ``target`` exists and was made from the source whose sha256 is given."""
    stamp = _stamp(target)
    return target.is_file() and stamp.is_file() and stamp.read_text().strip() == source_sha256


def mark_current(target: Path, source_sha256: str) -> None:
    """Record that ``target`` (just written) was made from ``source_sha256``."""
    _stamp(target).write_text(source_sha256 + "\n")


USAGE = (
    f"usage: python -m model_files.artifacts defaults | serialized BACKEND | files BACKEND"
    f" | int8 BACKEND QUANTIZE WEIGHTS_DIR   (BACKEND: {', '.join(SERIALIZED)}; "
    f"QUANTIZE: {', '.join(QUANTIZE)})"
)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    command, rest = (args[0], args[1:]) if args else ("", [])
    arity = {"defaults": 0, "serialized": 1, "files": 1, "int8": 3}
    if arity.get(command) != len(rest) or (rest[:1] and rest[0] not in SERIALIZED):
        print(USAGE, file=sys.stderr)
        return 2
    if command == "defaults":
        print(DEFAULT_BACKEND, DEFAULT_QUANTIZE)
    elif command == "int8":
        try:
            files, why_not = int8_to_pack(Path(rest[2]), rest[0], rest[1])
        except (ValueError, OSError, KeyError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print("\n".join(files) if files else why_not, file=sys.stdout if files else sys.stderr)
    else:
        name = serialized(rest[0])
        print("\n".join([name, *companions(name)]) if command == "files" else name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
