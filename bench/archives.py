"""Our model archives as the benchmark sees them: what is inside a ``.mar``, and variant
archives with other frontend settings for the sweep.

Why variants are whole archives: in TorchServe 0.12 a positive ``batchSize``,
``maxBatchDelay`` or ``minWorkers`` in the archive's model-config.yaml wins over both
config.properties ``models={...}`` and the register API's parameters, so the only reliable way
to serve other settings is to pack them into the archive's YAML.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from buildsteps.configgen import VERSION, archive_name, run_archive_sh
from model_files.artifacts import (
    DEFAULT_QUANTIZE,
    INFO,
    MANIFEST,
    archive_quantize,
    backend_of,
    read_manifest,
)


@dataclass(frozen=True)
class ArchiveInfo:
    """The parts of a ``.mar`` the benchmark checks: manifest, weights provenance and the
    model-config.yaml it carries. ``quantize``: archive.sh's QUANTIZE for it (none or int8)."""

    path: Path
    model_name: str
    version: str
    backend: str
    quantize: str
    weights: dict
    model_config: dict
    config_file: str  # the model-config.yaml's name inside the archive

    @classmethod
    def read(cls, path: Path) -> ArchiveInfo:
        with zipfile.ZipFile(path) as mar:
            manifest = read_manifest(mar)
            quantize = archive_quantize(mar.namelist())
            weights = json.loads(mar.read(INFO))
            config_file = manifest.get("configFile")
            config = yaml.safe_load(mar.read(config_file)) if config_file else {}
        serialized = manifest["serializedFile"]
        return cls(
            path,
            manifest["modelName"],
            manifest.get("modelVersion", VERSION),
            backend_of(serialized),
            quantize,
            weights,
            config or {},
            config_file or f"{manifest['modelName']}.yaml",
        )

    def with_config(self, config: dict, mar_path: Path, version: str | None = None) -> Path:
        """This archive with ``config`` as its model-config.yaml (and ``version`` in its
        manifest, if given), at ``mar_path``: the same weights and code, so what
        ``build_variant`` would pack from this archive's inputs, without archive.sh's staging
        and archiver run (Info-ZIP's ``zip`` replaces those members and copies the others as
        they are)."""
        texts = {self.config_file: _config_text(config)}
        if version is not None:
            with zipfile.ZipFile(self.path) as mar:
                manifest = json.loads(mar.read(MANIFEST))
            manifest["model"]["modelVersion"] = version
            texts[MANIFEST] = json.dumps(manifest, indent=2)
        mar_path.parent.mkdir(parents=True, exist_ok=True)
        if shutil.which("zip") is None:  # no Info-ZIP: every member written again
            with zipfile.ZipFile(self.path) as old, zipfile.ZipFile(mar_path, "w") as new:
                for info in old.infolist():
                    new.writestr(info, texts.get(info.filename) or old.read(info))
            return mar_path
        shutil.copyfile(self.path, mar_path)
        with tempfile.TemporaryDirectory() as folder:
            for name, text in texts.items():
                (Path(folder) / name).parent.mkdir(parents=True, exist_ok=True)
                (Path(folder) / name).write_text(text)
            subprocess.run(["zip", "-q", str(mar_path.resolve()), *texts], cwd=folder, check=True)
        return mar_path


def variant_config(base_yaml: Path, batch_size: int, max_batch_delay: int, workers: int) -> dict:
    """``base_yaml`` (config/models/resnet50-tagger.yaml) with other top-level frontend settings;
    the ``handler:`` section is kept as is."""
    config = yaml.safe_load(base_yaml.read_text())
    config.update(
        batchSize=batch_size, maxBatchDelay=max_batch_delay, minWorkers=workers, maxWorkers=workers
    )
    return config


def build_variant(
    model: str,
    config: dict,
    backend: str,
    work_dir: Path,
    mar_path: Path,
    quantize: str = DEFAULT_QUANTIZE,
    version: str = VERSION,
    weights_dir: Path | None = None,
) -> Path:
    """Archive ``model`` at ``version`` with ``config`` as its model-config.yaml via
    ``archive.sh``, from ``weights_dir`` (None: archive.sh's, build/weights); the result is
    moved to ``mar_path`` (the file name may differ from the model name: TorchServe takes the
    name from the manifest). Call it for one model at a time, never concurrently."""
    config_dir = work_dir / "config"
    out_dir = work_dir / "out"
    shutil.rmtree(work_dir, ignore_errors=True)
    config_dir.mkdir(parents=True)
    (config_dir / f"{model}.yaml").write_text(_config_text(config))
    run_archive_sh(
        model,
        quiet=True,
        CONFIG_DIR=str(config_dir),
        OUT=str(out_dir),
        BACKEND=backend,
        QUANTIZE=quantize,
        VERSION=version,
        **({} if weights_dir is None else {"WEIGHTS_DIR": str(weights_dir)}),
    )
    mar_path.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(out_dir / archive_name(model, version), mar_path)
    shutil.rmtree(work_dir, ignore_errors=True)
    return mar_path


def _config_text(config: dict) -> str:
    return "# Generated by bench/archives.py: a variant.\n" + yaml.safe_dump(
        config, sort_keys=False
    )
