"""Build the checkpoint that goes into the archives, and record where it came from.

    python -m buildsteps.weights [--source auto|imagenet|seeded|/path/to/ckpt.pt]
                                 [--labels labels.json|labels.txt]
                                 [--add-head NAME CHECKPOINT LABELS ...]

writes into ``--out`` (default ``build/weights``):

- ``resnet50.pt``         torchvision ``resnet50`` state dict (its ``fc`` has N classes);
- ``weights_info.json``   source, ``trained`` flag, sha256 of ``resnet50.pt``, ``classes`` N,
                          ``labels`` (where the names came from) and ``labels_sha256`` (of
                          ``index_to_name.json``); the describe API reports this file verbatim
                          and every archive carries it, so it names files by name and sha256,
                          never by a path of the machine that built it;
- ``.request.json``       what was asked (the paths as given), to tell the next build whether
                          it is up to date; local, never packed;
- ``index_to_name.json``  class index -> name: ImageNet's ``meta["categories"]`` for the
                          ImageNet and seeded sources, ``--labels`` for a checkpoint.

Several heads on one backbone (``--add-head``, repeatable): each added checkpoint must hold the
same backbone as ``--source`` (every tensor but ``fc``'s equal: a head ``tsctl head train`` made
on the served backbone does), and its ``fc`` rows are appended to the source's, its labels to
the labels; ``weights_info.json``'s ``heads`` names each head (the source's: ``imagenet`` for
ImageNet's labels, else ``--name``) with its classes, in row order. One forward then computes
every head (servecore/classes.py tells them apart).

A checkpoint (``buildsteps/checkpoint.py`` says the formats) is a torchvision resnet50 with any
N >= 2 classes; its labels must name each class once. A checkpoint with N != 1000 needs
``--labels`` unless it carries its labels (``tsctl head train``'s does: ``--labels`` must then be
that same list); one with 1,000 classes and no labels is given ImageNet's names, with a
warning. Every refusal (labels that do not match, keys that are not a ResNet50, a file that is
not a checkpoint) happens before anything is written.

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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from buildsteps.checkpoint import (
    CheckpointError,
    check_labels,
    read_checkpoint,
    read_labels,
    same_labels,
)
from model_files.artifacts import CHECKPOINT, INFO, LABELS, sha256_of

REQUEST = ".request.json"  # what the build was asked (local paths): beside INFO, never packed

SEED = 0
UNTRAINED_WARNING = (
    "UNTRAINED WEIGHTS: seeded random initialisation (seed 0), not ImageNet. Embeddings and "
    "tags are NOT meaningful. Rebuild with network access (make weights WEIGHTS=imagenet) or "
    "your own checkpoint (make weights WEIGHTS=/path/to/resnet50.pt)."
)


def banner(message: str) -> None:
    line = "!" * 100
    print(f"\n{line}\n!! {message}\n{line}\n", file=sys.stderr, flush=True)


IMAGENET_LABELS = "imagenet: torchvision ResNet50_Weights.IMAGENET1K_V2 meta['categories']"


def _imagenet_names() -> list[str]:
    from model_files.resnet_dual import WEIGHTS

    return list(WEIGHTS.meta["categories"])


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


def _checkpoint_state_dict(path: Path, labels: Path | None):
    """A checkpoint's state dict, its labels and its info; every check before anything is
    written (``CheckpointError`` says what is wrong)."""
    state, classes, carried = read_checkpoint(path)
    if labels is not None:
        names, where = read_labels(labels), f"labels file {labels.name}"
        same_labels(carried, names, path, where)
    elif carried is not None:
        names, where = carried, f"the labels {path.name} carries"
    elif classes == len(_imagenet_names()):
        names, where = _imagenet_names(), IMAGENET_LABELS
        banner(
            f"{path} has 1,000 classes and no LABELS was given: serving ImageNet's class names. "
            "If it was fine-tuned on other classes, rebuild with LABELS=/path/to/labels."
        )
    else:
        raise CheckpointError(
            f"{path} has {classes} classes: give their names with LABELS=/path/to/labels "
            "(a JSON list, a JSON object index -> name, or a text file, one name per line)"
        )
    if where != IMAGENET_LABELS:  # yours; ImageNet's own repeat 'crane' and 'maillot'
        check_labels(names, classes, where)
    return (
        state,
        names,
        {
            "source": "checkpoint",
            "trained": True,
            "detail": f"local checkpoint {path.name} (sha256 {sha256_of(path)})",
            "labels": where,
        },
    )


def resolve(source: str, labels: Path | None = None):
    """Return ``(state_dict, labels, info)`` for a ``--source`` value (``labels``: the
    ``--labels`` file, for a checkpoint only)."""
    if source in ("imagenet", "seeded", "auto") and labels is not None:
        raise CheckpointError(
            f"--labels is for your own checkpoint; {source} weights serve ImageNet's 1,000 classes"
        )
    if source == "imagenet":
        state, info = _imagenet_state_dict()
    elif source == "seeded":
        banner(UNTRAINED_WARNING)
        state, info = _seeded_state_dict()
    elif source == "auto":
        try:
            state, info = _imagenet_state_dict()
        except OSError as exc:  # URLError is an OSError: no network, DNS failure, refused.
            banner(f"ImageNet weights could not be downloaded ({exc}). {UNTRAINED_WARNING}")
            state, info = _seeded_state_dict()
    else:
        return _checkpoint_state_dict(Path(source), labels)
    return state, _imagenet_names(), {**info, "labels": IMAGENET_LABELS}


def _still_current(source: str, labels: Path | None, info: dict) -> bool:
    """Whether weights built from ``source`` need no rebuild: an explicit ``auto`` retries the
    download after an offline fallback; a checkpoint is rebuilt when its file or its labels
    file changed."""
    if labels is not None and (
        not labels.is_file() or info.get("requested_labels_sha256") != sha256_of(labels)
    ):
        return False
    if source == "auto":
        return info.get("trained", False)
    if source in ("imagenet", "seeded"):
        return True
    path = Path(source)
    return path.is_file() and sha256_of(path) in info.get("detail", "")


def _asked_before(asked: dict) -> tuple[str, Path | None, list[AddedHead], str]:
    """The source, labels, heads and name weights were built from, as ``REQUEST`` records."""
    labels = asked.get("requested_labels")
    heads = [AddedHead(h[0], Path(h[1]), Path(h[3])) for h in asked.get("requested_heads", [])]
    name = asked.get("requested_name") or next((h["name"] for h in asked.get("heads", [])), "")
    labels_path = None if labels is None else Path(labels)
    source = asked.get("requested", "auto")
    if source == "auto":  # what it resolved to: a rebuild is the same weights, not a download
        source = "imagenet" if asked.get("source") == "imagenet" else "seeded"
    return source, labels_path, heads, name or "main"


@dataclass(frozen=True)
class AddedHead:
    """One ``--add-head``: its name, checkpoint and labels file."""

    name: str
    checkpoint: Path
    labels: Path

    def requested(self) -> list[str]:
        """What a rebuild compares: the paths and the files' hashes."""
        return [
            self.name,
            str(self.checkpoint),
            sha256_of(self.checkpoint) if self.checkpoint.is_file() else "",
            str(self.labels),
            sha256_of(self.labels) if self.labels.is_file() else "",
        ]


def with_heads(
    state: dict, names: list[str], info: dict, heads: Sequence[AddedHead], name: str
) -> tuple[dict, list[str], dict]:
    """``state`` with each added head's ``fc`` rows after its own, ``names`` with their labels
    and ``info`` with ``heads``; ``CheckpointError`` when a head is not on ``state``'s backbone,
    its labels do not name its classes, or two heads share a name."""
    import torch

    if not heads:
        return state, names, info
    first = "imagenet" if info["labels"] == IMAGENET_LABELS else name
    recorded = [{"name": first, "classes": len(names), "labels": info["labels"]}]
    names = list(names)
    weight, bias = [state["fc.weight"]], [state["fc.bias"]]
    for head in heads:
        if not head.name.strip() or head.name in {h["name"] for h in recorded}:
            raise CheckpointError(
                f"head name {head.name!r} is empty or already taken "
                f"({', '.join(h['name'] for h in recorded)}): give each head its own name"
            )
        theirs, classes, carried = read_checkpoint(head.checkpoint)
        labels = read_labels(head.labels)
        same_labels(carried, labels, head.checkpoint, f"labels file {head.labels}")
        check_labels(labels, classes, f"labels file {head.labels}")
        other = [
            k for k in state if not k.startswith("fc.") and not torch.equal(state[k], theirs[k])
        ]
        if other:
            raise CheckpointError(
                f"{head.checkpoint}: its backbone is not the one of --source ({len(other)} "
                f"tensors differ, e.g. {other[0]}): a head must be trained on the backbone it "
                "is served with (tsctl head train through a server of these weights)"
            )
        weight.append(theirs["fc.weight"])
        bias.append(theirs["fc.bias"])
        names += labels
        recorded.append(
            {
                "name": head.name,
                "classes": classes,
                "labels": f"labels file {head.labels.name}",
                "detail": f"fc of {head.checkpoint.name} (sha256 {sha256_of(head.checkpoint)})",
            }
        )
    state = {**state, "fc.weight": torch.cat(weight), "fc.bias": torch.cat(bias)}
    return state, names, {**info, "heads": recorded}


def build(
    source: str | None,
    out: Path,
    labels: Path | None = None,
    heads: Sequence[AddedHead] = (),
    name: str = "main",
) -> dict:
    """Write the three files into ``out``; skip when they already hold ``source`` (``None``:
    keep any weights already built, else ``auto``) with ``labels`` and ``heads`` (``name``: the
    source's head, where it is not ImageNet's). Raises ``CheckpointError`` before writing
    anything when a checkpoint or its labels cannot be served."""
    info_path = out / INFO
    if info_path.is_file() and (out / CHECKPOINT).is_file():
        info = json.loads(info_path.read_text())
        request = out / REQUEST
        asked = {**info, **(json.loads(request.read_text()) if request.is_file() else {})}
        old = "requested" in info  # a build before REQUEST kept paths in the info: rebuilt once
        wanted = (source is None and labels is None and not heads) or (
            asked.get("requested") == (source or asked.get("requested"))
            and asked.get("requested_labels") == (None if labels is None else str(labels))
            and asked.get("requested_heads", []) == [h.requested() for h in heads]
            and asked.get("requested_name", name) == name
            and _still_current(source or asked.get("requested", "auto"), labels, asked)
        )
        if wanted and not old and sha256_of(out / CHECKPOINT) == info.get("sha256"):
            print(f"weights up to date: {info['source']} ({info_path})")
            return info
        if wanted:  # a checkpoint that is not the one recorded: rebuild as it was asked
            print(
                f"weights: {out / CHECKPOINT} is not the one {INFO} records, or {INFO} is an "
                "older build's: rebuilding as it was asked",
                file=sys.stderr,
            )
            if source is None:
                source, labels, heads, name = _asked_before(asked)
        elif source is None and heads:  # heads added to the weights already built
            source = asked.get("requested")
    source = source or "auto"

    import torch

    state, names, info = resolve(source, labels)
    state, names, info = with_heads(state, names, info, heads, name)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / CHECKPOINT
    # An interrupted save leaves the partial file aside, never under the checkpoint's name.
    partial = out / f".{CHECKPOINT}.partial"
    torch.save(state, partial)
    os.replace(partial, ckpt)
    (out / LABELS).write_text(json.dumps({str(i): name for i, name in enumerate(names)}, indent=0))
    request = {
        "requested": source,
        "requested_labels": None if labels is None else str(labels),
        "requested_labels_sha256": None if labels is None else sha256_of(labels),
        "requested_heads": [h.requested() for h in heads],
        "requested_name": name,
    }
    (out / REQUEST).write_text(json.dumps(request, indent=2) + "\n")
    info.update(
        file=CHECKPOINT,
        sha256=sha256_of(ckpt),
        classes=len(names),
        labels_sha256=sha256_of(out / LABELS),
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
    parser.add_argument(
        "--labels",
        type=Path,
        default=None,
        help="your checkpoint's class names: a JSON list, a JSON object index -> name, or a "
        "text file with one name per line (needed when its fc has other than 1,000 classes)",
    )
    parser.add_argument(
        "--add-head",
        nargs=3,
        action="append",
        default=[],
        metavar=("NAME", "CHECKPOINT", "LABELS"),
        help="serve another head from the same forward: a checkpoint on the same backbone "
        "(tsctl head train's resnet50.pt) and its labels; repeatable",
    )
    parser.add_argument(
        "--name",
        default="main",
        help="the --source head's name when heads are added (ImageNet's labels: imagenet)",
    )
    parser.add_argument("--out", type=Path, default=Path("build/weights"))
    args = parser.parse_args(argv)
    heads = [AddedHead(n, Path(c), Path(lbl)) for n, c, lbl in args.add_head]
    try:
        info = build(args.source or None, args.out, args.labels, heads, args.name)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not info["trained"]:
        banner(info["warning"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
