"""The one per-request failure boundary: whatever goes wrong while one request is opened,
decoded or explained becomes that request's ``Failed`` and nothing else's.

``attempt`` runs one step of one request and catches any exception; ``each_image`` runs a step
on each of a request's images and says which one failed ("image k of n"). Anything but a
``RequestError`` is a bug of ours: logged with the request id, answered 500 for that request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from servecore.errors import InternalError, RequestError, detached
from servecore.stages import Failed

logger = logging.getLogger(__name__)

T = TypeVar("T")
X = TypeVar("X")


def attempt(request_id: str, stage: str, step: Callable[[], T]) -> T | Failed:
    """``step()``, or the request's ``Failed`` when it raises (``stage`` names the step for an
    unexpected error's message: ``parsing``, ``decoding``, ...)."""
    try:
        return step()
    except Exception as exc:  # noqa: BLE001 - the last line of defence, per request
        return Failed(request_id, detached(as_request_error(exc, stage, request_id)))


def each_image(request_id: str, stage: str, items: Sequence[X], step: Callable[[X], T]) -> list[T]:
    """``step`` of each of a request's images, in order; the first failure is raised as the
    request's error, saying which image it was when there are several."""
    results = []
    for k, item in enumerate(items):
        try:
            results.append(step(item))
        except Exception as exc:  # noqa: BLE001 - converted, then raised to the boundary
            raise as_request_error(exc, stage, request_id).of_image(k, len(items)) from None
    return results


def as_request_error(exc: Exception, stage: str, request_id: str) -> RequestError:
    """``exc`` as the request's error. Anything but a ``RequestError`` is a bug of ours:
    logged with the request id and answered 500 for this request alone, never a failed
    batch."""
    if isinstance(exc, RequestError):
        return exc
    logger.error(
        "request %s: unexpected %s while %s", request_id, type(exc).__name__, stage, exc_info=exc
    )
    return InternalError(
        f"unexpected error while {stage} this request "
        f"({type(exc).__name__}); request id {request_id}"
    )
