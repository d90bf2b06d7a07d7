"""The core's own request values: what one request asks for (``ParsedRequest``), whatever wire
format and engine it came by, and the readers of the fields every format shares (``topk``,
base64 images, the image count). An edge hands its request over as a ``Payload``, a value with
``parse(config)`` (``servecore.edges``: an HTTP request, a tensor request); the core calls it
inside the request's own failure boundary.

Explanation parameters are collected as sent (``ParsedRequest.options``); ``servecore.explain``
reads them.
"""

from __future__ import annotations

import base64
import binascii
import enum
import re
import typing
from dataclasses import dataclass, field
from typing import Any

from servecore.config import HandlerConfig, Output
from servecore.errors import InvalidParameter, InvalidRequest, PayloadTooLarge, echo
from servecore.priority import Priority

# Explanation parameters (``/explanations``, KServe v1 ``:explain``): a form field, a JSON
# field or a v1 ``parameters`` key, passed on unread to servecore.explain.
EXPLAIN_KEYS = ("target", "method", "n_steps", "internal_batch_size", "png")


class Protocol(enum.Enum):
    """The wire format a request came in, and so the one its answer goes out in."""

    PLAIN = "plain"  # raw body, multipart field, or {"data": b64}: one image, bare answer
    V1 = "v1"  # KServe v1: {"predictions": [...]}
    V2 = "v2"  # KServe v2 / Open Inference Protocol: named output tensors


@dataclass(frozen=True)
class OutputSpec:
    """One KServe v2 output the client asked for; ``top_k`` only for ``tags``; ``binary``: its
    ``parameters.binary_data`` (None: not said, the request's ``binary_data_output`` decides)."""

    output: Output
    top_k: int | None = None
    binary: bool | None = None


@dataclass(frozen=True)
class ParsedRequest:
    """What one request asks for: its encoded images (or, ``crops``, each image's crop as
    ``servecore.crops`` lays it out) and how to answer."""

    protocol: Protocol
    images: list[bytes]
    top_k: int | None = None
    request_id: str | None = None
    outputs: tuple[OutputSpec, ...] = field(default_factory=tuple)
    options: dict[str, Any] = field(default_factory=dict)  # EXPLAIN_KEYS given, as sent
    priority: Priority | None = None  # the body's parameters.priority; None: not given
    crops: bool = False  # images are preprocessed crops, not encoded images
    binary_output: bool = False  # v2 parameters.binary_data_output: outputs as raw bytes

    def binary(self, output: Output) -> bool:
        """Whether ``output`` goes back in the v2 binary tensor extension: its own
        ``binary_data``, else the request's ``binary_data_output``."""
        own = next((o.binary for o in self.outputs if o.output is output), None)
        return self.binary_output if own is None else own

    def tags_top_k(self, default: int) -> int:
        """How many tags to answer: a v2 ``tags`` output's own ``topk``, else the request's,
        else the model's ``default``."""
        own = next((o.top_k for o in self.outputs if o.output is Output.TAGS and o.top_k), None)
        return own or self.top_k or default

    def wants(self, output: Output, task: Output) -> bool:
        """Whether the answer carries ``output``: the v2 outputs asked for, else the task's."""
        if self.outputs:
            return any(o.output is output for o in self.outputs)
        return output is task


class Payload(typing.Protocol):
    """A request as an edge hands it to the core: ``parse`` makes it the core's value, or
    raises the request's ``RequestError``."""

    def parse(self, config: HandlerConfig) -> ParsedRequest: ...


def parse_top_k(value: Any) -> int:
    """``topk`` from a form field, header or JSON value: a positive integer (the model's class
    count bounds it once the model is known: ``check_top_k``)."""
    given = value
    if isinstance(value, (bytes, bytearray)):
        given = value = value.decode("utf-8", "replace")
    if isinstance(value, str) and re.fullmatch(r"\s*\+?[0-9]{1,7}\s*", value):
        value = int(value)
    if type(value) is not int or value < 1:
        raise InvalidParameter(f"topk must be a positive integer, got {echo(given)}")
    return value


def check_top_k(request: ParsedRequest, classes: int, what: str = "the model's classes") -> None:
    """Refuse (400) a ``topk`` above ``classes`` (``what`` they are: the model's, or its
    largest head's), the request's or a v2 output's."""
    for k in (request.top_k, *(o.top_k for o in request.outputs)):
        if k is not None and k > classes:
            raise InvalidParameter(f"topk must be an integer from 1 to {classes} ({what}), got {k}")


def decode_base64(value: Any, where: str) -> bytes:
    """Strict base64 (standard or URL-safe alphabet, optional ``data:...;base64,`` prefix)."""
    if not isinstance(value, str):
        raise InvalidRequest(f"{where} must be a base64 string, got {type(value).__name__}")
    text = value.strip()
    if text.startswith("data:") and ";base64," in text[:100]:
        text = text.split(",", 1)[1]
    text = "".join(text.split())  # line-wrapped base64 (e.g. `base64` without -w0)
    if "-" in text or "_" in text:
        text = text.replace("-", "+").replace("_", "/")
    try:
        data = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequest(f"{where} is not valid base64 ({exc})") from None
    if not data:
        raise InvalidRequest(f"{where} is empty: expected a base64-encoded image")
    return data


def count_images(count: int, config: HandlerConfig) -> None:
    """Refuse a request with more images than one may carry, before any of them is read."""
    if count > config.max_images_per_request:
        raise PayloadTooLarge(
            f"request carries {count} images, more than the limit of "
            f"{config.max_images_per_request} (handler.max_images_per_request); split it into "
            "several requests"
        )
