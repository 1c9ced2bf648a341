"""What models.yaml describes, as frozen dataclasses: ``Config`` (``server`` and the ``models``),
``ServerConfig`` and its ``KeySpec``s, ``ModelSpec`` with its ``Upstream`` and its ``AdapterSpec``s; the
names and defaults they share."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ...hardware.sysmem import DEFAULT_RESERVE

# the worker's bounds on a model's adapters and their scales, which the configuration is held to
from ...protocol.bounds import MAX_ADAPTERS  # noqa: F401 (re-exported)
from ...protocol.bounds import MAX_SCALE as MAX_LORA_SCALE  # noqa: F401 (re-exported)
from ...protocol.settings import DEFAULT_PROMPT_CACHE_BYTES, LlamaSettings

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_KEEP_ALIVE = 300.0  # seconds an idle model stays loaded, as Ollama's 5m
DEFAULT_LOAD_TIMEOUT = 300.0
DEFAULT_MAX_LOADED = 3  # as Ollama's OLLAMA_MAX_LOADED_MODELS on a CPU; 0 = no limit
DEFAULT_KV_CACHE_MAX_BYTES = 8 * 2**30  # saved conversations, all models together
DEFAULT_MAX_MEDIA_PIXELS = 7680 * 4320  # a picture's most pixels: 8K UHD

REASONING_MODES = ("auto", "think", "think_mistral", "seed", "channel", "harmony", "think_dsml", "cohere",
                   "think_kimi", "kimi_k3", "think_ling", "none")
# text.toolformats.FORMATS, and auto (read from the chat template) and none (refuse tools)
TOOL_FORMATS = ("auto", "hermes", "qwen3_coder", "llama3", "mistral", "harmony", "deepseek", "deepseek_dsml", "glm",
                "command_r", "minimax", "minimax_m3", "kimi", "kimi_k3", "plain", "none")
REASONING_FIELDS = ("reasoning_content", "reasoning")
ROLES = ("user", "admin")
# a request's place among the requests waiting for a model, first to last (``access/claims``)
PRIORITIES = ("interactive", "normal", "batch")
# a key's share weight, bounded both ways: past them one share would all but starve the rest
MIN_WEIGHT, MAX_WEIGHT = 0.001, 1000.0
EVENT_LOOPS = ("auto", "uvloop", "asyncio")  # server.event_loop (auto: uvloop where it is installed)
BUDGET_PERIODS = ("day", "week", "month")
MEMORY = Path(":memory:")  # server.usage_db: off, the usage store kept in memory only
DEFAULT_USAGE_DAYS = 400  # a year of daily history, and the month before it to compare against


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


# LoRA adapters a request names (``BASE:ADAPTER``, ``models/adapternames``). Each one a model has is
# a file its worker opens and a buffer on each device its layers use, and a request's name is
# looked up among them: a model has at most MAX_ADAPTERS (models.yaml's, discovery's and those
# added at run time together: the worker's bound), each named in at most MAX_ADAPTER_NAME characters.
MAX_ADAPTER_NAME = 64
ADAPTER_SOURCES = ("models.yaml", "discovered", "runtime")
# letters, digits, "_", ".", "+", "-": never ":" (BASE:ADAPTER splits at the last one), "/" (a
# repository's path), "#" (a replica's NAME#1), a glob's "*?[", space or a control character
ADAPTER_NAME_CHAR = r"[\w.+-]"  # (the schema's pattern of a name: ``models._loras``)
_ADAPTER_NAME = re.compile(ADAPTER_NAME_CHAR + "+")


@dataclass(frozen=True)
class AdapterSpec:
    """A LoRA adapter a model takes by name: a request for ``BASE:NAME`` (or ``NAME`` alone where one
    model has it) runs BASE with the adapter's product added at ``scale``. Its ``name`` is kept as
    given and compared as names are (``normalize_name``)."""

    name: str
    path: Path  # the adapter's GGUF (general.type adapter, adapter.type lora)
    scale: float = 1.0  # what it is applied at when a request names it
    source: str = "models.yaml"  # ADAPTER_SOURCES: models.yaml's loras, found beside the model, added at run time
    # what every request that names no adapter gets (0; POST /lora-adapters sets it: serving/adapters.py)
    default: float = 0.0


def adapter_name_problem(name: object) -> str | None:
    """Why ``name`` cannot name an adapter (``MAX_ADAPTER_NAME``, ``_ADAPTER_NAME``), or None (pure)."""
    if not isinstance(name, str) or not name.strip():
        return "an adapter's name must be a non-empty string"
    name = name.strip()
    if len(name) > MAX_ADAPTER_NAME:
        return f"an adapter's name is at most {MAX_ADAPTER_NAME} characters, got {len(name)}"
    if not _ADAPTER_NAME.fullmatch(name):
        return ("an adapter's name is letters, digits, '_', '.', '+' and '-' (never ':': a request names it "
                f"as MODEL:ADAPTER), got {name!r}")
    return None


@dataclass(frozen=True)
class ModelSpec(LlamaSettings):
    """A model the gateway can serve: where it lives and how to load it. Exactly one of
    ``path`` (a GGUF run here), ``upstream`` (another server) or ``replicas`` (several of
    those behind this one name) is set. llama.cpp's settings (``n_ctx``, ``parallel``,
    ``cache_type_k``, ...) are ``LlamaSettings``'s fields, keyword-only; the fields below are
    the gateway's own."""

    name: str
    path: Path | None = None
    aliases: tuple[str, ...] = ()
    embeddings: bool = False
    keep_alive: float | None = None  # seconds idle before unloading; None: server.keep_alive; inf: never
    preload: bool = False
    reasoning: str = "auto"  # REASONING_MODES, or a pair of markers (reasoning.pair_format): how thinking is marked
    tool_format: str = "auto"  # how the model writes tool calls (TOOL_FORMATS)
    # thinking tokens per OpenAI reasoning_effort (minimal/low/medium/high; null: no cap), over
    # protocol.params.DEFAULT_BUDGETS
    reasoning_budgets: dict[str, int | None] = field(default_factory=dict)
    defaults: dict[str, float] = field(default_factory=dict)  # sampling defaults for requests
    source: str = "models.yaml"  # models.yaml | discovered | demo | upstream
    upstream: Upstream | None = None
    replicas: tuple[ModelSpec, ...] = ()  # each a local or upstream spec, named NAME#1, NAME#2, ...
    pin: bool = False  # loaded at start and never unloaded (neither evicted nor by keep_alive)
    # the LoRA adapters a request may name (models.yaml's ``loras``, or found beside a discovered
    # model), at most MAX_ADAPTERS; ``lora`` (LlamaSettings') are applied to every request instead
    loras: tuple[AdapterSpec, ...] = ()

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
class KeySpec:
    """One API key and what it may do. The key itself is kept only where the configuration gave
    it (``secret``); a keys file may hold only its SHA-256 (``digest``), which is all a request
    is matched by. ``models``: names and globs the key may use (empty: every model). Limits
    left None do not apply; ``budget`` is tokens per ``budget_period``; ``expires`` is a time
    (epoch seconds) after which the key is refused."""

    name: str
    digest: bytes = field(repr=False)  # never in a log line, should a configuration be printed
    secret: str | None = field(default=None, repr=False)
    named: bool = True  # named by the operator; a bare key is named by its place (key1, key2, ...)
    role: str = "admin"
    models: tuple[str, ...] = ()
    mcp: tuple[str, ...] | None = None  # the MCP servers it may use, by name or glob (None: every one)
    rpm: int | None = None
    tpm: int | None = None
    max_parallel: int | None = None
    budget: int | None = None
    budget_period: str = "month"
    expires: float | None = None
    # its requests' place in a model's queue (``serving/fairness``): its share's weight against the
    # other keys', its priority (its requests' highest: a request may ask a lower one), and whether
    # it may have a model loaded (false: only models already loaded or pinned)
    weight: float = 1.0
    priority: str = "normal"
    may_load: bool = True
    source: str = ""  # where it was given: server.api_keys, a keys file's path, the environment

    @property
    def limited(self) -> bool:
        """Whether anything but the key itself was said of it: a scope or a limit."""
        return bool(self.models) or not self.may_load or self.priority == "batch" or any(
            v is not None for v in (self.rpm, self.tpm, self.max_parallel, self.budget, self.expires))


@dataclass(frozen=True)
class SecretRef:
    """A secret in models.yaml: given inline (``value``), or read when used from the environment
    (``env``) or from a file in the state folder's ``secrets`` folder (``file``)."""

    value: str | None = field(default=None, repr=False)
    env: str | None = None
    file: str | None = None


@dataclass(frozen=True)
class McpServerConfig:
    """One of ``server.mcp_servers``: an MCP server the gateway may connect to, over stdio (a
    program it starts: ``command``) or streamable HTTP (``url``)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, SecretRef] = field(default_factory=dict)
    cwd: Path | None = None
    url: str | None = None
    headers: dict[str, SecretRef] = field(default_factory=dict)
    timeout: float | None = None  # one call's seconds; None: server.tool_timeout
    max_tools: int = 256  # the most tools taken from its list; past it, the rest are left out and said so

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"


@dataclass(frozen=True)
class WebSearchConfig:
    """``server.web_search``: what answers the ``web_search`` tool: a SearXNG server's JSON API
    (``searxng``) or a tool of a configured MCP server (``mcp``: ``SERVER/TOOL``)."""

    searxng: str | None = None
    mcp: str | None = None
    max_results: int = 5


@dataclass(frozen=True)
class CaptureConfig:
    """``server.capture``: each request and its answer kept as received and as sent
    (``server/captures``), for the page's Requests tab and ``/captures``; off by default."""

    enabled: bool = False
    # all captures together, every byte counted; past it, keyless requests' go first, then the
    # oldest of the key that holds the most (``server/captures``)
    max_bytes: int = 64 * 2**20
    # each request's body and each answer's bytes kept at most this long; past it, cut and said so
    max_body_bytes: int = 2**20
    keep: bool = False  # also kept in the state folder (its captures folder), read again at a start
    redact_content: bool = False  # keep the shapes and counts, not the text


@dataclass(frozen=True)
class OtelConfig:
    """``server.otel``: OpenTelemetry traces (``server/tracing``, the ``otel`` extra). Each field
    left out is the SDK's own, from its standard variables (``OTEL_EXPORTER_OTLP_ENDPOINT``,
    ``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER``, ...)."""

    # None: on where OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set
    enabled: bool | None = None
    endpoint: str | None = None  # the collector's base URL (OTLP/HTTP, protobuf): /v1/traces is added
    service_name: str | None = None
    sampler: str | None = None  # OTEL_TRACES_SAMPLER's names: always_on, parentbased_traceidratio, ...
    sampler_arg: float | None = None  # the ratio of the traceidratio samplers
    headers: dict[str, str] = field(default_factory=dict)  # sent with each export (a collector's key)


@dataclass(frozen=True)
class ServerConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    models_dirs: tuple[Path, ...] = ()
    api_keys: tuple[KeySpec, ...] = ()  # from every source: the section, the keys file, the environment
    # the keys file: server.api_keys_file, else keys.yaml in the state folder where it exists;
    # written by ``gguf-gateway keys``, read again on SIGHUP and when it changes
    keys_file: Path | None = None
    # The gateway's own state (the keys file, the usage database); None: ``default_state_dir``
    state_dir: Path | None = None
    # Usage per key, model, wire and hour (``access/usage``): SQLite at this path (None: usage.db
    # in the state folder; ":memory:": kept in memory only), and how many days of it are kept
    usage_db: Path | None = None
    usage_days: int = DEFAULT_USAGE_DAYS
    discover_default_stores: bool = True
    keep_alive: float = DEFAULT_KEEP_ALIVE
    load_timeout: float = DEFAULT_LOAD_TIMEOUT
    max_loaded_models: int = DEFAULT_MAX_LOADED
    reasoning_fields: tuple[str, ...] = ("reasoning_content", "reasoning")
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call the API ("*": any)
    max_body_bytes: int = 32 * 2**20
    max_messages: int = 4096
    max_queue: int = 64  # per model: requests waiting beyond this get 429
    # Who goes first into a model's free slot (``serving/fairness``): a share (a key) not let in
    # while its request waited this long goes first, so a lower priority or weight is never starved
    priority_max_wait: float = 30.0
    # Swaps (a model unloaded for another): the loaded one stays this long after its last request
    # ends while another waits for its room, so its clients' next requests come first; a request
    # waiting for a swap forces it after max_swap_wait (the loaded model then takes no new request)
    swap_hold_seconds: float = 2.0
    max_swap_wait: float = 30.0
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
    # Pictures and sounds in requests (``wire/media``): each file's largest size and a picture's
    # most pixels (its header's width x height, read before llama.cpp decodes it)
    max_media_bytes: int = 20 * 2**20
    max_media_pixels: int = DEFAULT_MAX_MEDIA_PIXELS
    # A request's pictures and sounds together, read from their headers before any is decoded:
    # how many (as many as Anthropic's API takes), all the pictures' pixels (each is decoded in
    # turn, but decoding and resizing take the worker's time by the pixel) and all the sounds'
    # seconds (each decoded at the projector's rate, and its time to encode grows with it)
    max_media_per_request: int = 100
    max_media_pixels_per_request: int = 8 * DEFAULT_MAX_MEDIA_PIXELS
    max_media_seconds_per_request: float = 600.0
    # media named by an http(s) URL are fetched only where this is set (``server/fetch``), within
    # max_media_bytes and remote_media_timeout seconds, never from a loopback, private or
    # link-local address unless allow_remote_media_private
    allow_remote_media: bool = False
    allow_remote_media_private: bool = False
    remote_media_timeout: float = 10.0
    ollama_port: int | None = None  # also listen here (Ollama's is 11434), for clients that cannot be pointed elsewhere
    # Where an unloaded model's conversations (its slots' KV caches) are saved, to be restored
    # when it loads again; None: under the user's cache directory (``default_kv_cache_dir``).
    kv_cache_dir: Path | None = None
    kv_cache_max_bytes: int = DEFAULT_KV_CACHE_MAX_BYTES  # all models' saved caches together; 0: save none
    # each model's prompt cache in host memory, unless its entry sets its own; 0: none
    prompt_cache_bytes: int = DEFAULT_PROMPT_CACHE_BYTES
    # Memory, by pool (``ram``, or a GPU as ggml names it, lowercased: ``cuda0``): the bytes the
    # models may hold there in all (none: no budget of its own; a plain size in YAML is RAM's),
    # and what is kept free of it: bytes, or a share (``"10%"`` -> -10), ``default`` for any
    # pool not named (a plain size or share in YAML is everyone's)
    memory_budget: dict[str, int] = field(default_factory=dict)
    memory_reserve: dict[str, int] = field(default_factory=lambda: {"default": DEFAULT_RESERVE})
    # keep one worker process started ahead of the next load (its interpreter and llama.cpp
    # imported): a model switch skips that part of the start, for the spare's idle memory
    spare_worker: bool = True
    # the HTTP server's event loop (``cli.serve.event_loop``): uvloop's (the ``fast`` extra), asyncio's
    # own, or ``auto``: uvloop where it is installed. asyncio's by default: uvloop did not make the
    # 1-token p50 measurably shorter (docs/performance.md, "Where a request's time goes")
    event_loop: str = "asyncio"
    # keep Claude Code's per-session ``x-anthropic-billing-header:`` system block in the prompt
    # (off: left out, so that a new session's prompt reuses the last one's cache)
    keep_billing_header: bool = False
    # the model ``gguf-gateway launch`` points a coding agent at when none is named (``cli/launch``)
    agent_model: str | None = None
    # Pulling a model a request names that is on no disk (``hub/``): the name prefixes that may
    # be (``("",)``: any; empty: none), how long a whole (not streamed) request waits for the
    # download, and the bytes a pull leaves free on the disk it writes to
    pull_on_demand: tuple[str, ...] = ()
    # the registries such a pull may use, by host, matched whole: ``hf.co`` is the Hugging Face
    # hub (``HF_ENDPOINT``), any other an Ollama registry; never a host only the request names
    pull_on_demand_hosts: tuple[str, ...] = ("hf.co", "registry.ollama.ai")
    pull_wait_seconds: float = 1800.0
    pull_keep_free_bytes: int = 1 << 30
    # Tools the gateway runs itself (``gateway/tools``): the MCP servers it may connect to, the
    # backend of web search, web fetch (None: on where web_search is set), the request URLs an
    # MCP server may be named by beyond the configured ones (prefixes), and the loop's bounds
    mcp_servers: dict[str, McpServerConfig] = field(default_factory=dict)
    web_search: WebSearchConfig | None = None
    web_fetch: bool | None = None
    mcp_allowed_urls: tuple[str, ...] = ()
    max_tool_rounds: int = 8
    tool_timeout: float = 30.0
    max_tool_result_bytes: int = 64 * 1024
    max_tool_result_tokens: int = 4096
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    otel: OtelConfig = field(default_factory=OtelConfig)


@dataclass(frozen=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    models: tuple[ModelSpec, ...] = ()
    path: Path | None = None
    warnings: tuple[str, ...] = ()


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


def default_state_dir() -> Path:
    """The gateway's state folder: ``$XDG_STATE_HOME``, else ``~/Library/Application Support`` on
    macOS, else ``~/.local/state``; in it ``gguf-gateway``."""
    if os.environ.get("XDG_STATE_HOME"):
        base = Path(os.environ["XDG_STATE_HOME"])
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path.home() / ".local" / "state"
    return base / "gguf-gateway"


def normalize_name(name: str) -> str:
    return name.strip().lower()
