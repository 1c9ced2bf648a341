"""The frames on the two pipes between the gateway (parent) and a model worker (child).

Transport: two pipes, one each way, on file descriptors handed to the child (never its
stdout, which llama.cpp or a library could write to). Each message is a frame: a 4-byte
big-endian length (``HEADER``), then that many bytes of UTF-8 JSON (``frame``; ``unjson`` reads
a body back). The commands (``commands``) and the events (``events``) are such frames; the one
event sent for nearly every token has a frame of its own that needs no JSON
(``events.text_frame``).
"""

from __future__ import annotations

import json
import struct
from dataclasses import fields, is_dataclass
from pathlib import PurePath
from typing import Any


def _plain(o: Any) -> Any:
    """JSON's form of what JSON has no type for: a path (as text), a dataclass (the object of its
    fields, as ``asdict`` writes it, without the deep copy ``asdict`` makes first: a request's
    command is encoded at once, and the copy cost more than the encoding)."""
    if isinstance(o, PurePath):
        return str(o)
    names = _FIELD_NAMES.get(type(o))
    if names is None and is_dataclass(o) and not isinstance(o, type):
        names = _FIELD_NAMES[type(o)] = tuple(f.name for f in fields(o))
    if names is not None:
        return {name: getattr(o, name) for name in names}
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}

HEADER = struct.Struct(">I")  # a frame's length, before its body
_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=_plain).encode  # made once: used per token
unjson = json.JSONDecoder().decode  # a frame's JSON body read back


def frame(msg: dict[str, Any]) -> bytes:
    """``msg``'s frame: its length, then its JSON (a dataclass as its fields' object: ``_plain``)."""
    data = _json(msg).encode()
    return HEADER.pack(len(data)) + data
