"""OpenTelemetry traces: one trace per observed request, after the GenAI semantic conventions,
exported over OTLP/HTTP (protobuf) by the ``otel`` extra (``opentelemetry-sdk``,
``opentelemetry-exporter-otlp-proto-http``).

Nothing of ``opentelemetry`` is imported until a ``Tracing`` is made (``make``, when ``wanted``
says so): a gateway with tracing off never loads it. ``Tracing`` keeps its own
``TracerProvider``, never the process's global one, so two gateways in one process export each
under its own service name.

The observe middleware calls ``begin`` when a request comes (its root span starts, its parent
taken from an incoming W3C ``traceparent`` / ``tracestate``), passes ``forward``'s header pair
on to an upstream server (``base/tracecontext.FORWARD``), and calls ``end`` once when it ends.
The child spans are made only then, from the ``Observation``'s monotonic marks (each converted
to epoch time by the offset between the two clocks taken at ``begin``), so a request costs
nothing between the two, and only the spans whose marks exist are made.

The spans (times in the ``Observation``'s marks):

=======================  ========  ==========================================  =========================
span                     kind      from -> to                                  attributes
=======================  ========  ==========================================  =========================
``{op} {model}``, else   SERVER    started -> end                              ``gen_ai.*``, ``http.*``,
``{METHOD} {route}``                                                           ``error.type``,
                                                                               ``gguf_gateway.*`` (below)
``queue``                INTERNAL  queued -> admitted, else leased, else end
``load`` (in ``queue``)  INTERNAL  load.began (not before queued) -> ended     ``gguf_gateway.load.*``
``prompt``               INTERNAL  admitted -> first token, else end           ``gguf_gateway.prompt.*``
``generation``           INTERNAL  first token -> last token, else end         ``gen_ai.usage.*``,
                                                                               ``gguf_gateway.speculation.*``
``execute_tool {tool}``  INTERNAL  a hosted tool's call, its start -> its end  ``gen_ai.tool.*``,
                                                                               ``gguf_gateway.tool.*``
=======================  ========  ==========================================  =========================

``{op}`` is ``gen_ai.operation.name`` (``ROUTE_OPERATIONS``); a route with none is named by
method and route (HTTP's convention), or by method alone where no route matched.

The root's attributes: ``http.request.method``, ``http.route``, ``http.response.status_code``,
``error.type`` (from 400: the error's code, else the status); on a GenAI route also
``gen_ai.operation.name``, ``gen_ai.provider.name`` (``llama.cpp``), ``gen_ai.request.model`` (as
asked), ``gen_ai.response.model`` (what served), ``gen_ai.request.max_tokens`` / ``.seed`` /
``.stop_sequences`` where set and ``.temperature`` / ``.top_p`` / ``.top_k`` /
``.frequency_penalty`` / ``.presence_penalty`` where the caller or the model's defaults set them,
``gen_ai.usage.input_tokens`` (cached ones included) and ``.output_tokens`` (not on embeddings
and rerank), ``gen_ai.usage.cache_read.input_tokens`` and ``.reasoning.output_tokens`` where
not 0, ``gen_ai.response.finish_reasons``, ``gen_ai.response.time_to_first_chunk`` (seconds);
and the gateway's own: ``gguf_gateway.request_id``, ``gguf_gateway.principal`` (the key's name),
``gguf_gateway.client_disconnected`` (where the caller left). The children's:
``gguf_gateway.load.bytes`` (the model's files), ``.load.source`` (``ModelSpec.source``),
``.load.duration_s`` (the whole load's, which may have begun before the request);
``gguf_gateway.prompt.tokens_read``, ``.prompt.tokens_reused``, ``.prompt.cache_source``
(slot, ram, disk); ``gen_ai.usage.output_tokens``, and where not 0
``gen_ai.usage.reasoning.output_tokens``, ``gguf_gateway.speculation.drafted`` and
``.speculation.accepted`` (drafted tokens kept).

The root's status is ERROR from 500 up; a 4xx sets only
``error.type`` (HTTP's convention for servers). ``obs.trace_id`` is set only where the root
span is sampled: the event then names a trace a collector has.

Bounds: what a caller sent is quoted in a span only cut (a model's name to
``base.errors.MAX_MODEL_NAME``, in the span's name too), and the SDK's own limits hold every
span (``LIMITS``: each attribute's length, how many attributes, events and links), so the
exporter's queue holds a bounded number of bounded spans. At the end (``shutdown``) what is
still queued is exported within a bound the app gives (within its drain time): past it, the
exporter stops retrying and what is left is dropped, so a collector that is down does not hold
the gateway's exit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..base.errors import MAX_MODEL_NAME

if TYPE_CHECKING:
    from ..models.config.specs import OtelConfig
    from .events import Observation

log = logging.getLogger(__name__)

INSTALL = "pip install 'gguf-gateway[otel]'"
PROVIDER = "llama.cpp"  # gen_ai.provider.name: no well-known value names it; the semconv allows our own
DEFAULT_SERVICE = "gguf-gateway"
PREFIX = "gguf_gateway."

_CHAT, _TEXT, _EMBED, _RERANK = "chat", "text_completion", "embeddings", "rerank"
ROUTE_OPERATIONS: dict[str, str] = {
    "/v1/chat/completions": _CHAT, "/v1/messages": _CHAT, "/v1/responses": _CHAT, "/api/chat": _CHAT,
    "/v1/completions": _TEXT, "/api/generate": _TEXT, "/infill": _TEXT, "/v1/fim/completions": _TEXT,
    "/v1/embeddings": _EMBED, "/api/embed": _EMBED, "/api/embeddings": _EMBED,
    **{f"{prefix}/{name}": _RERANK for prefix in ("", "/v1") for name in ("rerank", "reranking")},
}
# GenerationRequest's sampling fields -> gen_ai.request.*; these are told only where the caller or
# the model's defaults set them (``given``): the rest are the gateway's own defaults
_GIVEN_FIELDS = ("temperature", "top_p", "top_k", "frequency_penalty", "presence_penalty")

# the SDK's span limits (``SpanLimits``): every string attribute (each string of a list too) cut
# to MAX_ATTRIBUTE_LENGTH characters, at most MAX_ATTRIBUTES attributes and MAX_EVENTS events
# and links on a span
MAX_ATTRIBUTE_LENGTH = 1024
MAX_ATTRIBUTES = 64
MAX_EVENTS = 16
# the methods HTTP's conventions name; any other is told as ``_OTHER`` (a span named ``HTTP``)
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"})
SHUTDOWN_SECONDS = 5.0  # at most, for the spans still queued at the end (the app: within its drain time too)
SHUTDOWN_GRACE = 1.0  # seconds after the bound for the exporter to stop once told to

_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_warned = False  # the environment asked for traces and the extra is missing: said once


class TracingUnavailable(RuntimeError):
    """``server.otel`` asked for traces and the ``otel`` extra is not installed."""


def wanted(config: OtelConfig, environ: Mapping[str, str]) -> bool:
    """Whether traces are on: ``server.otel.enabled`` where it says, else the SDK's standard
    variables (an OTLP endpoint set, the SDK not disabled, the traces exporter not ``none``)."""
    if config.enabled is not None:
        return config.enabled
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(environ.get(v, "").strip() for v in _ENDPOINT_VARIABLES)


def make(config: OtelConfig, environ: Mapping[str, str]) -> Tracing | None:
    """The app's tracing, or None where it is off. Asked for by models.yaml and not installed:
    ``TracingUnavailable``; asked for by the environment only: a warning (once), and no traces."""
    global _warned
    if not wanted(config, environ):
        return None
    try:
        return Tracing(config)
    except ImportError as exc:
        if config.enabled:
            raise TracingUnavailable(f"server.otel is enabled but OpenTelemetry is not installed "
                                     f"({exc}); {INSTALL}") from None
        if not _warned:
            _warned = True
            log.warning("the environment asks for traces (an OTEL_EXPORTER_OTLP_*ENDPOINT) but OpenTelemetry "
                        "is not installed: no traces (%s)", INSTALL)
        return None


def _sampler(config: OtelConfig) -> Any:
    """``server.otel.sampler`` (and its ratio) as the SDK's sampler; None: the SDK's, from
    ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG``."""
    if config.sampler is None:
        return None
    from opentelemetry.sdk.trace import sampling

    ratio = 1.0 if config.sampler_arg is None else config.sampler_arg
    return {"always_on": sampling.ALWAYS_ON, "always_off": sampling.ALWAYS_OFF,
            "parentbased_always_on": sampling.DEFAULT_ON, "parentbased_always_off": sampling.DEFAULT_OFF,
            "traceidratio": sampling.TraceIdRatioBased(ratio),
            "parentbased_traceidratio": sampling.ParentBasedTraceIdRatio(ratio)}[config.sampler]


def _resource(config: OtelConfig) -> Any:
    """service.name: models.yaml's, else the SDK's (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``),
    else ``gguf-gateway``; service.version: the package's."""
    from importlib import metadata

    from opentelemetry.sdk.resources import Resource

    attributes: dict[str, Any] = {}
    name = config.service_name or str(Resource.create({}).attributes.get("service.name", ""))
    attributes["service.name"] = name if name and not name.startswith("unknown_service") else DEFAULT_SERVICE
    try:
        attributes["service.version"] = metadata.version("gguf-gateway")
    except metadata.PackageNotFoundError:
        pass
    return Resource.create(attributes)


def _endpoint(config: OtelConfig) -> str | None:
    """The traces URL: models.yaml's base URL and ``/v1/traces``; None: the SDK's, from
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``."""
    if not config.endpoint:
        return None
    base = config.endpoint.rstrip("/")
    return base if base.endswith("/v1/traces") else base + "/v1/traces"


class Tracing:
    """An app's tracer: its own provider, batch processor and OTLP/HTTP exporter. ``begin`` and
    ``end`` run on the event loop; the processor exports from its own thread."""

    def __init__(self, config: OtelConfig):
        # every import first: a missing extra raises ImportError before anything is made
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import SpanLimits, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        limits = SpanLimits(max_attributes=MAX_ATTRIBUTES, max_span_attributes=MAX_ATTRIBUTES,
                            max_events=MAX_EVENTS, max_links=MAX_EVENTS, max_event_attributes=MAX_ATTRIBUTES,
                            max_link_attributes=MAX_ATTRIBUTES, max_attribute_length=MAX_ATTRIBUTE_LENGTH,
                            max_span_attribute_length=MAX_ATTRIBUTE_LENGTH)
        # the app's cleanup shuts it down (``shutdown``): no atexit hook holding it past the app
        self.provider = TracerProvider(sampler=_sampler(config), resource=_resource(config), shutdown_on_exit=False,
                                       span_limits=limits)
        self.exporter = OTLPSpanExporter(endpoint=_endpoint(config), headers=config.headers or None)
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("gguf_gateway")
        self._propagator = TraceContextTextMapPropagator()
        self._server, self._internal = trace.SpanKind.SERVER, trace.SpanKind.INTERNAL
        self._in_span = trace.set_span_in_context
        self._status = trace.Status
        self._error_code = trace.StatusCode.ERROR

    def begin(self, headers: Mapping[str, str], obs: Observation, method: str, route: str) -> Any:
        """The request's root span, started at ``obs.started`` (its parent the caller's
        ``traceparent``, where it sent one); the handle ``forward`` and ``end`` take."""
        offset = time.time_ns() - int(time.monotonic() * 1e9)  # monotonic seconds -> epoch ns
        parent = self._propagator.extract(headers) if "traceparent" in headers else None
        matched = route != "other"  # no route matched: HTTP's convention names the span by its method alone
        if method not in HTTP_METHODS:  # the convention's word for a method it does not know (any token is one)
            method = "_OTHER"
        named = "HTTP" if method == "_OTHER" else method
        span = self.tracer.start_span(f"{named} {route}" if matched else named, context=parent, kind=self._server,
                                      start_time=int(obs.started * 1e9) + offset,
                                      attributes={"http.request.method": method, "http.route": route} if matched
                                      else {"http.request.method": method})
        if span.is_recording():
            obs.trace_id = format(span.get_span_context().trace_id, "032x")
        return span, offset, route

    def forward(self, handle: Any) -> tuple[tuple[str, str], ...]:
        """The ``traceparent`` (and ``tracestate``) naming the request's root span, for an
        upstream server: its spans then join this trace."""
        ctx = handle[0].get_span_context()
        pair = (("traceparent", f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"),)
        state = ctx.trace_state.to_header() if ctx.trace_state else ""
        return pair + ((("tracestate", state),) if state else ())

    def end(self, handle: Any, obs: Observation, status: int, error_code: str | None) -> None:
        """The request ended (``status`` 499 where its client went): the children made from
        the observation's marks, the root's attributes set, the root ended."""
        span, offset, route = handle
        if not span.is_recording():
            span.end()
            return
        finish = time.monotonic()

        def ns(t: float) -> int:
            return int(t * 1e9) + offset

        op = ROUTE_OPERATIONS.get(route)
        model = _cut(obs.model if obs.model != "-" else obs.asked_model)
        if op is not None:  # GenAI's name for the span; else HTTP's, given at ``begin``
            span.update_name(f"{op} {model}" if model else op)
        span.set_attributes(self._root_attributes(obs, op, status, error_code))
        if status >= 500:
            span.set_status(self._status(self._error_code, error_code or str(status)))
        ctx = self._in_span(span)
        if obs.queued is not None:
            queue_end = obs.admitted or obs.leased or finish
            queue = self._child("queue", ctx, ns(obs.queued))
            load = obs.load
            if load is not None:
                began = max(load.began, obs.queued)
                self._child("load", self._in_span(queue), ns(began), {
                    PREFIX + "load.bytes": load.bytes, PREFIX + "load.source": load.source,
                    PREFIX + "load.duration_s": round(load.ended - load.began, 6)}).end(ns(max(load.ended, began)))
            queue.end(ns(queue_end))
        if obs.admitted is not None:
            prompt: dict[str, Any] = {PREFIX + "prompt.tokens_read": max(obs.prompt_tokens - obs.cached_tokens, 0),
                                      PREFIX + "prompt.tokens_reused": obs.cached_tokens}
            if obs.cache_source:
                prompt[PREFIX + "prompt.cache_source"] = obs.cache_source
            self._child("prompt", ctx, ns(obs.admitted), prompt).end(ns(obs.first_token or finish))
        if obs.first_token is not None:
            generated: dict[str, Any] = {"gen_ai.usage.output_tokens": obs.completion_tokens}
            if obs.reasoning_tokens:  # each attribute costs the SDK's checks: only those that say something
                generated["gen_ai.usage.reasoning.output_tokens"] = obs.reasoning_tokens
            if obs.drafted_tokens:
                generated[PREFIX + "speculation.drafted"] = obs.drafted_tokens
                generated[PREFIX + "speculation.accepted"] = obs.accepted_tokens
            self._child("generation", ctx, ns(obs.first_token), generated).end(ns(obs.last_token or finish))
        for call in obs.hosted_tool_calls:
            self._tool(ctx, call, ns)
        span.end(ns(finish))

    def _tool(self, ctx: Any, call: dict[str, Any], ns: Callable[[float], int]) -> None:
        """A tool the gateway ran in the answer: GenAI's ``execute_tool {name}`` span."""
        name = _cut(call["name"])
        attributes: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                                      "gen_ai.tool.type": "extension" if call.get("server") else "function",
                                      PREFIX + "tool.bytes": call["bytes"]}
        if call.get("server"):
            attributes[PREFIX + "tool.server"] = _cut(call["server"])
        span = self._child(f"execute_tool {name}", ctx, ns(call["started"]), attributes)
        if call.get("error") is not None:
            span.set_attribute("error.type", call["outcome"])
            span.set_status(self._status(self._error_code, call["outcome"]))
        span.end(ns(call["started"] + call["seconds"]))

    def _child(self, name: str, ctx: Any, start: int, attributes: dict[str, Any] | None = None) -> Any:
        return self.tracer.start_span(name, context=ctx, kind=self._internal, start_time=start, attributes=attributes)

    @staticmethod
    def _root_attributes(obs: Observation, op: str | None, status: int, error_code: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {"http.response.status_code": status, PREFIX + "request_id": obs.request_id,
                               PREFIX + "principal": obs.principal}
        if status >= 400:
            out["error.type"] = error_code or str(status)
        if obs.disconnected:
            out[PREFIX + "client_disconnected"] = True
        if op is None:
            return out
        out["gen_ai.operation.name"] = op
        out["gen_ai.provider.name"] = PROVIDER
        if obs.asked_model:
            out["gen_ai.request.model"] = _cut(obs.asked_model)
        if obs.model != "-":
            out["gen_ai.response.model"] = _cut(obs.model)
        req = obs.request
        if req is not None:
            given = req.given
            for name in _GIVEN_FIELDS:
                if name in given:
                    out["gen_ai.request." + name] = float(getattr(req, name))  # doubles, top_k too
            if req.max_tokens is not None:
                out["gen_ai.request.max_tokens"] = req.max_tokens
            if req.seed is not None:
                out["gen_ai.request.seed"] = req.seed
            if req.stop:
                out["gen_ai.request.stop_sequences"] = list(req.stop)
        out["gen_ai.usage.input_tokens"] = obs.prompt_tokens
        if op != _EMBED and op != _RERANK:
            out["gen_ai.usage.output_tokens"] = obs.completion_tokens
        if obs.cached_tokens:
            out["gen_ai.usage.cache_read.input_tokens"] = obs.cached_tokens
        if obs.reasoning_tokens:
            out["gen_ai.usage.reasoning.output_tokens"] = obs.reasoning_tokens
        if obs.finish_reason:
            out["gen_ai.response.finish_reasons"] = [obs.finish_reason]
        if obs.first_token is not None:
            out["gen_ai.response.time_to_first_chunk"] = round(obs.first_token - obs.started, 6)
        return out

    def shutdown(self, seconds: float | None = None) -> None:
        """The spans still held exported, the exporter closed (blocking: call it off the loop).
        Given ``seconds``, within them: past them the exporter is told to stop (its retries
        end, what is still queued is dropped, and that is logged), and this returns at most
        ``SHUTDOWN_GRACE`` later whatever the exporter does."""
        if seconds is None:
            self.provider.shutdown()
            return
        done = threading.Event()

        def close() -> None:
            try:
                self.provider.shutdown()
            except Exception:
                log.exception("the trace exporter failed to shut down")
            finally:
                done.set()

        # a daemon: a collector that never answers cannot keep the process from exiting
        threading.Thread(target=close, name="otel-shutdown", daemon=True).start()
        if done.wait(max(0.0, seconds)):
            return
        log.warning("traces: the collector took over %g s; the spans still queued are dropped", seconds)
        try:
            self.exporter.shutdown()
        except Exception:
            log.exception("the trace exporter failed to shut down")
        done.wait(SHUTDOWN_GRACE)


def _cut(name: str | None) -> str | None:
    """A model's name as a span may quote it: at most ``MAX_MODEL_NAME`` characters."""
    return name[:MAX_MODEL_NAME] if name is not None else None
