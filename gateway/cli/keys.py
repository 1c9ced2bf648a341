"""``gguf-gateway keys add / list / revoke`` and ``gguf-gateway usage``.

The contract:

* ``keys add NAME`` makes a random key (``new_key``), writes only its SHA-256 (``sha256:HEX``)
  with its settings and ``created`` into the keys file, and prints the key once: alone on its
  line on stdout, with a line on stderr saying it will not be shown again and where it went. The
  keys file is ``--file``, else the configuration's (``server.api_keys_file``, else
  ``keys.yaml`` in the state folder). Its role is ``--role``, else ``user``, except a bare key
  (no scope, no limit) while no key of the configuration is an admin: that one is an admin, and
  stderr says so. A key that would not be an admin while none is (``--role user``, or a scope or
  a limit and no ``--role``) is refused with a line saying to add an admin first: the gateway
  refuses keys and no admin, and a key with a scope or a limit is never an admin by omission
  (``config.keys``'s rule). A name already
  in the file or given by another source is refused; the new entry is checked as the gateway
  reads it (``config.keys.entry``) before anything is written. A running gateway watches the
  file and picks the change up within seconds. Its place in a busy model's queue: ``--weight``,
  ``--priority`` and ``--no-load``, the keys file's ``weight``, ``priority`` and ``may_load: false``.
* ``keys list`` shows every key of the configuration, from every source, with its role, models,
  limits, its queue terms where not the defaults, source and last use (the usage database, read
  only): never a key, never a digest.
* ``keys revoke NAME`` removes NAME from the keys file. A name given elsewhere (models.yaml,
  ``$GGUF_GATEWAY_API_KEYS``) is refused naming where to remove it; so is the last admin while
  other keys remain (the gateway would refuse a configuration of keys and no admin).
* ``usage`` asks a running gateway's ``GET /usage`` (``client.Gateway``: ``--url`` and
  ``--api-key`` as ``status`` takes them) and prints a table, a total, each key's limits, and a
  warning where usage is not being written to disk. Every string the server sent is written
  through ``untrusted.shown``.

The ``keys`` commands read the configuration as one they edit (``load_config(editing=True)``):
keys and no admin, or a ``server.api_keys_file`` not made yet, are warnings, not refusals, so
that ``keys add NAME --role admin`` can mend the one and ``keys add`` make the other.

Exit codes: 0 done; 1 refused, not found, or no gateway to ask; 2 bad arguments or configuration.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any, TextIO

from ..access.gate import usage_path
from ..access.limits import iso
from ..access.usage import read_last_used
from ..backends.untrusted import shown
from ..base.checks import parse_time
from ..models.config import Config, ConfigError, KeySpec, ServerConfig, find_config_path, load_config
from ..models.config import keys as keyfile
from ..models.config.specs import BUDGET_PERIODS, MAX_WEIGHT, MIN_WEIGHT, PRIORITIES, ROLES
from .client import BadAnswer, Gateway, Unreachable
from .configfile import config_arg

NAME_RE = re.compile(r"[A-Za-z0-9._@-]{1,64}")
SECTION, ENV = "server.api_keys", f"${keyfile.ENV_KEYS}"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION_RE = re.compile(r"(\d+)\s*([smhdw])")
COLUMNS = ("PERIOD", "KEY", "MODEL", "WIRE", "REQUESTS", "PROMPT", "COMPLETION", "TOTAL")
WINDOWS = (("rpm", "requests_last_minute", "requests"), ("tpm", "tokens_last_minute", "tokens"))
NUMBERS = ("requests", "prompt_tokens", "completion_tokens", "total_tokens")


class BadArgument(ValueError):
    """A command-line value this command cannot take: exit 2."""


def add_commands(sub: argparse._SubParsersAction) -> None:
    keys = sub.add_parser("keys", help="add, list and revoke API keys (the keys file a running gateway watches)")
    actions = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="make a new key, write its digest to the keys file, print it once")
    add.add_argument("name", help="1-64 letters, digits and ._-@")
    add.add_argument("--role", choices=ROLES, help="default: user (admin for a first key with no scope or "
                     "limit; a first key with one needs an admin added first)")
    add.add_argument("--models", nargs="+", action="extend", metavar="GLOB",
                     help="the models it may use, names or globs (default: all)")
    for flag in ("rpm", "tpm", "max-parallel", "budget"):
        add.add_argument(f"--{flag}", type=int, metavar="N")
    add.add_argument("--budget-period", choices=BUDGET_PERIODS, help="what --budget counts over (default: month)")
    add.add_argument("--expires", metavar="WHEN", help="a date or time (2027-01-31, 2027-01-31T12:00:00Z) or a "
                     "duration from now (30d, 12h, 90m, 2w)")
    add.add_argument("--weight", type=float, metavar="W", help="its share of a busy model against other keys' "
                     f"(default 1; from {MIN_WEIGHT:g} to {MAX_WEIGHT:g})")
    add.add_argument("--priority", choices=PRIORITIES, help="its requests' highest priority (default: normal); a "
                     "request's own `priority` may lower it")
    add.add_argument("--no-load", dest="may_load", action="store_const", const=False, help="it may use only models "
                     "already loaded or pinned, never have one loaded (may_load: false)")
    add.add_argument("--note", help="a note kept beside it")
    listing = actions.add_parser("list", help="every key of the configuration: role, models, limits, last use")
    listing.add_argument("--json", action="store_true", help="a JSON list")
    revoke = actions.add_parser("revoke", help="remove a key from the keys file")
    revoke.add_argument("name")
    for p in (add, listing, revoke):
        config_arg(p)
    for p in (add, revoke):
        p.add_argument("--file", metavar="KEYSFILE", help="the keys file (default: server.api_keys_file, else "
                       "keys.yaml in the state folder)")
    usage = sub.add_parser("usage", help="tokens a running gateway counted, per key, model and wire")
    for flag, what in (("key", "a key's name"), ("model", "a model"), ("wire", "chat, messages, responses, ...")):
        usage.add_argument(f"--{flag}", action="append", metavar=flag.upper(), help=f"only {what} (repeatable)")
    usage.add_argument("--since", metavar="WHEN", help="a date, a time, or a duration ago (7d); default: 30 days ago")
    usage.add_argument("--until", metavar="WHEN", help="a date, a time, or a duration ago (exclusive); default: now")
    usage.add_argument("--group", choices=("day", "hour"), default="day")
    usage.add_argument("--json", action="store_true", help="the gateway's JSON as it answered")
    config_arg(usage)
    usage.add_argument("--url", help="the gateway (default: $GGUF_GATEWAY_URL, else host and port from the config)")
    usage.add_argument("--api-key", help="default: $GGUF_GATEWAY_API_KEY, else the config's first key "
                   "(sent to a named --url only with --config)")
    for p in (keys, usage):
        p.set_defaults(run=main)


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        if args.command == "usage":
            return cmd_usage(args, out)
        config = _config(args.config)
        if config is None:
            return 2
        command = {"add": cmd_add, "list": cmd_list, "revoke": cmd_revoke}[args.keys_command]
        return command(args, config, out)
    except BadArgument as e:
        _err(f"error: {e}")
        return 2


def _err(line: str) -> None:
    print(line, file=sys.stderr)


def _config(explicit: str | None) -> Config | None:
    """The configuration, read as ``keys`` edits it (keys and no admin, or a keys file named and
    not made yet, are warnings: what these commands mend); None after printing its problems."""
    try:
        return load_config(find_config_path(explicit), check_files=False, editing=True)
    except ConfigError as e:
        for line in e.problems:
            _err(f"error: {line}")
        return None


def _watched(server: ServerConfig) -> Path:
    """The keys file a gateway of this configuration reads and watches."""
    return keyfile.keys_path(server)


def _same(a: str | Path, b: Path) -> bool:
    """Whether a key's source (or a path) is the file ``b``."""
    if a in (SECTION, ENV):
        return False
    try:
        return Path(a).resolve() == b.resolve()
    except (OSError, RuntimeError):
        return False


def _where(key: KeySpec, config: Config) -> str:
    if key.source == SECTION:
        return f"{config.path or 'models.yaml'} ({SECTION})"
    return key.source


def _day_or_time(t: float) -> str:
    text = iso(t)
    return text[:10] if text.endswith("T00:00:00Z") else text


def when(text: str, flag: str, *, ago: bool, now: float | None = None) -> float:
    """A time from a date, a date and time (UTC unless it says), or a duration (30d, 12h, 90m,
    2w, 1d12h) from now: ahead, or ``ago``."""
    now = time.time() if now is None else now
    spec = text.strip().lower()
    parts = _DURATION_RE.findall(spec)
    if parts and re.fullmatch(r"(\d+\s*[smhdw]\s*)+", spec):
        seconds = sum(int(n) * _UNITS[u] for n, u in parts)
        try:
            return dt.datetime.fromtimestamp(now - seconds if ago else now + seconds, dt.timezone.utc).timestamp()
        except (OverflowError, OSError, ValueError):
            raise BadArgument(f"{flag}: {text!r} is too far off") from None
    got = parse_time(text)
    if got is None:
        raise BadArgument(f"{flag}: expected a date (2027-01-31), a time (2027-01-31T12:00:00Z) or a duration "
                          f"(30d, 12h, 90m, 2w), got {text!r}")
    return got


class ArgumentReport:
    """The ``checks.Report`` a new entry is checked against: each problem as its flag's."""

    def __init__(self, name: str):
        self.base = Path.cwd()
        self.name = name
        self.problems: list[str] = []

    def error(self, where: str, message: str) -> None:
        field = where.removeprefix(self.name).lstrip(".")
        self.problems.append(f"--{field.replace('_', '-')}: {message}" if field else message)


# --- keys add -------------------------------------------------------------------------------
def cmd_add(args: argparse.Namespace, config: Config, out: TextIO) -> int:
    name = args.name
    if not NAME_RE.fullmatch(name):
        raise BadArgument(f"a key's name is 1-64 letters, digits and ._-@, got {shown(name, 80)!r}")
    watched = _watched(config.server)
    path = Path(args.file).expanduser() if args.file else watched
    entries = _entries(path)
    if name in entries:
        _err(f"error: a key named {name!r} is already in {path} (gguf-gateway keys revoke {name}, then add it "
             "again, to replace it)")
        return 1
    elsewhere = [k for k in config.server.api_keys if k.name == name and not _same(k.source, path)]
    if elsewhere:
        _err(f"error: a key named {name!r} is already given by {_where(elsewhere[0], config)}: choose another name")
        return 1
    no_admin = not any(k.role == "admin" for k in config.server.api_keys)
    key = keyfile.new_key()
    settings: dict[str, Any] = {"key": keyfile.DIGEST + keyfile.digest_of(key).hex()}
    if args.role:
        settings["role"] = args.role
    if args.models:
        settings["models"] = list(args.models)
    for field in ("rpm", "tpm", "max_parallel", "budget", "budget_period", "priority", "may_load"):
        if getattr(args, field) is not None:
            settings[field] = getattr(args, field)
    if args.weight is not None:  # 2, not 2.0, in the file where it is whole
        settings["weight"] = int(args.weight) if args.weight.is_integer() and abs(args.weight) < 2**53 else args.weight
    now = time.time()
    if args.expires is not None:
        expires = when(args.expires, "--expires", ago=False, now=now)
        if expires <= now:
            raise BadArgument(f"--expires: {iso(expires)} has passed")
        settings["expires"] = iso(expires)
    settings["created"] = iso(now)
    if args.note is not None:
        settings["note"] = args.note
    report = ArgumentReport(name)
    checked = keyfile.entry(report, name, name, settings, str(path))
    if report.problems or checked is None:
        for line in report.problems or ["the new key's settings are not valid"]:
            _err(f"error: {line}")
        return 2
    # --role, else user; while no key is an admin, the configuration's own rule (``keys.entry``): a bare key is one,
    # and a key with a scope or a limit is never one by omission
    role = args.role or ("admin" if no_admin and not checked.limited else "user")
    if no_admin and role != "admin":
        if args.role:
            _err(f"error: no key is an admin yet, and a configuration with keys and no admin is refused: make {name} "
                 "an admin (--role admin), or add an admin first")
        else:
            _err(f"error: no key is an admin yet, and {name} has a scope or a limit, so it would be a user (a limited "
                 "key is never an admin by omission): add an admin first (gguf-gateway keys add NAME --role admin)")
        return 1
    entries[name] = {"key": settings.pop("key"), "role": role, **settings}
    try:
        keyfile.write_file(path, entries)
    except OSError as e:
        _err(f"error: cannot write {path}: {e.strerror or e}")
        return 1
    if no_admin and not args.role:
        _err(f"no admin key yet: {name} is an admin")
    out.write(key + "\n")
    out.flush()
    _err(f"key {name!r} ({role}) written to {path} as its SHA-256 only: copy it now, it will not be shown again")
    if _same(path, watched):
        _err("a running gateway picks it up within seconds (it watches that file)")
    else:
        _err(f"note: this configuration reads its keys file from {watched}, not {path}: no gateway of it will take "
             "this key until server.api_keys_file names that file")
    return 0


def _entries(path: Path) -> dict[str, Any]:
    try:
        return keyfile.load_for_edit(path)
    except (OSError, UnicodeDecodeError) as e:
        raise BadArgument(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


# --- keys list ------------------------------------------------------------------------------
def _limits(key: KeySpec, now: float) -> dict[str, Any]:
    got: dict[str, Any] = {f: getattr(key, f) for f in ("rpm", "tpm", "max_parallel", "budget")
                           if getattr(key, f) is not None}
    if key.budget is not None:
        got["budget_period"] = key.budget_period
    if key.expires is not None:
        got["expires"] = iso(key.expires)
        got["expired"] = key.expires <= now
    return got


def _limits_text(key: KeySpec, now: float) -> str:
    parts = [f"{f.replace('_', ' ')} {getattr(key, f)}" for f in ("rpm", "tpm", "max_parallel")
             if getattr(key, f) is not None]
    if key.budget is not None:
        parts.append(f"budget {key.budget}/{key.budget_period}")
    if key.expires is not None:
        parts.append(f"{'expired' if key.expires <= now else 'expires'} {_day_or_time(key.expires)}")
    return ", ".join(parts) or "-"


def _queue(key: KeySpec) -> dict[str, Any]:
    """A key's terms in a busy model's queue: weight, priority, may_load."""
    return {"weight": key.weight, "priority": key.priority, "may_load": key.may_load}


def _queue_text(key: KeySpec) -> str:
    """Its queue terms where they are not the defaults ("weight 4, batch, no load"), else "-"."""
    parts = [f"weight {key.weight:g}"] if key.weight != 1 else []
    parts += [key.priority] if key.priority != "normal" else []
    parts += ["no load"] if not key.may_load else []
    return ", ".join(parts) or "-"


def cmd_list(args: argparse.Namespace, config: Config, out: TextIO) -> int:
    for line in config.warnings:
        _err(f"warning: {line}")
    keys = config.server.api_keys
    last = read_last_used(usage_path(config.server))
    now = time.time()
    if args.json:
        rows = [{"name": k.name, "role": k.role, "models": list(k.models), "limits": _limits(k, now),
                 "queue": _queue(k), "source": _where(k, config),
                 "last_used": iso(last[k.name]) if k.name in last else None}
                for k in keys]
        out.write(json.dumps(rows, indent=2) + "\n")
        return 0
    if not keys:
        _err("no API keys: a gateway of this configuration takes requests without one (gguf-gateway keys add NAME)")
        return 0
    table: list[tuple[str, ...]] = [("NAME", "ROLE", "MODELS", "LIMITS", "QUEUE", "SOURCE", "LAST USE")]
    for k in keys:
        table.append((shown(k.name), k.role, shown(",".join(k.models)) or "*", _limits_text(k, now),
                      _queue_text(k), shown(_where(k, config)), iso(last[k.name]) if k.name in last else "never"))
    _table(out, table, right=())
    return 0


def _table(out: TextIO, rows: list[tuple[str, ...]], right: tuple[int, ...]) -> None:
    """Columns padded to their widest cell, those in ``right`` right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        out.write("  ".join(cells).rstrip() + "\n")


# --- keys revoke ----------------------------------------------------------------------------
def cmd_revoke(args: argparse.Namespace, config: Config, out: TextIO) -> int:
    name = args.name
    path = Path(args.file).expanduser() if args.file else _watched(config.server)
    entries = _entries(path)
    keys = config.server.api_keys
    if name not in entries:
        elsewhere = [k for k in keys if k.name == name]
        if not elsewhere:
            _err(f"error: no key named {shown(name, 80)!r} (gguf-gateway keys list shows them)")
            return 1
        for k in elsewhere:
            if k.source == SECTION:
                _err(f"error: {name!r} is given in {config.path or 'models.yaml'} ({SECTION}): remove it there, then "
                     "reload the gateway (SIGHUP, or POST /config/reload)")
            elif k.source == ENV:
                _err(f"error: {name!r} is given by {ENV}: remove it there and restart the gateway")
            else:
                _err(f"error: {name!r} is in {k.source}, not {path}: gguf-gateway keys revoke {name} --file {k.source}")
        return 1
    gone = [k for k in keys if k.name == name and _same(k.source, path)]
    left = [k for k in keys if not (k.name == name and _same(k.source, path))]
    if any(k.role == "admin" for k in gone) and left and not any(k.role == "admin" for k in left):
        _err(f"error: {name!r} is the last admin key, and {len(left)} other key(s) remain: a configuration with keys "
             "and no admin is refused, so the gateway would keep its keys as they are. Add another admin first "
             "(gguf-gateway keys add NAME --role admin), or revoke the other keys first")
        return 1
    del entries[name]
    try:
        keyfile.write_file(path, entries)
    except OSError as e:
        _err(f"error: cannot write {path}: {e.strerror or e}")
        return 1
    out.write(f"revoked {name}: removed from {path}\n")
    if _same(path, _watched(config.server)):
        _err("a running gateway refuses its key within seconds (it watches that file)")
    if not left:
        _err("no keys are left: a gateway of this configuration now takes requests without a key")
    return 0


# --- usage ----------------------------------------------------------------------------------
def cmd_usage(args: argparse.Namespace, out: TextIO) -> int:
    query: list[tuple[str, str]] = [("group", args.group)]
    for param in ("key", "model", "wire"):
        query += [(param, v) for v in getattr(args, param) or ()]
    for param in ("since", "until"):
        if getattr(args, param):
            query.append((param, iso(when(getattr(args, param), f"--{param}", ago=True))))
    config = None
    if args.config or find_config_path(None):
        try:
            config = load_config(find_config_path(args.config), check_files=False)
        except ConfigError as e:
            for line in e.problems:
                _err(f"error: {line}")
            if not (args.url or os.environ.get("GGUF_GATEWAY_URL")):
                return 2
    gw = Gateway.from_args(args, config)
    try:
        answer = gw.get("/usage?" + urllib.parse.urlencode(query))
        if args.json:
            out.write(json.dumps(answer, indent=2) + "\n")
            return 0
        try:
            _usage(answer, out)
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
            raise BadAnswer(f"{gw.url} answered /usage in a shape this client does not read ({type(e).__name__}); "
                            "is this a gguf-gateway?") from None
    except (Unreachable, BadAnswer, RuntimeError) as e:
        hint = "; pass --api-key KEY (or set $GGUF_GATEWAY_API_KEY)" if str(e).startswith("401") and not gw.api_key \
            else ""
        _err(f"error: {shown(str(e), 500)}{hint}")
        return 1
    return 0


def _usage(answer: dict[str, Any], out: TextIO) -> None:
    def text(v: Any) -> str:
        return shown(str(v), 200)

    rows: list[tuple[str, ...]] = [COLUMNS]
    totals = [0, 0, 0, 0]
    for row in answer["data"]:
        numbers = [int(row[n]) for n in NUMBERS]
        totals = [a + b for a, b in zip(totals, numbers)]
        rows.append((*(text(row[c]) for c in ("period", "key", "model", "wire")), *map(str, numbers)))
    span = f"{text(answer['since'])} to {text(answer['until'])}, by {text(answer['group'])}"
    if len(rows) == 1:
        out.write(f"no requests recorded from {span}\n")
    else:
        out.write(f"usage from {span}\n")
        _table(out, [*rows, ("TOTAL", "", "", "", *map(str, totals))], right=(4, 5, 6, 7))
    for name, state in sorted(answer["limits"].items()):
        parts = []
        if state.get("budget") is not None:
            parts.append(f"budget {int(state['budget'])}/{text(state['budget_period'])}, {int(state['spent'])} spent, "
                         f"resets {text(state['resets'])}")
        for limit, count, what in WINDOWS:
            if state.get(count) is not None:
                parts.append(f"{int(state[count])} of {int(state[limit])} {what} in the last minute")
        parts.append(f"{int(state['in_flight'])} in flight")
        out.write(f"{text(name)}: {'; '.join(parts)}\n")
    if answer["recording"] is False:
        reason = answer.get("reason")
        _err("warning: the gateway is not writing usage to disk (it keeps it in memory until it stops)"
             + (f": {text(reason)}" if reason else ""))
