"""How an error message quotes a client's value, on both sides of the wire (the core's errors
and the shared v2 binary reader): its repr, cut to a short prefix with its full length, so an
error body never grows with what the client sent."""

from __future__ import annotations

from typing import Any

ECHO_CHARS = 40  # of a client's value quoted in a message


def echo(value: Any) -> str:
    """A client's value as an error message may quote it: its repr, cut to a short prefix
    with its full length when longer."""
    text = repr(value)
    return text if len(text) <= ECHO_CHARS else f"{text[:ECHO_CHARS]}... ({len(text)} chars)"
