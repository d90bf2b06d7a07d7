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
    paths, x = head.in_path_order(paths, x)
    labels, y = head.labels_of(paths, "/photos")
    fitted = head.fit(x, y, labels, seed=3)
    return [(paths[r], labels[p]) for r, p in zip(fitted.test_rows, fitted.predicted)]


def test_the_same_photos_in_another_order_hold_out_the_same_photos_tagged_alike():
    paths, x = _photos()
    shuffled = np.random.default_rng(1).permutation(len(paths))
    first = _held_out(paths, x)
    again = _held_out([paths[i] for i in shuffled], x[shuffled])
    assert len(first) == 10
    assert again == first


def test_in_path_order_keeps_each_vector_with_its_path():
    paths, x = _photos(8)
    order = [5, 2, 7, 0, 1, 6, 3, 4]
    sorted_paths, sorted_x = head.in_path_order([paths[i] for i in order], x[order])
    assert sorted_paths == sorted(paths)
    assert np.array_equal(sorted_x, x[np.argsort(paths)])
