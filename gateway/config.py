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
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml

from .engine.protocol import CACHE_TYPES
from .sampling import SAMPLING
from .sysmem import DEFAULT_RESERVE, RAM

ENV_CONFIG = "GGUF_GATEWAY_CONFIG"
ENV_KEYS = "GGUF_GATEWAY_API_KEYS"  # comma-separated, each "key" or "name=key"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_KEEP_ALIVE = 300.0  # seconds an idle model stays loaded, as Ollama's 5m
DEFAULT_LOAD_TIMEOUT = 300.0
DEFAULT_MAX_LOADED = 3  # as Ollama's OLLAMA_MAX_LOADED_MODELS on a CPU; 0 = no limit
DEFAULT_KV_CACHE_MAX_BYTES = 8 * 2**30  # saved conversations, all models together

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
        if value == -1:
            return float("inf")
        try:
            seconds = float(value)
        except OverflowError:  # an integer past any float
            return None
        return seconds if 0 <= seconds < float("inf") else None
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
class Upstream:
    """Another machine's OpenAI-compatible server that answers for a model (``upstream:`` in
    models.yaml). Its URL comes only from configuration, never from a request; its key is
    never logged, shown or counted (``repr`` leaves it out)."""

    url: str  # base URL, ending before /chat/completions (e.g. http://box:8080/v1)
    model: str | None = None  # the upstream's name for the model; None: the entry's own name
    api_key: str | None = field(default=None, repr=False)
    discover: bool = False  # list the upstream's models under ``prefix``
    prefix: str = ""  # discovered names are prefix + the upstream's model id
    connect_timeout: float = 10.0  # seconds to open a connection
    first_byte_timeout: float = 300.0  # seconds from sending a request to the answer's first event
    idle_timeout: float = 120.0  # seconds between two events of an answer
    max_connections: int = 32  # the pool's open connections to this upstream


@dataclass(frozen=True)
class ModelSpec:
    """A model the gateway can serve: where it lives and how to load it. Exactly one of
    ``path`` (a GGUF run here), ``upstream`` (another server) or ``replicas`` (several of
    those behind this one name) is set."""

    name: str
    path: Path | None = None
    aliases: tuple[str, ...] = ()
    n_ctx: int | None = None  # None: the model's trained context, capped (engine decides)
    n_gpu_layers: int = -1  # -1: every layer on the GPU when llama.cpp has one
    embeddings: bool = False
    reranker: bool = False  # scores documents against a query (/v1/rerank) with llama.cpp's rank pooling
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
    source: str = "models.yaml"  # models.yaml | discovered | demo | upstream
    upstream: Upstream | None = None
    replicas: tuple[ModelSpec, ...] = ()  # each a local or upstream spec, named NAME#1, NAME#2, ...
    rpc: tuple[str, ...] = ()  # llama.cpp RPC servers (host:port) that hold part of a local model's layers
    # llama-server's settings, passed to llama.cpp as they are (README: "llama-server flags")
    cache_type_k: str = "f16"  # engine.protocol.CACHE_TYPES
    cache_type_v: str = "f16"  # a quantized V cache needs flash attention
    n_ubatch: int | None = None  # physical batch; None: n_batch
    n_threads_batch: int | None = None  # threads reading prompts; None: n_threads
    main_gpu: int = 0
    # the devices llama.cpp may offload to, by name (llama-server's --device): None: every GPU;
    # (): none (``devices: none``), the model stays on the CPU and touches no GPU
    devices: tuple[str, ...] | None = None
    split_mode: str = "layer"  # SPLIT_MODES: how a model spreads over several GPUs
    tensor_split: tuple[float, ...] = ()  # each GPU's share of the model
    use_mlock: bool = False  # lock the weights in RAM (never swapped out)
    rope_freq_base: float | None = None  # None: the model's own
    rope_freq_scale: float | None = None
    kv_unified: bool = False  # the slots share one pool of n_ctx cells (llama-server's default) instead of n_ctx each
    lora: tuple[tuple[Path, float], ...] = ()  # LoRA adapters: (GGUF path, scale)
    pin: bool = False  # loaded at start and never unloaded (neither evicted nor by keep_alive)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    @property
    def local(self) -> bool:
        """Whether the model runs in a worker on this machine (and takes its memory)."""
        return self.path is not None

    @property
    def members(self) -> tuple[ModelSpec, ...]:
        """The specs that run: the replicas, or the spec itself."""
        return self.replicas or (self,)


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
    # each API key's prompts reuse only that key's cached prompts (slots and saved caches), so a
    # cache hit cannot tell one key what another sent; off: one user's keys share them
    isolate_cache_by_key: bool = False
    # how long a streamed token may wait to go out with the next ones (a fast model's tokens
    # then reach the gateway process in twos or threes: fewer wake-ups); 0: each at once
    stream_interval_ms: int = 10
    # how often an upstream server (``upstream:``) is asked for its /models while it is not
    # down (a down one is asked when its back-off ends); 0: only requests tell its health
    upstream_check_seconds: float = 30.0
    responses_store: int = 1000  # OpenAI Responses kept in memory for previous_response_id; 0: none
    ollama_port: int | None = None  # also listen here (Ollama's is 11434), for clients that cannot be pointed elsewhere
    # Where an unloaded model's conversations (its slots' KV caches) are saved, to be restored
    # when it loads again; None: under the user's cache directory (``default_kv_cache_dir``).
    kv_cache_dir: Path | None = None
    kv_cache_max_bytes: int = DEFAULT_KV_CACHE_MAX_BYTES  # all models' saved caches together; 0: save none
    # Memory, by pool (``ram``, or a GPU as ggml names it, lowercased: ``cuda0``): the bytes the
    # models may hold there in all (none: no budget of its own; a plain size in YAML is RAM's),
    # and what is kept free of it: bytes, or a share (``"10%"`` -> -10), ``default`` for any
    # pool not named (a plain size or share in YAML is everyone's)
    memory_budget: dict[str, int] = field(default_factory=dict)
    memory_reserve: dict[str, int] = field(default_factory=lambda: {"default": DEFAULT_RESERVE})
    # keep one worker process started ahead of the next load (its interpreter and llama.cpp
    # imported): a model switch skips that part of the start, for the spare's idle memory
    spare_worker: bool = True
    # keep Claude Code's per-session ``x-anthropic-billing-header:`` system block in the prompt
    # (off: left out, so that a new session's prompt reuses the last one's cache)
    keep_billing_header: bool = False


@dataclass(frozen=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    models: tuple[ModelSpec, ...] = ()
    path: Path | None = None
    warnings: tuple[str, ...] = ()


SPLIT_MODES = ("none", "layer", "row")


def default_kv_cache_dir() -> Path:
    """The user's cache directory: ``$XDG_CACHE_HOME``, else ``~/Library/Caches`` on macOS, else
    ``~/.cache``; in it ``gguf-gateway/kv``."""
    if os.environ.get("XDG_CACHE_HOME"):
        base = Path(os.environ["XDG_CACHE_HOME"])
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path.home() / ".cache"
    return base / "gguf-gateway" / "kv"


SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 2**10, "m": 1000**2, "mb": 1000**2, "mib": 2**20,
              "g": 1000**3, "gb": 1000**3, "gib": 2**30, "t": 1000**4, "tb": 1000**4, "tib": 2**40}


def parse_bytes(value: Any) -> int | None:
    """A size: bytes as an integer, or a string with a unit (``512MiB``, ``4 GB``); None if not one."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 0 else None
    if not isinstance(value, str):
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value)
    if m is None or m.group(2).lower() not in SIZE_UNITS:
        return None
    return int(float(m.group(1)) * SIZE_UNITS[m.group(2).lower()])


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

    def reserve(self, where: str, v: Any):
        """A size, or a share of the machine's memory (``"10%"``, kept as -10)."""
        if isinstance(v, str) and v.strip().endswith("%"):
            try:
                share = float(v.strip()[:-1])
            except ValueError:
                share = -1
            if 0 <= share < 100:
                return -share if share else 0
            self.error(where, f"must be a size (1GiB) or a share of memory from 0% to 99%, got {_show(v)}")
            return _INVALID
        return self.byte_size(where, v)

    def per_device(self, parse: Callable[[str, Any], Any], plain: str):
        """A value for each memory pool (``ram``, ``cuda0``, ...: keys lowercased), or one plain
        value, which is ``plain``'s."""
        def check(where: str, v: Any):
            if not isinstance(v, dict):
                parsed = parse(where, v)
                return _INVALID if parsed is _INVALID else {plain: parsed}
            out = {}
            for key, item in v.items():
                if not isinstance(key, str) or not key.strip():
                    self.error(where, f"keys must be device names (ram, cuda0, ...), got {_show(key)}")
                    continue
                parsed = parse(f"{where}.{key}", item)
                if parsed is not _INVALID:
                    out[key.strip().lower()] = parsed
            return out
        return check

    def byte_size(self, where: str, v: Any):
        n = parse_bytes(v)
        if n is None:
            self.error(where, f"must be a size: bytes, or a number with a unit (512MiB, 4GiB), got {_show(v)}")
            return _INVALID
        return n

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
            "isolate_cache_by_key": self.boolean,
            "stream_interval_ms": self.integer(minimum=0, maximum=1000, what="an integer from 0 to 1000"),
            "upstream_check_seconds": self.seconds,
            "responses_store": self.integer(minimum=0, what="an integer >= 0 (0: keep none)"),
            "ollama_port": self.integer(minimum=1, maximum=65535, what="a port number (1-65535)"),
            "kv_cache_dir": self.path_field,
            "kv_cache_max_bytes": self.byte_size,
            "spare_worker": self.boolean,
            "keep_billing_header": self.boolean,
            "memory_budget": self.per_device(self.byte_size, RAM),
            "memory_reserve": self.per_device(self.reserve, "default"),
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
            for member in spec.members:
                if check_files and member.path is not None and not member.path.is_file():
                    self.warnings.append(f"{self.file}: {where}: model file not found: {member.path}")
            models.append(spec)

        if self.problems:
            raise ConfigError(self.problems)
        return Config(server=ServerConfig(**server), models=tuple(models), path=self.file,
                      warnings=tuple(self.warnings))

    def model(self, where: str, name: Any, raw: Any) -> ModelSpec | None:
        if not isinstance(name, str) or not name.strip():
            self.error(where, f"model name must be a non-empty string, got {_show(name)}")
            return None
        name = name.strip()
        if isinstance(raw, str):
            path = self.path(where, raw)
            return ModelSpec(name=name, path=path) if path else None
        if not isinstance(raw, dict):
            self.error(where, f"must be a file path or a mapping with `path` (or `upstream`, `replicas`), "
                              f"got {_show(raw)}")
            return None
        before = len(self.problems)
        kinds = [k for k in ("path", "upstream", "replicas") if k in raw]
        if not kinds:
            self.error(f"{where}.path", "required: the model's GGUF file (or `upstream`: another server's URL, "
                                        "or `replicas`)")
            return None
        if len(kinds) > 1:
            self.error(where, f"needs exactly one of `path`, `upstream` or `replicas`, got {', '.join(kinds)}")
            return None
        if kinds == ["replicas"]:
            stray = sorted(k for k in raw if k not in self._common_keys() and k != "replicas")
            if stray:
                self.error(where, f"{', '.join(stray)}: set these on each replica, not on the entry")
            fields = self.mapping(where, {k: v for k, v in raw.items() if k not in stray},
                                  {**self._common_keys(), "replicas": self.list_of(lambda w, v: v)})
            members = []
            for i, item in enumerate(fields.get("replicas", ()), 1):
                member = self.member(f"{where}.replicas[{i - 1}]", f"{name}#{i}", item)
                if member is not None:
                    members.append(member)
            if not fields.get("replicas"):
                self.error(f"{where}.replicas", "must list at least one replica")
            fields["replicas"] = tuple(members)
            fields["parallel"] = sum(m.parallel for m in members) or 1
        else:
            fields = self._kind_fields(where, raw, upstream=kinds == ["upstream"])
        if len(self.problems) > before:
            return None
        return self._spec(where, name, fields)

    def member(self, where: str, name: str, raw: Any) -> ModelSpec | None:
        """One replica: a GGUF path, or a mapping for a local or an upstream backend."""
        if isinstance(raw, str):
            path = self.path(where, raw)
            return ModelSpec(name=name, path=path) if path else None
        if not isinstance(raw, dict):
            self.error(where, f"must be a file path or a mapping with `path` or `upstream`, got {_show(raw)}")
            return None
        before = len(self.problems)
        kinds = [k for k in ("path", "upstream") if k in raw]
        if len(kinds) != 1:
            self.error(where, f"needs exactly one of `path` or `upstream`, got {', '.join(kinds) or 'none'}")
            return None
        fields = self._kind_fields(where, raw, upstream=kinds == ["upstream"])
        if len(self.problems) > before:
            return None
        return self._spec(where, name, fields)

    def _common_keys(self) -> dict[str, Callable[[str, Any], Any]]:
        return {
            "aliases": self.list_of(self.string),
            "keep_alive": self.duration,
            "preload": self.boolean,
            "reasoning": self.reasoning,
            "reasoning_budgets": self.reasoning_budgets,
            "defaults": self.defaults,
            "embeddings": self.boolean,
        }

    def _local_keys(self) -> dict[str, Callable[[str, Any], Any]]:
        return {
            "path": self.path_field,
            "n_ctx": self.integer(minimum=1, what="a positive integer"),
            "n_gpu_layers": self.integer(minimum=-1, what="an integer >= -1 (-1: all layers)"),
            "n_threads": self.integer(minimum=1, what="a positive integer"),
            "n_batch": self.integer(minimum=1, what="a positive integer"),
            "parallel": self.integer(minimum=1, maximum=64, what="an integer from 1 to 64"),
            "flash_attn": self.boolean,
            "repack": self.boolean,
            "swa_full": self.boolean,
            "use_mmap": self.boolean,
            "chat_template": self.string,
            "tool_format": self.one_of(TOOL_FORMATS),
            "rpc": self.list_of(self.rpc_server),
            "reranker": self.boolean,
            "cache_type_k": self.one_of(tuple(CACHE_TYPES)),
            "cache_type_v": self.one_of(tuple(CACHE_TYPES)),
            "n_ubatch": self.integer(minimum=1, what="a positive integer"),
            "n_threads_batch": self.integer(minimum=1, what="a positive integer"),
            "main_gpu": self.integer(minimum=0, what="a GPU index >= 0"),
            "split_mode": self.one_of(SPLIT_MODES),
            "tensor_split": self.tensor_split,
            "devices": self.device_names,
            "use_mlock": self.boolean,
            "rope_freq_base": self.positive_number,
            "rope_freq_scale": self.positive_number,
            "kv_unified": self.boolean,
            "lora": self.list_of(self.lora_adapter),
            "pin": self.boolean,
            **self._common_keys(),
        }

    def _upstream_keys(self) -> dict[str, Callable[[str, Any], Any]]:
        return {
            "upstream": self.url,
            "model": self.string,
            "api_key": self.string,
            "api_key_env": self.string,
            "api_key_file": self.path_field,
            "upstream_discover": self.boolean,
            "prefix": self.string,
            "timeouts": lambda w, v: self.mapping(w, v, {"connect": self.positive_seconds,
                                                         "first_byte": self.positive_seconds,
                                                         "idle": self.positive_seconds}),
            "max_connections": self.integer(minimum=1, maximum=4096, what="an integer from 1 to 4096"),
            "parallel": self.integer(minimum=1, maximum=1024, what="an integer from 1 to 1024"),
            **self._common_keys(),
        }

    def _kind_fields(self, where: str, raw: dict[str, Any], *, upstream: bool) -> dict[str, Any]:
        """A local or an upstream entry's fields; a key that belongs to the other kind of backend
        is named as such (a typo'd config must not half-work)."""
        table, other = (self._upstream_keys(), self._local_keys()) if upstream else (self._local_keys(),
                                                                                     self._upstream_keys())
        what = "a local model (`path`), not an upstream" if upstream else "an upstream (`upstream`), not a local model"
        for key in raw:
            if key not in table and key in other:
                self.error(f"{where}.{key}", f"is for {what}")
        keys = [k for k in ("api_key", "api_key_env", "api_key_file") if k in raw]
        if len(keys) > 1:
            self.error(where, f"give one of api_key, api_key_env, api_key_file, got {', '.join(keys)}")
        return self.mapping(where, {k: v for k, v in raw.items() if k in table or k not in other}, table)

    def _spec(self, where: str, name: str, fields: dict[str, Any]) -> ModelSpec | None:
        """The spec from a checked entry's fields; an upstream's own keys become its ``Upstream``."""
        if "upstream" not in fields:
            if CACHE_TYPES[fields.get("cache_type_v", "f16")].quantized and fields.get("flash_attn") is False:
                self.error(f"{where}.cache_type_v", "a quantized V cache needs flash attention: "
                                                    "leave flash_attn unset (llama.cpp decides) or true")
                return None
            if fields.get("n_ubatch", 0) > fields.get("n_batch", ModelSpec.n_batch):
                self.error(f"{where}.n_ubatch", f"must be at most n_batch ({fields.get('n_batch', ModelSpec.n_batch)})")
                return None
            return ModelSpec(name=name, **fields)
        url = fields.pop("upstream")
        key = fields.pop("api_key", None)
        if (var := fields.pop("api_key_env", None)) is not None:
            key = os.environ.get(var) or None
            if key is None:  # like a missing model file: the other models still serve
                self.warnings.append(f"{self.file}: {where}.api_key_env: environment variable {var} is not set; "
                                     "requests to this upstream go without a key")
        if (file := fields.pop("api_key_file", None)) is not None:
            try:
                key = file.read_text(encoding="utf-8").strip().splitlines()[0].strip()
            except (OSError, IndexError) as e:
                self.error(f"{where}.api_key_file", f"cannot read a key from {file}: "
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

    def url(self, where: str, v: Any):
        """An http(s) base URL; a bare host gets OpenAI's ``/v1``."""
        parts = urlsplit(v.strip()) if isinstance(v, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.query or \
                parts.fragment or parts.username or parts.password:
            self.error(where, f"must be an http:// or https:// base URL such as http://host:8080/v1 "
                              f"(no query, no credentials: give `api_key`), got {_show(v)}")
            return _INVALID
        try:
            parts.port  # noqa: B018 (raises on a bad port)
        except ValueError:
            self.error(where, f"has a bad port: {_show(v)}")
            return _INVALID
        path = parts.path.rstrip("/") or "/v1"
        return urlunsplit((parts.scheme, parts.netloc, path, "", ""))

    def positive_number(self, where: str, v: Any):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
            self.error(where, f"must be a number > 0, got {_show(v)}")
            return _INVALID
        return float(v)

    def tensor_split(self, where: str, v: Any):
        """Each GPU's share, as llama-server's --tensor-split: numbers >= 0, not all 0."""
        if not isinstance(v, list) or not v or len(v) > 16 or any(
                isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x < float("inf") for x in v) \
                or not any(v):
            self.error(where, f"must be a list of each GPU's share (numbers >= 0, not all 0; at most 16), "
                              f"got {_show(v)}")
            return _INVALID
        return tuple(float(x) for x in v)

    def device_names(self, where: str, v: Any):
        """llama-server's --device: ``none``, or a list of llama.cpp's device names (CUDA0,
        Vulkan1, ...: ``gguf-gateway devices`` lists them), checked against llama.cpp at load."""
        if isinstance(v, str) and v.strip().lower() == "none":
            return ()
        if not isinstance(v, list) or not v or len(v) > 16 or any(
                not isinstance(x, str) or not x.strip() or x.strip().lower() == "none" for x in v) \
                or len({x.strip().lower() for x in v}) != len(v):
            self.error(where, f"must be none or a list of distinct device names (CUDA0, Vulkan1, ...: see "
                              f"gguf-gateway devices), got {_show(v)}")
            return _INVALID
        return tuple(x.strip() for x in v)

    def lora_adapter(self, where: str, v: Any):
        """A LoRA adapter: its GGUF path, or ``{path: ..., scale: 1.0}``."""
        raw = {"path": v} if isinstance(v, str) else v
        if not isinstance(raw, dict):
            self.error(where, f"must be a path or {{path: FILE, scale: NUMBER}}, got {_show(v)}")
            return _INVALID
        fields = self.mapping(where, raw, {"path": self.path_field, "scale": self.number})
        if "path" not in fields:
            if "path" not in raw:
                self.error(f"{where}.path", "is required")
            return _INVALID
        return (fields["path"], fields.get("scale", 1.0))

    def number(self, where: str, v: Any):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or abs(v) == float("inf"):
            self.error(where, f"must be a number, got {_show(v)}")
            return _INVALID
        return float(v)

    def rpc_server(self, where: str, v: Any):
        """``host:port`` of a llama.cpp ``rpc-server``."""
        host, _, port = v.rpartition(":") if isinstance(v, str) else ("", "", "")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            self.error(where, f"must be host:port of an rpc-server, got {_show(v)}")
            return _INVALID
        return f"{host.strip()}:{int(port)}"

    def positive_seconds(self, where: str, v: Any):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            self.error(where, f"must be a number of seconds > 0, got {_show(v)}")
            return _INVALID
        return float(v)


_INVALID = object()
