"""A tagger for the user's own labels: a linear head (a linear probe) fitted on the served
embeddings of a folder of labelled photos, measured on a held-out split, and folded into a
torchvision ResNet50 checkpoint that ``make archives WEIGHTS=... LABELS=...`` packs.

    report = train(client, "photos/", Path("tags/"))  # all the steps below, into tags/

    photos = walk(folder)                          # every photo now, labelled by subfolder
    check_split(label_counts(photos), test_size)   # before anything is embedded
    chosen = training_set(paths, X, photos)        # the rows of exactly those photos
    fitted = fit(chosen.x, chosen.y, chosen.labels, test_size=0.25, seed=0)
    fitted.report                                  # sizes, accuracy, per-label P/R, confusion
    state = fold(backbone_state_dict, fitted)      # a full resnet50 state dict, fc with N rows

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

import hashlib
import json
import math
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from model_files.artifacts import labels_problem
from serveclient import jobs, outputlock
from serveclient.client import Client
from serveclient.collection import Collection
from serveclient.errors import ServeError, Unhealthy, UsageError

DEFAULT_BACKBONE = Path("build/weights/resnet50.pt")
OUTPUTS = ("resnet50.pt", "labels.txt", "report.json", "report.html")  # in the order written
CALIBRATION_BINS = 15
MIN_PER_LABEL = 2  # a stratified split needs one photo per label on each side
CONFUSION_TABLE_LABELS = 50  # the report's full N x N table up to this many labels
CONFUSION_PAIRS = 100  # the most confused (true, predicted) pairs the report lists


@dataclass(frozen=True)
class Photo:
    """A photo under FOLDER now: its path as the walk spells it, and its label."""

    path: str
    label: str


def absolute(path: str) -> str:
    """``path`` as ``walk`` and ``training_set`` compare it: ``~`` expanded, made absolute,
    normalised (``photos/x``, ``./photos/x`` and ``~/photos/x`` run from home are one)."""
    return os.path.abspath(os.path.expanduser(path))


def walk(folder: Path | str) -> dict[str, Photo]:
    """Every photo under ``folder`` now (the embedding job's walk, serveclient.collection), by
    ``absolute`` path, labelled by the first subfolder it lies in. Refused: a photo directly
    in ``folder``, and folder names that are no labels (``labels_problem``: what ``make
    serve`` would refuse later, ``Cat`` beside ``cat`` among them)."""
    root, found = absolute(str(folder)), {}
    for entry in Collection([str(folder)]).entries():
        path = absolute(entry.path)
        parts = Path(os.path.relpath(path, root)).parts
        if len(parts) < 2:
            raise UsageError(
                f"{entry.path} is not in a label's subfolder of {folder}",
                "put each photo in FOLDER/<label>/ (one subfolder per label)",
            )
        try:  # a label is text: the folder's name as the file system holds it, read as UTF-8
            label = os.fsencode(parts[0]).decode("utf-8")
        except UnicodeDecodeError:
            raise UsageError(
                f"the folder {parts[0]!r} of {folder} is not named in UTF-8", "rename it"
            ) from None
        found[path] = Photo(entry.path, label)
    problem = labels_problem(sorted({p.label for p in found.values()}))
    if problem:
        raise UsageError(f"the subfolders of {folder} are no labels: {problem}", "rename them")
    return found


def label_counts(photos: Mapping[str, Photo]) -> dict[str, int]:
    """Photos per label, in label order."""
    return dict(sorted(Counter(p.label for p in photos.values()).items()))


def check_split(counts: Mapping[str, int], test_size: float) -> None:
    """Refuse what the seeded stratified split of ``fit`` cannot divide, in the tool's words:
    fewer than 2 labels, a label with fewer than ``MIN_PER_LABEL`` photos, or a held-out share
    that leaves some label without a photo on one side (scikit-learn holds out
    ``ceil(test_size * n)`` photos and needs one of each label on each side)."""
    labels, n = len(counts), sum(counts.values())
    if labels < 2:
        raise UsageError(
            f"{labels} label found; a tagger needs at least 2",
            "make one subfolder per label, each with photos",
        )
    few = [f"{label} ({count})" for label, count in counts.items() if count < MIN_PER_LABEL]
    if few:
        raise UsageError(
            f"too few photos for a held-out split: {', '.join(few[:10])}"
            + (f" and {len(few) - 10} more labels" if len(few) > 10 else ""),
            f"give each label at least {MIN_PER_LABEL} photos (tens make a useful report)",
        )
    held_out = math.ceil(test_size * n)
    if not labels <= held_out <= n - labels:
        raise UsageError(
            f"{labels} labels, {n} photos: --test-size {test_size} holds out {held_out} and "
            f"trains on {n - held_out}, and each side needs a photo of every label",
            f"give --test-size from {labels / n:.3f} to {(n - labels) / n:.3f}"
            if labels / n <= (n - labels) / n
            else "give each label more photos",
        )


@dataclass(frozen=True)
class TrainingSet:
    """The rows fitted on: one per photo under FOLDER now, in path order (so the seed picks the
    same held-out photos whatever order the embedding job finished them in, on every host),
    and how many rows of the embeddings were left out, by reason."""

    paths: list[str]
    x: np.ndarray
    y: np.ndarray
    labels: list[str]
    left_out: dict[str, int]


def training_set(
    paths: Sequence[str], x: np.ndarray, photos: Mapping[str, Photo], dropped: int = 0
) -> TrainingSet:
    """The rows of ``x`` (``paths`` their photos) for exactly ``photos`` (``walk``'s), each path
    compared ``absolute``: a row whose photo was moved or deleted since, or that a run on
    another FOLDER wrote into the same --out, is left out (``not_under_folder``, counted with
    the ``dropped`` rows the embedding job's merge already removed as gone); a photo stored
    twice (two spellings of one path) is fitted once, on the row the walk spells
    (``stored_twice``). ``ServeError`` when a photo has no row: the folder changed meanwhile."""
    kept: dict[str, int] = {}
    gone = dropped
    for row, path in enumerate(paths):
        where = absolute(path)
        photo = photos.get(where)
        if photo is None:
            gone += 1
        elif where not in kept or path == photo.path:
            kept[where] = row
    missing = [photos[p].path for p in photos if p not in kept]
    if missing:
        raise ServeError(
            f"{len(missing)} photos have no embedding (e.g. {missing[0]}): the folder changed "
            "while head train ran",
            "rerun: what was embedded is kept",
        )
    order = sorted(kept)
    labels = sorted({photos[p].label for p in order})
    index = {label: i for i, label in enumerate(labels)}
    return TrainingSet(
        [photos[p].path for p in order],
        x[[kept[p] for p in order]],
        np.array([index[photos[p].label] for p in order], dtype=np.int64),
        labels,
        {"not_under_folder": gone, "stored_twice": len(paths) + dropped - gone - len(kept)},
    )


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
    from sklearn.metrics import precision_recall_fscore_support
    from sklearn.model_selection import train_test_split

    check_split(dict(zip(labels, np.bincount(y, minlength=len(labels)).tolist())), test_size)
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
        "confusion": confusion(truth, predicted, labels),
        "calibration": {
            "method": "softmax of the multinomial logistic regression (no post-hoc scaling)",
            "expected_calibration_error": expected_calibration_error(probabilities, truth),
            "bins": CALIBRATION_BINS,
            "served_probabilities": "the served fc sees the pooled vector x, not x/|x|: "
            "same ranking, probabilities at temperature 1/|x| (sharper); see docs/own-tags.md",
        },
    }
    return Fitted(list(labels), weight, test, predicted, probabilities, report)


def confusion(truth: np.ndarray, predicted: np.ndarray, labels: Sequence[str]) -> dict:
    """The held-out confusion, bounded: ``counts``, the N x N table (rows true, columns
    predicted), only for at most ``CONFUSION_TABLE_LABELS`` labels (else ``[]``), and
    ``most_confused``, at most ``CONFUSION_PAIRS`` mistaken (true, predicted) pairs, most
    frequent first, with the number of mistaken pairs left out. Counted from the pairs that
    occur, so memory follows the held-out photos, not N x N."""
    pairs, counts = np.unique(np.stack([truth, predicted]), axis=1, return_counts=True)
    table = []
    if len(labels) <= CONFUSION_TABLE_LABELS:
        dense = np.zeros((len(labels), len(labels)), dtype=np.int64)
        dense[pairs[0], pairs[1]] = counts
        table = dense.tolist()
    wrong = [(-int(c), int(t), int(p)) for (t, p), c in zip(pairs.T, counts) if t != p]
    wrong.sort()
    return {
        "rows": "true label",
        "columns": "predicted label",
        "labels": list(labels),
        "counts": table,
        "table_labels_max": CONFUSION_TABLE_LABELS,
        "most_confused": [
            {"true": labels[t], "predicted": labels[p], "count": -c}
            for c, t, p in wrong[:CONFUSION_PAIRS]
        ],
        "most_confused_left_out": max(0, len(wrong) - CONFUSION_PAIRS),
    }


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


def train(
    client: Client,
    folder: Path | str,
    out: Path,
    *,
    backbone: Path = DEFAULT_BACKBONE,
    test_size: float = 0.25,
    seed: int = 0,
    c: float = 1.0,
    job: jobs.JobOptions | None = None,
    note: Callable[[str], None] = lambda text: None,
) -> dict:
    """``tsctl head train FOLDER --out DIR``: the photos under ``folder`` embedded through the
    server (``jobs.into_parquet`` into ``out/embeddings.parquet``: a rerun embeds only what is
    new), the head fitted on exactly them and ``OUTPUTS`` written (``publish``); report.json's
    figures, with the embedding job's summary. ``note``: each step's progress line.

    Every value, the labels and the split are refused (``UsageError``) before the server is
    asked anything, and so are served weights that are not ``backbone`` (by sha256); one run
    per ``out`` at a time (``outputlock``; ``job.wait`` to queue); ``Unhealthy`` when a photo
    could not be embedded (what was embedded is kept)."""
    job = job or jobs.JobOptions()
    photos = _checked(Path(folder), out, backbone, test_size, seed, c)
    with outputlock.hold(out, wait=job.wait):
        identity, record = _backbone(client, job.model_for("embedding"), backbone)
        out.mkdir(parents=True, exist_ok=True)
        for stale in out.glob(".*.partial"):  # what a killed run was writing
            stale.unlink()
        embeddings = out / "embeddings.parquet"
        note(f"{len(photos)} photos under {folder}: embedding what is new into {embeddings}")
        embedded = jobs.into_parquet(
            client, "embedding", Collection([str(folder)]), embeddings, job
        )
        if embedded["failed"]:
            failures = "; ".join(f"{f['path']}: {f['error']}" for f in embedded["failures"][:5])
            raise Unhealthy(
                f"{embedded['failed']} photos could not be embedded ({failures})",
                "fix or remove them and rerun: what was embedded is kept",
            )
        from serveclient.vectors import read_matrix

        chosen = training_set(*read_matrix(embeddings), photos, embedded["gone"] or 0)
        note(f"fitting the head on {len(chosen.paths)} photos")
        fitted = fit(chosen.x, chosen.y, chosen.labels, test_size=test_size, seed=seed, c=c)
        summary = report(out, chosen, fitted, identity, record)
        note(f"writing {', '.join(OUTPUTS)} into {out}")
        publish(out, backbone, fitted, summary)
    return {**summary, "embedding_job": embedded}


def _checked(
    folder: Path, out: Path, backbone: Path, test_size: float, seed: int, c: float
) -> dict[str, Photo]:
    """Everything ``train`` refuses before the server is asked anything (exit 2): the paths,
    the values, the folders as labels and the split; the photos under ``folder`` now."""
    if not folder.is_dir():
        raise UsageError(
            f"{folder} is not a folder", "FOLDER holds one subfolder of photos per label"
        )
    if not backbone.is_file():
        raise UsageError(
            f"no backbone checkpoint at {backbone}",
            f"pass the checkpoint the server was built from: --backbone {DEFAULT_BACKBONE}",
        )
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file", "--out names a folder")
    if not 0 < test_size < 1:
        raise UsageError(
            f"--test-size {test_size}: the held-out share is a fraction between 0 and 1",
            "e.g. --test-size 0.25 (the default)",
        )
    if not (math.isfinite(c) and c > 0):
        raise UsageError(
            f"--C {c}: the inverse L2 strength is a positive number",
            "e.g. --C 1.0 (the default; smaller regularises more)",
        )
    if not 0 <= seed < 2**32:
        raise UsageError(f"--seed {seed}: from 0 to 2**32 - 1", "e.g. --seed 0")
    photos = walk(folder)
    check_split(label_counts(photos), test_size)
    return photos


def _backbone(client: Client, model: str, backbone: Path) -> tuple[dict, dict]:
    """The embedding model's identity and the backbone's record, refused when the served
    weights are not ``backbone``."""
    from serveclient.batchjob import model_identity

    _, identity = model_identity(client, model, with_management=client.reaches_management)
    served = identity.get("weights_sha256")
    sha256 = hashlib.sha256(backbone.read_bytes()).hexdigest()
    if served is not None and served != sha256:
        raise UsageError(
            f"{backbone} (sha256 {sha256[:16]}...) is not the served backbone "
            f"(describe reports {served[:16]}...)",
            "pass the checkpoint the served archive was built from",
        )
    return identity, {
        "path": str(backbone),
        "sha256": sha256,
        "checked_against_server": served is not None,
    }


def report(out: Path, chosen: TrainingSet, fitted: Fitted, identity: dict, backbone: dict) -> dict:
    """report.json: the fit's figures, the rows left out, where it came from (the model's
    ``identity``, the ``backbone``'s record), the held-out photos and the mistakes among them."""
    held_out = [
        {
            "path": chosen.paths[row],
            "label": chosen.labels[chosen.y[row]],
            "predicted": chosen.labels[predicted],
            "probability": float(probabilities[predicted]),
        }
        for row, predicted, probabilities in zip(
            fitted.test_rows, fitted.predicted, fitted.probabilities
        )
    ]
    return {
        **fitted.report,
        "photos": len(chosen.paths),
        "left_out": chosen.left_out,
        "embedded_by": identity,
        "backbone": backbone,
        "outputs": {"weights": str(out / OUTPUTS[0]), "labels": str(out / OUTPUTS[1])},
        "held_out": held_out,
        "mistakes": [h for h in held_out if h["predicted"] != h["label"]],
    }


def publish(out: Path, backbone: Path, fitted: Fitted, report: dict) -> None:
    """``OUTPUTS``, each written beside its name (``.NAME.partial``) and renamed over it, in
    that order: a kill leaves every name whole, the old file or the new. The checkpoint
    carries its labels; ``labels.txt`` (UTF-8, one per line) is written from the same list."""
    import torch

    from serveclient import pages

    labels = fitted.labels
    state = fold(torch.load(backbone, map_location="cpu", weights_only=True), fitted)
    checkpoint = {"state_dict": state, "labels": labels}
    thumbs = pages.Thumbnailer(expected=max(1, len(report["mistakes"])))
    # A path's bytes as the file system gave them (a non-UTF-8 name's are surrogate-escaped).
    page = pages.head_page(report, report["mistakes"], thumbs).encode("utf-8", "surrogateescape")
    writers: list[Callable[[Path], Any]] = [
        lambda path: torch.save(checkpoint, path),
        lambda path: path.write_bytes("".join(f"{label}\n" for label in labels).encode()),
        lambda path: path.write_bytes((json.dumps(report, indent=2) + "\n").encode()),
        lambda path: path.write_bytes(page),
    ]
    for name, write in zip(OUTPUTS, writers):
        partial = out / f".{name}.partial"
        write(partial)
        os.replace(partial, out / name)
