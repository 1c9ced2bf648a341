"""What a template's filters, methods and operators would make, refused before they run where
that follows from their arguments (``templatebounds``' *Length* and *Unfolding*: a width, a
count, an exponent, a separator times the items, a format's fields), and the filters and tests
wrapped to tick, walk their arguments and check their results (``bounded_filter``). Used by
``templatesandbox.BoundedSandbox``'s hooks.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping
from string import Formatter as _StringFormatter
from typing import Any

from jinja2.sandbox import SandboxedEscapeFormatter, SandboxedFormatter
from jinja2.utils import _PassArg

from .templatebounds import ITEM_BYTES, MAX_INT_BITS, Guard, Runaway, current

WRAP_CHARS = 1 << 16  # textwrap (wordwrap) takes quadratic time to break one long word

_PERCENT = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+)?)?[hlL]?(.)", re.S)
_DIGITS = re.compile(r"\d+")


def _number(digits: str) -> int:
    return int(digits) if len(digits) < 10 else 1 << 40


def percent(guard: Guard, fmt: Any, args: Any) -> None:
    """``fmt % args``: its length is at most the format's, plus each spec's width and
    precision and the longest argument's text."""
    if not isinstance(fmt, (str, bytes)):
        return
    if isinstance(args, tuple):
        values: list[Any] = list(args)
    elif isinstance(args, Mapping):
        values = list(args.values())
    else:
        values = [args]
    longest = max((guard.unfolded(v) for v in values), default=0)
    star = max((abs(v) for v in values if isinstance(v, int)), default=0)
    text = fmt.decode("latin-1") if isinstance(fmt, bytes) else fmt
    size = len(text)
    for m in _PERCENT.finditer(text):
        width, precision = (star if g == "*" else _number(g or "0") for g in m.group(1, 2))
        size += width + precision + longest
    guard.length(size, "a %-formatted string")


def _spec_width(spec: str) -> int:
    return sum(_number(d) for d in _DIGITS.findall(spec))


class _Checked(_StringFormatter):
    """``str.format``'s fields within the bounds: each field's width and value before it is
    formatted, and the string so far after."""

    made = 0

    def format_field(self, value: Any, format_spec: str) -> Any:
        guard = current()
        guard.tick()
        guard.length(_spec_width(format_spec) + guard.unfolded(value), "a formatted field")
        out = super().format_field(value, format_spec)
        self.made += len(out)
        guard.length(self.made, "a formatted string")
        return out


class Formatter(_Checked, SandboxedFormatter):
    pass


class EscapeFormatter(_Checked, SandboxedEscapeFormatter):
    pass


def str_method(guard: Guard, receiver: str | bytes, name: str, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """A string's method whose result's length follows from its arguments, refused past
    ``chars`` (the arguments returned, an iterable to join made a list)."""
    n = len(receiver)
    if name == "join" and args:
        items = list(args[0])
        guard.length(sum(len(x) for x in items if isinstance(x, (str, bytes))) + n * len(items), "a joined string")
        return (items, *args[1:])
    if name == "replace" and len(args) >= 2:
        _replaced(guard, receiver, args[0], args[1], args[2] if len(args) > 2 else kwargs.get("count", -1))
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int):
            tabs = receiver.count("\t") if isinstance(receiver, str) else receiver.count(b"\t")
            guard.length(n + tabs * size, "a string with its tabs expanded")
    elif name in ("split", "rsplit", "splitlines"):
        sep = args[0] if args and name != "splitlines" else kwargs.get("sep")
        parts = receiver.count(sep) + 1 if isinstance(sep, type(receiver)) and sep else n + 1  # type: ignore[arg-type]
        guard.afford(parts * ITEM_BYTES, f"a {name}")
    elif name == "translate" and args:
        table = args[0]
        values = table.values() if isinstance(table, Mapping) else table if isinstance(table, (list, tuple)) else ()
        longest = max((len(v) for v in values if isinstance(v, (str, bytes))), default=1)
        guard.length(n * max(longest, 1), "a translated string")
    return args


def _replaced(guard: Guard, s: Any, old: Any, new: Any, count: Any) -> None:
    if isinstance(s, (str, bytes)) and isinstance(old, type(s)) and isinstance(new, type(s)):
        times = s.count(old) if old else len(s) + 1  # type: ignore[arg-type]
        if isinstance(count, int) and count >= 0:
            times = min(times, count)
        guard.length(len(s) + times * max(0, len(new) - len(old)), "a string with its replacements")


# Filters that neither print, compare nor hash their subject or arguments whole (their
# results are checked as they are made, and a lazy one's items as they are used).
_SHALLOW_FILTERS = frozenset({"length", "count", "first", "last", "list", "reverse", "default", "d", "batch",
                              "slice", "map", "select", "reject", "selectattr", "rejectattr", "attr", "items",
                              "random", "int", "float", "abs", "round"})
# Filters that consume an iterator whole, comparing or printing its items: it is listed first,
# to be walked.
_CONSUMING = frozenset({"join", "sort", "unique", "sum", "min", "max", "groupby", "tojson"})
# Filters that make a list of an object per item of their subject (a string's characters).
_LISTING = frozenset({"list", "sort", "batch", "slice", "groupby", "dictsort"})
# Filters that make as many characters or items as an integer argument says.
_COUNTED = frozenset({"center", "batch", "slice", "truncate"})
# Methods that keep their arguments in their list, dict or loop (``loop.changed``'s last value).
KEEPING = frozenset({"append", "insert", "extend", "update", "setdefault", "changed"})
# Tests that compare their subject to their argument; the others only look at its type or value.
_DEEP_TESTS = frozenset({"in", "eq", "equalto", "==", "ne", "!=", "lt", "<", "lessthan", "le", "<=", "gt", ">",
                         "greaterthan", "ge", ">="})


def _subject(text: Any) -> str:
    return text if isinstance(text, str) else str(text)


def _check_filter(name: str, guard: Guard, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The filter ``name``'s result, refused before it is made where its length follows from
    its arguments (``args`` without the context Jinja passes some filters, returned with an
    iterable to join made a list)."""
    def arg(i: int, key: str, default: Any) -> Any:
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name in ("indent", "wordwrap", "replace", "format") and args:
        s = _subject(args[0])
        if name == "indent":
            width = arg(1, "width", 4)
            w = width if isinstance(width, int) else len(str(width))
            guard.length(len(s) + (s.count("\n") + 1) * w, "an indented string")
        elif name == "wordwrap":
            if len(s) > WRAP_CHARS:
                raise Runaway(f"wordwrap takes a text of {WRAP_CHARS} characters at most")
            width, wrap = arg(1, "width", 79), arg(3, "wrapstring", None)
            lines = len(s) // max(width, 1) + 1 if isinstance(width, int) else len(s)
            guard.length(len(s) + lines * len(wrap or "\n"), "a wrapped string")
        elif name == "replace":
            _replaced(guard, s, arg(1, "old", ""), arg(2, "new", ""), arg(3, "count", None))
        else:
            percent(guard, s, kwargs or tuple(args[1:]))
    elif name == "join" and args:
        items = list(args[0])
        sep = len(str(arg(1, "d", "")))
        guard.length(sum(guard.unfolded(x) + sep for x in items), "a joined string")
        return (items, *args[1:])
    elif name == "tojson" and args:
        indent = arg(1, "indent", None)
        width = indent if isinstance(indent, int) else len(indent) if isinstance(indent, str) else 0
        size, depth = guard.walk(args[0])
        guard.length(size * (1 + max(width, 0) * depth), "a JSON text")  # each item a line, indented
    return args


def bounded_filter(name: str, f: Callable[..., Any], test: bool = False) -> Callable[..., Any]:
    """``f`` (a filter or test) within the bounds: each call ticks; an iterator it consumes is
    listed first; its subject and arguments are walked (``unfolded``) unless it only looks at
    them shallowly; a count or width it makes that many of is at most ``chars``; and its result
    is checked as it is made."""
    skip = 1 if _PassArg.from_obj(f) is not None else 0
    deep = name in _DEEP_TESTS if test else name not in _SHALLOW_FILTERS

    @functools.wraps(f)
    def checked(*args: Any, **kwargs: Any) -> Any:
        guard = current()
        guard.tick()
        own = args[skip:]
        if name == "sum" and not isinstance(own[2] if len(own) > 2 else kwargs.get("start", 0), (int, float)):
            raise Runaway("sum() starts from a number only (adding up lists takes quadratic time)")
        if own and name in _CONSUMING and isinstance(own[0], Iterator):
            own = (guard.made(list(own[0])), *own[1:])
        if own and name in _LISTING and isinstance(own[0], (str, list, tuple, dict)):
            guard.afford(len(own[0]) * ITEM_BYTES, f"the {name} filter's result")
        if deep:
            for v in (*own, *kwargs.values()):
                guard.unfolded(v)
        if not test:
            if name in _COUNTED:
                for v in (*own[1:], *kwargs.values()):
                    if isinstance(v, int):
                        guard.length(abs(v), f"the {name} filter's result")
            own = _check_filter(name, guard, own, kwargs)
        return guard.made(f(*args[:skip], *own, **kwargs))

    return checked


def binop(guard: Guard, operator: str, left: Any, right: Any) -> None:
    """An operator whose result's length (or an integer's bits) follows from its operands,
    refused past the bounds before it runs: ``+`` and ``*`` of sequences, ``*`` and ``**`` of
    integers, ``%`` formatting. (``+``, ``-`` and the divisions of integers grow them by a bit
    at most: the result is checked as it is made.)"""
    if operator == "%":
        percent(guard, left, right)
    elif operator == "+":
        if isinstance(left, (str, bytes, list, tuple)) and isinstance(right, (str, bytes, list, tuple)):
            guard.length(len(left) + len(right), "a sum")
    elif operator in ("*", "**") and isinstance(left, int) and isinstance(right, int):
        bits = max(left.bit_length(), 1)
        if operator == "**":
            grown = right * bits if abs(left) > 1 and right > 0 else 0
        else:
            grown = bits + right.bit_length()
        if grown > MAX_INT_BITS:
            raise Runaway(f"it would make an integer of more than {MAX_INT_BITS} bits")
    elif operator == "*":
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(times, int):
                guard.length(len(seq) * times, "a repeated sequence")
