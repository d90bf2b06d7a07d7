"""TorchServe's requests as the model's ``Incoming``, and which batch is a describe call.

TorchServe hands a request over as a dict (its "row"): ``body`` for a raw body, one key per
multipart field; JSON arrives parsed. ``http_request`` unpacks it, here and nowhere else."""

from __future__ import annotations

from typing import Any

from servecore.edges.http import IMAGE_FIELD, Body, HttpEdge, HttpRequest
from servecore.edges.jsonguard import JsonDocument
from servecore.stages import Incoming
from serveshared.v2binary import HEADER_LENGTH as LENGTH
from serveshared.wire import DEADLINE_HEADER, PRIORITY_HEADER, TOP_K_HEADER

BODY_KEY = "body"  # TorchServe's name for a raw request body in its row
PAYLOAD_KEYS = (BODY_KEY, IMAGE_FIELD)
# TorchServe 0.12 sets this property to "True" on /explanations and KServe v1 :explain, and to
# "False" otherwise, whatever header a client sends.
EXPLAIN_PROPERTY = "explain"


def incoming(edge: HttpEdge, context, idx: int, row: dict) -> Incoming:
    """Request ``idx`` of TorchServe's batch, decoded by the HTTP ``edge``: its id (for the
    logs), its payload, its route, its class and deadline (``X-Priority``, ``X-Deadline``: a
    bad one fails it alone), its trace context (``traceparent``, ``tracestate``)."""
    properties = _properties(context, idx)
    named = {k.lower(): v for k, v in properties.items() if isinstance(v, str)}  # any case
    request = http_request(row, named.get(TOP_K_HEADER.lower()), named.get(LENGTH.lower()))
    headers = {name: named.get(name.lower()) for name in (PRIORITY_HEADER, DEADLINE_HEADER)}
    request_id = str((context.request_ids or {}).get(idx, "?"))
    explain = properties.get(EXPLAIN_PROPERTY) == "True"
    return edge.decode(request_id, request, headers, explain).traced(named)


def http_request(row: dict, top_k: str | None = None, length: str | None = None) -> HttpRequest:
    """TorchServe's row as the core's ``HttpRequest``: ``body`` is the raw body, every other key
    a form field; JSON TorchServe parsed (any value but text) goes on as a ``JsonDocument``,
    checked for depth by the core, not serialised again (that would parse every JSON body twice
    and size-check a text the client never sent). ``length``: Inference-Header-Content-Length."""
    return HttpRequest(
        body=_payload(row[BODY_KEY]) if BODY_KEY in row else None,
        form={k: _payload(v) if k == IMAGE_FIELD else v for k, v in row.items() if k != BODY_KEY},
        top_k_header=top_k,
        header_length=length,  # a v2 body in the binary tensor extension
    )


def _payload(value: Any) -> Body:
    return value if isinstance(value, (bytes, bytearray, str)) else JsonDocument(value)


def _properties(context, idx: int) -> dict:
    """Request ``idx``'s headers and TorchServe's properties, as sent (none: {})."""
    processor = context.request_processor
    if not processor or idx >= len(processor) or processor[idx] is None:
        return {}
    return processor[idx].get_request_properties()


def is_describe(context) -> bool:
    """The management API's describe call (``?customized=true``: one request, no image, its
    ``describe`` property "True"); a ``describe: True`` header on a prediction is a header."""
    if len(context.request_processor or []) != 1:
        return False
    properties = _properties(context, 0)
    return properties.get("describe") == "True" and not any(k in properties for k in PAYLOAD_KEYS)
