"""``tsctl head train``'s held-out split depends on the photos and ``--seed`` alone: the
embedding job writes rows in the order it finished them, and a rerun, another host or another
engine finishes them in another order. The CI run that found it held out another photo than the
report it was compared with."""

from __future__ import annotations

import numpy as np

from serveclient import head


def _photos(rows: int = 40) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(7)
    labels = ("cats", "dogs", "owls", "rats")
    paths = [f"/photos/{labels[i % 4]}/{i:03d}.jpg" for i in range(rows)]
    x = rng.normal(size=(rows, 2048)).astype(np.float32)
    x[:, :4] += 3 * np.eye(4, dtype=np.float32)[[i % 4 for i in range(rows)]]
    return paths, x / np.linalg.norm(x, axis=1, keepdims=True)


def _held_out(paths: list[str], x: np.ndarray) -> list[tuple[str, str]]:
    photos = {p: head.Photo(p, p.split("/")[2]) for p in paths}
    chosen = head.training_set(paths, x, photos)
    fitted = head.fit(chosen.x, chosen.y, chosen.labels, seed=3)
    return [(chosen.paths[r], chosen.labels[p]) for r, p in zip(fitted.test_rows, fitted.predicted)]


def test_the_same_photos_in_another_order_hold_out_the_same_photos_tagged_alike():
    paths, x = _photos()
    shuffled = np.random.default_rng(1).permutation(len(paths))
    first = _held_out(paths, x)
    again = _held_out([paths[i] for i in shuffled], x[shuffled])
    assert len(first) == 10
    assert again == first


def test_the_training_set_keeps_each_vector_with_its_path_in_path_order():
    paths, x = _photos(8)
    order = [5, 2, 7, 0, 1, 6, 3, 4]
    photos = {p: head.Photo(p, p.split("/")[2]) for p in paths}
    chosen = head.training_set([paths[i] for i in order], x[order], photos)
    assert chosen.paths == sorted(paths)
    assert np.array_equal(chosen.x, x[np.argsort(paths)])
    assert [chosen.labels[i] for i in chosen.y] == [p.split("/")[2] for p in sorted(paths)]


def test_the_confusion_in_the_report_is_bounded_and_says_what_it_left_out():
    """Over ``CONFUSION_TABLE_LABELS`` labels no N x N table (1,000 labels would be a million
    cells); the most confused pairs, at most ``CONFUSION_PAIRS``, most frequent first, and how
    many mistaken pairs it left out."""
    rng = np.random.default_rng(11)
    labels = [f"label-{i:03d}" for i in range(60)]
    y = np.repeat(np.arange(len(labels)), 4)
    x = rng.normal(size=(len(y), 16)).astype(np.float32)  # noise: mistakes everywhere
    fitted = head.fit(x, y, labels, test_size=0.5)
    report = fitted.report["confusion"]
    assert report["counts"] == [] and report["table_labels_max"] == head.CONFUSION_TABLE_LABELS < 60
    wrong = [(t, p) for t, p in zip(y[fitted.test_rows], fitted.predicted) if t != p]
    pairs = report["most_confused"]
    assert len(pairs) == head.CONFUSION_PAIRS < len(set(wrong))
    assert report["most_confused_left_out"] == len(set(wrong)) - head.CONFUSION_PAIRS
    assert [p["count"] for p in pairs] == sorted((p["count"] for p in pairs), reverse=True)
    for p in pairs:
        pair = (labels.index(p["true"]), labels.index(p["predicted"]))
        assert p["count"] == wrong.count(pair)


def test_a_small_confusion_keeps_its_table_and_names_its_pairs():
    truth, predicted = np.array([0, 0, 1, 1, 2, 2]), np.array([0, 1, 1, 0, 2, 0])
    report = head.confusion(truth, predicted, ["a", "b", "c"])
    assert report["counts"] == [[1, 1, 0], [1, 1, 0], [1, 0, 1]]
    assert report["most_confused"] == [
        {"true": "a", "predicted": "b", "count": 1},
        {"true": "b", "predicted": "a", "count": 1},
        {"true": "c", "predicted": "a", "count": 1},
    ]
    assert report["most_confused_left_out"] == 0
