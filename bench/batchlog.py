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
import time
from dataclasses import replace
from pathlib import Path
from typing import Iterable, Sequence

from bench.stats import Sample

_LINE = re.compile(r"PredictionTime\.Milliseconds:[\d.]+\|#ModelName:(?P<model>[^,|]+)")
_IDS = re.compile(r"\|#hostname:[^,]*,\d+,(?P<ids>[0-9a-fA-F,-]*)")


def request_ids(line: str) -> list[str]:
    """The request ids that end a worker's metric line (``...|#hostname:HOST,TIMESTAMP,ID,...``);
    none for the metrics TorchServe writes without them."""
    match = _IDS.search(line)
    return [i for i in match.group("ids").split(",") if i] if match else []


def batches_by_request(lines: Iterable[str], model: str) -> dict[str, int]:
    """``{request_id: size of its batch}`` from ``PredictionTime`` lines of ``model``."""
    sizes: dict[str, int] = {}
    for line in lines:
        match = _LINE.search(line)
        if not match or match.group("model") != model:
            continue
        ids = request_ids(line)
        for request_id in ids:
            sizes[request_id] = len(ids)
    return sizes


def with_logged_batches(samples: Sequence[Sample], log_file: Path, model: str,
                        wait_s: float = 30.0) -> list[Sample]:
    """``samples`` with ``batch_size`` filled from the log wherever it was unknown. The
    frontend copies the worker's lines into the log asynchronously, after the answers went
    out: the log is re-read (up to ``wait_s``) until every answered request is in it."""
    wanted = {s.request_id for s in samples if s.ok and not s.batch_size and s.request_id}
    deadline = time.monotonic() + wait_s
    while True:
        text = log_file.read_text(errors="replace") if log_file.exists() else ""
        sizes = batches_by_request(text.splitlines(), model)
        if wanted <= sizes.keys() or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return [s if s.batch_size or s.request_id not in sizes
            else replace(s, batch_size=sizes[s.request_id]) for s in samples]
