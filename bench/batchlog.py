"""Server-side batch sizes from TorchServe's own log, for handlers that do not report them
(the stock ``image_classifier``).

After every batch the worker prints a ``PredictionTime`` metric whose last fields are the
request ids of that batch; the frontend copies the line into ``logs/ts_log.log``:

    ... result=[METRICS]PredictionTime.Milliseconds:2485.75|#ModelName:resnet50-stock,Level:Model
    |#type:GAUGE|#hostname:vm,1795321899,<id1>,<id2>,..., pattern=[METRICS]

and every response carries its request id in ``x-request-id``, so each answer can be matched
with the size of the batch it was computed in.
"""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Iterable, Sequence

from bench.stats import Sample

_LINE = re.compile(
    r"PredictionTime\.Milliseconds:[\d.]+\|#ModelName:(?P<model>[^,|]+)[^|]*"
    r"\|#type:\w+\|#hostname:[^,]*,\d+,(?P<ids>[0-9a-fA-F,-]+)"
)


def batches_by_request(lines: Iterable[str], model: str) -> dict[str, int]:
    """``{request_id: size of its batch}`` from ``PredictionTime`` lines of ``model``."""
    sizes: dict[str, int] = {}
    for line in lines:
        match = _LINE.search(line)
        if not match or match.group("model") != model:
            continue
        ids = [i for i in match.group("ids").split(",") if i]
        for request_id in ids:
            sizes[request_id] = len(ids)
    return sizes


def with_logged_batches(samples: Sequence[Sample], log_file: Path, model: str) -> list[Sample]:
    """``samples`` with ``batch_size`` filled from the log wherever it was unknown."""
    text = log_file.read_text(errors="replace") if log_file.exists() else ""
    sizes = batches_by_request(text.splitlines(), model)
    return [s if s.batch_size or s.request_id not in sizes
            else replace(s, batch_size=sizes[s.request_id]) for s in samples]
