"""``BoundedSandbox``: Jinja's sandbox whose compiled templates run within the bounds of the
thread's ``templatebounds.Guard`` (the contract: ``templatebounds``' docstring). Jinja's own
hooks (attribute and item reads, calls, intercepted operators, ``str.format``) tick and check;
``_Code``, its code generator, adds those Jinja has none for (a loop's iterable, ``~``,
comparisons, literals, slices, block buffers, what is set on a namespace); compiling ticks at
each token and node, and hands Python's compiler a bounded text.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes as nodes
from jinja2.compiler import CodeGenerator, Frame, operators
from jinja2.filters import FILTERS
from jinja2.runtime import LoopContext, Macro
from jinja2.sandbox import SandboxedEnvironment
from jinja2.tests import TESTS
from markupsafe import Markup

from .templatebounds import Runaway, current
from .templatecosts import KEEPING, EscapeFormatter, Formatter, binop, bounded_filter, str_method

MAX_CODE_CHARS = 1 << 19  # the Python a template compiles to; llama.cpp's make tens of thousands
REMOVED = ("lipsum", "pprint")  # a global and a filter that loop in Python by a count of their own


class _Iterated:
    """A ``{% for %}``'s iterable: each item taken ticks, and drops the transient charge back to
    what it was when the loop took its first (what a turn made is gone by the next, or kept
    and charged so: Jinja's scoping keeps a turn's variables in the turn). Its length is the
    iterable's, where it has one (``loop.length`` reads it; a ``TypeError`` makes Jinja count
    the items itself)."""

    __slots__ = ("source",)

    def __init__(self, source: Any):
        self.source = source

    def __iter__(self) -> Iterator[Any]:
        guard = current()
        start = guard.transient
        for item in self.source:
            guard.tick()
            guard.transient = start
            yield item

    def __len__(self) -> int:
        return len(self.source)


class _Buffer(list):
    """A block's output (a macro, ``{% set %}...{% endset %}``, ``{% filter %}``), joined when
    it ends: what is written to it is charged and kept within ``chars``."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def _add(self, piece: Any) -> None:
        guard = current()
        guard.tick()
        size = len(piece) if isinstance(piece, str) else guard.unfolded(piece)
        self.n += size
        guard.length(self.n, "a block's output")
        guard.charge(size + 8, kept=True)

    def append(self, piece: Any) -> None:
        self._add(piece)
        super().append(piece)

    def extend(self, pieces: Iterable[Any]) -> None:
        for piece in pieces:
            self.append(piece)


class _Code(CodeGenerator):
    """Jinja's code generator, with the hooks Jinja has none for: each loop's iterable
    (``iterate``), ``~`` (``concatenated``), each side of a comparison and each key of a dict
    literal (``compared``), literals and slices (``made``), block buffers (``output_buffer``),
    and what is set on a namespace (``kept_in``, ``kept``)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.hooked: dict[int, str] = {}  # expressions (by id: the tree lives while it compiles) -> their hook's call

    def visit(self, node: nodes.Node, *args: Any, **kwargs: Any) -> Any:
        current().tick()
        opening = self.hooked.get(id(node))
        if opening is None:
            return super().visit(node, *args, **kwargs)
        self.write(opening)
        super().visit(node, *args, **kwargs)
        self.write(")")

    def _hooked(self, hook: str, node: nodes.Expr, frame: Frame) -> None:
        self.write(f"environment.{hook}(")
        self.visit(node, frame)
        self.write(")")

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        # where the loop begins, and a recursive loop's loop(...)
        self.hooked[id(node.iter)] = "environment.iterate("
        super().visit_For(node, frame)

    def visit_Assign(self, node: nodes.Assign, frame: Frame) -> None:
        target = node.target
        if isinstance(target, nodes.NSRef):  # ns.attr = value: kept, less what it replaces
            self.hooked[id(node.node)] = f"environment.kept_in({frame.symbols.ref(target.name)}, {target.attr!r}, "
        elif any(True for _ in target.find_all(nodes.NSRef)):  # ns.a, ns.b = ...
            self.hooked[id(node.node)] = "environment.kept("
        super().visit_Assign(node, frame)

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.concatenated((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def visit_Compare(self, node: nodes.Compare, frame: Frame) -> None:
        self.write("(")
        self._hooked("compared", node.expr, frame)
        for op in node.ops:
            self.write(f" {operators[op.op]} ")
            self._hooked("compared", op.expr, frame)
        self.write(")")

    def visit_List(self, node: nodes.List, frame: Frame) -> None:
        self.write("environment.made(")
        super().visit_List(node, frame)
        self.write(")")

    def visit_Tuple(self, node: nodes.Tuple, frame: Frame) -> None:
        if node.ctx != "load":  # a target: (a, b) = ...
            return super().visit_Tuple(node, frame)
        self.write("environment.made(")
        super().visit_Tuple(node, frame)
        self.write(")")

    def visit_Dict(self, node: nodes.Dict, frame: Frame) -> None:
        self.write("environment.made({")
        for idx, item in enumerate(node.items):
            if idx:
                self.write(", ")
            self._hooked("compared", item.key, frame)
            self.write(": ")
            self.visit(item.value, frame)
        self.write("})")

    def visit_Getitem(self, node: nodes.Getitem, frame: Frame) -> None:
        if not isinstance(node.arg, nodes.Slice):  # environment.getitem
            return super().visit_Getitem(node, frame)
        self.write("environment.made(")
        super().visit_Getitem(node, frame)
        self.write(")")

    def buffer(self, frame: Frame) -> None:
        frame.buffer = self.temporary_identifier()
        self.writeline(f"{frame.buffer} = environment.output_buffer()")


class _Tokens(jinja2.ext.Extension):
    """A tick at each token the lexer reads: compiling a template is bounded by the deadline too."""

    def filter_stream(self, stream: Any) -> Iterator[Any]:
        guard = current()
        for token in stream:
            guard.tick()
            yield token


@jinja2.pass_context
def _finalize(context: Any, value: Any) -> str:
    """Each ``{{ value }}``'s text (Jinja writes ``str(value)``). Taking the context, it keeps
    Jinja from running it at compile time."""
    return current().text(value)


class BoundedSandbox(SandboxedEnvironment):
    """Jinja's sandbox whose templates run within a ``Guard``'s bounds (``bounded``). Filters,
    tests and globals a subclass adds go in through ``filters`` and ``globals_``, to be bounded
    too."""

    code_generator_class = _Code
    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

    def __init__(self, *, filters: Mapping[str, Callable[..., Any]] | None = None,
                 globals_: Mapping[str, Any] | None = None, **options: Any):
        extensions = [*options.pop("extensions", ()), _Tokens]
        super().__init__(optimized=False, finalize=_finalize, extensions=extensions, **options)
        self.filters = {name: bounded_filter(name, f)
                        for name, f in {**FILTERS, **(filters or {})}.items() if name not in REMOVED}
        tests: dict[str, Callable[..., Any]] = dict(TESTS)  # type: ignore[arg-type]
        self.tests = {name: bounded_filter(name, f, test=True) for name, f in tests.items()}
        for name in REMOVED:
            self.globals.pop(name, None)
        self.globals.update(globals_ or {})

    def _compile(self, source: str, filename: str) -> types.CodeType:
        """Python's compiler on what Jinja made of the template: it holds the GIL (every thread
        of the process stops) for as long as it takes, so what it is given is bounded."""
        current().tick()
        if len(source) > MAX_CODE_CHARS:
            raise Runaway(f"it compiles to more than {MAX_CODE_CHARS} characters of Python")
        return super()._compile(source, filename)

    # hooks of Jinja's sandbox

    def getattr(self, obj: Any, attribute: str) -> Any:
        current().tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        guard = current()
        guard.tick()
        if isinstance(argument, tuple):  # hashed
            guard.unfolded(argument)
        return super().getitem(obj, argument)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        guard = current()
        guard.tick()
        if operator in ("*", "+", "**", "%"):
            binop(guard, operator, left, right)
        return guard.made(super().call_binop(context, operator, left, right))

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        guard = current()
        guard.tick()
        receiver = getattr(obj, "__self__", None)
        if isinstance(obj, Macro):  # it reads its arguments through the hooks; what it made is gone as it returns
            start = guard.transient
            result = super().call(context, obj, *args, **kwargs)
            guard.transient = start
            return guard.made(result)
        if isinstance(obj, LoopContext):  # a recursive loop's loop(children): each turn ticks
            args = (_Iterated(args[0]), *args[1:]) if args else args
        for v in (*args, *kwargs.values()):
            guard.unfolded(v)
            if isinstance(receiver, (str, bytes, int)) and isinstance(v, int):  # center, zfill, to_bytes...
                guard.length(abs(v), f"the result of {obj.__name__}")
        if isinstance(receiver, (str, bytes)):
            args = str_method(guard, receiver, obj.__name__, args, kwargs)
        elif isinstance(receiver, (list, dict, LoopContext)) and obj.__name__ in KEEPING:
            if obj.__name__ == "extend" and args and isinstance(args[0], Iterator):
                args = (guard.made(list(args[0])), *args[1:])
            guard.charge(sum(guard.held(v) for v in (*args, *kwargs.values())), kept=True)
        result = super().call(context, obj, *args, **kwargs)
        if isinstance(receiver, (list, dict)):
            guard.length(len(receiver), "a list or dict")
        return guard.made(result)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """Jinja's own, through formatters that check each field (``templatecosts.Formatter``)."""
        if not isinstance(value, (types.MethodType, types.BuiltinMethodType)) \
                or value.__name__ not in ("format", "format_map") or not isinstance(value.__self__, str):
            return None
        f_self: str = value.__self__
        formatter = EscapeFormatter(self, escape=f_self.escape) if isinstance(f_self, Markup) else Formatter(self)
        is_format_map = value.__name__ == "format_map"

        def wrapper(*args: Any, **kwargs: Any) -> str:
            if is_format_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one argument, and no keyword arguments")
                kwargs, args = args[0], ()
            formatter.made = 0
            return type(f_self)(formatter.vformat(f_self, args, kwargs))

        return functools.update_wrapper(wrapper, value)

    # hooks of ours (``_Code``)

    def iterate(self, iterable: Any) -> _Iterated:
        return _Iterated(iterable)

    def concatenated(self, values: tuple[Any, ...]) -> str:
        """``a ~ b ~ ...``: each walked before it is made text, the whole within ``chars``."""
        guard = current()
        guard.tick()
        parts = [guard.text(v) for v in values]
        guard.length(sum(len(p) for p in parts), "a ~ concatenation")
        return guard.made("".join(parts))

    def compared(self, value: Any) -> Any:
        """A side of a comparison, or a dict literal's key (hashed): walked first."""
        guard = current()
        guard.tick()
        guard.unfolded(value)
        return value

    def made(self, value: Any) -> Any:
        """A literal or a slice, just made."""
        guard = current()
        guard.tick()
        return guard.made(value)

    def output_buffer(self) -> _Buffer:
        return _Buffer()

    def kept_in(self, namespace: Any, attr: str, value: Any) -> Any:
        """What ``{% set ns.attr = value %}`` sets: kept, less what it replaces."""
        guard = current()
        guard.tick()
        guard.keep_in((id(namespace), attr), value)
        return value

    def kept(self, value: Any) -> Any:
        """What ``{% set ns.a, ns.b = value %}`` sets: kept."""
        guard = current()
        guard.tick()
        guard.charge(guard.held(value), kept=True)
        return value
