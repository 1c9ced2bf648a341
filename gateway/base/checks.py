"""Checks of configuration values, written as declarations: each check is a callable
``(report, where, value)`` that returns the value as the gateway keeps it, or ``INVALID``
after telling ``report`` what is wrong at ``where`` (a dotted YAML path). Tables of them
(``{key: check}``) describe a mapping; ``mapping`` walks one.

Each check also carries the JSON Schema fragment of what it accepts (``schema_of``; set by
``accepts`` on a check function, by the constructors on the checks they make), from which
``models/config/reference.py`` builds models.yaml's schema and reference.

Pure and small: the models.yaml reader (``config``) uses them, and so does the declaration of
llama.cpp's load settings (``protocol.settings``), which both processes import.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

INVALID: Any = object()  # what a check returns after reporting a problem


class Report(Protocol):
    """Where problems go, and what relative paths are relative to."""

    base: Path

    def error(self, where: str, message: str) -> None: ...


Check = Callable[[Report, str, Any], Any]
C = TypeVar("C", bound=Check)

S = r"\S"  # a pattern: not blank (a string check strips what it reads)


def accepts(schema: dict[str, Any]) -> Callable[[C], C]:
    """Marks a check with the JSON Schema fragment of the values it accepts."""
    def mark(check: C) -> C:
        setattr(check, "schema", schema)  # noqa: B010 (a function's attribute, not in its type)
        return check
    return mark


def schema_of(check: Check) -> dict[str, Any]:
    """The JSON Schema fragment ``check`` accepts (``accepts``)."""
    schema = getattr(check, "schema", None)
    if schema is None:
        raise LookupError(f"{getattr(check, '__qualname__', check)} declares no schema (checks.accepts)")
    return dict(schema)


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema``, or null."""
    return {"anyOf": [{"type": "null"}, schema]}


SHOWN = 200  # characters of a value a problem quotes: a file's value may be of any size


def show(value: Any) -> str:
    """A value as a problem quotes it (JSON where it can be), its first ``SHOWN`` characters and
    its length where it is longer: a problem's line stays a line, whatever a file holds."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(text)} characters)"


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


def parse_time(text: str) -> float | None:
    """Epoch seconds from an ISO 8601 date (``2027-01-31``) or date and time
    (``2027-01-31T12:00:00Z``; UTC unless it says); None when ``text`` is neither."""
    try:
        when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    try:
        return (when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)).timestamp()
    except (OverflowError, ValueError):  # a date at the edge of the calendar, past what a timestamp holds
        return None


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


def mapping(r: Report, where: str, value: Any, allowed: Mapping[str, Check]) -> dict[str, Any]:
    """The keys of ``value`` that pass their check in ``allowed``; an unknown key is a problem."""
    out: dict[str, Any] = {}
    if value is None:
        return out
    if not isinstance(value, dict):
        r.error(where, f"must be a mapping, got {show(value)}")
        return out
    for key, item in value.items():
        sub = f"{where}.{key}"
        if key not in allowed:
            r.error(sub, f"unknown key (expected one of: {', '.join(allowed)})")
            continue
        parsed = allowed[key](r, sub, item)
        if parsed is not INVALID:
            out[key] = parsed
    return out


def object_schema(allowed: Mapping[str, Check]) -> dict[str, Any]:
    """The JSON Schema of a mapping ``mapping`` checks by ``allowed`` (unknown keys refused)."""
    return {"type": "object", "properties": {k: schema_of(c) for k, c in allowed.items()},
            "additionalProperties": False}


def table(allowed: Mapping[str, Check]) -> Check:
    """A nested mapping checked by ``allowed`` (or nothing: null)."""
    return accepts(nullable(object_schema(allowed)))(lambda r, where, v: mapping(r, where, v, allowed))


def resolve_path(r: Report, where: str, value: Any) -> Path | None:
    """A file path, ``~`` and ``$VARS`` expanded, relative to ``r.base``; None after a problem."""
    if not isinstance(value, str) or not value.strip():
        r.error(where, f"must be a file path, got {show(value)}")
        return None
    expanded = os.path.expanduser(os.path.expandvars(value.strip()))
    return (r.base / expanded).resolve() if not os.path.isabs(expanded) else Path(expanded)


PATH_SCHEMA = {"type": "string", "pattern": S,
               "description": "a file path: ~ and $VARS expanded, relative to models.yaml"}


@accepts(PATH_SCHEMA)
def path(r: Report, where: str, v: Any) -> Any:
    p = resolve_path(r, where, v)
    return INVALID if p is None else p


def integer(*, minimum: int | None = None, maximum: int | None = None, what: str = "an integer") -> Check:
    def check(r: Report, where: str, v: Any) -> Any:
        ok = isinstance(v, int) and not isinstance(v, bool)
        ok = ok and (minimum is None or v >= minimum) and (maximum is None or v <= maximum)
        if not ok:
            r.error(where, f"must be {what}, got {show(v)}")
            return INVALID
        return v
    bounds = {k: b for k, b in (("minimum", minimum), ("maximum", maximum)) if b is not None}
    return accepts({"type": "integer", **bounds})(check)


POSITIVE_INTEGER = integer(minimum=1, what="a positive integer")


def one_of(choices: tuple[str, ...]) -> Check:
    def check(r: Report, where: str, v: Any) -> Any:
        if v not in choices:
            r.error(where, f"must be one of {', '.join(choices)}, got {show(v)}")
            return INVALID
        return v
    return accepts({"enum": list(choices)})(check)


@accepts({"type": "boolean"})
def boolean(r: Report, where: str, v: Any) -> Any:
    if not isinstance(v, bool):
        r.error(where, f"must be true or false, got {show(v)}")
        return INVALID
    return v


@accepts({"type": "string", "pattern": S})
def string(r: Report, where: str, v: Any) -> Any:
    if not isinstance(v, str) or not v.strip():
        r.error(where, f"must be a non-empty string, got {show(v)}")
        return INVALID
    return v.strip()


def list_of(item: Check) -> Check:
    def check(r: Report, where: str, v: Any) -> Any:
        if v is None:
            return ()
        if not isinstance(v, list):
            r.error(where, f"must be a list, got {show(v)}")
            return INVALID
        items = [item(r, f"{where}[{i}]", x) for i, x in enumerate(v)]
        return INVALID if any(x is INVALID for x in items) else tuple(items)
    return accepts(nullable({"type": "array", "items": schema_of(item)}))(check)


@accepts({"type": "number"})
def number(r: Report, where: str, v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or abs(v) == float("inf"):
        r.error(where, f"must be a number, got {show(v)}")
        return INVALID
    return float(v)


def number_in(low: float, high: float, *, exclusive_minimum: bool = False) -> Check:
    """A finite number from ``low`` (or above it, where ``exclusive_minimum``) to ``high``."""
    what = f"a number {'>' if exclusive_minimum else '>='} {low:g} and <= {high:g}"

    def check(r: Report, where: str, v: Any) -> Any:
        ok = not isinstance(v, bool) and isinstance(v, (int, float)) and v == v
        ok = ok and (v > low if exclusive_minimum else v >= low) and v <= high
        if not ok:
            r.error(where, f"must be {what}, got {show(v)}")
            return INVALID
        return float(v)
    return accepts({"type": "number", "exclusiveMinimum" if exclusive_minimum else "minimum": low,
                    "maximum": high})(check)


@accepts({"type": "number", "minimum": 0, "maximum": 1})
def fraction(r: Report, where: str, v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
        r.error(where, f"must be a number from 0 to 1, got {show(v)}")
        return INVALID
    return float(v)


@accepts({"type": "number", "exclusiveMinimum": 0})
def positive_number(r: Report, where: str, v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
        r.error(where, f"must be a number > 0, got {show(v)}")
        return INVALID
    return float(v)


@accepts({"type": "number", "minimum": 0})
def seconds(r: Report, where: str, v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        r.error(where, f"must be a number of seconds >= 0, got {show(v)}")
        return INVALID
    return float(v)


@accepts({"type": "number", "exclusiveMinimum": 0})
def positive_seconds(r: Report, where: str, v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        r.error(where, f"must be a number of seconds > 0, got {show(v)}")
        return INVALID
    return float(v)


_NUMBER_TEXT = r"[+]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][+-]?[0-9]+)?"
DURATION_SCHEMA = {"anyOf": [{"const": -1}, {"type": "number", "minimum": 0}, {"type": "string", "pattern": (
    r"^\s*(-1|[fF][oO][rR][eE][vV][eE][rR]|[iI][nN][fF]|" + _NUMBER_TEXT
    + r"|([0-9]+([.][0-9]+)?([mM][sS]|[sS]|[mM]|[hH]))+)\s*$")}]}


@accepts(DURATION_SCHEMA)
def duration(r: Report, where: str, v: Any) -> Any:
    secs = parse_duration(v)
    if secs is None:
        r.error(where, f'must be a duration (seconds, or like "5m", "1h"; -1 keeps it loaded), got {show(v)}')
        return INVALID
    return secs


SIZE_SCHEMA = {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": (
    r"^\s*[0-9]+([.][0-9]+)?\s*([bB]|[kKmMgGtT]([iI]?[bB])?)?\s*$")}]}


@accepts(SIZE_SCHEMA)
def byte_size(r: Report, where: str, v: Any) -> Any:
    n = parse_bytes(v)
    if n is None:
        r.error(where, f"must be a size: bytes, or a number with a unit (512MiB, 4GiB), got {show(v)}")
        return INVALID
    return n
