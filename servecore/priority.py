"""Who is waiting for a request, and until when: its priority class and its deadline.

Every request has a class. ``INTERACTIVE`` (the default) is a person waiting for one photo;
``BULK`` is a collection job (``tsctl embed/tag``, the KServe Indexed Job) that can wait and
retry. The numbers are Triton's own ``priority`` request parameter (1 = highest level; 0 or
none = the model's default level, interactive), so one client sends the same value to either
engine: the KServe v2 parameter ``priority``, or the ``X-Priority`` header (``interactive``,
``bulk``, 1 or 2) where a request has no parameters (plain and v1 bodies).

A deadline is a moment (Unix time, seconds) after which the caller no longer wants the answer:
the ``X-Deadline`` header. A request still unstarted at its deadline is answered 504
``DeadlineExceeded`` without being decoded or computed. An absolute time, because TorchServe's
frontend passes its worker no arrival time to count a relative timeout from; Triton's own
``timeout`` parameter (microseconds from arrival) is honoured by Triton's queue.
"""

from __future__ import annotations

import math
import re
from typing import Any

from servecore.errors import InvalidParameter, echo
from serveshared.wire import DEADLINE_HEADER, PRIORITY_KEY, Priority

__all__ = ["PRIORITY_KEY", "Priority", "parse_deadline", "parse_priority"]

_NAMES = {p.name.lower(): p for p in Priority}


def parse_priority(value: Any) -> Priority:
    """``priority`` from a v2 parameter or ``X-Priority`` header: 1 / ``interactive``, 2 /
    ``bulk``; 0 (Triton's "the default level") is interactive. Anything else is a 400."""
    given = value
    if isinstance(value, (bytes, bytearray)):
        given = value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _NAMES:
            return _NAMES[text]
        if re.fullmatch(r"[0-9]{1,2}", text):
            value = int(text)
    if type(value) is int and value == 0:
        return Priority.INTERACTIVE
    if type(value) is int and value in Priority._value2member_map_:
        return Priority(value)
    raise InvalidParameter(
        f"priority must be 1 or 'interactive', 2 or 'bulk' (0: the default, interactive), "
        f"got {echo(given)}"
    )


def parse_deadline(value: Any) -> float:
    """``X-Deadline``: a Unix time in seconds (decimals allowed), e.g. ``1764067200.25``."""
    given = value
    if isinstance(value, (bytes, bytearray)):
        given = value = value.decode("utf-8", "replace")
    try:
        moment = float(value.strip()) if isinstance(value, str) else float("nan")
    except ValueError:
        moment = float("nan")
    if not math.isfinite(moment) or moment <= 0:
        raise InvalidParameter(
            f"{DEADLINE_HEADER} must be a Unix time in seconds such as 1764067200.25, "
            f"got {echo(given)}"
        )
    return moment
