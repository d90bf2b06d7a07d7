"""The JSON guard: a body is measured for size and nesting depth before ``json.loads`` runs,
so no request can make the parser recurse deeply or allocate without bound."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from servecore.config import HandlerConfig
from servecore.errors import InvalidRequest, PayloadTooLarge


def is_json(text: str | bytes | bytearray) -> bool:
    """Whether a text body is JSON (or a client's broken JSON): JSON sent under another type
    than ``application/json`` (or, on TorchServe, too deep for its own parser) arrives as text.
    Image formats never start with ``{`` or ``[``."""
    if isinstance(text, str):
        return text[:64].lstrip()[:1] in ("{", "[")
    return bytes(text[:64].lstrip()[:1]) in (b"{", b"[")


@dataclass(frozen=True)
class JsonDocument:
    """A JSON body an engine has already parsed (TorchServe parses ``application/json`` bodies
    itself, Triton hands over bytes): handed over as such, so that it is checked for depth
    (``checked``) rather than serialised again to go through ``load_json``."""

    value: Any

    def checked(self, config: HandlerConfig) -> Any:
        """The document, its nesting depth checked (400 above ``handler.max_json_depth``)."""
        if isinstance(self.value, (dict, list)):
            _check_depth(parsed_depth(self.value, config.max_json_depth + 1), config)
        return self.value


def load_json(text: str | bytes | bytearray, config: HandlerConfig) -> Any:
    """A JSON body (``is_json``) as parsed JSON, its size and nesting depth checked before
    ``json.loads`` runs."""
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    if len(data) > config.max_json_bytes:
        raise PayloadTooLarge(
            f"JSON body is {len(data)} bytes, more than the limit of "
            f"{config.max_json_bytes} (handler.max_json_bytes)"
        )
    _check_depth(json_depth(data, config.max_json_depth), config)
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"malformed JSON body: {exc}") from None


def _check_depth(depth: int, config: HandlerConfig) -> None:
    if depth > config.max_json_depth:
        raise InvalidRequest(
            f"JSON body is nested more than {config.max_json_depth} levels deep "
            "(handler.max_json_depth); a KServe v2 request needs 4"
        )


_STEP = np.zeros(256, dtype=np.int32)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1


def json_depth(text: bytes, at_most: int | None = None) -> int:
    """The deepest bracket nesting of a JSON text, brackets inside strings not counted; linear
    time, vectorised, no recursion, whatever the text (malformed text gives a number too, and is
    left for ``json.loads`` to refuse). With ``at_most``, a text with no more opening brackets
    than that is not scanned (its depth cannot exceed it): the common case costs two counts."""
    opening = text.count(b"[") + text.count(b"{")
    if at_most is not None and opening <= at_most:
        return opening
    # Escapes only occur inside strings; blank them out pairwise, left to right, so that every
    # remaining quote opens or closes a string.
    text = text.replace(b"\\\\", b"__").replace(b'\\"', b"__")
    codes = np.frombuffer(text, dtype=np.uint8)
    in_string = (np.cumsum(codes == ord('"'), dtype=np.int32) & 1).astype(bool)
    steps = np.where(in_string, 0, _STEP[codes])
    return int(np.cumsum(steps, dtype=np.int32).max(initial=0))


def parsed_depth(value: Any, stop: int) -> int:
    """The nesting depth of parsed JSON (a scalar is 0), found without recursion; stops
    looking once ``stop`` is reached."""
    deepest = 0
    pending = [(value, 1)] if isinstance(value, (dict, list)) else []
    while pending and deepest < stop:
        node, depth = pending.pop()
        deepest = max(deepest, depth)
        children = node.values() if isinstance(node, dict) else node
        pending.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest
