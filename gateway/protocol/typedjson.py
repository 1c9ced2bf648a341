"""Values read back from JSON as the types their dataclass fields name, where JSON has no such
type: a tuple, a path, a dataclass (an object), a list of either. The typed messages
between the gateway and a worker (``protocol``) are read through it."""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints


def _from_json(tp: Any) -> Callable[[Any], Any] | None:
    """How a value JSON read becomes the annotated type ``tp`` again where JSON has no such type
    (a tuple, a path); None where it already is that type."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Path:
        return Path
    if origin is list and args and is_dataclass(args[0]):
        read = _reader(args[0])
        return lambda v: [read(x) for x in v]
    if origin is list and args and (each := _from_json(args[0])) is not None:  # a list of tuples
        return lambda v: [each(x) for x in v]
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = _from_json(args[0])
            return tuple if item is None else lambda v: tuple(map(item, v))
        parts = [_from_json(a) or (lambda x: x) for a in args]
        return lambda v: tuple(f(x) for f, x in zip(parts, v))
    if origin is Union or origin is types.UnionType:
        arms = [a for a in args if a is not type(None)]
        inner = [c for a in arms if (c := _from_json(a)) is not None]
        if not inner:
            return None
        if len(arms) > 1:  # JSON could not tell which arm a value was: a field type this cannot carry
            raise TypeError(f"{tp} cannot cross as JSON")
        return lambda v: None if v is None else inner[0](v)
    return None


def _reader(cls: Any) -> Callable[[dict[str, Any]], Any]:
    """``cls`` (a dataclass) from the JSON object ``asdict`` made of one, each field of its type."""
    hints = get_type_hints(cls)
    convert = {f.name: c for f in fields(cls) if (c := _from_json(hints[f.name])) is not None}

    def read(d: dict[str, Any]) -> Any:
        for name, c in convert.items():
            if name in d:
                d[name] = c(d[name])
        return cls(**d)
    return read


def nested(cls: type) -> tuple[tuple[str, Callable[[dict[str, Any]], Any] | None], ...]:
    """A command's fields, each with the reader of the dataclass it holds (sent as a JSON object),
    or of the type JSON has not (a list of tuples), or None."""
    hints = get_type_hints(cls)
    return tuple((f.name, _reader(hints[f.name]) if is_dataclass(hints[f.name]) else _from_json(hints[f.name]))
                 for f in fields(cls))
