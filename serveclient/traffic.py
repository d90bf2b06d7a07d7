"""Who waits for a request, and until when, on the wire: the one place that turns a request's
class and deadline into each engine's form.

A class is ``interactive`` (a person waiting: the servers' default) or ``bulk`` (a collection
job that can wait and retry: ``tsctl embed/tag``, the KServe Indexed Job). A deadline is a Unix
time in seconds after which the answer is no use; the server answers a request still unstarted
then with 504 ``DeadlineExceeded``, neither decoded nor computed.

- TorchServe: headers ``X-Priority: interactive|bulk`` and ``X-Deadline: <Unix seconds>``
  (its frontend passes its worker no arrival time, so a deadline is a moment, not a timeout);
  a v2 body also carries the ``priority`` parameter.
- Triton: the v2 parameters ``priority`` (1 interactive, 2 bulk: its priority levels) and
  ``timeout`` (microseconds from now, counted by Triton's queue), plus the same headers.

The names and numbers are serveshared.wire's, which the server reads them by.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from serveshared.wire import DEADLINE_HEADER, PRIORITY_HEADER, PRIORITY_KEY, TIMEOUT_KEY, Priority

CLASSES = {p.name.lower(): int(p) for p in Priority}  # interactive: 1, bulk: 2


@dataclass(frozen=True)
class Traffic:
    """A request's class (``None``: say nothing, the server takes it as interactive) and
    deadline (Unix seconds; ``None``: none). ``clock`` gives the time a Triton ``timeout`` is
    counted from (injected by tests)."""

    priority: str | None = None
    deadline: float | None = None
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        if self.priority is not None and self.priority not in CLASSES:
            raise ValueError(f"priority must be one of {sorted(CLASSES)}, got {self.priority!r}")

    @classmethod
    def within(
        cls,
        priority: str | None = None,
        deadline_ms: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> Traffic:
        """A class, and a deadline ``deadline_ms`` from now (None: none)."""
        deadline = None if deadline_ms is None else clock() + deadline_ms / 1000
        return cls(priority, deadline, clock)

    def headers(self) -> dict[str, str]:
        """``X-Priority`` and ``X-Deadline``, each only when set (both engines)."""
        out = {}
        if self.priority is not None:
            out[PRIORITY_HEADER] = self.priority
        if self.deadline is not None:
            out[DEADLINE_HEADER] = f"{self.deadline:.3f}"
        return out

    def parameters(self, timeout: bool = False) -> dict[str, int]:
        """The v2 request parameters: ``priority`` (both engines read it); with ``timeout``
        (a server that expires requests by it: Triton) also ``timeout``, the microseconds
        left now (at least 1: Triton reads 0 as "no timeout", and a deadline already past
        must still expire)."""
        out = {}
        if self.priority is not None:
            out[PRIORITY_KEY] = CLASSES[self.priority]
        if self.deadline is not None and timeout:
            out[TIMEOUT_KEY] = max(1, math.ceil((self.deadline - self.clock()) * 1_000_000))
        return out


INTERACTIVE = Traffic()  # nothing sent: what a person's single request is by default
BULK = Traffic("bulk")
