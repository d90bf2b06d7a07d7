"""GPU deployment: the model configs, archives and config.properties that put each model's
workers on the GPUs, from the ``gpu:`` section of ``config/models/<model>.yaml``.

    python -m buildsteps.gpu [--gpus 1] [--out build/gpu]     # make gpu DEVICE=gpu GPUS=1

The CPU deployment (``config/config.properties``, ``model-store/``) is left as it is; this
writes a GPU one beside it::

    build/gpu/models/<model>.yaml      the archive's model-config.yaml for GPUs (below)
    build/gpu/model-store/<model>.mar  eager archives (PyTorch: the backend that runs on CUDA)
    build/gpu/config.properties        config/config.properties' settings + number_of_gpu,
                                       this model store, the GPU workers (``make serve DEVICE=gpu``)

What TorchServe 0.12 does with it: a worker gets a GPU only where ``number_of_gpu`` (its
config.properties; unset, the GPUs ``nvidia-smi`` lists) is above 0; the archive's YAML (not
``models={...}``) says ``deviceType: gpu`` and ``deviceIds``, and with ``deviceIds`` set the
model's own counter hands its workers ``deviceIds[0], deviceIds[1], ...`` round robin
(``WorkLoadManager.addThreads``). So ``workersPerGpu`` x GPUs workers, ``deviceIds`` every GPU,
put exactly ``workersPerGpu`` of the model's workers on each GPU. The handler takes the GPU it
is given (``handler.device: auto``). Triton's ``KIND_GPU`` instance group reads the same
``workersPerGpu`` as its per-GPU ``count`` (``tritonrepo.generate --gpus``).

The ``gpu:`` section: ``workersPerGpu`` (required), and any of ``batchSize``,
``maxBatchDelay``, ``responseTimeout`` to replace the top-level value on GPUs only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from pathlib import Path

import yaml

from buildsteps.configgen import (
    FRONTEND_KEYS,
    MODELS_DIR,
    REPO,
    VERSION,
    bulk_lanes,
    frontend_settings,
    local_config,
    model_names,
    rewrite_properties,
    run_archive_sh,
)

SECTION = "gpu"
OVERRIDES = ("batchSize", "maxBatchDelay", "responseTimeout")  # a GPU value may replace these
OUT = REPO / "build" / "gpu"
WEIGHTS_DIR = REPO / "build" / "weights"
SERVER_PROPERTIES = REPO / "config" / "server.properties"
BACKEND = "eager"  # PyTorch on CUDA; the other backends' pinned runtimes are CPU builds


def _read(model_yaml: Path) -> dict:
    return yaml.safe_load(model_yaml.read_text()) or {}


def gpu_section(model_yaml: Path) -> dict:
    """The model's ``gpu:`` section, checked: ``workersPerGpu`` a positive integer, overrides
    among ``OVERRIDES`` only. ``SystemExit`` says what is wrong and where."""
    section = _read(model_yaml).get(SECTION)
    if not isinstance(section, dict):
        raise SystemExit(
            f"{model_yaml}: no `{SECTION}:` section; add `{SECTION}: {{workersPerGpu: 2}}` to "
            "deploy this model on GPUs"
        )
    unknown = sorted(set(section) - {"workersPerGpu", *OVERRIDES})
    if unknown:
        raise SystemExit(
            f"{model_yaml}: {SECTION}.{unknown[0]} is not a GPU setting "
            f"(workersPerGpu, {', '.join(OVERRIDES)})"
        )
    per_gpu = section.get("workersPerGpu")
    if not isinstance(per_gpu, int) or isinstance(per_gpu, bool) or per_gpu < 1:
        raise SystemExit(
            f"{model_yaml}: {SECTION}.workersPerGpu must be 1 or more, got {per_gpu!r}"
        )
    return section


def _check_gpus(gpus: int) -> None:
    if gpus < 1:
        raise SystemExit(f"--gpus must be 1 or more, got {gpus}")


def gpu_settings(model_yaml: Path, gpus: int) -> dict:
    """TorchServe's frontend settings of the model on ``gpus`` GPUs: the top-level keys (with
    the ``gpu:`` section's overrides), ``workersPerGpu`` x ``gpus`` workers, ``deviceType:
    gpu`` and ``deviceIds`` every GPU (0 .. gpus-1), so each GPU gets ``workersPerGpu``."""
    _check_gpus(gpus)
    section = gpu_section(model_yaml)
    workers = section["workersPerGpu"] * gpus
    settings = frontend_settings(model_yaml)
    settings.update({key: section[key] for key in OVERRIDES if key in section})
    settings.update(minWorkers=workers, maxWorkers=workers)
    return {**settings, "deviceType": "gpu", "deviceIds": list(range(gpus))}


def model_config(model_yaml: Path, gpus: int) -> dict:
    """The archive's model-config.yaml for GPUs: the model's YAML with ``gpu_settings`` at
    the top and no ``gpu:`` section (it has been applied)."""
    settings = gpu_settings(model_yaml, gpus)
    rest = {k: v for k, v in _read(model_yaml).items() if k != SECTION and k not in settings}
    return {**settings, **rest}


def write_model_configs(out: Path, gpus: int, models_dir: Path = MODELS_DIR) -> list[Path]:
    """``out/<model>.yaml`` for every model of ``models_dir`` (archive.sh's CONFIG_DIR)."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in model_names(models_dir):
        source = models_dir / f"{name}.yaml"
        path = out / f"{name}.yaml"
        path.write_text(
            f"# GENERATED by `python -m buildsteps.gpu --gpus {gpus}` from "
            f"config/models/{name}.yaml: do not edit.\n"
            + yaml.safe_dump(model_config(source, gpus), sort_keys=False)
        )
        written.append(path)
    return written


def repo_models(gpus: int, models_dir: Path = MODELS_DIR) -> dict[str, dict]:
    """Every model with its TorchServe settings on ``gpus`` GPUs, for ``models={...}`` (which
    takes the workers and batching; ``deviceType``/``deviceIds`` act only from the archive)."""
    return {
        name: {
            k: v
            for k, v in gpu_settings(models_dir / f"{name}.yaml", gpus).items()
            if k in FRONTEND_KEYS
        }
        for name in model_names(models_dir)
    }


def config_properties(
    gpus: int,
    server_properties: Path = SERVER_PROPERTIES,
    *,
    lanes: bool = True,
    version: str = VERSION,
) -> str:
    """config.properties of the GPU deployment: ``server_properties``' settings with
    ``number_of_gpu`` (the ``deviceIds`` are checked against it) and the GPU workers."""
    text = local_config(
        server_properties,
        repo_models(gpus),
        version,
        lanes=bulk_lanes() if lanes else None,
    )
    header = f"# The GPU deployment: `python -m buildsteps.gpu --gpus {gpus}` ({gpus} GPU(s)).\n"
    return header + rewrite_properties(text, {"number_of_gpu": str(gpus)})


def archive(
    store: Path,
    gpus: int,
    weights_dir: Path = WEIGHTS_DIR,
    version: str = VERSION,
    configs: Path | None = None,
) -> None:
    """Eager archives of every model with its GPU model-config.yaml, into ``store``.
    ``configs``: where ``write_model_configs`` already wrote them for ``gpus`` (``build``);
    None: written to a temporary folder."""
    with contextlib.ExitStack() as stack:
        if configs is None:
            configs = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            write_model_configs(configs, gpus)
        run_archive_sh(
            BACKEND=BACKEND,
            QUANTIZE="none",
            CONFIG_DIR=str(configs),
            OUT=str(store),
            WEIGHTS_DIR=str(weights_dir),
            VERSION=version,
        )


def build(out: Path = OUT, gpus: int = 1, weights_dir: Path = WEIGHTS_DIR) -> Path:
    """The local GPU deployment under ``out`` (module docstring); returns its
    config.properties."""
    _check_gpus(gpus)
    write_model_configs(out / "models", gpus)
    archive(out / "model-store", gpus, weights_dir, configs=out / "models")
    properties = out / "config.properties"
    text = config_properties(gpus)
    store = os.path.relpath(out / "model-store", REPO)
    properties.write_text(rewrite_properties(text, {"model_store": store}))
    return properties


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m buildsteps.gpu", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--gpus", type=int, default=1, help="GPUs on the host (1)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--weights", type=Path, default=WEIGHTS_DIR)
    args = parser.parse_args(argv)
    properties = build(args.out, args.gpus, args.weights)
    print(f"GPU deployment: {properties} (torchserve --ts-config {properties})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
