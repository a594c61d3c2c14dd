"""A real OTLP/HTTP trace receiver for the tracing tests: POST /v1/traces bodies (protobuf, optionally gzip or
deflate) decoded with opentelemetry-proto's ExportTraceServiceRequest, kept, and their spans flattened to dicts."""

from __future__ import annotations

import gzip
import http.server
import threading
import zlib

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                       ExportTraceServiceResponse)

from tests.server import wait_for


class Receiver:
    """An OTLP/HTTP trace receiver: every export request decoded and kept; its spans flattened to dicts."""

    def __init__(self):
        self.requests: list[tuple[str, str, ExportTraceServiceRequest]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                data = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    data = gzip.decompress(data)
                elif encoding == "deflate":
                    data = zlib.decompress(data)
                message = ExportTraceServiceRequest()
                message.ParseFromString(data)
                with receiver.lock:
                    receiver.requests.append((self.path, self.headers.get("Content-Type", ""), message))
                body = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def spans(self) -> list[dict]:
        out = []
        with self.lock:
            requests = list(self.requests)
        for _, _, message in requests:
            for resource_spans in message.resource_spans:
                resource = _attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        out.append({"name": span.name, "trace": span.trace_id.hex(), "id": span.span_id.hex(),
                                    "parent": span.parent_span_id.hex(), "kind": span.kind,
                                    "status": span.status.code, "message": span.status.message,
                                    "start": span.start_time_unix_nano, "end": span.end_time_unix_nano,
                                    "trace_state": span.trace_state, "attributes": _attributes(span.attributes),
                                    "resource": resource, "scope": scope_spans.scope.name})
        return out

    def trace_of(self, request_id: str, children: int) -> tuple[dict, list[dict]]:
        """The root span of the request with this id and its children, once at least `children` arrived."""
        def found():
            spans = self.spans()
            roots = [s for s in spans if s["attributes"].get("qag.request_id") == request_id]
            if not roots:
                return None
            kids = [s for s in spans if s["parent"] == roots[0]["id"]]
            return (roots[0], sorted(kids, key=lambda s: s["start"])) if len(kids) >= children else None
        return wait_for(found, f"the spans of request {request_id}")


def _attributes(pairs) -> dict:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in pairs}
