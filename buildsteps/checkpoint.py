"""A user's fine-tuned ResNet50 and its labels, read and checked before anything is built.

``read_checkpoint(path)`` -> a torchvision ``resnet50`` state dict whose ``fc`` has N >= 2
classes. Accepted: a state dict (``torch.save(model.state_dict())``), one nested under
``"state_dict"`` or ``"model"`` (training scripts' checkpoints), keys prefixed ``module.``
(DataParallel) or ``model.``, and a whole module (``torch.save(model)``) of torchvision's
``ResNet``. Always read with ``torch.load(weights_only=True)``: a whole module only through an
allow-list of torchvision's ResNet classes and the ``nn`` layers a ResNet50 holds, never an
arbitrary pickle (a checkpoint can carry code).

A checkpoint may carry its labels (``{"state_dict": ..., "labels": [names]}``, as ``tsctl head
train`` writes it): one file holds the pair, so a LABELS file that is not the same list is refused
rather than served under the wrong names.

``read_labels(path)`` -> the class names, from a JSON list, a JSON object index -> name (as
TorchServe's ``index_to_name.json``, whose values may be ``[wnid, name]``), or a text file with
one name per line. UTF-8 (a BOM is dropped), any line ends (``\n``, ``\r\n``, ``\r``);
blank lines at the end are ignored. The names then follow ``model_files.artifacts``'s
``labels_problem``, the rule ``tsctl head train`` applies to its folders.

Each refusal is a ``CheckpointError`` whose message says what is wrong and how to fix it.
"""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Sequence
from pathlib import Path

from model_files.artifacts import labels_problem

MIN_CLASSES = 2
# Prefixes a wrapper adds to every key: DataParallel / DistributedDataParallel, and a
# LightningModule or wrapper holding the network as ``self.model``.
PREFIXES = ("module.", "model.")
# Where training scripts nest the state dict in a checkpoint dict.
NESTED = ("state_dict", "model")


class CheckpointError(ValueError):
    """A checkpoint or labels file that cannot be served; the message says why and how to fix."""


def _allowed_globals() -> list:
    """What a whole pickled torchvision ResNet50 needs beyond tensors: its classes and layers."""
    from torch import nn
    from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

    return [
        ResNet,
        Bottleneck,
        BasicBlock,
        nn.Conv2d,
        nn.BatchNorm2d,
        nn.ReLU,
        nn.MaxPool2d,
        nn.AdaptiveAvgPool2d,
        nn.Linear,
        nn.Sequential,
        set,
    ]


def _load(path: Path) -> object:
    import torch

    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist (WEIGHTS=/path/to/file.pt)")
    try:
        with torch.serialization.safe_globals(_allowed_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        if "Unsupported global" in text or "GLOBAL" in text:
            what = next((line for line in text.splitlines() if "GLOBAL" in line), "").strip()
            raise CheckpointError(
                f"{path} needs code beyond torchvision's ResNet to load ({what or 'a global'}), "
                "and a checkpoint is never unpickled with arbitrary code: save the weights "
                "alone with torch.save(model.state_dict(), path) and build from that"
            ) from None
        raise CheckpointError(
            f"{path} is not a PyTorch checkpoint ({text.splitlines()[0][:200]}): give a file "
            "written by torch.save(model.state_dict(), path)"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise CheckpointError(
            f"{path} is not a PyTorch checkpoint ({str(exc).splitlines()[0][:200]}): give a "
            "file written by torch.save(model.state_dict(), path)"
        ) from None


def _state_dict(loaded: object, path: Path) -> dict:
    import torch
    from torch import nn
    from torchvision.models import ResNet

    for key in NESTED:
        if isinstance(loaded, dict) and isinstance(loaded.get(key), (dict, nn.Module)):
            loaded = loaded[key]
    if isinstance(loaded, nn.Module):
        if not isinstance(loaded, ResNet):
            raise CheckpointError(
                f"{path} holds a {type(loaded).__name__}, not torchvision's ResNet: save a "
                "torchvision resnet50's state dict"
            )
        loaded = loaded.state_dict()
    if not isinstance(loaded, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items()
    ):
        raise CheckpointError(
            f"{path} holds a {type(loaded).__name__}, not a state dict of tensors: give a file "
            "written by torch.save(model.state_dict(), path)"
        )
    state = dict(loaded)
    for prefix in PREFIXES:
        if state and all(k.startswith(prefix) for k in state):
            state = {k.removeprefix(prefix): v for k, v in state.items()}
    return state


def _check_resnet50(state: dict, path: Path) -> int:
    """The class count N of a resnet50 state dict (its ``fc``'s rows); refuses any other."""
    from torchvision.models import resnet50

    fc = state.get("fc.weight")
    if fc is None or fc.dim() != 2:
        raise CheckpointError(
            f"{path} is not a torchvision resnet50 state dict: it has no 2-d 'fc.weight' "
            f"(first keys: {sorted(state)[:5]})"
        )
    classes = fc.shape[0]
    if classes < MIN_CLASSES:
        raise CheckpointError(f"{path}: fc has {classes} class, a tagger needs {MIN_CLASSES}+")
    expected = {k: tuple(v.shape) for k, v in resnet50(num_classes=classes).state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{path} is not a torchvision resnet50 state dict: {len(missing)} keys missing "
            f"{missing[:5]}, {len(unexpected)} unexpected {unexpected[:5]}; save "
            "torchvision.models.resnet50(num_classes=N).state_dict() (a 'module.' or 'model.' "
            "prefix is removed for you)"
        )
    wrong = [
        f"{k} {tuple(state[k].shape)} (resnet50: {shape})"
        for k, shape in expected.items()
        if tuple(state[k].shape) != shape
    ]
    if wrong:
        raise CheckpointError(
            f"{path} is not a torchvision resnet50 state dict: {len(wrong)} tensors have the "
            f"wrong shape: {'; '.join(wrong[:3])}"
        )
    return classes


def read_checkpoint(path: Path) -> tuple[dict, int, list[str] | None]:
    """``(state_dict, classes, labels)`` of the resnet50 checkpoint at ``path``, ``labels`` the
    names it carries (None when it carries none); else a ``CheckpointError``."""
    loaded = _load(path)
    carried = loaded.get("labels") if isinstance(loaded, dict) else None
    state = _state_dict(loaded, path)
    if not (isinstance(carried, list) and all(isinstance(n, str) for n in carried)):
        carried = None  # another program's "labels" entry: not names
    return state, _check_resnet50(state, path), carried


def read_labels(path: Path) -> list[str]:
    """The class names in ``path`` (JSON list, JSON object index -> name, or one per line)."""
    if not path.is_file():
        raise CheckpointError(f"labels file {path} does not exist (LABELS=/path/to/labels)")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CheckpointError(
            f"labels file {path} is not UTF-8 (byte {exc.start}: {data[exc.start : exc.end]!r}): "
            "save it as UTF-8"
        ) from None
    if path.suffix.lower() == ".json":
        try:
            return _json_labels(json.loads(text), path)
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"labels file {path} is not valid JSON: {exc}") from None
    lines = re.split(r"\r\n|\r|\n", text)
    while lines and not lines[-1].strip():
        lines.pop()  # blank lines at the end: an editor's, not classes
    return [line.strip() for line in lines]


def _json_labels(data: object, path: Path) -> list[str]:
    if isinstance(data, dict):
        indexes = sorted(data, key=lambda k: int(k) if re.fullmatch("[0-9]+", k) else -1)
        if indexes != [str(i) for i in range(len(data))]:
            raise CheckpointError(
                f"labels file {path}: a JSON object's keys must be the class indexes "
                f"'0'..'{len(data) - 1}', each once"
            )
        data = [data[k] for k in indexes]
    if not isinstance(data, list):
        raise CheckpointError(
            f"labels file {path} must hold a JSON list of names or an object index -> name, "
            f"got {type(data).__name__}"
        )
    # TorchServe's index_to_name.json may give [wnid, name]: the name is the last item.
    names = [item[-1] if isinstance(item, list) and item else item for item in data]
    if not all(isinstance(name, str) for name in names):
        raise CheckpointError(f"labels file {path}: every label must be a string")
    return [name.strip() for name in names]


def check_labels(labels: Sequence[str], classes: int, where: str) -> None:
    """Refuse labels that do not name each of ``classes`` classes once."""
    if len(labels) != classes:
        raise CheckpointError(
            f"{where} has {len(labels)} labels but the checkpoint's fc has {classes} classes: "
            f"give exactly {classes} names, in the order of the fc's rows"
        )
    problem = labels_problem(labels)
    if problem:
        raise CheckpointError(f"{where}: {problem}")


def same_labels(carried: list[str] | None, given: list[str], path: Path, where: str) -> None:
    """Refuse a labels file that is not the list the checkpoint at ``path`` carries."""
    if carried is None or carried == given:
        return
    i = next((i for i, pair in enumerate(zip(carried, given)) if pair[0] != pair[1]), None)
    differ = (
        f"{len(carried)} labels there, {len(given)} here"
        if i is None
        else f"class {i} is {carried[i]!r} there, {given[i]!r} here"
    )
    raise CheckpointError(
        f"{where} is not the list of labels {path} carries ({differ}): they come from different "
        "runs (one interrupted, or rerun since); leave LABELS out to serve the checkpoint's own, "
        "or rerun tsctl head train"
    )
