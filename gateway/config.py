"""The one reader of models.yaml and the environment.

``load_config`` turns a file (or nothing) into a frozen ``Config``. Every problem is
reported as ``FILE: YAML.PATH: message`` and all of them are collected before raising,
so ``check-config`` shows each mistake on its own line. Unknown keys are errors: a typo
must never be silently ignored. A model file that does not exist is not fatal to
``serve`` (the model fails when asked for), so those are kept apart as ``warnings``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .sampling import SAMPLING

ENV_CONFIG = "GGUF_GATEWAY_CONFIG"
ENV_KEYS = "GGUF_GATEWAY_API_KEYS"  # comma-separated, each "key" or "name=key"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_KEEP_ALIVE = 300.0  # seconds an idle model stays loaded, as Ollama's 5m
DEFAULT_LOAD_TIMEOUT = 300.0
DEFAULT_MAX_LOADED = 3  # as Ollama's OLLAMA_MAX_LOADED_MODELS on a CPU; 0 = no limit

REASONING_MODES = ("auto", "think", "think_mistral", "seed", "channel", "harmony", "none")
# toolcalls.FORMATS, and auto (read from the chat template) and none (refuse tools)
TOOL_FORMATS = ("auto", "hermes", "qwen3_coder", "llama3", "mistral", "harmony", "deepseek", "plain", "none")
REASONING_FIELDS = ("reasoning_content", "reasoning")
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


def parse_duration(value: Any) -> float | None:
    """Seconds from ``300``, ``"5m"``, ``"1h30m"``, ``"90s"``; ``-1`` means forever (``inf``).

    None when ``value`` is not a duration."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float("inf") if value == -1 else (float(value) if value >= 0 else None)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("-1", "forever", "inf"):
            return float("inf")
        try:
            return parse_duration(float(text))
        except ValueError:
            pass
        parts = _DURATION_RE.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
            return sum(float(n) * scale[u] for n, u in parts)
    return None


class ConfigError(Exception):
    """One or more problems, each a full line naming the file and the YAML path."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass(frozen=True)
class ModelSpec:
    """A model the gateway can serve: where it lives and how to load it."""

    name: str
    path: Path
    aliases: tuple[str, ...] = ()
    n_ctx: int | None = None  # None: the model's trained context, capped (engine decides)
    n_gpu_layers: int = -1  # -1: every layer on the GPU when llama.cpp has one
    embeddings: bool = False
    keep_alive: float | None = None  # seconds idle before unloading; None: server.keep_alive; inf: never
    preload: bool = False
    n_threads: int | None = None  # None: the CPUs this process may use (at most 16)
    n_batch: int = 512
    parallel: int = 4  # sequence slots decoded together; each holds n_ctx tokens
    flash_attn: bool | None = None  # None: llama.cpp decides
    # llama.cpp's repacked CPU weight layouts: faster kernels on some CPUs, but a token's logits
    # then depend on how many other tokens share its batch (greedy answers change under load)
    repack: bool = False
    # sliding-window layers keep every position (llama.cpp's C default): a prefix is reused however
    # far back a prompt leaves it, and answers do not depend on how a prompt was split; false
    # keeps only the window (llama-server's default), far less memory
    swa_full: bool = True
    use_mmap: bool = True
    chat_template: str | None = None  # Jinja source overriding the GGUF's own template
    reasoning: str = "auto"  # REASONING_MODES, or a pair of markers (reasoning.pair_format): how thinking is marked
    tool_format: str = "auto"  # how the model writes tool calls (TOOL_FORMATS)
    # thinking tokens per OpenAI reasoning_effort (minimal/low/medium/high; null: no cap), over
    # protocol.params.DEFAULT_BUDGETS
    reasoning_budgets: dict[str, int | None] = field(default_factory=dict)
    defaults: dict[str, float] = field(default_factory=dict)  # sampling defaults for requests
    source: str = "models.yaml"  # models.yaml | discovered | demo

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


@dataclass(frozen=True)
class ServerConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    models_dirs: tuple[Path, ...] = ()
    api_keys: tuple[tuple[str, str], ...] = ()  # (principal name, key), from every source
    discover_default_stores: bool = True
    keep_alive: float = DEFAULT_KEEP_ALIVE
    load_timeout: float = DEFAULT_LOAD_TIMEOUT
    max_loaded_models: int = DEFAULT_MAX_LOADED
    reasoning_fields: tuple[str, ...] = ("reasoning_content", "reasoning")
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call the API ("*": any)
    max_body_bytes: int = 32 * 2**20
    max_messages: int = 4096
    max_queue: int = 64  # per model: requests waiting beyond this get 429
    request_timeout: float = 600.0  # seconds a request may run; 0: no limit
    # Connections (a timeout of 0: none). A client that stops reading a stream for write_timeout
    # is treated as gone; a connection must send a request's headers within header_timeout of
    # opening (or of its first byte after a response) and may sit idle for keepalive_timeout.
    write_timeout: float = 30.0
    header_timeout: float = 10.0
    keepalive_timeout: float = 30.0
    body_timeout: float = 60.0  # a request's body must arrive whole within this
    max_connections: int = 512  # open connections past this are refused with a 503
    events_path: Path | None = None  # append one JSON line per request here
    drain_seconds: float = 30.0  # on SIGTERM, how long requests in flight may take to finish
    metrics_public: bool = False  # /metrics without an API key
    # how long a streamed token may wait to go out with the next ones (a fast model's tokens
    # then reach the gateway process in twos or threes: fewer wake-ups); 0: each at once
    stream_interval_ms: int = 10


@dataclass(frozen=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    models: tuple[ModelSpec, ...] = ()
    path: Path | None = None
    warnings: tuple[str, ...] = ()


def default_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "gguf-gateway" / "models.yaml"


def find_config_path(explicit: str | os.PathLike | None = None) -> Path | None:
    """``--config``, else ``$GGUF_GATEWAY_CONFIG``, else the user's config file if it exists."""
    if explicit:
        return Path(explicit)
    if os.environ.get(ENV_CONFIG):
        return Path(os.environ[ENV_CONFIG])
    path = default_config_path()
    return path if path.is_file() else None


def normalize_name(name: str) -> str:
    return name.strip().lower()


def load_config(path: str | os.PathLike | None = None, *, check_files: bool = True) -> Config:
    """Load and validate ``path`` (``None``: built-in defaults). Raises ``ConfigError``."""
    if path is None:
        return Config()
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError([f"{path}: cannot read: {e.strerror or e}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError([f"{path}: invalid YAML: {where}{problem}"]) from None
    return _Parser(path).parse(data, check_files=check_files)


def _parse_keys(lines: list[str]) -> list[tuple[str | None, str]]:
    """Keys from a file's lines or the environment: "key", "name=key" or "name: key"; # comments."""
    out: list[tuple[str | None, str]] = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        for sep in ("=", ": "):
            if sep in line:
                name, key = line.split(sep, 1)
                out.append((name.strip() or None, key.strip()))
                break
        else:
            out.append((None, line))
    return [(n, k) for n, k in out if k]


def _name_keys(keys: list[tuple[str | None, str]]) -> tuple[tuple[str, str], ...]:
    return tuple((name or f"key{i}", key) for i, (name, key) in enumerate(keys, 1))


def _show(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


class _Parser:
    """Walks the YAML tree, collecting every problem with its dotted path."""

    def __init__(self, file: Path):
        self.file = file
        self.base = file.resolve().parent
        self.problems: list[str] = []
        self.warnings: list[str] = []

    def error(self, where: str, message: str) -> None:
        self.problems.append(f"{self.file}: {where}: {message}")

    def path(self, where: str, value: Any) -> Path | None:
        if not isinstance(value, str) or not value.strip():
            self.error(where, f"must be a file path, got {_show(value)}")
            return None
        expanded = os.path.expanduser(os.path.expandvars(value.strip()))
        return (self.base / expanded).resolve() if not os.path.isabs(expanded) else Path(expanded)

    def mapping(self, where: str, value: Any, allowed: dict[str, Callable[[str, Any], Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if value is None:
            return out
        if not isinstance(value, dict):
            self.error(where, f"must be a mapping, got {_show(value)}")
            return out
        for key, item in value.items():
            sub = f"{where}.{key}"
            if key not in allowed:
                self.error(sub, f"unknown key (expected one of: {', '.join(allowed)})")
                continue
            parsed = allowed[key](sub, item)
            if parsed is not _INVALID:
                out[key] = parsed
        return out

    # --- typed fields: each returns the value, or _INVALID after recording a problem ---
    def integer(self, *, minimum: int | None = None, maximum: int | None = None, what: str = "an integer"):
        def check(where: str, v: Any):
            ok = isinstance(v, int) and not isinstance(v, bool)
            ok = ok and (minimum is None or v >= minimum) and (maximum is None or v <= maximum)
            if not ok:
                self.error(where, f"must be {what}, got {_show(v)}")
                return _INVALID
            return v
        return check

    def one_of(self, choices: tuple[str, ...]):
        def check(where: str, v: Any):
            if v not in choices:
                self.error(where, f"must be one of {', '.join(choices)}, got {_show(v)}")
                return _INVALID
            return v
        return check

    def reasoning(self, where: str, v: Any):
        """One of REASONING_MODES, or the model's own ``[open, close]`` pair of thinking markers."""
        if isinstance(v, list):
            if len(v) == 2 and all(isinstance(m, str) and m.strip() for m in v) and v[0] != v[1]:
                from .reasoning import pair_format

                return pair_format(v[0], v[1])
            self.error(where, f"a pair of markers must be two different non-empty strings [open, close], "
                              f"got {_show(v)}")
            return _INVALID
        return self.one_of(REASONING_MODES)(where, v)

    def reasoning_budgets(self, where: str, v: Any):
        efforts = ("minimal", "low", "medium", "high")
        if not isinstance(v, dict) or any(k not in efforts for k in v) or any(
                b is not None and (not isinstance(b, int) or isinstance(b, bool) or b < 0) for b in v.values()):
            self.error(where, f"must map {', '.join(efforts)} to a number of tokens >= 0 (or null: no cap), "
                              f"got {_show(v)}")
            return _INVALID
        return dict(v)

    def boolean(self, where: str, v: Any):
        if not isinstance(v, bool):
            self.error(where, f"must be true or false, got {_show(v)}")
            return _INVALID
        return v

    def string(self, where: str, v: Any):
        if not isinstance(v, str) or not v.strip():
            self.error(where, f"must be a non-empty string, got {_show(v)}")
            return _INVALID
        return v.strip()

    def list_of(self, item: Callable[[str, Any], Any]):
        def check(where: str, v: Any):
            if v is None:
                return ()
            if not isinstance(v, list):
                self.error(where, f"must be a list, got {_show(v)}")
                return _INVALID
            items = [item(f"{where}[{i}]", x) for i, x in enumerate(v)]
            return _INVALID if any(x is _INVALID for x in items) else tuple(items)
        return check

    def api_keys(self, where: str, v: Any):
        """A list of keys, or a map ``name: key`` so events and metrics can name the principal."""
        if v is None:
            return []
        if isinstance(v, dict):
            out = []
            for name, key in v.items():
                if not isinstance(key, str) or not key.strip():
                    self.error(f"{where}.{name}", f"must be a non-empty string, got {_show(key)}")
                else:
                    out.append((str(name), key.strip()))
            return out
        keys = self.list_of(self.string)(where, v)
        return _INVALID if keys is _INVALID else [(None, k) for k in keys]

    def duration(self, where: str, v: Any):
        seconds = parse_duration(v)
        if seconds is None:
            self.error(where, f'must be a duration (seconds, or like "5m", "1h"; -1 keeps it loaded), got {_show(v)}')
            return _INVALID
        return seconds

    def seconds(self, where: str, v: Any):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            self.error(where, f"must be a number of seconds >= 0, got {_show(v)}")
            return _INVALID
        return float(v)

    def defaults(self, where: str, v: Any):
        def check(param):
            def one(sub: str, x: Any):
                problem = param.problem(x)
                if problem:
                    self.error(sub, f"{problem}, got {_show(x)}")
                    return _INVALID
                return x
            return one
        return self.mapping(where, v, {name: check(p) for name, p in SAMPLING.items()})

    def path_field(self, where: str, v: Any):
        p = self.path(where, v)
        return _INVALID if p is None else p

    # --- sections ---
    def parse(self, data: Any, *, check_files: bool) -> Config:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError([f"{self.file}: top level: must be a mapping, got {_show(data)}"])
        server_raw = data.get("server")
        server = self.mapping("server", server_raw, {
            "host": self.string,
            "port": self.integer(minimum=1, maximum=65535, what="a port number (1-65535)"),
            "models_dirs": self.list_of(self.path_field),
            "api_keys": self.api_keys,
            "api_keys_file": self.path_field,
            "cors_origins": self.list_of(self.string),
            "max_body_bytes": self.integer(minimum=1024, what="an integer >= 1024"),
            "max_messages": self.integer(minimum=1, what="a positive integer"),
            "max_queue": self.integer(minimum=0, what="an integer >= 0"),
            "request_timeout": self.seconds,
            "write_timeout": self.seconds,
            "header_timeout": self.seconds,
            "keepalive_timeout": self.seconds,
            "body_timeout": self.seconds,
            "max_connections": self.integer(minimum=1, what="a positive integer"),
            "discover_default_stores": self.boolean,
            "keep_alive": self.duration,
            "load_timeout": self.seconds,
            "max_loaded_models": self.integer(minimum=0, what="an integer >= 0 (0: no limit)"),
            "reasoning_fields": self.list_of(self.one_of(REASONING_FIELDS)),
            "events_path": self.path_field,
            "drain_seconds": self.seconds,
            "metrics_public": self.boolean,
            "stream_interval_ms": self.integer(minimum=0, maximum=1000, what="an integer from 0 to 1000"),
        })

        keys = list(server.pop("api_keys", ()))
        keys_file = server.pop("api_keys_file", None)
        if keys_file is not None:
            try:
                keys += _parse_keys(keys_file.read_text(encoding="utf-8").splitlines())
            except OSError as e:
                self.error("server.api_keys_file", f"cannot read {keys_file}: {e.strerror or e}")
        if os.environ.get(ENV_KEYS):
            keys += _parse_keys(os.environ[ENV_KEYS].split(","))
        server["api_keys"] = _name_keys(keys)

        entries: list[tuple[str, str, Any]] = []  # (yaml path, name, raw)
        models_raw = data.get("models")
        if models_raw is not None and not isinstance(models_raw, dict):
            self.error("models", f"must be a mapping of name to path or settings, got {_show(models_raw)}")
        elif models_raw:
            entries += [(f"models.{k}", k, v) for k, v in models_raw.items()]
        for key, value in data.items():
            if key in ("server", "models"):
                continue
            if isinstance(value, str):  # the older layout: top-level `name: path` pairs
                entries.append((str(key), key, value))
            else:
                self.error(str(key), "unknown key (expected server, models, or a `name: path` model entry)")

        models: list[ModelSpec] = []
        seen: dict[str, str] = {}
        for where, name, raw in entries:
            spec = self.model(where, name, raw)
            if spec is None:
                continue
            for n in spec.names:
                key = normalize_name(n)
                if key in seen:
                    self.error(where, f"name {_show(n)} is already used by {seen[key]}")
                else:
                    seen[key] = where
            if check_files and not spec.path.is_file():
                self.warnings.append(f"{self.file}: {where}: model file not found: {spec.path}")
            models.append(spec)

        if self.problems:
            raise ConfigError(self.problems)
        return Config(server=ServerConfig(**server), models=tuple(models), path=self.file,
                      warnings=tuple(self.warnings))

    def model(self, where: str, name: Any, raw: Any) -> ModelSpec | None:
        if not isinstance(name, str) or not name.strip():
            self.error(where, f"model name must be a non-empty string, got {_show(name)}")
            return None
        if isinstance(raw, str):
            path = self.path(where, raw)
            return ModelSpec(name=name.strip(), path=path) if path else None
        if not isinstance(raw, dict):
            self.error(where, f"must be a file path or a mapping with `path`, got {_show(raw)}")
            return None
        before = len(self.problems)
        fields = self.mapping(where, raw, {
            "path": self.path_field,
            "aliases": self.list_of(self.string),
            "n_ctx": self.integer(minimum=1, what="a positive integer"),
            "n_gpu_layers": self.integer(minimum=-1, what="an integer >= -1 (-1: all layers)"),
            "embeddings": self.boolean,
            "keep_alive": self.duration,
            "preload": self.boolean,
            "n_threads": self.integer(minimum=1, what="a positive integer"),
            "n_batch": self.integer(minimum=1, what="a positive integer"),
            "parallel": self.integer(minimum=1, maximum=64, what="an integer from 1 to 64"),
            "flash_attn": self.boolean,
            "repack": self.boolean,
            "swa_full": self.boolean,
            "use_mmap": self.boolean,
            "chat_template": self.string,
            "reasoning": self.reasoning,
            "tool_format": self.one_of(TOOL_FORMATS),
            "reasoning_budgets": self.reasoning_budgets,
            "defaults": self.defaults,
        })
        if "path" not in fields and "path" not in raw:
            self.error(f"{where}.path", "required: the model's GGUF file")
        if len(self.problems) > before:
            return None
        return ModelSpec(name=name.strip(), **fields)


_INVALID = object()
