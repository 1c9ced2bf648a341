"""API keys from every source, as ``KeySpec``s: ``server.api_keys`` (a list of keys, or a map
of names to a key or to a key's settings), the keys file (``server.api_keys_file``, else
``keys.yaml`` in the state folder where it exists) and ``$GGUF_GATEWAY_API_KEYS``; and the keys
file's writing, for ``gguf-gateway keys``.

A key is given as itself or, in the keys file, as ``sha256:HEX`` (its SHA-256 in hex): a
request is matched by its key's digest either way, so a file of digests gives away no key.

The keys file is YAML, a map of names to a key or its settings::

    alice:
      key: sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
      role: user
      models: [gemma*, qwen3:8b]
      rpm: 60
      budget: 1000000
      budget_period: month
    ci: sha256:...

A file of one key per line (``key``, ``name=key``), as earlier versions read, still reads.

Roles: a key is what its ``role`` says; one that says none is an ``admin`` when nothing else is
said of it either (a bare key, as every key was before keys had roles) and a ``user`` once it
has a scope or a limit, so a key limited in anything is never an admin by omission. A
configuration with keys and no admin is refused: nobody could load a model or read every key's
usage.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
import secrets
import tempfile
from pathlib import Path
from typing import Any

import yaml

from ...base import checks
from ...base.checks import INVALID, Report, show
from .parsing import Parsing
from .specs import BUDGET_PERIODS, MAX_WEIGHT, MIN_WEIGHT, PRIORITIES, ROLES, KeySpec, ServerConfig, default_state_dir

ENV_KEYS = "GGUF_GATEWAY_API_KEYS"  # comma-separated, each "key" or "name=key"
KEYS_FILE = "keys.yaml"  # in the state folder, where no server.api_keys_file names another
DIGEST = "sha256:"
_DIGEST_RE = re.compile(r"sha256:([0-9a-fA-F]{64})")
MAX_KEYS_FILE = 4 << 20  # bytes: far past any real list of keys, and read whole


def keys_path(server: ServerConfig) -> Path:
    """The keys file a gateway of this configuration reads (where it exists) and watches:
    ``server.api_keys_file``, else keys.yaml in the state folder."""
    return server.keys_file or (server.state_dir or default_state_dir()) / KEYS_FILE


def digest_of(key: str) -> bytes:
    """What a request's key is matched by."""
    return hashlib.sha256(key.encode()).digest()


def new_key() -> str:
    """A fresh random key, as OpenAI's look."""
    return "sk-gg-" + secrets.token_urlsafe(32)


@checks.accepts({"anyOf": [{"type": "number"}, {"type": "string", "pattern": r"^\s*[0-9]{4}-[0-9]{2}-[0-9]{2}"}]})
def _when(r: Report, where: str, v: Any) -> Any:
    """A time: YAML's own timestamp, an ISO 8601 date or date and time (UTC unless it says), or
    epoch seconds; kept as epoch seconds."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str) and (t := checks.parse_time(v)) is not None:
        return t
    if isinstance(v, dt.datetime):
        return (v if v.tzinfo else v.replace(tzinfo=dt.timezone.utc)).timestamp()
    if isinstance(v, dt.date):
        return dt.datetime(v.year, v.month, v.day, tzinfo=dt.timezone.utc).timestamp()
    r.error(where, f"must be a date or time (2027-01-31, 2027-01-31T12:00:00Z), got {show(v)}")
    return INVALID


SECRET_SCHEMA = {"type": "string", "pattern": checks.S, "anyOf": [
    {"not": {"pattern": r"^\s*[sS][hH][aA]256:"}}, {"pattern": r"^\s*sha256:[0-9a-fA-F]{64}\s*$"}]}


@checks.accepts(SECRET_SCHEMA)
def _secret(r: Report, where: str, v: Any) -> Any:
    """A key, or its digest: (digest, the key or None)."""
    if not isinstance(v, str) or not v.strip():
        r.error(where, f"must be a non-empty string (a key, or sha256:HEX), got {show(v)}")
        return INVALID
    v = v.strip()
    if v.lower().startswith(DIGEST):
        m = _DIGEST_RE.fullmatch(v)
        if m is None:
            r.error(where, "a digest must be sha256: and 64 hex digits")
            return INVALID
        return bytes.fromhex(m.group(1)), None
    return digest_of(v), v


_LIMIT = checks.POSITIVE_INTEGER
SETTINGS: dict[str, checks.Check] = {
    "key": _secret,
    "role": checks.one_of(ROLES),
    "models": checks.list_of(checks.string),
    "mcp": checks.list_of(checks.string),
    "rpm": _LIMIT,
    "tpm": _LIMIT,
    "max_parallel": _LIMIT,
    "budget": _LIMIT,
    "budget_period": checks.one_of(BUDGET_PERIODS),
    "expires": _when,
    "weight": checks.number_in(MIN_WEIGHT, MAX_WEIGHT),
    "priority": checks.one_of(PRIORITIES),
    "may_load": checks.boolean,
    "created": _when,  # said by ``keys add``; read, not used
    "note": checks.string,
}
# each setting's line in the reference (``reference.py``)
DOCS: dict[str, str] = {
    "key": "the key, or sha256:HEX (its SHA-256 in hex)",
    "role": "admin or user; unset: admin for a bare key, user once it has a scope or a limit",
    "models": "globs of the model names it may use",
    "mcp": "names or globs of the MCP servers (server.mcp_servers) it may use; unset: every one",
    "rpm": "requests a minute", "tpm": "tokens a minute", "max_parallel": "requests at once",
    "budget": "tokens a budget_period", "budget_period": "the budget's period (UTC)",
    "expires": "refused after this date or time (UTC unless it says)",
    "weight": f"its share of a busy model against other keys' (default 1; from {MIN_WEIGHT:g} to {MAX_WEIGHT:g})",
    "priority": "interactive, normal (default) or batch: its requests' highest; a request's `priority` may lower it",
    "may_load": "false: it may use only models already loaded or pinned, never have one loaded (default true)",
    "created": "when `keys add` made it (read, not used)", "note": "a note (read, not used)",
}
ENTRY_SCHEMA = {"anyOf": [SECRET_SCHEMA, {**checks.object_schema(SETTINGS), "required": ["key"]}]}


def entry(r: Report, where: str, name: str | None, value: Any, source: str) -> KeySpec | None:
    """One key: a string (the key or its digest) or its settings (``key`` and the rest)."""
    if not isinstance(value, dict):
        value = {"key": value}
    if "key" not in value:
        r.error(where, "needs `key` (the key, or sha256:HEX)")
        return None
    settings = checks.mapping(r, where, value, SETTINGS)
    if "key" not in settings or len(settings) < len(value):
        return None
    digest, secret = settings.pop("key")
    settings.pop("created", None)
    settings.pop("note", None)
    spec = KeySpec(name=name or "", digest=digest, secret=secret, named=name is not None, source=source,
                   **{k: v for k, v in settings.items() if k != "role"})
    return KeySpec(**{**spec.__dict__, "role": settings.get("role") or ("user" if spec.limited else "admin")})


@checks.accepts({"anyOf": [{"type": "null"}, {"type": "object", "additionalProperties": ENTRY_SCHEMA},
                           {"type": "array", "items": SECRET_SCHEMA}]})
def from_section(r: Report, where: str, v: Any) -> Any:
    """``server.api_keys``: a list of keys, or a map of names to a key or its settings."""
    if v is None:
        return []
    if isinstance(v, dict):
        out = [entry(r, f"{where}.{name}", str(name), value, where) for name, value in v.items()]
        return [k for k in out if k is not None]
    keys = checks.list_of(checks.string)(r, where, v)
    if keys is INVALID:
        return INVALID
    return [k for k in (entry(r, f"{where}[{i}]", None, key, where) for i, key in enumerate(keys)) if k is not None]


def _lines(lines: list[str]) -> list[tuple[str | None, str]]:
    """Keys one per line, or from the environment: "key", "name=key" or "name: key"; # comments."""
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


def file_entries(text: str) -> dict[str, Any] | list[tuple[str | None, str]]:
    """A keys file's entries: its YAML map, or the keys of a file of lines."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    if isinstance(data, dict) and all(isinstance(k, str) for k in data):
        return data
    return _lines(text.splitlines())


def read_file(r: Report, where: str, path: Path) -> list[KeySpec]:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_KEYS_FILE + 1)
        if len(raw) > MAX_KEYS_FILE:
            r.error(where, f"{path} is larger than {MAX_KEYS_FILE} bytes: not a keys file")
            return []
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        r.error(where, f"cannot read {path}: {getattr(e, 'strerror', None) or e}")
        return []
    try:
        entries = file_entries(text)
    except RecursionError:  # PyYAML's reader recurses per nesting level
        r.error(where, f"{path} nests too deeply: not a keys file")
        return []
    source = str(path)
    if isinstance(entries, dict):
        out = [entry(r, f"{path}: {name}", name, value, source) for name, value in entries.items()]
    else:
        out = [entry(r, f"{path}: line {i}", name, key, source) for i, (name, key) in enumerate(entries, 1)]
    return [k for k in out if k is not None]


def from_env(r: Report, text: str) -> list[KeySpec]:
    out = [entry(r, f"${ENV_KEYS}[{i}]", name, key, f"${ENV_KEYS}")
           for i, (name, key) in enumerate(_lines(text.split(",")))]
    return [k for k in out if k is not None]


def gather(r: Parsing, section: list[KeySpec], keys_file: Path | None, default_file: Path, *,
           editing: bool = False) -> tuple[tuple[KeySpec, ...], Path | None]:
    """Every key, in order: the section's, the keys file's, the environment's; a bare key named
    by its place (``key1``, ``key2``, ...). The keys file is ``keys_file``, else ``default_file``
    where it exists. A configuration with keys and no admin is a problem, unless ``editing``
    (``gguf-gateway keys``, which mends it), where that and a keys file not made yet are warnings."""
    keys = list(section)
    where = "server.api_keys_file"
    if keys_file is None and default_file.is_file():
        keys_file, where = default_file, "keys file"
    if keys_file is not None and not (editing and not keys_file.exists()):
        keys += read_file(r, where, keys_file)
    if os.environ.get(ENV_KEYS):
        keys += from_env(r, os.environ[ENV_KEYS])
    named = tuple(k if k.named else KeySpec(**{**k.__dict__, "name": f"key{i}"}) for i, k in enumerate(keys, 1))
    if named and not any(k.role == "admin" for k in named):
        (r.warn if editing else r.error)(
            "server.api_keys", "no key is an admin, so no key could load a model or read every key's usage: "
            "give one `role: admin` (gguf-gateway keys add NAME --role admin)")
    return named, keys_file


# --- writing the keys file (gguf-gateway keys) -------------------------------------------------
HEADER = ("# gguf-gateway's API keys: `gguf-gateway keys add / revoke` write this file, and a running\n"
          "# gateway reads it again when it changes. Each key is kept as its SHA-256 only.\n")


def load_for_edit(path: Path) -> dict[str, Any]:
    """A keys file's entries as a map to edit (a file of lines becomes one: a bare key named by
    its line); {} where there is no file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    entries = file_entries(text)
    if isinstance(entries, dict):
        return dict(entries)
    return {name or f"line{i}": key for i, (name, key) in enumerate(entries, 1)}


def write_file(path: Path, entries: dict[str, Any]) -> None:
    """The keys file, whole: written beside it and renamed over it, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = HEADER + (yaml.safe_dump(entries, sort_keys=False, default_flow_style=None) if entries else "")
    fd, tmp = tempfile.mkstemp(prefix=".keys-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
