"""The one reader of models.yaml and the environment.

``load_config`` turns a file (or nothing) into a frozen ``Config``. Every problem is
reported as ``FILE: YAML.PATH: message`` and all of them are collected before raising,
so ``check-config`` shows each mistake on its own line. Unknown keys are errors: a typo
must never be silently ignored. A model file that does not exist is not fatal to
``serve`` (the model fails when asked for), so those are kept apart as ``warnings``.

One module per job: ``specs`` (what the file describes, as dataclasses), ``server`` and
``models`` (each section's keys and checks, declared), ``parsing`` (where problems are
collected); the value checks themselves are ``gateway.base.checks``, and llama.cpp's settings
are declared once in ``protocol.settings``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from ...base.checks import parse_bytes, parse_duration, show
from .keys import ENV_KEYS
from .models import parse_models
from .parsing import Parsing
from .server import parse_server
from .specs import (
    DEFAULT_HOST,
    DEFAULT_KEEP_ALIVE,
    DEFAULT_KV_CACHE_MAX_BYTES,
    DEFAULT_LOAD_TIMEOUT,
    DEFAULT_MAX_LOADED,
    DEFAULT_PORT,
    EVENT_LOOPS,
    MAX_ADAPTER_NAME,
    MAX_ADAPTERS,
    MAX_LORA_SCALE,
    MEMORY,
    REASONING_FIELDS,
    REASONING_MODES,
    TOOL_FORMATS,
    AdapterSpec,
    Config,
    ConfigError,
    KeySpec,
    ModelSpec,
    ServerConfig,
    Upstream,
    adapter_name_problem,
    default_kv_cache_dir,
    default_state_dir,
    normalize_name,
)

__all__ = ["DEFAULT_HOST", "DEFAULT_KEEP_ALIVE", "DEFAULT_KV_CACHE_MAX_BYTES", "DEFAULT_LOAD_TIMEOUT",
           "DEFAULT_MAX_LOADED", "DEFAULT_PORT", "ENV_CONFIG", "ENV_KEYS", "EVENT_LOOPS", "MAX_ADAPTERS",
           "MAX_ADAPTER_NAME", "MAX_LORA_SCALE", "REASONING_FIELDS", "REASONING_MODES", "MEMORY", "TOOL_FORMATS",
           "AdapterSpec", "Config", "ConfigError", "KeySpec", "ModelSpec", "ServerConfig", "Upstream",
           "adapter_name_problem", "default_config_path", "default_kv_cache_dir", "default_state_dir",
           "find_config_path", "load_config", "normalize_name", "parse_bytes", "parse_duration"]

ENV_CONFIG = "GGUF_GATEWAY_CONFIG"


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


def load_config(path: str | os.PathLike | None = None, *, check_files: bool = True, editing: bool = False) -> Config:
    """Load and validate ``path`` (``None``: built-in defaults). Raises ``ConfigError``.
    ``editing``: for ``gguf-gateway keys``, which mends what it reads past (``keys.gather``)."""
    if path is None:  # no file: the defaults, and the keys the environment and the state folder give
        return _parse(Parsing(Path("(defaults)")), {}, check_files=check_files, path=None, editing=editing)
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
    return _parse(Parsing(path), data, check_files=check_files, path=path, editing=editing)


def _parse(r: Parsing, data: Any, *, check_files: bool, path: Path | None = None, editing: bool = False) -> Config:
    """The sections in their order (``server``, then the models), every problem collected."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"{r.file}: top level: must be a mapping, got {show(data)}"])
    server = parse_server(r, data.get("server"), editing=editing)
    models = parse_models(r, data, check_files=check_files)
    if r.problems:
        raise ConfigError(r.problems)
    return Config(server=ServerConfig(**server), models=tuple(models), path=path, warnings=tuple(r.warnings))
