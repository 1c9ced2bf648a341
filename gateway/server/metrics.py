"""Prometheus metrics, one registry per app (so tests and embedders never collide).

Names follow Prometheus: prefix ``gguf_gateway_``, base units, ``_total`` counters. Label
values stay bounded: ``model`` is always a resolvable model's name (``-`` when the request
named none that resolves), ``endpoint`` is a route template, never a raw path.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .. import __version__
from ..models.lifecycle import ModelState

NO_MODEL = "-"
# Latency buckets fit for LLM serving, milliseconds to minutes (after vLLM's).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
               0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
STATES = tuple(s.value for s in ModelState)


MAX_REASONS = 200  # distinct reasons gguf_gateway_rejected_requests_total keeps apart
MAX_KEYS = 64  # API keys with series of their own, so a long list of keys cannot grow the scrape without end


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        p = "gguf_gateway_"
        self.requests = Counter(p + "requests", "Requests answered, by model, endpoint and HTTP status",
                                ["model", "endpoint", "status"], registry=r)
        self.duration = Histogram(p + "request_duration_seconds", "Time from request to the end of the answer",
                                  ["model", "endpoint"], buckets=DURATION_BUCKETS, registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Time from request to the first generated token",
                              ["model"], buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram(p + "inter_token_latency_seconds", "Time between generated tokens",
                             ["model"], buckets=ITL_BUCKETS, registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens processed", ["model"], registry=r)
        self.cached_tokens = Counter(p + "cached_prompt_tokens", "Prompt tokens found in a slot's cache (not decoded "
                                     "again)", ["model"], registry=r)
        self.completion_tokens = Counter(p + "completion_tokens", "Tokens generated", ["model"], registry=r)
        self.reasoning_tokens = Counter(p + "reasoning_tokens", "Generated tokens that were thinking",
                                        ["model"], registry=r)
        self.drafted_tokens = Counter(p + "drafted_tokens", "Tokens speculative decoding proposed", ["model"],
                                      registry=r)
        self.accepted_tokens = Counter(p + "accepted_tokens", "Proposed tokens the model kept (the rest of "
                                       "drafted_tokens was decoded in vain)", ["model"], registry=r)
        self.load_duration = Histogram(p + "model_load_duration_seconds", "Time to load a model",
                                       ["model"], buckets=LOAD_BUCKETS, registry=r)
        self.load_failures = Counter(p + "model_load_failures", "Model loads that failed", ["model"], registry=r)
        self.worker_restarts = Counter(p + "worker_restarts", "Model workers that exited without being asked to",
                                       ["model"], registry=r)
        self.disconnects = Counter(p + "client_disconnects", "Clients that went away before their answer ended",
                                   ["model", "endpoint"], registry=r)
        self.rejected = Counter(p + "rejected_requests", "Requests refused before any work, by reason",
                                ["reason"], registry=r)
        self.connections_closed = Counter(p + "connections_closed", "Connections this gateway closed or refused "
                                          "itself, by reason (header_timeout, keepalive_timeout, max_connections)",
                                          ["reason"], registry=r)
        self.pull_bytes = Counter(p + "pull_bytes", "Bytes downloaded by pulls, by source (huggingface, ollama)",
                                  ["source"], registry=r)
        self.pulls = Counter(p + "pulls", "Pulls finished, by source and outcome (done, failed, cancelled)",
                             ["source", "outcome"], registry=r)
        self.key_requests = Counter(p + "key_requests", "Requests that spend tokens, by API key (named keys; "
                                    "past MAX_KEYS, and bare keys, as other) and wire", ["key", "wire"], registry=r)
        self.key_tokens = Counter(p + "key_tokens", "Tokens spent, by API key and kind (prompt, completion)",
                                  ["key", "kind"], registry=r)
        self.key_limited = Counter(p + "key_limited", "Requests refused by a key's limit (rpm, tpm, max_parallel, "
                                   "budget)", ["key", "limit"], registry=r)
        self.tool_calls = Counter(p + "tool_calls", "Calls of tools the gateway ran itself, by MCP server (web: web "
                                  "search and fetch; request: a server a request named), tool and outcome",
                                  ["server", "tool", "outcome"], registry=r)
        self.queue_wait = Histogram(p + "queue_wait_seconds", "Time a request waited for its model's slot (its load "
                                    "included), by model, API key (as key_requests labels it) and priority",
                                    ["model", "key", "priority"], buckets=WAIT_BUCKETS, registry=r)
        self.slot_seconds = Counter(p + "slot_seconds", "Seconds requests held a model's slots, by model and API key: "
                                    "each key's share served", ["model", "key"], registry=r)
        self.swaps = Counter(p + "swaps", "Models unloaded to load another, by reason (idle: past its "
                             "swap_hold_seconds; max_swap_wait: a request waited that long)", ["reason"], registry=r)
        self._keys: set[str] = set()
        self._series: dict[tuple[object, tuple[str, ...]], Any] = {}  # ``series``'s
        self.connections_open = Gauge(p + "connections_open", "Client connections open now", registry=r)
        info = Gauge(p + "build_info", "Versions of this gateway and what it runs on",
                     ["version", "python", "llama_cpp_python"], registry=r)
        info.labels(__version__, platform.python_version(), _llama_cpp_version()).set(1)
        self._model_collector: _ModelCollector | None = None
        self._reasons: set[str] = set()

    def tool_call(self, call: dict[str, Any]) -> None:
        """A hosted tool's call (``Observation.hosted_tool_calls``' line): a server a request
        named, not a configured one, is counted as ``request`` with its tool as ``other``, so a
        stranger's names never become series."""
        server = call.get("server")
        if server is None:
            server, tool = "web", call["kind"]
        elif call.get("configured"):
            tool = call["name"]
        else:
            server, tool = "request", "other"
        self.series(self.tool_calls, server, tool, call["outcome"]).inc()

    def series(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, kept: prometheus_client's lookup (a lock, each label
        checked) costs more than the count it is for, and every request makes several. A series
        is never removed, so the one kept is the one scraped."""
        key = (metric, labels)
        child = self._series.get(key)
        if child is None:
            child = self._series[key] = metric.labels(*labels)
        return child

    def rejection(self, reason: str) -> None:
        """Count a refused request by its reason (an error code). The codes come from the
        gateway, and also from upstream servers, which could mint a new one per answer: past
        ``MAX_REASONS`` distinct ones, a new one is counted as ``other`` (each is a series
        kept for good)."""
        if reason not in self._reasons:
            if len(self._reasons) >= MAX_REASONS:
                reason = "other"
            else:
                self._reasons.add(reason)
        self.rejected.labels(reason).inc()

    def key_label(self, name: str, named: bool) -> str:
        """A key's label: its name for a key the operator named, the first ``MAX_KEYS`` of them
        (each is a series kept for good); ``other`` for the rest and for bare keys."""
        if not named:
            return "other"
        if name not in self._keys:
            if len(self._keys) >= MAX_KEYS:
                return "other"
            self._keys.add(name)
        return name

    def spent(self, key: str, wire: str, prompt_tokens: int, completion_tokens: int) -> None:
        """One request that spent tokens, by its key's label."""
        self.key_requests.labels(key, wire).inc()
        for kind, n in (("prompt", prompt_tokens), ("completion", completion_tokens)):
            if n:
                self.key_tokens.labels(key, kind).inc(n)

    def watch_models(self, rows: Callable[[], Iterable[tuple[str, str, int, int, float, int, int]]]) -> None:
        """Per-model gauges read at scrape time: rows of (model, state, in_flight, queued, loaded
        fraction, memory estimate, memory allocated)."""
        self._model_collector = _ModelCollector(rows)
        self.registry.register(self._model_collector)

    def watch_upstreams(self, upstreams: Callable[[], Iterable[tuple[str, str]]],
                        replicas: Callable[[], Iterable[tuple[str, str, bool, int, int]]]) -> None:
        """Gauges and counters read at scrape time: rows of (upstream, health state), and of
        (model, replica, up, requests, failovers)."""
        self.registry.register(_UpstreamCollector(upstreams, replicas))

    def watch_gpus(self, gpus: Callable[[], Iterable[tuple[str, str, int, int]]]) -> None:
        """Per-GPU gauges read at scrape time: rows of (device, description, free bytes when
        last read, total bytes)."""
        self.registry.register(_GpuCollector(gpus))

    def watch_connections(self, count: Callable[[], int]) -> None:
        self.connections_open.set_function(count)

    def scrape(self) -> bytes:
        return generate_latest(self.registry)


class _ModelCollector:
    def __init__(self, rows) -> None:
        self.rows = rows

    def describe(self):
        return []

    def collect(self):
        state = GaugeMetricFamily("gguf_gateway_model_state", "1 for the state each model is in",
                                  labels=["model", "state"])
        in_flight = GaugeMetricFamily("gguf_gateway_requests_in_flight", "Requests being answered, by model",
                                      labels=["model"])
        queued = GaugeMetricFamily("gguf_gateway_requests_queued",
                                   "Requests waiting for their model (loading, or behind another request)",
                                   labels=["model"])
        progress = GaugeMetricFamily("gguf_gateway_model_load_progress", "How much of each model is loaded, 0 to 1 "
                                     "(a load under way: the part of its weights read so far)", labels=["model"])
        estimate = GaugeMetricFamily("gguf_gateway_model_memory_estimate_bytes", "What each model should take "
                                     "loaded (weights, KV cache, compute), from its header and settings",
                                     labels=["model"])
        allocated = GaugeMetricFamily("gguf_gateway_model_memory_allocated_bytes", "What llama.cpp allocated for "
                                      "each loaded model (0 while not loaded)", labels=["model"])
        for model, current, flying, waiting, loaded, need, held in self.rows():
            for s in STATES:
                state.add_metric([model, s], 1.0 if s == current else 0.0)
            in_flight.add_metric([model], flying)
            queued.add_metric([model], waiting)
            progress.add_metric([model], loaded)
            estimate.add_metric([model], need)
            allocated.add_metric([model], held)
        yield from (state, in_flight, queued, progress, estimate, allocated)


class _GpuCollector:
    def __init__(self, gpus) -> None:
        self.gpus = gpus

    def describe(self):
        return []

    def collect(self):
        free = GaugeMetricFamily("gguf_gateway_gpu_memory_free_bytes", "Each GPU's free memory as llama.cpp last "
                                 "reported it (read before each load onto a GPU)", labels=["device", "description"])
        total = GaugeMetricFamily("gguf_gateway_gpu_memory_total_bytes", "Each GPU's memory as llama.cpp reports it",
                                  labels=["device", "description"])
        for device, description, n_free, n_total in self.gpus():
            free.add_metric([device, description], n_free)
            total.add_metric([device, description], n_total)
        yield from (free, total)


class _UpstreamCollector:
    def __init__(self, upstreams, replicas) -> None:
        self.upstreams, self.replicas = upstreams, replicas

    def describe(self):
        return []

    def collect(self):
        up = GaugeMetricFamily("gguf_gateway_upstream_up", "1 while an upstream server answers (0: down or not yet "
                               "reached), by the models.yaml entry or replica it serves", labels=["upstream"])
        for name, state in self.upstreams():
            up.add_metric([name], 1.0 if state == "up" else 0.0)
        replica_up = GaugeMetricFamily("gguf_gateway_replica_up", "1 while a replica of a model can answer",
                                       labels=["model", "replica"])
        requests = CounterMetricFamily("gguf_gateway_replica_requests", "Requests handed to each replica",
                                       labels=["model", "replica"])
        failovers = CounterMetricFamily("gguf_gateway_replica_failovers", "Requests a replica failed before "
                                        "answering, passed on to another", labels=["model", "replica"])
        for model, replica, alive, handed, passed in self.replicas():
            replica_up.add_metric([model, replica], 1.0 if alive else 0.0)
            requests.add_metric([model, replica], handed)
            failovers.add_metric([model, replica], passed)
        yield from (up, replica_up, requests, failovers)


def _llama_cpp_version() -> str:
    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return "unknown"
