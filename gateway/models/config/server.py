"""models.yaml's ``server:`` section: its keys and their checks, declared (``SERVER``), and the
API keys gathered from every source (``keys``: the section, the keys file, ``$GGUF_GATEWAY_API_KEYS``)."""

from __future__ import annotations

import re
from typing import Any

from ...base import checks
from ...base.checks import INVALID, Check, Report, show
from ...hardware.sysmem import RAM
from .hostedtools import SEARCH_DOCS, SERVER_DOCS, allowed_urls, check_references, mcp_servers, web_search
from .keys import KEYS_FILE, from_section, gather
from .parsing import Parsing
from .specs import EVENT_LOOPS, MEMORY, REASONING_FIELDS, CaptureConfig, OtelConfig, default_state_dir


@checks.accepts({"anyOf": [{"type": "string", "pattern": r"^\s*0*[0-9]{1,2}([.][0-9]*)?\s*%\s*$"},
                           checks.SIZE_SCHEMA]})
def _reserve(r: Report, where: str, v: Any) -> Any:
    """A size, or a share of the machine's memory (``"10%"``, kept as -10)."""
    if isinstance(v, str) and v.strip().endswith("%"):
        try:
            share = float(v.strip()[:-1])
        except ValueError:
            share = -1
        if 0 <= share < 100:
            return -share if share else 0
        r.error(where, f"must be a size (1GiB) or a share of memory from 0% to 99%, got {show(v)}")
        return INVALID
    return checks.byte_size(r, where, v)


def _per_device(parse: Check, plain: str) -> Check:
    """A value for each memory pool (``ram``, ``cuda0``, ...: keys lowercased), or one plain
    value, which is ``plain``'s."""
    def check(r: Report, where: str, v: Any) -> Any:
        if not isinstance(v, dict):
            parsed = parse(r, where, v)
            return INVALID if parsed is INVALID else {plain: parsed}
        out = {}
        for key, item in v.items():
            if not isinstance(key, str) or not key.strip():
                r.error(where, f"keys must be device names (ram, cuda0, ...), got {show(key)}")
                continue
            parsed = parse(r, f"{where}.{key}", item)
            if parsed is not INVALID:
                out[key.strip().lower()] = parsed
        return out
    one = checks.schema_of(parse)
    return checks.accepts({"anyOf": [one, {"type": "object", "propertyNames": {"pattern": checks.S},
                                           "additionalProperties": one}]})(check)


@checks.accepts({"anyOf": [{"type": "boolean"}, checks.schema_of(checks.list_of(checks.string))]})
def _pull_on_demand(r: Report, where: str, v: Any) -> Any:
    """``true`` / ``false``, or a list of name prefixes (``hf.co``, ``bartowski``, ``llama3``): a
    request naming a model on no disk that starts with one of them pulls it. ``true`` is ``("",)``."""
    if isinstance(v, bool):
        return ("",) if v else ()
    prefixes = checks.list_of(checks.string)(r, where, v)
    return tuple(p.strip().lower() for p in prefixes) if isinstance(prefixes, tuple) else prefixes


_REGISTRY_HOST = re.compile(r"[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?(?::[0-9]{1,5})?")


@checks.accepts(checks.schema_of(checks.list_of(checks.string)))
def _pull_hosts(r: Report, where: str, v: Any) -> Any:
    """The registries a request may pull from on demand, each a host (``HOST[:PORT]``, matched
    whole, case-insensitively): ``hf.co`` (or ``huggingface.co``) is the Hugging Face hub that
    ``HF_ENDPOINT`` names, any other an Ollama registry. A host only a request names is never asked."""
    hosts = checks.list_of(checks.string)(r, where, v)
    if not isinstance(hosts, tuple):
        return hosts
    out = []
    for i, host in enumerate(hosts):
        host = host.lower()
        if not _REGISTRY_HOST.fullmatch(host) or ".." in host:
            r.error(f"{where}[{i}]", f"must be a registry's host (HOST or HOST:PORT, no scheme or path), "
                                     f"got {show(host)}")
            return INVALID
        out.append(host)
    return tuple(out)


@checks.accepts({"anyOf": [{"const": False}, checks.PATH_SCHEMA]})
def _usage_db(r: Report, where: str, v: Any) -> Any:
    """A file path, or ``off`` (``false``): usage kept in memory only, for the limits."""
    if v is False or (isinstance(v, str) and v.strip().lower() in ("off", ":memory:")):
        return MEMORY
    return checks.path(r, where, v)


_CAPTURE: dict[str, Check] = {
    "enabled": checks.boolean,
    "max_bytes": checks.byte_size,
    "max_body_bytes": checks.byte_size,
    "keep": checks.boolean,
    "redact_content": checks.boolean,
}


@checks.accepts({"type": "object", "additionalProperties": {"type": "string"}})
def _headers(r: Report, where: str, v: Any) -> Any:
    if not isinstance(v, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
        r.error(where, f"must be a mapping of header names to strings, got {show(v)}")
        return INVALID
    return dict(v)


def _switch(kind: type, allowed: dict[str, Check]) -> Check:
    """``true`` / ``false`` (``kind(enabled=...)``), or a mapping of ``kind``'s fields checked by
    ``allowed`` (``enabled`` then true unless it says otherwise)."""
    def check(r: Report, where: str, v: Any) -> Any:
        if isinstance(v, bool):
            return kind(enabled=v)
        return kind(**{"enabled": True, **checks.mapping(r, where, v, allowed)})
    return checks.accepts({"anyOf": [{"type": "boolean"}, checks.schema_of(checks.table(allowed))]})(check)


_OTEL: dict[str, Check] = {
    "enabled": checks.boolean,
    "endpoint": checks.string,
    "service_name": checks.string,
    "sampler": checks.one_of(("always_on", "always_off", "traceidratio", "parentbased_always_on",
                              "parentbased_always_off", "parentbased_traceidratio")),
    "sampler_arg": checks.fraction,
    "headers": _headers,
}

_PORT = checks.integer(minimum=1, maximum=65535, what="a port number (1-65535)")

SERVER: dict[str, Check] = {
    "host": checks.string,
    "port": _PORT,
    "models_dirs": checks.list_of(checks.path),
    "api_keys": from_section,
    "api_keys_file": checks.path,
    "cors_origins": checks.list_of(checks.string),
    "max_body_bytes": checks.integer(minimum=1024, what="an integer >= 1024"),
    "max_messages": checks.POSITIVE_INTEGER,
    "max_queue": checks.integer(minimum=0, what="an integer >= 0"),
    "priority_max_wait": checks.seconds,
    "swap_hold_seconds": checks.seconds,
    "max_swap_wait": checks.seconds,
    "request_timeout": checks.seconds,
    "write_timeout": checks.seconds,
    "header_timeout": checks.seconds,
    "keepalive_timeout": checks.seconds,
    "body_timeout": checks.seconds,
    "max_connections": checks.POSITIVE_INTEGER,
    "discover_default_stores": checks.boolean,
    "keep_alive": checks.duration,
    "load_timeout": checks.seconds,
    "max_loaded_models": checks.integer(minimum=0, what="an integer >= 0 (0: no limit)"),
    "reasoning_fields": checks.list_of(checks.one_of(REASONING_FIELDS)),
    "events_path": checks.path,
    "drain_seconds": checks.seconds,
    "metrics_public": checks.boolean,
    "isolate_cache_by_key": checks.boolean,
    "stream_interval_ms": checks.integer(minimum=0, maximum=1000, what="an integer from 0 to 1000"),
    "upstream_check_seconds": checks.seconds,
    "responses_store": checks.integer(minimum=0, what="an integer >= 0 (0: keep none)"),
    "ollama_port": _PORT,
    "kv_cache_dir": checks.path,
    "kv_cache_max_bytes": checks.byte_size,
    "prompt_cache_bytes": checks.byte_size,
    "spare_worker": checks.boolean,
    "event_loop": checks.one_of(EVENT_LOOPS),
    "keep_billing_header": checks.boolean,
    "agent_model": checks.string,
    "memory_budget": _per_device(checks.byte_size, RAM),
    "memory_reserve": _per_device(_reserve, "default"),
    "max_media_bytes": checks.byte_size,
    "max_media_pixels": checks.POSITIVE_INTEGER,
    "max_media_per_request": checks.POSITIVE_INTEGER,
    "max_media_pixels_per_request": checks.POSITIVE_INTEGER,
    "max_media_seconds_per_request": checks.positive_seconds,
    "allow_remote_media": checks.boolean,
    "allow_remote_media_private": checks.boolean,
    "remote_media_timeout": checks.positive_seconds,
    "pull_on_demand": _pull_on_demand,
    "pull_on_demand_hosts": _pull_hosts,
    "pull_wait_seconds": checks.seconds,
    "pull_keep_free_bytes": checks.byte_size,
    "state_dir": checks.path,
    "usage_db": _usage_db,
    "usage_days": checks.integer(minimum=1, maximum=36500, what="a number of days from 1 to 36500"),
    "capture": _switch(CaptureConfig, _CAPTURE),
    "otel": _switch(OtelConfig, _OTEL),
    "mcp_servers": mcp_servers,
    "web_search": web_search,
    "web_fetch": checks.boolean,
    "mcp_allowed_urls": allowed_urls,
    "max_tool_rounds": checks.integer(minimum=0, maximum=64, what="an integer from 0 to 64"),
    "tool_timeout": checks.positive_seconds,
    "max_tool_result_bytes": checks.byte_size,
    "max_tool_result_tokens": checks.integer(minimum=16, maximum=1 << 20, what="an integer from 16 to 1048576"),
}


# each key's line in the reference (``reference.py``)
DOCS: dict[str, str] = {
    "host": "address to bind; loopback unless you mean to expose it",
    "port": "TCP port",
    "models_dirs": "more discovery roots: every GGUF below them is served by its file name",
    "api_keys": "API keys: a list, or a map of names to a key or its settings (keys, below); more in the keys file",
    "api_keys_file": "the keys file (the same map; a key may be sha256:HEX); unset: keys.yaml in state_dir",
    "cors_origins": "browser origins allowed to call the API (\"*\": any)",
    "max_body_bytes": "larger request bodies get 413",
    "max_messages": "more messages in one request get 400",
    "max_queue": "per model: requests waiting beyond this get 429",
    "priority_max_wait": "a key not let in while its request waited this long goes first (never starved)",
    "swap_hold_seconds": "a loaded model stays this long after its last request while another waits for its room",
    "max_swap_wait": "a request waiting for another model to be unloaded forces the swap after this long",
    "request_timeout": "seconds a request may run; 0: no limit",
    "write_timeout": "a streamed answer whose client reads nothing this long ends as a disconnect",
    "header_timeout": "seconds a connection has to send a request's headers",
    "keepalive_timeout": "an idle kept-alive connection is closed after this many seconds",
    "body_timeout": "seconds a request body has to arrive whole, else 408",
    "max_connections": "more open connections are refused with 503",
    "discover_default_stores": "also discover ~/models, llama.cpp's, Hugging Face's, LM Studio's and Ollama's stores",
    "keep_alive": "unload a model idle this long (seconds, or 30s / 5m / 1h; -1: never)",
    "load_timeout": "seconds a request waits for its model to load, then 503",
    "max_loaded_models": "at most this many models loaded at once (0: no limit)",
    "reasoning_fields": "where answers carry a model's thinking",
    "events_path": "append one JSON line per request to this file",
    "drain_seconds": "on SIGTERM, how long requests in flight may take to finish",
    "metrics_public": "/metrics answers without an API key",
    "isolate_cache_by_key": "a prompt cache is reused only by the API key that filled it",
    "stream_interval_ms": "a streamed token may wait this long to go out with the next ones (0: at once)",
    "upstream_check_seconds": "how often each upstream is asked for its /models (0: never)",
    "responses_store": "OpenAI Responses kept in memory for previous_response_id (0: none)",
    "ollama_port": "also serve on this port (Ollama's is 11434)",
    "kv_cache_dir": "where an unloaded model's conversations (KV caches) are saved; unset: the user's cache folder",
    "kv_cache_max_bytes": "all saved caches together (0: save none)",
    "prompt_cache_bytes": "per model: host memory keeping other conversations' caches (0: off)",
    "spare_worker": "keep one worker process started ahead of the next load",
    "event_loop": "the HTTP server's event loop: uvloop (pip install 'gguf-gateway[fast]'), asyncio, or auto: "
                  "uvloop where installed",
    "keep_billing_header": "keep Claude Code's per-session billing header in the prompt",
    "agent_model": "the model `gguf-gateway launch` gives a coding agent when it names none "
                   "(unset: the loaded model with tool calls and the biggest context)",
    "memory_budget": "at most this much memory for all models together; or by device: {ram: 16GiB, cuda0: 20GiB}",
    "memory_reserve": "kept free of each device's memory: a size or a share (10%); or by device",
    "max_media_bytes": "the largest picture or sound in a request",
    "max_media_pixels": "the most pixels of one picture",
    "max_media_per_request": "pictures and sounds in one request",
    "max_media_pixels_per_request": "all of a request's pictures' pixels",
    "max_media_seconds_per_request": "all of a request's sounds together, in seconds",
    "allow_remote_media": "fetch pictures and sounds a request gives by URL",
    "allow_remote_media_private": "also from private and loopback addresses",
    "remote_media_timeout": "seconds a remote picture or sound has to arrive",
    "pull_on_demand": "true, or name prefixes: a request naming a model on no disk pulls it first",
    "pull_on_demand_hosts": "the registries such a pull may use, by host (hf.co: the Hugging Face hub), "
                            "never one only the request names",
    "pull_wait_seconds": "how long a whole (not streamed) request waits for such a pull",
    "pull_keep_free_bytes": "a pull that would leave less free on its disk is refused (507)",
    "state_dir": "the keys file and the usage database; unset: $XDG_STATE_HOME/gguf-gateway",
    "usage_db": "usage per key, model, wire and hour; off (false): in memory only",
    "usage_days": "days of usage kept",
    "capture": "keep requests that spend tokens and their answers (GET /captures): true, or a mapping",
    "otel": "OpenTelemetry traces: true, or a mapping",
    "capture.enabled": "capturing is on",
    "capture.max_bytes": "all captures together, every byte counted (past it: keyless requests' first, then "
                         "the oldest of the key holding most)",
    "capture.max_body_bytes": "each body and each answer (past it: cut)",
    "capture.keep": "also keep them in the state folder, read again at a start",
    "capture.redact_content": "shapes and counts, not the text",
    "otel.enabled": "tracing is on", "otel.endpoint": "the OTLP/HTTP collector",
    "otel.service_name": "the service's name in traces", "otel.sampler": "which traces are kept",
    "mcp_servers": "MCP servers the gateway may connect to (its tools for every wire, and /mcp): NAME: a mapping",
    **{f"mcp_servers.NAME.{k}": line for k, line in SERVER_DOCS.items()},
    "web_search": "the backend of the web_search tool: {searxng: URL} or {mcp: SERVER/TOOL}; unset: dropped",
    **{f"web_search.{k}": line for k, line in SEARCH_DOCS.items()},
    "web_fetch": "the web_fetch tool (pages fetched as text, never from private addresses); unset: on with web_search",
    "mcp_allowed_urls": "URL prefixes a request may name as an MCP server (server_url) beyond the configured ones",
    "max_tool_rounds": "hosted tool calls one answer may make before it must end",
    "tool_timeout": "seconds one hosted tool call may take",
    "max_tool_result_bytes": "a hosted tool's result is cut to this many bytes",
    "max_tool_result_tokens": "and to this many of the model's tokens",
    "otel.sampler_arg": "the share of traces a ratio sampler keeps", "otel.headers": "headers sent to the collector",
}
MIRRORS: dict[str, tuple[str, str]] = {  # key: (llama-server flag, Ollama variable)
    "host": ("--host", "OLLAMA_HOST"), "port": ("--port", "OLLAMA_HOST"), "api_keys": ("--api-key", ""),
    "api_keys_file": ("--api-key-file", ""), "keep_alive": ("", "OLLAMA_KEEP_ALIVE"),
    "max_loaded_models": ("", "OLLAMA_MAX_LOADED_MODELS"), "max_queue": ("", "OLLAMA_MAX_QUEUE"),
    "models_dirs": ("", "OLLAMA_MODELS"), "cors_origins": ("", "OLLAMA_ORIGINS"),
    "prompt_cache_bytes": ("--cache-ram", ""), "metrics_public": ("--metrics", ""),
    "request_timeout": ("-to, --timeout", "")}

def parse_server(r: Parsing, raw: Any, *, editing: bool = False) -> dict[str, Any]:
    """``ServerConfig``'s fields from the section, the API keys from all their sources
    (``editing``: as ``keys.gather`` reads them for ``gguf-gateway keys``)."""
    server = checks.mapping(r, "server", raw, SERVER)
    state = server.get("state_dir") or default_state_dir()
    server["api_keys"], server["keys_file"] = gather(
        r, server.pop("api_keys", []), server.pop("api_keys_file", None), state / KEYS_FILE, editing=editing)
    check_references(r, server)
    return server
