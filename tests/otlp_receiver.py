"""An OTLP/HTTP trace receiver on loopback, for the tests: ``POST /v1/traces`` (protobuf,
gzip or deflate where ``Content-Encoding`` says), each span kept as a plain dict.

    with OtlpReceiver() as rx:
        ...  # export to rx.url
        spans = rx.wait_for(lambda spans: len(spans) >= 3)

A threaded ``http.server``: it answers whatever event loop the gateway under test runs in.
"""

from __future__ import annotations

import asyncio
import gzip
import http.server
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

Span = dict[str, Any]


def value(v: AnyValue) -> Any:
    """An OTLP ``AnyValue`` as Python: arrays as lists, key-value lists as dicts."""
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind)


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in kvs}


def decode(body: bytes) -> list[Span]:
    """An ``ExportTraceServiceRequest``'s spans, each a dict with its resource's service name."""
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    out: list[Span] = []
    for rs in req.resource_spans:
        resource = attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append({
                    "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                    "parent_span_id": s.parent_span_id.hex() or None, "name": s.name, "kind": s.kind,
                    "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
                    "attributes": attributes(s.attributes), "status": s.status.code,
                    "status_message": s.status.message, "trace_state": s.trace_state,
                    "service": resource.get("service.name"), "resource": resource, "scope": ss.scope.name,
                })
    return out


class OtlpReceiver:
    """Collects the spans exported to it; ``url`` is its base (``/v1/traces`` is added by exporters)."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests: list[dict[str, str]] = []  # each export's headers
        self._cond = threading.Condition()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                encoding = self.headers.get("Content-Encoding", "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if self.path != "/v1/traces":
                    self._answer(404, b"")
                    return
                spans = decode(body)
                with receiver._cond:
                    receiver.requests.append(dict(self.headers.items()))
                    receiver.spans.extend(spans)
                    receiver._cond.notify_all()
                self._answer(200, ExportTraceServiceResponse().SerializeToString())

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, predicate: Callable[[list[Span]], Any], timeout: float = 10.0) -> list[Span]:
        """The spans so far, once ``predicate`` holds for them (a copy); AssertionError at ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                spans = list(self.spans)
                if predicate(spans):
                    return spans
                left = deadline - time.monotonic()
                if left <= 0:
                    names = [(s["service"], s["name"]) for s in spans]
                    raise AssertionError(f"no such spans within {timeout:g} s; got {names}")
                self._cond.wait(left)

    async def until(self, predicate: Callable[[list[Span]], Any], timeout: float = 10.0) -> list[Span]:
        """``wait_for`` from a coroutine: the event loop (and the gateway on it) runs meanwhile."""
        return await asyncio.to_thread(self.wait_for, predicate, timeout)

    def trace(self, trace_id: str) -> list[Span]:
        with self._cond:
            return [s for s in self.spans if s["trace_id"] == trace_id]
