"""Build the checkpoint that goes into the archives, and record where it came from.

    python -m buildsteps.weights [--source auto|imagenet|seeded|/path/to/ckpt.pt]

writes into ``--out`` (default ``build/weights``):

- ``resnet50.pt``         torchvision ``resnet50`` state dict;
- ``weights_info.json``   source, ``trained`` flag, sha256 of ``resnet50.pt`` (the describe API
                          reports this file verbatim);
- ``index_to_name.json``  class index -> name, from the weights' own ``meta["categories"]``.

Without ``--source``, weights already built are kept (whatever their source), else ``auto``;
"built" means ``resnet50.pt`` hashes to the sha256 in ``weights_info.json`` (a checkpoint that
does not is rebuilt from the recorded source). The checkpoint is written to a temporary file and
renamed into place, so an interrupted build never leaves a partial ``resnet50.pt``.
``auto`` downloads ImageNet weights (``ResNet50_Weights.IMAGENET1K_V2``) and, when the network
is unreachable, falls back to seeded *untrained* weights with a loud warning: those serve the
right shapes and pass parity tests, but their labels are meaningless.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from model_files.artifacts import CHECKPOINT, INFO, LABELS, sha256_of

SEED = 0
UNTRAINED_WARNING = (
    "UNTRAINED WEIGHTS: seeded random initialisation (seed 0), not ImageNet. Embeddings and "
    "tags are NOT meaningful. Rebuild with network access (make weights WEIGHTS=imagenet) or "
    "your own checkpoint (make weights WEIGHTS=/path/to/resnet50.pt)."
)


def banner(message: str) -> None:
    line = "!" * 100
    print(f"\n{line}\n!! {message}\n{line}\n", file=sys.stderr, flush=True)


def _imagenet_state_dict():
    from model_files.resnet_dual import WEIGHTS

    # torchvision verifies the file's hash prefix; the URL is recorded for provenance.
    return WEIGHTS.get_state_dict(progress=True, check_hash=True), {
        "source": "imagenet",
        "trained": True,
        "detail": f"torchvision {WEIGHTS} from {WEIGHTS.url}",
    }


def _seeded_state_dict():
    import torch
    from torchvision.models import resnet50

    torch.manual_seed(SEED)
    return resnet50(weights=None).state_dict(), {
        "source": "seeded-untrained",
        "trained": False,
        "detail": f"torchvision resnet50(weights=None) after torch.manual_seed({SEED})",
        "warning": UNTRAINED_WARNING,
    }


def _checkpoint_state_dict(path: Path):
    import torch

    if not path.is_file():
        raise SystemExit(f"error: checkpoint {path} does not exist (WEIGHTS=/path/to/file.pt)")
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model"):
        if isinstance(loaded, dict) and isinstance(loaded.get(key), dict):
            loaded = loaded[key]
    state = {k.removeprefix("module."): v for k, v in loaded.items()}
    from model_files.resnet_dual import build_dual

    try:
        build_dual(state)
    except RuntimeError as exc:
        raise SystemExit(
            f"error: {path} is not a torchvision resnet50 state dict: {exc}".splitlines()[0]
        ) from None
    return state, {
        "source": "checkpoint",
        "trained": True,
        "detail": f"local checkpoint {path.resolve()} (sha256 {sha256_of(path)})",
    }


def resolve(source: str):
    """Return ``(state_dict, info)`` for a ``--source`` value."""
    if source == "imagenet":
        return _imagenet_state_dict()
    if source == "seeded":
        banner(UNTRAINED_WARNING)
        return _seeded_state_dict()
    if source == "auto":
        try:
            return _imagenet_state_dict()
        except OSError as exc:  # URLError is an OSError: no network, DNS failure, refused.
            banner(f"ImageNet weights could not be downloaded ({exc}). {UNTRAINED_WARNING}")
            return _seeded_state_dict()
    return _checkpoint_state_dict(Path(source))


def _still_current(source: str, info: dict) -> bool:
    """Whether weights built from ``source`` need no rebuild: an explicit ``auto`` retries the
    download after an offline fallback; a checkpoint is rebuilt when its file changed."""
    if source == "auto":
        return info.get("trained", False)
    if source in ("imagenet", "seeded"):
        return True
    path = Path(source)
    return path.is_file() and sha256_of(path) in info.get("detail", "")


def build(source: str | None, out: Path) -> dict:
    """Write the three files into ``out``; skip when they already hold ``source`` (``None``:
    keep any weights already built, else ``auto``)."""
    info_path = out / INFO
    if info_path.is_file() and (out / CHECKPOINT).is_file():
        info = json.loads(info_path.read_text())
        wanted = source is None or (
            info.get("requested") == source and _still_current(source, info)
        )
        if wanted and sha256_of(out / CHECKPOINT) == info.get("sha256"):
            print(f"weights up to date: {info['source']} ({info_path})")
            return info
        if wanted:  # a checkpoint that is not the one recorded: rebuild from the same source
            print(
                f"weights: {out / CHECKPOINT} does not match its recorded sha256; rebuilding",
                file=sys.stderr,
            )
            source = source or info.get("requested")
    source = source or "auto"

    import torch

    from model_files.resnet_dual import WEIGHTS

    state, info = resolve(source)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / CHECKPOINT
    # An interrupted save leaves the partial file aside, never under the checkpoint's name.
    partial = out / f".{CHECKPOINT}.partial"
    torch.save(state, partial)
    os.replace(partial, ckpt)
    info.update(requested=source, file=CHECKPOINT, sha256=sha256_of(ckpt))
    categories = WEIGHTS.meta["categories"]
    (out / LABELS).write_text(
        json.dumps({str(i): name for i, name in enumerate(categories)}, indent=0)
    )
    info_path.write_text(json.dumps(info, indent=2) + "\n")
    print(f"weights written: {info['source']} sha256={info['sha256'][:16]}... -> {ckpt}")
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--source",
        default=None,
        help="auto (ImageNet, else seeded), imagenet, seeded, or a .pt path; "
        "default: keep the weights already built, else auto",
    )
    parser.add_argument("--out", type=Path, default=Path("build/weights"))
    args = parser.parse_args(argv)
    info = build(args.source or None, args.out)
    if not info["trained"]:
        banner(info["warning"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
