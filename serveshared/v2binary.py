"""The KServe v2 binary tensor extension as a client writes it (Triton's HTTP frontend,
tritonclient and ``servecore.crops`` read it back): a JSON header whose inputs say how many
raw bytes each takes (``parameters.binary_data_size``), then those bytes in input order, and
the header's length in ``Inference-Header-Content-Length``. No numpy or torch here: ``tsctl``'s
collection image has neither."""

from __future__ import annotations

import json
from collections.abc import Sequence

HEADER_LENGTH = "Inference-Header-Content-Length"


def binary_tensor(name: str, datatype: str, shape: Sequence[int], nbytes: int) -> dict:
    """One input's entry in the header: its raw bytes, ``nbytes`` of them, follow it."""
    return {
        "name": name,
        "datatype": datatype,
        "shape": [int(n) for n in shape],
        "parameters": {"binary_data_size": nbytes},
    }


def bytes_elements(elements: Sequence[bytes]) -> bytes:
    """A ``BYTES`` tensor's raw data: each element its 4-byte little-endian length, then it."""
    return b"".join(len(e).to_bytes(4, "little") + e for e in elements)


def binary_body(header: dict, data: bytes) -> tuple[bytes, dict[str, str]]:
    """The request's body (``header`` as JSON, then ``data``: every binary input's bytes in
    input order) and the headers it needs."""
    text = json.dumps(header).encode()
    return text + data, {
        HEADER_LENGTH: str(len(text)),
        "Content-Type": "application/octet-stream",
    }
