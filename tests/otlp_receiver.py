"""A real OTLP/HTTP trace receiver on 127.0.0.1 for tests (no stubs): what an OTLP backend is sent.

It takes `POST /v1/traces` bodies as OpenTelemetry's exporters send them (protobuf, optionally
gzipped), decodes them with the protocol's own generated classes (opentelemetry-proto), and keeps
every span as a dict: name, trace and span ids, parent id, kind, and attributes as plain values.

    with OTLPReceiver() as receiver:
        ...  # export to receiver.url
        receiver.spans
"""
from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                       ExportTraceServiceResponse)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class OTLPReceiver:
    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.resources: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "OTLPReceiver":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        with self._lock:
            for rs in request.resource_spans:
                resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                self.resources.append(resource)
                for scope in rs.scope_spans:
                    for span in scope.spans:
                        self.spans.append({"name": span.name, "trace_id": span.trace_id.hex(),
                                           "span_id": span.span_id.hex(), "parent_id": span.parent_span_id.hex(),
                                           "kind": span.kind, "resource": resource,
                                           "attributes": {a.key: _value(a.value) for a in span.attributes}})


def _handler(receiver: OTLPReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            receiver.take(body)
            payload = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler
