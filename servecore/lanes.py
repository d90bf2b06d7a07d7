"""The bulk lane: a second registration of a model whose workers run only on CPU time nobody
else wants.

A batch that has started is not pre-empted: on a 2-core host a person's photo that arrives
behind a collection job's batch waits for all of it, whatever the core admits next
(results/traffic.md). The kernel can pre-empt a process, though. ``handler.bulk_model`` names
a second registration of the same archive (``resnet50-embedding-bulk``); clients send their
bulk traffic there (``tsctl embed``/``tag``, the KServe Indexed Job), and its workers put every
thread under Linux's ``SCHED_IDLE`` policy once loaded: they run only when no normal process
(the interactive worker, the engine's frontend) wants the CPU, and a waking interactive worker
takes the cores back at once, mid-batch. Alone, a bulk worker still gets the whole machine.
Lowering one's own scheduling class needs no privilege (not in a container either).
"""

from __future__ import annotations

import os
from pathlib import Path

from servecore.priority import Priority

TASKS = Path("/proc/self/task")


def lane_of(model: str, bulk_model: str) -> Priority:
    """The traffic a registration named ``model`` serves: ``BULK`` when it is the model's
    ``handler.bulk_model``, else ``INTERACTIVE``."""
    return Priority.BULK if bulk_model and model == bulk_model else Priority.INTERACTIVE


def yield_cpu() -> str:
    """Every thread of this process (and so every thread it starts later, which inherits its
    creator's policy) under ``SCHED_IDLE``: what was applied, for the worker's log and
    describe. Where the policy is missing (not Linux) the process is ``nice 19`` instead."""
    policy = getattr(os, "SCHED_IDLE", None)
    if policy is None or not TASKS.is_dir():
        os.nice(19 - os.nice(0))
        return "nice 19"
    for tid in os.listdir(TASKS):
        try:
            os.sched_setscheduler(int(tid), policy, os.sched_param(0))
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
    return "SCHED_IDLE"
