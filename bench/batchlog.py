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

import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from bench.stats import Sample

log = logging.getLogger("bench.batchlog")
T = TypeVar("T")

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


def settled_log(
    log_file: Path,
    parse: Callable[[list[str]], T],
    done: Callable[[T], bool],
    timeout_s: float = 30.0,
) -> T:
    """``parse`` of the log's lines once ``done`` holds for what it returns. TorchServe logs
    asynchronously, and the frontend copies the worker's lines after the answers went out, so a
    client can hold every answer before their lines are in. Each look reads only what was
    appended since the last one; after ``timeout_s`` it warns and returns what it has."""
    lines: list[str] = []
    offset, partial = 0, b""
    deadline = time.monotonic() + timeout_s
    while True:
        if log_file.exists():
            with log_file.open("rb") as f:
                f.seek(offset)
                chunk = f.read()
            offset += len(chunk)
            *complete, partial = (partial + chunk).split(b"\n")
            lines += [line.decode(errors="replace") for line in complete]
        value = parse(lines)
        if done(value):
            return value
        if time.monotonic() > deadline:
            log.warning(
                "%s: what was waited for is not in the log after %.0f s; using what is",
                log_file,
                timeout_s,
            )
            return value
        time.sleep(0.1)


def with_logged_batches(samples: Sequence[Sample], log_file: Path, model: str) -> list[Sample]:
    """``samples`` with ``batch_size`` filled from the log wherever it was unknown, once every
    answered request is in the log."""
    wanted = {s.request_id for s in samples if s.ok and not s.batch_size and s.request_id}
    sizes = settled_log(
        log_file,
        lambda lines: batches_by_request(lines, model),
        lambda sizes: wanted <= sizes.keys(),
    )
    return [
        s
        if s.batch_size or s.request_id not in sizes
        else replace(s, batch_size=sizes[s.request_id])
        for s in samples
    ]
