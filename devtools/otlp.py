"""A small OTLP/HTTP trace receiver on a loopback port: what the tracing tests check spans
against and what ``make bench-ceiling --tracing`` points its traced servers at.

``POST /v1/traces``, the body an ``ExportTraceServiceRequest`` (gzip or not), each answered
200 with an empty ``ExportTraceServiceResponse``. With ``keep`` every span received is kept
as a dict in ``spans``; without it only ``exports`` (posts) and ``spans_received`` are counted,
so that a benchmark's receiver costs its process little. ``hold_s``: each export answered after
that long (a slow collector); ``close``/``open``: the port shut (a collector down) and opened
again, the same port.
"""

from __future__ import annotations

import contextlib
import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

ANSWER = ExportTraceServiceResponse().SerializeToString()


def attributes(values) -> dict:
    """OTLP key-values as a plain dict."""
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in values}


class Receiver:
    """The collector (the module's docstring); ``url`` is what OTEL_EXPORTER_OTLP_ENDPOINT
    takes. Opened as it is made; ``close`` (or leaving ``with``) shuts it."""

    def __init__(self, keep: bool = True) -> None:
        self.keep, self.spans, self.exports, self.spans_received = keep, [], 0, 0
        self.hold_s, self.woken = 0.0, threading.Event()
        self.server: ThreadingHTTPServer | None = None
        self.port = 0
        self.open()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def open(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.woken.wait(receiver.hold_s)
                receiver.received(ExportTraceServiceRequest.FromString(body))
                with contextlib.suppress(OSError):  # a held export's client gave up
                    self.send_response(200)
                    self.send_header("Content-Type", "application/x-protobuf")
                    self.send_header("Content-Length", str(len(ANSWER)))
                    self.end_headers()
                    self.wfile.write(ANSWER)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *_exc) -> None:
        self.woken.set()  # held exports answer now
        self.close()

    def received(self, request: ExportTraceServiceRequest) -> None:
        self.exports += 1
        for resource_spans in request.resource_spans:
            resource = attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                self.spans_received += len(scope_spans.spans)
                if self.keep:
                    self.spans += [span(s, resource["service.name"]) for s in scope_spans.spans]


def span(s, service: str) -> dict:
    """One received span as the tests read it."""
    return {
        "service": service,
        "name": s.name,
        "trace_id": s.trace_id.hex(),
        "span_id": s.span_id.hex(),
        "parent": s.parent_span_id.hex(),
        "kind": s.kind,
        "start": s.start_time_unix_nano,
        "end": s.end_time_unix_nano,
        "status": s.status.code,
        "attributes": attributes(s.attributes),
        "links": [
            (link.trace_id.hex(), link.span_id.hex(), attributes(link.attributes))
            for link in s.links
        ],
    }
