"""models.yaml's ``server:`` section: its keys and their checks, declared (``SERVER``), and the
API keys gathered from every source (``keys``: the section, the keys file, ``$GGUF_GATEWAY_API_KEYS``)."""

from __future__ import annotations

from typing import Any

from ...base import checks
from ...base.checks import INVALID, Check, Report, show
from ...hardware.sysmem import RAM
from .keys import KEYS_FILE, from_section, gather
from .parsing import Parsing
from .specs import MEMORY, REASONING_FIELDS, CaptureConfig, OtelConfig, default_state_dir


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
    return check


def _pull_on_demand(r: Report, where: str, v: Any) -> Any:
    """``true`` / ``false``, or a list of name prefixes (``hf.co``, ``bartowski``, ``llama3``): a
    request naming a model on no disk that starts with one of them pulls it. ``true`` is ``("",)``."""
    if isinstance(v, bool):
        return ("",) if v else ()
    prefixes = checks.list_of(checks.string)(r, where, v)
    return tuple(p.strip().lower() for p in prefixes) if isinstance(prefixes, tuple) else prefixes


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
    return check


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
    "keep_billing_header": checks.boolean,
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
    "pull_wait_seconds": checks.seconds,
    "pull_keep_free_bytes": checks.byte_size,
    "state_dir": checks.path,
    "usage_db": _usage_db,
    "usage_days": checks.integer(minimum=1, maximum=36500, what="a number of days from 1 to 36500"),
    "capture": _switch(CaptureConfig, _CAPTURE),
    "otel": _switch(OtelConfig, _OTEL),
}


def parse_server(r: Parsing, raw: Any, *, editing: bool = False) -> dict[str, Any]:
    """``ServerConfig``'s fields from the section, the API keys from all their sources
    (``editing``: as ``keys.gather`` reads them for ``gguf-gateway keys``)."""
    server = checks.mapping(r, "server", raw, SERVER)
    state = server.get("state_dir") or default_state_dir()
    server["api_keys"], server["keys_file"] = gather(
        r, server.pop("api_keys", []), server.pop("api_keys_file", None), state / KEYS_FILE, editing=editing)
    return server
