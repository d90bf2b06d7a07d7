"""The KServe v2 binary tensor extension, written and read in one place: a JSON header whose
inputs say how many raw bytes each takes (``parameters.binary_data_size``), then those bytes in
input order, and the header's length in ``Inference-Header-Content-Length``. A client writes a
request (``binary_tensor``, ``bytes_elements``, ``binary_body``) and reads an answer's binary
outputs (``read_outputs``, written the same way by Triton and by our HTTP edge,
``servecore.edges.bodies``); a server reads a request back (``split_body``, ``fill_inputs``,
``elements_of``: ``servecore.parse`` answers their ``MalformedBinary`` 400). No numpy or torch
here: ``tsctl``'s collection image has neither."""

from __future__ import annotations

import json
from array import array
from collections.abc import Sequence
from typing import Any

from serveshared.quote import echo

HEADER_LENGTH = "Inference-Header-Content-Length"
# Output parameters: the request's ``binary_data_output`` asks for every output as raw bytes,
# an output's own ``binary_data`` for that one (Triton's names, read by ``servecore.parse``).
BINARY_OUTPUT, BINARY_DATA = "binary_data_output", "binary_data"


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


class MalformedBinary(ValueError):
    """A body or tensor that does not follow the extension's layout; the message says how (a
    server answers it 400, ``servecore.parse``)."""


def split_body(
    body: bytes | bytearray | memoryview, header_length: Any
) -> tuple[bytes, memoryview]:
    """A request body as its JSON header and a view of the bytes after it, not a copy: the
    tensors' bytes are read out once, element by element (``elements_of``).
    ``header_length``: the ``Inference-Header-Content-Length`` header's value, as text or
    bytes."""
    text = header_length
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("latin-1")
    length = int(text) if isinstance(text, str) and text.strip().isdigit() else None
    if length is None or length > len(body):
        raise MalformedBinary(
            f"{HEADER_LENGTH} must be the length of the body's JSON header (0..{len(body)}), "
            f"got {echo(header_length)}"
        )
    view = memoryview(body)
    return bytes(view[:length]), view[length:]


def fill_inputs(header: dict, data: memoryview) -> dict:
    """The JSON header with each input's ``binary_data_size`` bytes (in input order) put in
    as its ``data`` (a ``memoryview`` of ``data``, not a copy); ``MalformedBinary`` when the
    sizes and the data disagree."""
    inputs, at = header.get("inputs"), 0
    for i, tensor in enumerate(inputs if isinstance(inputs, list) else []):
        params = tensor.get("parameters") if isinstance(tensor, dict) else None
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if size is None:
            continue
        if type(size) is not int or size < 0 or at + size > len(data):
            raise MalformedBinary(
                f"inputs[{i}].parameters.binary_data_size is {echo(size)}, but the body "
                f"holds {len(data) - at} more bytes after its header"
            )
        tensor["data"] = data[at : at + size]
        at += size
    if at != len(data):
        raise MalformedBinary(
            f"the body holds {len(data) - at} bytes after its header that no input's "
            "binary_data_size claims"
        )
    return header


def elements_of(data: bytes | memoryview, where: str = "a BYTES tensor") -> list[bytes]:
    """A ``BYTES`` tensor's raw data back as its elements (``bytes_elements`` undone), each
    copied out once."""
    elements, at = [], 0
    while at < len(data):
        size = int.from_bytes(data[at : at + 4], "little") if at + 4 <= len(data) else -1
        if size < 0 or at + 4 + size > len(data):
            raise MalformedBinary(
                f"{where}'s binary data is cut short at byte {at}: each element is a 4-byte "
                "little-endian length and that many bytes"
            )
        elements.append(bytes(data[at + 4 : at + 4 + size]))
        at += 4 + size
    return elements


def read_outputs(body: bytes, header_length: int | None) -> list[dict[str, Any]]:
    """A v2 answer's ``outputs``, each with its ``data`` as JSON would give it (a flat list:
    floats for ``FP32``, text for ``BYTES``, bools for ``BOOL``), whether it came as JSON
    (``header_length`` None) or as raw bytes after the JSON header."""
    if header_length is None:
        return json.loads(body)["outputs"]
    outputs = json.loads(body[:header_length])["outputs"]
    at = header_length
    for output in outputs:
        size = (output.get("parameters") or {}).get("binary_data_size")
        if size is None:
            continue
        raw, at = body[at : at + size], at + size
        kind = output["datatype"]
        if kind == "FP32":
            values = array("f")
            values.frombytes(raw)
            if values.itemsize != 4 or array("H", [1]).tobytes() != b"\x01\x00":
                raise ValueError("FP32 outputs are read on little-endian hosts only")
            output["data"] = values.tolist()
        elif kind == "BYTES":
            output["data"] = [e.decode() for e in elements_of(raw)]
        elif kind == "BOOL":
            output["data"] = [b != 0 for b in raw]
        else:
            raise ValueError(f"no reader for binary {kind} output {output.get('name')!r}")
    return outputs
