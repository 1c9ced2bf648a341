"""Text that another server chose (an upstream's model ids and error messages, a gateway's
answers read by the console), made safe to use as a name and to show. Pure, standard library
only (the console imports it).

A name is refused unless every character is printable (Python's ``str.isprintable``: no
control character, no format character such as the bidi overrides U+202A-U+202E and isolates
U+2066-U+2069 or a zero-width space, no separator but the plain space), it is at most
``MAX_NAME`` characters, and it cannot read as a path that leaves where it is put (no
backslash, no ``.`` or ``..`` segment, no empty segment: ``org/model``, as vLLM and most hosted
servers list Hugging Face models, is a name).

``shown`` writes every character a terminal or a log could act on as its escape (``\\x1b``,
``\\u202e``), so what it returns prints as what it is."""

from __future__ import annotations

import re

MAX_NAME = 256  # characters of a model name taken from another server

# What a terminal acts on inside prose (a model's answer): C0 and C1 controls but newline and
# tab, the bidi marks, embeddings, overrides and isolates, and the line and paragraph separators.
# Other format characters (the zero-width joiner of an emoji) are left as they are.
_PROSE_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a model's name here, or None when it can."""
    if not isinstance(name, str) or not name:
        return "not a non-empty string"
    if len(name) > MAX_NAME:
        return f"longer than {MAX_NAME} characters"
    if not name.isprintable():
        return "a control, format (bidi) or separator character"
    if "\\" in name or any(part in ("", ".", "..") for part in name.split("/")):
        return "a path (a backslash, or a '.', '..' or empty segment between slashes)"
    return None


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shown(text: str, limit: int | None = None, *, prose: bool = False) -> str:
    """``text`` with what a terminal could act on written as escapes, cut to ``limit``
    characters (with an ellipsis). ``prose`` keeps newlines, tabs and the format characters of
    ordinary text (an answer); otherwise every unprintable character is escaped (a name, a
    table cell, a one-line message)."""
    if limit is not None and len(text) > limit:
        text = text[:limit] + "…"
    if prose:
        return _PROSE_UNSAFE.sub(lambda m: _escape(m.group()), text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)
