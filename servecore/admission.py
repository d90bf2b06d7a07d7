"""Which requests' work a batch runs within its budgets, and fairly from one batch to the next.

A batch runs at most ``handler.max_batch_images`` forward rows, decodes at most
``max_batch_pixels`` pixels and spends at most ``explain.max_passes_per_batch`` explanation
passes; the requests that do not fit get 503 ``Overloaded`` with ``Retry-After`` (the same
request fits alone or in a lighter batch). Within a batch interactive requests go before bulk
ones (``servecore.priority``), then the cheapest first, so ordinary photos are never crowded out
by expensive requests. Across batches a refused request
gains priority: its retry (the same images, recognised by ``Opened.fingerprint``) is admitted before
any request that was never refused, the oldest refusal first. Cheapest-first alone starved the
largest request a config allows under a steady stream of slightly smaller ones (issue #26: 46
refusals out of 46 in 92 s).

Bulk requests also have a share (issue #37): while an interactive request was seen within
``handler.interactive_window_ms``, bulk requests together get at most
``handler.bulk_batch_images`` forward rows of a batch (the first in line always), so a person's
photo waits behind a few bulk rows, not a full batch; with nobody about, a collection job has
the whole batch. A batch already running is never pre-empted.

The memory is per worker (a retry that lands on another worker of the model starts afresh
there) and bounded: ``REMEMBERED`` fingerprints, the least recently refused forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from servecore.errors import Overloaded
from servecore.priority import Priority
from servecore.stages import Admitted, Failed, Opened

REMEMBERED = 1024  # refused requests remembered per worker (16 bytes each, plus the dict's)


@dataclass(frozen=True)
class Budget:
    """One of a batch's budgets: ``handler.<setting>``, ``limit`` in ``unit`` and what each
    opened request costs of it."""

    setting: str
    unit: str
    limit: int
    cost: Callable[[Opened], int]


def admit(
    costs: Sequence[int],
    budget: int,
    waiting: Sequence[int | None] | None = None,
    classes: Sequence[Priority] | None = None,
) -> list[bool]:
    """Which requests get their work done in this batch, given each one's cost. Order: by
    class (``classes``; None: all interactive), interactive first; within a class the requests
    ``waiting`` since an earlier refusal (a sequence number, smaller = refused earlier), oldest
    first; then the others, cheapest first. Each is admitted in that order if it fits in what
    is left of ``budget``; the first one always, whatever its cost."""
    waiting = waiting or [None] * len(costs)
    classes = classes or [Priority.INTERACTIVE] * len(costs)
    never = float("inf")
    order = sorted(
        range(len(costs)),
        key=lambda i: (classes[i], never if waiting[i] is None else waiting[i], costs[i]),
    )
    admitted = [False] * len(costs)
    spent = 0
    for i in order:
        if spent + costs[i] > budget and spent > 0:
            continue  # a cheaper one further on may still fit
        admitted[i] = True
        spent += costs[i]
    return admitted


class Admission:
    """A worker's budgets over time: ``within`` admits one budget's work of a batch, refusing
    (and remembering) what does not fit; ``bulk_share`` holds bulk requests to their share
    while interactive traffic is about; ``served`` forgets the requests that got their turn."""

    def __init__(self, remembered: int = REMEMBERED) -> None:
        self.remembered = remembered
        self._refused: OrderedDict[bytes, int] = OrderedDict()  # fingerprint -> first refusal
        self._refusals = 0
        self._interactive_at: float | None = None  # when this worker last saw one (clock s)

    def within(
        self, requests: Sequence[Admitted], budget: Budget, among: Priority | None = None
    ) -> list[Admitted]:
        """``requests`` with the opened ones that do not fit ``budget`` replaced by their
        503 ``Failed``; ``among``: only the requests of that class share the budget (the
        others pass untouched)."""
        opened = [
            (i, r)
            for i, r in enumerate(requests)
            if isinstance(r, Opened) and (among is None or r.priority is among)
        ]
        costs = [budget.cost(r) for _, r in opened]
        waiting = [self._refused.get(r.fingerprint) for _, r in opened] if self._refused else None
        fitting = admit(costs, budget.limit, waiting, [r.priority for _, r in opened])
        result = list(requests)
        for (i, request), cost, fits in zip(opened, costs, fitting):
            if not fits:
                self._refuse(request.fingerprint)
                result[i] = Failed(
                    request.request_id,
                    Overloaded(
                        f"this batch's budget of {budget.limit} {budget.unit} "
                        f"(handler.{budget.setting}) was taken by other requests; this one needs "
                        f"{cost}: retry"
                    ),
                )
        return result

    def bulk_share(
        self, requests: Sequence[Admitted], budget: Budget, window_s: float, now: float
    ) -> list[Admitted]:
        """``requests`` with the bulk ones beyond ``budget`` refused while an interactive
        request was seen in the last ``window_s`` seconds, this batch included (``now``: the
        clock's time); all of them unchanged otherwise, or when ``budget.limit`` is 0."""
        if any(isinstance(r, Opened) and r.priority is Priority.INTERACTIVE for r in requests):
            self._interactive_at = now
        about = self._interactive_at is not None and now - self._interactive_at <= window_s
        if not about or budget.limit == 0:
            return list(requests)
        return self.within(requests, budget, among=Priority.BULK)

    def served(self, requests: Sequence[Admitted]) -> None:
        """The opened ones among ``requests`` got their turn: no priority owed any more."""
        if not self._refused:  # the common case: nobody waits, no fingerprint to compute
            return
        for request in requests:
            if isinstance(request, Opened):
                self._refused.pop(request.fingerprint, None)

    def _refuse(self, key: bytes) -> None:
        if key in self._refused:
            self._refused.move_to_end(key)  # keeps its first refusal: its place in the line
        else:
            self._refused[key] = self._refusals
            self._refusals += 1
        while len(self._refused) > self.remembered:
            self._refused.popitem(last=False)
