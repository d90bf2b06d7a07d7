"""The peer we are measured against: TorchServe's stock ``image_classifier`` handler serving
the SAME weights as a plain torchvision ResNet50 (logits only), TorchScript traced and frozen.

* ``export_stock_model`` writes ``resnet50_stock.torchscript.pt`` (redone only when the
  checkpoint's sha256 changes);
* ``archive_stock`` packs it with ``torch-model-archiver --handler image_classifier``;
* ``stock_config`` writes a config.properties that gives the stock model exactly the frontend
  settings (batchSize, maxBatchDelay, workers, timeout) our tagger gets from
  ``config/models/resnet50-tagger.yaml``, so the comparison differs only in handler and runtime;
* ``stock_server``: all three done, and the TorchServe that serves it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

from buildsteps import configgen
from model_files.artifacts import (
    CHECKPOINT,
    LABELS,
    checkpoint_sha256,
    is_current,
    mark_current,
    sha256_of,
)

MODEL_NAME = "resnet50-stock"
SERIALIZED = "resnet50_stock.torchscript.pt"


def export_stock_model(weights_dir: Path, out_dir: Path) -> Path:
    """Trace and freeze torchvision ``resnet50`` loaded from ``weights_dir/resnet50.pt``."""
    sha256 = checkpoint_sha256(weights_dir)
    target = out_dir / SERIALIZED
    if is_current(target, sha256):
        return target

    import torch
    from torchvision.models import resnet50

    out_dir.mkdir(parents=True, exist_ok=True)
    model = resnet50(weights=None)
    model.load_state_dict(
        torch.load(weights_dir / CHECKPOINT, map_location="cpu", weights_only=True)
    )
    model.eval()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer deprecation chatter
        frozen = torch.jit.freeze(torch.jit.trace(model, torch.randn(2, 3, 224, 224)).eval())
    frozen.save(str(target))
    mark_current(target, sha256)
    return target


def archive_stock(serialized: Path, index_to_name: Path, model_store: Path, tmpdir: Path) -> Path:
    """``resnet50-stock.mar`` in ``model_store``, rebuilt when the serialized model changed.

    torch-model-archiver stages in ``$TMPDIR/<model-name>`` and deletes it first, so it runs
    with a private ``TMPDIR``."""
    mar = model_store / f"{MODEL_NAME}.mar"
    # zip-store, as archive.sh packs ours: the two servers' start times compare like for like.
    source = f"{sha256_of(serialized)} zip-store"
    if is_current(mar, source):
        return mar
    model_store.mkdir(parents=True, exist_ok=True)
    tmpdir.mkdir(parents=True, exist_ok=True)
    archiver = Path(sys.executable).parent / "torch-model-archiver"
    options = {"model-name": MODEL_NAME, "version": configgen.VERSION,
               "serialized-file": serialized, "handler": "image_classifier",
               "extra-files": index_to_name, "export-path": model_store,
               "archive-format": "zip-store"}  # fmt: skip
    argv = [str(archiver), *(a for k, v in options.items() for a in (f"--{k}", str(v))), "--force"]
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, timeout=600)
    mark_current(mar, source)
    return mar


def stock_config(out: Path, like: str = "resnet50-tagger") -> Path:
    """Write a config.properties for the stock model: the shipped server settings, with one
    model, the stock one, given ``like``'s frontend settings from ``config/models/``."""
    settings = configgen.frontend_settings(configgen.MODELS_DIR / f"{like}.yaml")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        configgen.local_config(
            configgen.REPO / "config" / "server.properties", {MODEL_NAME: settings}
        )
    )
    return out


def stock_server(workdir: Path, like: str):
    """A ``LocalTorchServe`` in ``workdir`` (made afresh) serving the stock model of
    build/weights with ``like``'s frontend settings (started by ``with``)."""
    from bench.layout import BUILD, WEIGHTS, fresh_dir
    from devtools.server import LocalTorchServe

    store = BUILD / "model-store"
    serialized = export_stock_model(WEIGHTS, BUILD)
    archive_stock(serialized, WEIGHTS / LABELS, store, BUILD / "archiver-tmp")
    config = stock_config(BUILD / f"stock-like-{like}.properties", like=like)
    return LocalTorchServe(
        fresh_dir(workdir), store, config=config, load_models=[f"{MODEL_NAME}.mar"]
    )
