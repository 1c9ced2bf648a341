"""models.yaml's models: each entry's keys and their checks, declared by the kind of backend
(``LOCAL``: a GGUF run here, its llama.cpp keys being ``protocol.settings.LlamaSettings``'s;
``UPSTREAM``: another server; ``COMMON`` to both), and the entries made into ``ModelSpec``s,
replicas and upstreams included."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ...base import checks
from ...base.checks import INVALID, Check, Report, schema_of, show
from ...protocol import settings
from ...text.sampling_params import FLOAT_MAX, INT32_MAX, SAMPLING
from .parsing import Parsing
from .specs import (
    ADAPTER_NAME_CHAR,
    MAX_ADAPTER_NAME,
    MAX_ADAPTERS,
    MAX_LORA_SCALE,
    REASONING_MODES,
    TOOL_FORMATS,
    AdapterSpec,
    ModelSpec,
    Upstream,
    adapter_name_problem,
    normalize_name,
)

_EFFORTS = ("minimal", "low", "medium", "high")


_MARKER = {"type": "string", "minLength": 1, "pattern": checks.S}


@checks.accepts({"anyOf": [{"enum": list(REASONING_MODES)}, {
    "type": "array", "items": _MARKER, "minItems": 2, "maxItems": 2, "uniqueItems": True}]})
def _reasoning(r: Report, where: str, v: Any) -> Any:
    """One of REASONING_MODES, or the model's own ``[open, close]`` pair of thinking markers."""
    if isinstance(v, list):
        if len(v) == 2 and all(isinstance(m, str) and m.strip() for m in v) and v[0] != v[1]:
            from ...text.reasoning import pair_format

            return pair_format(v[0], v[1])
        r.error(where, f"a pair of markers must be two different non-empty strings [open, close], got {show(v)}")
        return INVALID
    return checks.one_of(REASONING_MODES)(r, where, v)


@checks.accepts({"type": "object", "additionalProperties": False, "properties": {
    e: {"type": ["integer", "null"], "minimum": 0} for e in _EFFORTS}})
def _reasoning_budgets(r: Report, where: str, v: Any) -> Any:
    if not isinstance(v, dict) or any(k not in _EFFORTS for k in v) or any(
            b is not None and (not isinstance(b, int) or isinstance(b, bool) or b < 0) for b in v.values()):
        r.error(where, f"must map {', '.join(_EFFORTS)} to a number of tokens >= 0 (or null: no cap), got {show(v)}")
        return INVALID
    return dict(v)


def _sampling_default(param: Any) -> Check:
    def check(r: Report, where: str, x: Any) -> Any:
        problem = param.problem(x)
        if problem:
            r.error(where, f"{problem}, got {show(x)}")
            return INVALID
        return x
    low = {"exclusiveMinimum" if param.low_open else "minimum": param.low} if param.low is not None else {}
    limit = FLOAT_MAX if param.kind is float else INT32_MAX
    return checks.accepts({"type": "number" if param.kind is float else "integer",
                           "minimum": -limit, "maximum": limit, **low,
                           **({"maximum": param.high} if param.high is not None else {})})(check)


@checks.accepts({"type": "string", "pattern": r"^\s*https?://[^/?#@\s]+(/[^?#]*)?\s*$"})
def _url(r: Report, where: str, v: Any) -> Any:
    """An http(s) base URL; a bare host gets OpenAI's ``/v1``."""
    parts = urlsplit(v.strip()) if isinstance(v, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.query or \
            parts.fragment or parts.username or parts.password:
        r.error(where, f"must be an http:// or https:// base URL such as http://host:8080/v1 "
                       f"(no query, no credentials: give `api_key`), got {show(v)}")
        return INVALID
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        r.error(where, f"has a bad port: {show(v)}")
        return INVALID
    path = parts.path.rstrip("/") or "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


@checks.accepts({"type": "number", "minimum": -MAX_LORA_SCALE, "maximum": MAX_LORA_SCALE})
def _lora_scale(r: Report, where: str, v: Any) -> Any:
    """A finite number within MAX_LORA_SCALE either way (``protocol.bounds.MAX_SCALE``: why the bound)."""
    if checks.number(r, where, v) is INVALID:
        return INVALID
    if not -MAX_LORA_SCALE <= v <= MAX_LORA_SCALE:
        r.error(where, f"must be a number from {-MAX_LORA_SCALE:g} to {MAX_LORA_SCALE:g} (llama.cpp multiplies the "
                       f"adapter's product by it: past that it drowns the model's own weights), got {show(v)}")
        return INVALID
    return float(v)


@checks.accepts({"anyOf": [{"type": "null"}, {
    "type": "object", "maxProperties": MAX_ADAPTERS,
    "propertyNames": {"pattern": rf"^\s*{ADAPTER_NAME_CHAR}{{1,{MAX_ADAPTER_NAME}}}\s*$"},
    "additionalProperties": {"anyOf": [checks.PATH_SCHEMA, {
        "type": "object", "required": ["path"], "additionalProperties": False,
        "properties": {"path": checks.PATH_SCHEMA, "scale": schema_of(_lora_scale)}}]}}]})
def _loras(r: Report, where: str, v: Any) -> Any:
    """``loras:``: each adapter's name to its GGUF file, or to ``{path: FILE, scale: NUMBER}``; at
    most MAX_ADAPTERS, names as ``adapter_name_problem`` allows, none twice (compared as names are).
    Every problem is told before the whole is refused."""
    if v is None:
        return ()
    if not isinstance(v, dict):
        r.error(where, f"must map each adapter's name to its GGUF file (or to {{path: FILE, scale: NUMBER}}), "
                       f"got {show(v)}")
        return INVALID
    if len(v) > MAX_ADAPTERS:
        r.error(where, f"names {len(v)} adapters: a model takes at most {MAX_ADAPTERS}")
        return INVALID
    out, seen, bad = [], set(), False
    for name, raw in v.items():
        sub = f"{where}.{name}"
        if (problem := adapter_name_problem(name)) is not None:
            r.error(sub, problem)
            bad = True
            continue
        if normalize_name(name) in seen:  # YAML keeps one of two equal keys; these differ in case alone
            r.error(sub, "is named twice (names are compared without case)")
            bad = True
            continue
        seen.add(normalize_name(name))
        entry = {"path": raw} if isinstance(raw, str) else raw
        if not isinstance(entry, dict):
            r.error(sub, f"must be the adapter's GGUF file or {{path: FILE, scale: NUMBER}}, got {show(raw)}")
            bad = True
            continue
        parsed = checks.mapping(r, sub, entry, {"path": checks.path, "scale": _lora_scale})
        if "path" not in entry:
            r.error(f"{sub}.path", "is required: the adapter's GGUF file")
        if len(parsed) < len(entry) or "path" not in entry:
            bad = True
            continue
        out.append(AdapterSpec(name=name.strip(), path=parsed["path"], scale=parsed.get("scale", 1.0)))
    return INVALID if bad else tuple(out)


# loras: on an entry that runs no llama.cpp worker here: why it cannot be
_NO_LORAS = {"upstream": "named LoRA adapters are applied by this gateway's llama.cpp worker, to a local model "
                         "(`path`); an upstream's own adapters are its models: give each an entry with `model:`",
             "replicas": "named LoRA adapters go on a local model's own entry (`path`): a replica set sends a "
                         "request to whichever member is free, and its members (other files, other servers) need "
                         "not take the same adapters"}


COMMON: dict[str, Check] = {
    "aliases": checks.list_of(checks.string),
    "keep_alive": checks.duration,
    "preload": checks.boolean,
    "reasoning": _reasoning,
    "reasoning_budgets": _reasoning_budgets,
    "defaults": checks.table({name: _sampling_default(p) for name, p in SAMPLING.items()}),
    "embeddings": checks.boolean,
}

LOCAL: dict[str, Check] = {
    "path": checks.path,
    **settings.CHECKS,
    "tool_format": checks.one_of(TOOL_FORMATS),
    "pin": checks.boolean,
    "loras": _loras,
    **COMMON,
}

UPSTREAM: dict[str, Check] = {
    "upstream": _url,
    "model": checks.string,
    "api_key": checks.string,
    "api_key_env": checks.string,
    "api_key_file": checks.path,
    "upstream_discover": checks.boolean,
    "prefix": checks.string,
    "timeouts": checks.table({"connect": checks.positive_seconds, "first_byte": checks.positive_seconds,
                              "idle": checks.positive_seconds}),
    "max_connections": checks.integer(minimum=1, maximum=4096, what="an integer from 1 to 4096"),
    "parallel": checks.integer(minimum=1, maximum=1024, what="an integer from 1 to 1024"),
    **COMMON,
}

@checks.accepts({"type": "array", "minItems": 1})  # its items: ``reference.member_schema``
def _replica_list(r: Report, where: str, v: Any) -> Any:
    """``replicas:``, each member read by ``_member`` once the entry is checked."""
    if v is None:
        return ()
    if not isinstance(v, list):
        r.error(where, f"must be a list, got {show(v)}")
        return INVALID
    return tuple(v)


REPLICAS: dict[str, Check] = {**COMMON, "replicas": _replica_list}

# each key's line in the reference (``reference.py``); a llama.cpp setting's is its field's
DOCS: dict[str, str] = {
    "path": "the GGUF file (the first part of a split model); relative to models.yaml",
    "tool_format": "how the model writes tool calls; auto: from its chat template and vocabulary",
    "pin": "loaded at start, never unloaded by eviction or keep_alive",
    "loras": "LoRA adapters a request names (MODEL:ADAPTER): each name to a file, or {path: FILE, scale: NUMBER}",
    "aliases": "more names for the model (case-insensitive); a glob (claude-*, gpt-*, *) catches names no model has",
    "keep_alive": "unload after idle this long (seconds, or 30s / 5m / 1h; -1: never); unset: server.keep_alive",
    "preload": "load at start instead of on the first request",
    "reasoning": "how the model marks its thinking: a format, none, or its own [open, close] pair; auto: "
                 "from the template",
    "reasoning_budgets": "thinking tokens per reasoning_effort (minimal, low, medium, high; null: no cap)",
    "defaults": "sampling defaults for requests that leave a field out",
    "embeddings": "serve /v1/embeddings with this model",
    "upstream": "another server's OpenAI-compatible base URL (a bare host:port gets /v1)",
    "model": "the upstream's name for the model; unset: this entry's name",
    "api_key": "the key sent to the upstream (never logged or shown)",
    "api_key_env": "the environment variable holding the upstream's key",
    "api_key_file": "a file whose first line is the upstream's key",
    "upstream_discover": "also serve every model the upstream's /v1/models lists, as prefix + id",
    "prefix": "the names of discovered upstream models start with this; unset: the entry's name and a slash",
    "timeouts": "seconds to wait on the upstream",
    "max_connections": "pooled connections to the upstream",
    "replicas": "several backends under one name: GGUF paths, or mappings of a local model or an upstream",
}
UPSTREAM_DOCS: dict[str, str] = {  # where a key means something else on an upstream
    "parallel": "requests the upstream answers at once (how replicas share work)"}
NESTED_DOCS: dict[str, str] = {
    "timeouts.connect": "seconds to open a connection",
    "timeouts.first_byte": "seconds from sending a request to the answer's first event",
    "timeouts.idle": "seconds between two events of an answer",
    "defaults.temperature": "sampling temperature", "defaults.top_p": "nucleus sampling: the probability kept",
    "defaults.top_k": "sample among this many most likely tokens (0: all)",
    "defaults.min_p": "drop tokens under this share of the most likely one's probability",
    "defaults.repeat_penalty": "penalty on repeated tokens (1: none)",
    "defaults.presence_penalty": "penalty on tokens already present", "defaults.frequency_penalty": (
        "penalty on tokens by how often they appeared"), "defaults.seed": "a fixed sampling seed",
    "defaults.max_tokens": "default completion length",
    "loras.NAME.path": "the adapter's GGUF file", "loras.NAME.scale": "the scale it is applied at (-100 to 100)",
}
MIRRORS: dict[str, tuple[str, str]] = {  # key: (llama-server flag, Ollama option)
    "keep_alive": ("", "keep_alive"), "embeddings": ("--embeddings", ""), "defaults.temperature": (
        "--temp", "temperature"), "defaults.top_p": ("--top-p", "top_p"), "defaults.top_k": ("--top-k", "top_k"),
    "defaults.min_p": ("--min-p", "min_p"), "defaults.repeat_penalty": ("--repeat-penalty", "repeat_penalty"),
    "defaults.presence_penalty": ("--presence-penalty", "presence_penalty"),
    "defaults.frequency_penalty": ("--frequency-penalty", "frequency_penalty"),
    "defaults.seed": ("-s, --seed", "seed"), "defaults.max_tokens": ("-n, --n-predict", "num_predict")}


def parse_models(r: Parsing, data: dict[str, Any], *, check_files: bool) -> list[ModelSpec]:
    """The specs of ``models:`` and of the older layout's top-level ``name: path`` pairs; a name
    (or alias) used twice is a problem, a model file not there a warning."""
    entries: list[tuple[str, str, Any]] = []  # (yaml path, name, raw)
    models_raw = data.get("models")
    if models_raw is not None and not isinstance(models_raw, dict):
        r.error("models", f"must be a mapping of name to path or settings, got {show(models_raw)}")
    elif models_raw:
        entries += [(f"models.{k}", k, v) for k, v in models_raw.items()]
    for key, value in data.items():
        if key in ("server", "models"):
            continue
        if isinstance(value, str):  # the older layout: top-level `name: path` pairs
            entries.append((str(key), key, value))
        else:
            r.error(str(key), "unknown key (expected server, models, or a `name: path` model entry)")

    models: list[ModelSpec] = []
    seen: dict[str, str] = {}
    for where, name, raw in entries:
        spec = _model(r, where, name, raw)
        if spec is None:
            continue
        for n in spec.names:
            key = normalize_name(n)
            if key in seen:
                r.error(where, f"name {show(n)} is already used by {seen[key]}")
            else:
                seen[key] = where
        for member in spec.members:
            if check_files:
                for what, file in _files(member):
                    if not file.is_file():
                        r.warn(where, f"{what} not found: {file}")
        models.append(spec)
    return models


def _files(spec: ModelSpec) -> list[tuple[str, Path]]:
    """The files a model entry names, each with what it is: the model's, its projector's, its
    draft model's (where ``draft`` is a path: a bare name is a model the catalog resolves) and
    its LoRA adapters' (``lora``, and ``loras`` by name)."""
    files = [("model file", spec.path)] if spec.path is not None else []
    if spec.mmproj is not None:
        files.append(("projector file (mmproj)", spec.mmproj))
    if spec.draft is not None and spec.draft.is_absolute():
        files.append(("draft model file", spec.draft))
    files += [("LoRA adapter", adapter) for adapter, _ in spec.lora]
    files += [(f"LoRA adapter {a.name!r}", a.path) for a in spec.loras]
    return files


def _model(r: Parsing, where: str, name: Any, raw: Any) -> ModelSpec | None:
    if not isinstance(name, str) or not name.strip():
        r.error(where, f"model name must be a non-empty string, got {show(name)}")
        return None
    name = name.strip()
    if isinstance(raw, str):
        path = checks.resolve_path(r, where, raw)
        return ModelSpec(name=name, path=path) if path else None
    if not isinstance(raw, dict):
        r.error(where, f"must be a file path or a mapping with `path` (or `upstream`, `replicas`), got {show(raw)}")
        return None
    before = len(r.problems)
    kinds = [k for k in ("path", "upstream", "replicas") if k in raw]
    if not kinds:
        r.error(f"{where}.path", "required: the model's GGUF file (or `upstream`: another server's URL, "
                                 "or `replicas`)")
        return None
    if len(kinds) > 1:
        r.error(where, f"needs exactly one of `path`, `upstream` or `replicas`, got {', '.join(kinds)}")
        return None
    if kinds == ["replicas"]:
        if "loras" in raw:
            r.error(f"{where}.loras", _NO_LORAS["replicas"])
        stray = sorted(k for k in raw if k not in REPLICAS and k != "loras")
        if stray:
            r.error(where, f"{', '.join(stray)}: set these on each replica, not on the entry")
        fields = checks.mapping(r, where, {k: v for k, v in raw.items() if k not in stray and k != "loras"},
                                REPLICAS)
        members = []
        for i, item in enumerate(fields.get("replicas", ()), 1):
            member = _member(r, f"{where}.replicas[{i - 1}]", f"{name}#{i}", item)
            if member is not None:
                members.append(member)
        if not fields.get("replicas"):
            r.error(f"{where}.replicas", "must list at least one replica")
        fields["replicas"] = tuple(members)
        fields["parallel"] = sum(m.parallel for m in members) or 1
    else:
        fields = _kind_fields(r, where, raw, upstream=kinds == ["upstream"])
    if len(r.problems) > before:
        return None
    return _spec(r, where, name, fields)


def _member(r: Parsing, where: str, name: str, raw: Any) -> ModelSpec | None:
    """One replica: a GGUF path, or a mapping for a local or an upstream backend."""
    if isinstance(raw, str):
        path = checks.resolve_path(r, where, raw)
        return ModelSpec(name=name, path=path) if path else None
    if not isinstance(raw, dict):
        r.error(where, f"must be a file path or a mapping with `path` or `upstream`, got {show(raw)}")
        return None
    before = len(r.problems)
    kinds = [k for k in ("path", "upstream") if k in raw]
    if len(kinds) != 1:
        r.error(where, f"needs exactly one of `path` or `upstream`, got {', '.join(kinds) or 'none'}")
        return None
    if "loras" in raw:
        r.error(f"{where}.loras", _NO_LORAS["replicas"])
        raw = {k: v for k, v in raw.items() if k != "loras"}
    fields = _kind_fields(r, where, raw, upstream=kinds == ["upstream"])
    if len(r.problems) > before:
        return None
    return _spec(r, where, name, fields)


def _kind_fields(r: Parsing, where: str, raw: dict[str, Any], *, upstream: bool) -> dict[str, Any]:
    """A local or an upstream entry's fields; a key that belongs to the other kind of backend
    is named as such (a typo'd config must not half-work)."""
    table, other = (UPSTREAM, LOCAL) if upstream else (LOCAL, UPSTREAM)
    what = "a local model (`path`), not an upstream" if upstream else "an upstream (`upstream`), not a local model"
    for key in raw:
        if upstream and key == "loras":
            r.error(f"{where}.loras", _NO_LORAS["upstream"])
        elif key not in table and key in other:
            r.error(f"{where}.{key}", f"is for {what}")
    keys = [k for k in ("api_key", "api_key_env", "api_key_file") if k in raw]
    if len(keys) > 1:
        r.error(where, f"give one of api_key, api_key_env, api_key_file, got {', '.join(keys)}")
    return checks.mapping(r, where, {k: v for k, v in raw.items() if k in table or k not in other}, table)


def _spec(r: Parsing, where: str, name: str, fields: dict[str, Any]) -> ModelSpec | None:
    """The spec from a checked entry's fields; an upstream's own keys become its ``Upstream``."""
    if "upstream" not in fields:
        if (problem := settings.conflict(fields)) is not None:
            r.error(f"{where}.{problem[0]}", problem[1])
            return None
        return ModelSpec(name=name, **fields)
    url = fields.pop("upstream")
    key = fields.pop("api_key", None)
    if (var := fields.pop("api_key_env", None)) is not None:
        key = os.environ.get(var) or None
        if key is None:  # like a missing model file: the other models still serve
            r.warn(f"{where}.api_key_env", f"environment variable {var} is not set; "
                                           "requests to this upstream go without a key")
    if (file := fields.pop("api_key_file", None)) is not None:
        try:
            key = file.read_text(encoding="utf-8").strip().splitlines()[0].strip()
        except (OSError, IndexError) as e:
            r.error(f"{where}.api_key_file", f"cannot read a key from {file}: "
                                             f"{getattr(e, 'strerror', None) or 'empty file'}")
    timeouts = fields.pop("timeouts", {})
    discover = fields.pop("upstream_discover", False)
    upstream = Upstream(url=url, model=fields.pop("model", None), api_key=key, discover=discover,
                        prefix=fields.pop("prefix", f"{name}/"),
                        connect_timeout=timeouts.get("connect", Upstream.connect_timeout),
                        first_byte_timeout=timeouts.get("first_byte", Upstream.first_byte_timeout),
                        idle_timeout=timeouts.get("idle", Upstream.idle_timeout),
                        max_connections=fields.pop("max_connections", Upstream.max_connections))
    return ModelSpec(name=name, upstream=upstream, source="upstream", **fields)
