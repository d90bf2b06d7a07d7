"""A tagger for the user's own labels: a linear head (a linear probe) fitted on the served
embeddings of a folder of labelled photos, measured on a held-out split, and folded into a
torchvision ResNet50 checkpoint that ``make archives WEIGHTS=... LABELS=...`` packs.

    labels, y = labels_of(paths, folder)          # one subfolder per label
    fitted = fit(X, y, labels, test_size=0.25, seed=0)
    fitted.report                                 # sizes, accuracy, per-label P/R, confusion
    state = fold(backbone_state_dict, fitted)     # a full resnet50 state dict, fc with N rows

The head: scikit-learn's multinomial ``LogisticRegression`` (lbfgs, L2): a convex fit with no
learning rate or epochs to choose, its softmax is the probability per tag, and it is minutes
on a CPU for tens of thousands of photos. Calibration is measured, not assumed: the held-out
expected calibration error (15 equal-width bins of the top probability) is in the report.

What it is fitted on, and why it folds exactly into ``fc`` as far as the ranking goes: the
served ``embedding`` is the pooled vector ``x`` divided by its norm (``normalize_embedding``),
while torchvision's ``fc`` reads ``x`` itself. The head is therefore linear with no intercept
on ``e = x / |x|`` scaled per feature (``e / s``, ``s`` the training set's standard deviation,
no centring): its logits are ``A e`` with ``A = W / s``, and ``fc`` = (``A``, bias 0) gives
``A x = |x| A e`` on the pooled vector. ``|x| > 0``, so the served tagger ranks the classes
exactly as the report did (the same top-1, so the same held-out accuracy); its probabilities are
those of the report at temperature ``1 / |x|`` (sharper), so the calibration the report
measures is the client-side head's. An intercept or centring would add a constant that does not
scale with ``|x|`` and could change the ranking, so neither is used.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from serveclient.errors import UsageError

CALIBRATION_BINS = 15
MIN_PER_LABEL = 2  # a stratified split needs one photo per label on each side


def labels_of(paths: Sequence[str], folder: Path | str) -> tuple[list[str], np.ndarray]:
    """The sorted labels (the names of ``folder``'s subfolders that hold photos) and each
    path's label index. A photo directly in ``folder`` has no label: refused."""
    names = []
    for path in paths:
        parts = Path(os.path.relpath(path, folder)).parts
        if len(parts) < 2:
            raise UsageError(
                f"{path} is not in a label's subfolder of {folder}",
                "put each photo in FOLDER/<label>/ (one subfolder per label)",
            )
        names.append(parts[0])
    labels = sorted(set(names))
    index = {label: i for i, label in enumerate(labels)}
    return labels, np.array([index[n] for n in names], dtype=np.int64)


def in_path_order(paths: Sequence[str], x: np.ndarray) -> tuple[list[str], np.ndarray]:
    """``paths`` sorted and ``x``'s rows with them. ``fit`` splits rows by a seed: in path
    order, not in the order an embedding job finished the photos, the seed picks the same
    held-out photos on every run and every host."""
    order = sorted(range(len(paths)), key=paths.__getitem__)
    return [paths[i] for i in order], x[order]


@dataclass
class Fitted:
    """The head (``weight`` [N, 2048], to apply to the L2-normalised embedding), the held-out
    split (indices into the rows fitted on, its predictions and probabilities) and the report."""

    labels: list[str]
    weight: np.ndarray
    test_rows: np.ndarray
    predicted: np.ndarray
    probabilities: np.ndarray
    report: dict


def fit(
    x: np.ndarray,
    y: np.ndarray,
    labels: Sequence[str],
    *,
    test_size: float = 0.25,
    seed: int = 0,
    c: float = 1.0,
) -> Fitted:
    """Split stratified and seeded, fit on the training part, measure on the held-out part."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import confusion_matrix, precision_recall_fscore_support
    from sklearn.model_selection import train_test_split

    counts = np.bincount(y, minlength=len(labels))
    if len(labels) < 2:
        raise UsageError(
            f"{len(labels)} label found; a tagger needs at least 2",
            "make one subfolder per label, each with photos",
        )
    if counts.min() < MIN_PER_LABEL:
        few = [f"{labels[int(i)]} ({counts[i]})" for i in np.flatnonzero(counts < MIN_PER_LABEL)]
        raise UsageError(
            f"too few photos for a held-out split: {', '.join(few)}",
            f"give each label at least {MIN_PER_LABEL} photos (tens make a useful report)",
        )
    rows = np.arange(len(y))
    train, test = train_test_split(rows, test_size=test_size, stratify=y, random_state=seed)
    scale = x[train].std(axis=0)
    scale[scale == 0] = 1.0  # a feature constant on the training set: left as it is
    model = LogisticRegression(C=c, fit_intercept=False, max_iter=5000)
    model.fit(x[train] / scale, y[train])
    weight = model.coef_ / scale  # [N, 2048] on the unscaled embedding
    if len(labels) == 2:  # binary: sklearn keeps one row; the softmax of (-z/2, z/2) equals it
        weight = np.concatenate([-weight / 2, weight / 2])
    logits = x[test] @ weight.T
    probabilities = _softmax(logits)
    predicted = probabilities.argmax(axis=1)
    truth = y[test]
    confusion = confusion_matrix(truth, predicted, labels=range(len(labels)))
    precision, recall, _, support = precision_recall_fscore_support(
        truth, predicted, labels=range(len(labels)), zero_division=0
    )
    report = {
        "labels": list(labels),
        "head": {
            "kind": "sklearn LogisticRegression (multinomial, lbfgs, L2, no intercept)",
            "C": c,
            "input": "the served L2-normalised embedding, scaled per feature (no centring)",
            "train_accuracy": float(model.score(x[train] / scale, y[train])),
        },
        "split": {
            "seed": seed,
            "test_size": test_size,
            "stratified": True,
            "train": len(train),
            "held_out": len(test),
            "per_label": {
                label: {"train": int((y[train] == i).sum()), "held_out": int((truth == i).sum())}
                for i, label in enumerate(labels)
            },
        },
        "held_out_accuracy": float((predicted == truth).mean()),
        "per_label": {
            label: {
                "precision": float(precision[i]),
                "recall": float(recall[i]),
                "support": int(support[i]),
            }
            for i, label in enumerate(labels)
        },
        "confusion": {
            "rows": "true label",
            "columns": "predicted label",
            "labels": list(labels),
            "counts": confusion.tolist(),
        },
        "calibration": {
            "method": "softmax of the multinomial logistic regression (no post-hoc scaling)",
            "expected_calibration_error": expected_calibration_error(probabilities, truth),
            "bins": CALIBRATION_BINS,
            "served_probabilities": "the served fc sees the pooled vector x, not x/|x|: "
            "same ranking, probabilities at temperature 1/|x| (sharper); see docs/own-tags.md",
        },
    }
    return Fitted(list(labels), weight, test, predicted, probabilities, report)


def expected_calibration_error(probabilities: np.ndarray, truth: np.ndarray) -> float:
    """Mean |accuracy - confidence| over equal-width bins of the top probability, weighted by
    the bins' sizes."""
    confidence = probabilities.max(axis=1)
    correct = probabilities.argmax(axis=1) == truth
    edges = np.linspace(0.0, 1.0, CALIBRATION_BINS + 1)
    bins = np.clip(np.digitize(confidence, edges[1:-1]), 0, CALIBRATION_BINS - 1)
    error = 0.0
    for b in range(CALIBRATION_BINS):
        inside = bins == b
        if inside.any():
            error += inside.mean() * abs(correct[inside].mean() - confidence[inside].mean())
    return float(error)


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def fold(backbone: dict, fitted: Fitted) -> dict:
    """A full torchvision resnet50 state dict: ``backbone``'s weights with ``fc`` replaced by
    the head (N rows, bias 0; see the module's docstring for why no bias)."""
    import torch

    if "fc.weight" not in backbone or backbone["fc.weight"].shape[1] != fitted.weight.shape[1]:
        raise UsageError(
            "the backbone is not a torchvision resnet50 state dict (no fc.weight [*, 2048])",
            "pass the served checkpoint: --backbone build/weights/resnet50.pt",
        )
    state = dict(backbone)
    state["fc.weight"] = torch.from_numpy(fitted.weight.astype(np.float32))
    state["fc.bias"] = torch.zeros(len(fitted.labels), dtype=torch.float32)
    return state
