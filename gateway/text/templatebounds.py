"""Bounds on an untrusted Jinja template: a wall-clock deadline, a length for each value it makes
and for its output, and a memory budget (issue 50: a model file is untrusted input, and its chat
template is code from a stranger).

This module is the guard: the bounds (``Bounds``, ``bounds_for``) and one render's ``Guard``,
which ``bounded(bounds)`` makes the thread's for one compile and render (``Guard.output`` reads
the render's output, ``template.root_render_func``, within it). ``templatesandbox`` holds the
``SandboxedEnvironment`` whose compiled templates check the guard as they run, ``templatecosts``
what a filter, a method or an operator would make, before it runs. A template that crosses a
bound raises ``Runaway`` at once, in the thread that renders it: nothing else stops, and the
same template renders the next request afresh.

Jinja's sandbox keeps a template from Python's internals, not from running forever or filling
memory: ``{{ 9**(9**9) }}`` is folded by Jinja's optimizer at compile time in one C call that
holds the GIL; ``{{ 'a'|center(10**9) }}`` makes a gigabyte in one; two loops over a long string
run for minutes without calling anything. So:

- **Time.** ``Guard.tick`` checks the deadline. Every hook a compiled template goes through ticks:
  attribute and item reads, calls (macros, methods, globals), filters, tests, intercepted
  operators, concatenation, comparison, literals, writes to an output buffer, each piece of
  output; and each item a ``{% for %}`` takes (``templatesandbox`` passes every loop's iterable
  through ``iterate``). So every loop reaches a check at each turn: a ``{% for %}`` by its
  iterable, a recursive macro, ``loop()`` or ``caller()`` by its call; what runs between two
  checks is straight-line code of the template's own text, plus one C call or filter whose cost
  the bounds below keep in proportion to ``chars``. The lexer ticks at each token, so compiling
  does too; nothing is folded at compile time (``optimized=False``, every arithmetic operator
  intercepted, a ``finalize`` that takes the context), so what compiling costs grows with the
  template's text alone; the code generator ticks at each node, and Python's compiler, which
  holds the GIL until it is done, gets at most ``templatesandbox.MAX_CODE_CHARS``.
- **Length.** No string, list or dict a template makes, nor its output, is longer than
  ``chars``: an operation whose result's length follows from its operands (``*``, ``**``,
  ``%``, ``center``, ``indent``, ``replace``, ``join``, ``format``, widths in format specs) is
  refused before it runs; any other result is checked as it is made.
- **Unfolding.** A list holding the same list twice, forty times over, is small but prints,
  compares and hashes as 2**40 items, in one C call. Before a value is printed, compared,
  hashed, sorted or passed to a filter or a method that reads it whole, ``Guard.unfolded``
  walks it, stopping past ``chars`` or ``MAX_DEPTH`` (hashing a deeply nested tuple overflows
  the C stack). The inputs are walked once (``measure``), as they cannot change.
- **Memory.** Every value made (by an operator, a filter, a method, ``~``, a literal, a slice)
  is charged by its size as *transient*: it lives at most until the loop that made it takes its
  next item or the macro that made it returns, where the transient charge goes back to what it
  was then. What can outlive that is charged as *kept*, by all it holds that the template made
  (``Guard.held``): what is added to a list or dict, what is set on a namespace (less what that
  replaces), a block's output and the render's. So a template that builds its prompt in a
  namespace, as some do, is charged for the prompt, not for each step of building it; the two
  charges together stay within ``memory``.

``bounds_for`` sets the bounds by the size of what the template reads: a template lays its
input out, adding its own text; it does not multiply it.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time
import types
from collections.abc import ItemsView, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from jinja2.runtime import Macro
from jinja2.utils import Namespace

SECONDS = 5.0  # a render's wall-clock bound, compile included ...
SECONDS_PER_MIB = 2.0  # ... plus this per MiB of its input (llama.cpp's templates read one in milliseconds)
CHARS = 1 << 20  # the length of any value a template makes, and of its output ...
CHARS_PER_INPUT = 8  # ... plus this many per character of its input
MEMORY = 64 << 20  # the bytes a render may make ...
MEMORY_PER_INPUT = 64  # ... plus this many per character of its input
MAX_DEPTH = 1000  # nesting, as deep as Python's own recursion limit lets repr and comparisons go
MAX_INT_BITS = 1 << 14  # integers past 4,300 digits do not print anyway (Python's int_max_str_digits)
ITEM_BYTES = 96  # what one small object in a list takes, at most: a wide character as a string (76) and its place (8)
OPAQUE = 1 << 20  # bytes charged for keeping a macro, a generator or a function: what it holds is not seen


class Runaway(Exception):
    """A template crossed a bound; the message says which."""


@dataclass(frozen=True)
class Bounds:
    seconds: float = SECONDS
    chars: int = CHARS  # the longest string, list, dict or output, and the longest unfolding
    memory: int = MEMORY  # bytes the values a render holds may take, as charged (``Guard.charge``)


def bounds_for(size: int) -> Bounds:
    """The bounds of a render whose inputs measure ``size`` (``measure``)."""
    return Bounds(SECONDS + SECONDS_PER_MIB * size / (1 << 20), CHARS + CHARS_PER_INPUT * size,
                  MEMORY + MEMORY_PER_INPUT * size)


_SEQUENCES = (list, tuple, set, frozenset, Mapping)
_VIEWS: tuple[type, ...] = (type({}.keys()), type({}.values()), type({}.items()))


def _leaf(value: Any) -> int:
    """At least the length of a scalar's text (an integer's by its bits, 3.3 per digit)."""
    if isinstance(value, (str, bytes)):
        return len(value) + 2
    if isinstance(value, bool) or value is None:
        return 5
    if isinstance(value, int):
        return value.bit_length() // 3 + 2
    return 64  # a float's repr, a macro's, a method's: a name and an address at most


def _nests(value: Any) -> bool:
    """Whether ``value`` holds others that print, compare and hash with it (a namespace prints
    its attributes)."""
    if isinstance(value, (list, tuple, dict)):
        return True
    return not isinstance(value, (str, bytes, int, float)) and value is not None and \
        isinstance(value, (_SEQUENCES, _VIEWS, Namespace))


def _children(value: Any) -> Iterable[Any]:
    """What ``value`` holds: a mapping's keys and values, a namespace's attributes' (each an
    object that lives as long as ``value``: never a pair made on the way)."""
    if isinstance(value, (list, tuple)):
        return value
    if isinstance(value, Namespace):
        value = object.__getattribute__(value, "_Namespace__attrs")
    if isinstance(value, Mapping):
        return (x for pair in value.items() for x in pair)
    if isinstance(value, ItemsView):
        return (x for pair in value for x in pair)
    return value


class Guard:
    """One render's bounds as it runs: its deadline, its charges (``transient`` and ``kept``,
    in bytes; ``slots``: what each namespace attribute was charged) and the sizes of its inputs
    (``known``: id -> (size, depth); its inputs live as long as the render does)."""

    __slots__ = ("bounds", "deadline", "transient", "kept", "slots", "known")

    def __init__(self, bounds: Bounds, known: dict[int, tuple[int, int]] | None = None):
        self.bounds = bounds
        self.deadline = time.monotonic() + bounds.seconds
        self.transient = self.kept = 0
        self.slots: dict[tuple[int, str], int] = {}
        self.known = known or {}

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise Runaway(f"it ran longer than {self.bounds.seconds:.3g} s")

    def length(self, n: int, what: str) -> None:
        if n > self.bounds.chars:
            raise Runaway(f"{what} would be longer than {self.bounds.chars} characters")

    def charge(self, nbytes: int, kept: bool = False) -> None:
        if kept:
            self.kept += nbytes
        else:
            self.transient += nbytes
        if self.transient + self.kept > self.bounds.memory:
            raise Runaway(f"it made more than {self.bounds.memory >> 20} MiB of values")

    def afford(self, nbytes: int, what: str) -> None:
        """Refuse, before it is made, what would take the charges past ``memory``: a result of
        many small objects (a split), which may take many times its text's length."""
        if self.transient + self.kept + nbytes > self.bounds.memory:
            raise Runaway(f"{what} would take the values it made past {self.bounds.memory >> 20} MiB")

    def made(self, value: Any) -> Any:
        """``value``, just made: its length checked and its size charged (a list's or tuple's
        strings too, as a split or a filter makes them anew)."""
        if isinstance(value, (str, bytes, list, tuple, dict)):
            self.length(len(value), "a value")
            size = sys.getsizeof(value)
            if isinstance(value, (list, tuple)):
                size += sum(sys.getsizeof(x) for x in value if isinstance(x, (str, bytes)))
            self.charge(size)
        elif isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise Runaway(f"it made an integer of more than {MAX_INT_BITS} bits")
        return value

    def held(self, value: Any) -> int:
        """The bytes ``value`` holds that the template made: itself and what it holds, each
        object once; none of the inputs' containers. A bound method holds its object; a
        macro, a generator or a function what it closes over, unseen (``OPAQUE``)."""
        total, seen, stack, steps = 0, set(), [value], 0
        while stack:
            v = stack.pop()
            if id(v) in seen or id(v) in self.known:
                continue
            seen.add(id(v))
            if isinstance(v, (str, bytes, int, float)) or v is None:
                total += sys.getsizeof(v)
            elif _nests(v):
                total += sys.getsizeof(v)
                stack.extend(_children(v))
            elif isinstance(v, (types.MethodType, types.BuiltinMethodType)):
                stack.append(v.__self__)
            elif isinstance(v, (Iterator, Macro, types.FunctionType, functools.partial)):
                total += OPAQUE
            else:
                total += sys.getsizeof(v)
            steps += 1
            if not steps & 1023:
                self.tick()
                if total > self.bounds.memory:
                    break
        return total

    def keep_in(self, slot: tuple[int, str], value: Any) -> None:
        """``value`` set on a namespace's attribute: kept, less what the attribute held before."""
        size = self.held(value)
        self.charge(size - self.slots.get(slot, 0), kept=True)
        self.slots[slot] = size

    def unfolded(self, value: Any) -> int:
        """How long ``value`` is written out, at least (characters, and one per item): what
        printing, comparing or hashing it walks in C. Refuses past ``chars``, nested past
        ``MAX_DEPTH``, or a cycle (it unfolds forever)."""
        if isinstance(value, str):
            return len(value)
        return self.walk(value)[0]

    def walk(self, value: Any) -> tuple[int, int]:
        """``unfolded``, and how deep ``value`` nests. Each container is walked once, however
        often it is held (a shared one's size counted each time: its unfolding), so the walk
        costs what the value holds in memory, not what it unfolds to; it ticks as it goes."""
        if not _nests(value):
            return _leaf(value), 0
        limit, known = self.bounds.chars, self.known
        sizes: dict[int, tuple[int, int]] = {}  # this walk's containers, by id (each lives while walked)
        open_: set[int] = set()  # entered, not yet summed
        stack: list[tuple[Any, int, bool]] = [(value, 1, False)]
        steps = 0
        while stack:
            v, depth, summed = stack.pop()
            key = id(v)
            if summed:  # its items are all sized now
                size, below = 1, 0
                for x in _children(v):
                    if _nests(x):
                        s, d = known.get(id(x)) or sizes[id(x)]
                        size, below = size + s, max(below, d)
                    else:
                        size += _leaf(x)
                if size > limit:
                    raise Runaway(f"a value it used would be longer than {limit} characters written out")
                if depth + below > MAX_DEPTH:  # through a container walked before, on another path
                    raise Runaway(f"it made a value nested more than {MAX_DEPTH} deep")
                sizes[key] = (size, below + 1)
                open_.discard(key)
                continue
            if key in sizes or key in known:
                continue
            if key in open_:
                raise Runaway("it made a value that holds itself")
            steps += 1
            if not steps & 1023:
                self.tick()
            open_.add(key)
            stack.append((v, depth, True))
            for x in _children(v):
                if _nests(x):
                    if depth + (known.get(id(x)) or (0, 1))[1] > MAX_DEPTH:
                        raise Runaway(f"it made a value nested more than {MAX_DEPTH} deep")
                    stack.append((x, depth + 1, False))
        return known.get(id(value)) or sizes[id(value)]

    def text(self, value: Any) -> str:
        """``str(value)``, as printing or ``~`` makes it, walked first."""
        if type(value) is str:
            return value
        self.length(self.unfolded(value), "a value's text")
        out = str(value)
        self.length(len(out), "a value's text")
        self.charge(sys.getsizeof(out))
        return out

    def output(self, pieces: Iterable[str]) -> str:
        """A render's output, as its root function yields it, within ``chars``."""
        out: list[str] = []
        n = 0
        for piece in pieces:
            self.tick()
            n += len(piece)
            self.length(n, "its output")
            self.charge(sys.getsizeof(piece), kept=True)
            out.append(piece)
        return "".join(out)


_local = threading.local()


def current() -> Guard:
    guard: Guard | None = getattr(_local, "guard", None)
    if guard is None:
        raise RuntimeError("a bounded template ran outside bounded()")
    return guard


@contextlib.contextmanager
def bounded(bounds: Bounds, known: dict[int, tuple[int, int]] | None = None) -> Iterator[Guard]:
    """This thread's guard for one compile and render."""
    outer = getattr(_local, "guard", None)
    _local.guard = guard = Guard(bounds, known)
    try:
        yield guard
    finally:
        _local.guard = outer


def measure(value: Any, known: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """The size and depth of inputs a template cannot change (as ``Guard.unfolded`` counts
    them), each container's recorded in ``known``. The inputs are trees (parsed JSON): each
    container is walked once."""
    if not _nests(value):
        return _leaf(value), 0
    size, depth = 1, 1
    for x in _children(value):
        s, d = measure(x, known)
        size, depth = size + s, max(depth, d + 1)
    known[id(value)] = (size, depth)
    return size, depth
