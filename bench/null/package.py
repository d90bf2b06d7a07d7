"""The null models laid out for each engine at run time, in a folder of the caller's
(nothing of this goes into git or the shipped build):

* ``torchserve_store``: one ``.mar`` per (kind, images per request), packed by
  ``torch-model-archiver`` with a private ``TMPDIR`` (it stages in ``$TMPDIR/<model-name>`` and
  deletes that first) and ``batchSize`` set so a full batch is ``BATCH_IMAGES`` images;
* ``triton_repository``: one model folder per kind, ``max_batch_size`` ``BATCH_IMAGES`` (Triton
  batches images, not requests, so one model takes both request sizes), its
  ``config.pbtxt`` from ``tritonrepo.generate.config_pbtxt``.

Every model gets the shipped embedding model's frontend settings (``maxBatchDelay``,
``responseTimeout``, one worker) and ``handler:`` section (one intra-op thread), and a queue
of ``QUEUE`` requests so the closed loop's clients are queued, not refused (the ceiling, not
the shipped bound).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from bench.layout import EMBEDDING, REPO, WEIGHTS
from buildsteps.configgen import MODELS_DIR, VERSION, frontend_settings
from model_files.artifacts import INFO, LABELS
from tritonrepo.generate import ADAPTER_MODULES, PACKAGES, config_pbtxt

KINDS = ("bare", "core")
BATCH_IMAGES = 64  # the GPU figures are at batch 64: one batch, 64 images
QUEUE = 512  # requests each model may hold queued
NULL = REPO / "bench" / "null"
SERIALIZED = "null-model.txt"  # a manifest names a model file; nothing reads it
HANDLERS = {"torchserve": "ts_{kind}.py", "triton": "triton_{kind}.py"}


def model_name(kind: str, images: int | None = None) -> str:
    """``null-core``, or on TorchServe (one model per request size) ``null-core-x8``."""
    return f"null-{kind}" if images is None else f"null-{kind}-x{images}"


def settings(batch_size: int) -> tuple[dict, dict]:
    """(frontend settings, ``handler:`` section): the embedding model's, with ``batch_size``
    and one worker; no bulk lane (these models have none)."""
    source = MODELS_DIR / f"{EMBEDDING}.yaml"
    frontend = {**frontend_settings(source), "batchSize": batch_size}
    frontend.update(minWorkers=1, maxWorkers=1)
    handler = dict(yaml.safe_load(source.read_text()).get("handler") or {})
    handler.pop("bulk_model", None)
    # One intra-op thread: a plan of many workers gives each one core, and on a shared host
    # torch's parallel stack of a batch waits on a descheduled thread (0.46 s for 64 rows
    # with 2 threads against 23-37 ms with one, measured on this 2-core host).
    handler["threads"] = 1
    return frontend, handler


def _stage(folder: Path) -> Path:
    """What a null model imports, under ``folder``: our packages, ``bench.null``, and the
    weights' provenance and labels (the core reads them); no model file."""
    for package in ("handlers", *PACKAGES):
        shutil.copytree(
            REPO / package, folder / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    (folder / "bench").mkdir()
    shutil.copyfile(REPO / "bench" / "__init__.py", folder / "bench" / "__init__.py")
    shutil.copytree(NULL, folder / "bench" / "null", ignore=shutil.ignore_patterns("__pycache__"))
    for name in (INFO, LABELS):
        shutil.copyfile(WEIGHTS / name, folder / name)
    (folder / SERIALIZED).write_text("no weights: a null model (bench/null)\n")
    return folder


def torchserve_store(work: Path, models: list[tuple[str, int]]) -> Path:
    """``work/store`` holding ``<model_name(kind, images)>.mar`` for each (kind, images)."""
    store, stage, tmp = work / "store", _stage(work / "stage"), work / "archiver-tmp"
    for folder in (store, tmp):
        folder.mkdir(parents=True, exist_ok=True)
    archiver = Path(sys.executable).parent / "torch-model-archiver"
    for kind, images in models:
        name = model_name(kind, images)
        frontend, handler = settings(BATCH_IMAGES // images)
        config = work / f"{name}.yaml"
        config.write_text(yaml.safe_dump({**frontend, "handler": handler}, sort_keys=False))
        subprocess.run(
            [
                str(archiver),
                *("--model-name", name, "--version", VERSION),
                *("--serialized-file", str(stage / SERIALIZED)),
                *("--handler", str(NULL / HANDLERS["torchserve"].format(kind=kind))),
                *("--extra-files", str(stage), "--config-file", str(config)),
                *("--export-path", str(store), "--force"),
            ],
            env={**os.environ, "TMPDIR": str(tmp)},
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=300,
        )
    return store


def triton_repository(work: Path, kinds: list[str]) -> Path:
    """``work/repository`` with one folder per kind: ``config.pbtxt`` and ``1/`` holding the
    null ``model.py`` (the core's with our adapter beside it as ``tritonrepo/model.py``)."""
    repository = work / "repository"
    frontend, handler = settings(BATCH_IMAGES)
    for kind in kinds:
        name = model_name(kind)
        version = _stage(repository / name / "1")
        shutil.rmtree(version / "handlers")  # TorchServe's adapter: not Triton's
        (version / "tritonrepo").mkdir()
        for module in (*ADAPTER_MODULES, "model.py"):
            shutil.copyfile(REPO / "tritonrepo" / module, version / "tritonrepo" / module)
        shutil.copyfile(NULL / HANDLERS["triton"].format(kind=kind), version / "model.py")
        text = config_pbtxt(name, frontend, handler, SERIALIZED, queue_size=QUEUE)
        # Its first line says it was generated from config/models/: not this one.
        text = "# GENERATED by bench/null/package.py for bench.ceiling\n" + text.split("\n", 1)[1]
        (repository / name / "config.pbtxt").write_text(text)
    return repository
