"""Build the storage bundle our KServe runtimes read from ``storageUri``, as a folder and a
``.tar.gz`` (``make kserve-bundle``, ``make kserve-bundle KSERVE_ENGINE=triton``).

    python -m kserve_tools.bundle [--out build/kserve] [--device cpu|gpu [--gpus 1]]
                                  [--model-version 1.0]
    python -m kserve_tools.bundle --engine triton [--out build/kserve] [--device gpu [--gpus 1]]

The bundle is the tree KServe's storage initializer puts at ``/mnt/models`` and the runtime's
command reads (``torchserve --model-store=/mnt/models/model-store
--ts-config=/mnt/models/config/config.properties``)::

    config/config.properties   kserve/runtime/server.properties + load_models + models={...}
                               from config/models/*.yaml (buildsteps.configgen, like the local one)
    config/metrics.yaml        config/metrics.yaml (the handler's batch histograms)
    config/readiness.py        kserve/runtime/readiness.py (the runtime's readiness probe)
    config/serve.sh            kserve/runtime/serve.sh (the runtime's command: TorchServe as PID 1)
    model-store/<model>.mar    one archive per config/models/<model>.yaml (<model>-<version>.mar
                               for another version)

Name: ``resnet50-serve``, plus ``-gpu`` for ``--device gpu`` and ``-<version>`` for another
archive version (re-archived with ``archive.sh`` under that version, e.g. the 2.0 canary). The
GPU bundle is ``buildsteps.gpu``'s deployment for ``--gpus`` GPUs (the pod's
``nvidia.com/gpu``): eager archives packed here from the weights with each model's GPU
model-config.yaml (``deviceType: gpu``, ``deviceIds``, ``workersPerGpu`` x GPUs workers) and
``number_of_gpu`` in its config.properties; ``model-store/`` is not used for it. The
``.tar.gz`` holds ``config/`` and ``model-store/`` at its top: kserve-storage unpacks a single
archive it downloads into ``/mnt/models``.

For our Triton runtime (``--engine triton``, ``kserve/triton-runtime``) the bundle is the model
repository ``tritonrepo.generate`` writes (``make triton-repo``'s), one folder per model at its
top, named ``resnet50-triton``; the runtime's launcher serves ``/mnt/models`` as the repository.
With ``--device gpu``, ``resnet50-triton-gpu``: the repository of the GPU archives with
``KIND_GPU`` instance groups, for KServe's stock Triton runtime on a GPU node (``kserve/triton``).
"""

from __future__ import annotations

import argparse
import shutil
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from buildsteps import gpu as gpu_deployment
from buildsteps.configgen import (
    REPO,
    VERSION,
    archive_name,
    local_config,
    repo_models,
    run_archive_sh,
)
from model_files.artifacts import archive_quantize, backend_of, read_manifest
from tritonrepo.generate import generate as generate_triton_repository

NAME = "resnet50-serve"
TRITON_NAME = "resnet50-triton"
ENGINES = ("torchserve", "triton")
SERVER_PROPERTIES = REPO / "kserve" / "runtime" / "server.properties"
METRICS = REPO / "config" / "metrics.yaml"
READINESS = REPO / "kserve" / "runtime" / "readiness.py"
SERVE = REPO / "kserve" / "runtime" / "serve.sh"
MODEL_STORE = REPO / "model-store"
DEVICES = ("cpu", "gpu")


@dataclass(frozen=True)
class Bundle:
    """A built bundle: the folder and its ``.tar.gz``."""

    folder: Path
    tarball: Path


def bundle_name(device: str = "cpu", version: str = VERSION) -> str:
    """``resnet50-serve[-gpu][-<version>]``: the last path element of the storageUri."""
    return (
        NAME + ("-gpu" if device == "gpu" else "") + ("" if version == VERSION else f"-{version}")
    )


def bundle_config(device: str = "cpu", version: str = VERSION, gpus: int = 1) -> str:
    """The bundle's config.properties text, from the same sources as config/config.properties
    (``device`` gpu: ``buildsteps.gpu``'s for ``gpus`` GPUs, with ``number_of_gpu``)."""
    if device == "gpu":
        return gpu_deployment.config_properties(
            gpus, SERVER_PROPERTIES, lanes=False, version=version
        )
    return local_config(SERVER_PROPERTIES, repo_models(), version)


def _copy_archives(store: Path, models: list[str], version: str, source: Path) -> None:
    built = [source / archive_name(model) for model in models]
    for mar in built:
        if not mar.is_file():
            raise SystemExit(f"{mar} missing: run `make archives` first")
    if version == VERSION:
        for mar in built:
            shutil.copy2(mar, store / mar.name)
        return
    # Another version: the same handler, weights and configs, archived under that version with
    # the backend and QUANTIZE the store's archives were built with.
    with zipfile.ZipFile(built[0]) as mar:
        serialized, quantize = (
            read_manifest(mar)["serializedFile"],
            archive_quantize(mar.namelist()),
        )
    run_archive_sh(
        VERSION=version, OUT=str(store), BACKEND=backend_of(serialized), QUANTIZE=quantize
    )


def build(
    out: Path = REPO / "build" / "kserve",
    device: str = "cpu",
    version: str = VERSION,
    model_store: Path = MODEL_STORE,
    gpus: int = 1,
    weights_dir: Path = gpu_deployment.WEIGHTS_DIR,
) -> Bundle:
    """Build ``out/<name>/`` and ``out/<name>.tar.gz`` (replacing older ones): the archives of
    ``model_store``, or for ``device`` gpu the GPU archives for ``gpus`` GPUs packed from
    ``weights_dir``."""
    if device not in DEVICES:
        raise SystemExit(f"device must be one of {DEVICES}, got {device!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    name = bundle_name(device, version)
    models = sorted(repo_models())
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        stage = Path(tmp) / name
        (stage / "config").mkdir(parents=True)
        (stage / "model-store").mkdir()
        (stage / "config" / "config.properties").write_text(bundle_config(device, version, gpus))
        shutil.copy2(METRICS, stage / "config" / "metrics.yaml")
        shutil.copy2(READINESS, stage / "config" / "readiness.py")
        shutil.copy2(SERVE, stage / "config" / "serve.sh")
        if device == "gpu":
            gpu_deployment.archive(stage / "model-store", gpus, Path(weights_dir), version)
        else:
            _copy_archives(stage / "model-store", models, version, Path(model_store))
        for mar in sorted((stage / "model-store").glob("*.mar")):
            mar_version = read_manifest(mar)["modelVersion"]
            if mar_version != version:
                raise SystemExit(f"{mar.name} is version {mar_version}, the bundle {version}")
        return _publish(stage, out)


def build_triton(
    out: Path = REPO / "build" / "kserve",
    model_store: Path = MODEL_STORE,
    precision: str | None = None,
    gpus: int | None = None,
    weights_dir: Path = gpu_deployment.WEIGHTS_DIR,
) -> Bundle:
    """Build ``out/resnet50-triton/`` and its ``.tar.gz``: the Triton model repository of
    ``model_store``'s archives (``precision`` pins ``handler.precision``, as
    ``tritonrepo.generate --precision`` does). ``gpus``: ``out/resnet50-triton-gpu/``, the
    repository of GPU archives packed from ``weights_dir`` with ``KIND_GPU`` instances."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        stage = Path(tmp) / (TRITON_NAME + ("-gpu" if gpus else ""))
        if gpus:
            model_store = Path(tmp) / "model-store"
            gpu_deployment.archive(model_store, gpus, Path(weights_dir))
        generate_triton_repository(
            stage, model_store=Path(model_store), precision=precision, lanes=False, gpus=gpus
        )
        return _publish(stage, out)


def _publish(stage: Path, out: Path) -> Bundle:
    """``stage`` (inside a temporary folder of ``out``) as ``out/<name>/`` and
    ``out/<name>.tar.gz``, its top-level entries at the tarball's top; older ones replaced."""
    tarball = stage.parent / f"{stage.name}.tar.gz"
    # Level 0 (gzip's stored blocks, still the .tar.gz the storage initializer unpacks): the
    # model files are stored zips and float weights, which level 1 shrinks by 8% for ~30 s of
    # one core per bundle.
    with tarfile.open(tarball, "w:gz", compresslevel=0) as tar:
        for top in sorted(stage.iterdir()):
            tar.add(top, arcname=top.name, filter=_portable)
    folder = out / stage.name
    shutil.rmtree(folder, ignore_errors=True)
    stage.rename(folder)
    tarball.replace(out / tarball.name)
    return Bundle(folder, out / tarball.name)


def _portable(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """No builder's user names or ids in the tarball (the pod runs as uid 1000)."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kserve_tools.bundle", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, default=REPO / "build" / "kserve")
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="torchserve",
        help="torchserve: kserve/runtime's bundle; triton: kserve/triton-runtime's "
        "model repository",
    )
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    parser.add_argument(
        "--gpus", type=int, default=1, help="GPUs per pod for --device gpu (nvidia.com/gpu: 1)"
    )
    parser.add_argument(
        "--model-version",
        default=VERSION,
        help=f"archive version, the key of models={{...}} ({VERSION})",
    )
    args = parser.parse_args(argv)
    if args.gpus < 1:
        parser.error("--gpus must be at least 1")
    gpus = args.gpus if args.device == "gpu" else None
    if args.engine == "triton":
        if args.model_version != VERSION:
            parser.error(
                "--engine triton builds the repository of the current archives: "
                "--model-version is TorchServe's"
            )
        bundle = build_triton(args.out, gpus=gpus)
    else:
        bundle = build(args.out, args.device, args.model_version, gpus=gpus or 1)
    print(f"bundle folder:  {bundle.folder}\nbundle tarball: {bundle.tarball}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
