"""What the per-format tests share: a real template by name, and an answer read through the
gateway's ``AnswerParser`` whole, one character at a time and cut at every point.

A test file binds its own tools: ``parse = functools.partial(formatcheck.parse, tools=TOOLS)``
(and the same for ``both_ways`` / ``every_way``); ``tools=`` in a call still overrides."""

import json

from realmodel import CACHE

from gateway.models import testmodels as tm
from gateway.text.toolformats import AnswerParser, CallArgs, CallEnd, CallStart, Piece


def template(name):
    return tm.llama_cpp_source_file(f"models/templates/{name}.jinja", CACHE / "templates").read_text()


def parse(fmt, pieces, *, tools, reasoning=None, tail="", stream=True):
    """(thinking, content, [(name, args)], failed) of an answer fed in ``pieces``; a call that
    ended with an error (it broke after it began) has args None."""
    p = AnswerParser(fmt, tools, reasoning=reasoning, prompt_tail=tail, stream=stream)
    items = [it for piece in pieces for it in p.feed(piece)] + p.flush()
    thinking = "".join(i.text for i in items if isinstance(i, Piece) and i.kind == "thinking")
    content = "".join(i.text for i in items if isinstance(i, Piece) and i.kind == "content")
    calls = {i.index: [i.name, ""] for i in items if isinstance(i, CallStart)}
    for i in items:
        if isinstance(i, CallArgs):
            calls[i.index][1] += i.text
    ends = {i.index: i.error for i in items if isinstance(i, CallEnd)}
    assert sorted(ends) == sorted(calls)
    return thinking, content, [(n, None if ends[k] else json.loads(a)) for k, (n, a) in calls.items()], len(p.failed)


def both_ways(fmt, text, *, tools, **kw):
    """(streamed, whole) results of the answer, each the same read whole, one character at a time
    and cut at each point."""
    got = []
    for stream in (True, False):
        one = parse(fmt, [text], tools=tools, stream=stream, **kw)
        assert parse(fmt, list(text), tools=tools, stream=stream, **kw) == one
        for i in range(len(text) + 1):
            assert parse(fmt, [text[:i], text[i:]], tools=tools, stream=stream, **kw) == one, i
        got.append(one)
    return tuple(got)


def every_way(fmt, text, *, tools, **kw):
    """The answer's one result, streamed or not (no call in it breaks after it began)."""
    streamed, whole = both_ways(fmt, text, tools=tools, **kw)
    assert streamed == whole
    return whole
