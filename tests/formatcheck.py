"""What the per-format tests share: a real template by name, and an answer read through the
gateway's ``AnswerParser`` (its items checked for order by ``summarize``) whole, one character at
a time and cut at every point.

A test file binds its own tools: ``parse = functools.partial(formatcheck.parse, tools=TOOLS)``
(and the same for ``read``, ``each_way``, ``both_ways``, ``every_way``, ``failing``); ``tools=``
in a call still overrides."""

import json
import re

from realmodel import CACHE

from gateway.models import testmodels as tm
from gateway.text.toolformats import AnswerParser, CallArgs, CallEnd, CallStart

# Two described tools several formats' tests call: one with a required string and an integer,
# one with no arguments.
WEATHER_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "noop", "description": "nothing", "parameters": {
        "type": "object", "properties": {}}}},
]


def template(name):
    return tm.llama_cpp_source_file(f"models/templates/{name}.jinja", CACHE / "templates").read_text()


def summarize(items):
    """(thinking, content, [(name, args, error)]) of a parser's items, checking their order: no
    empty text, calls counted from 0 with ids of their own, arguments only while a call is open,
    every call ended, and a call that ended without an error a JSON object (parsed; raw text
    where it ended with one)."""
    thinking = content = ""
    calls, ended, ids = {}, set(), set()
    for it in items:
        if isinstance(it, tuple):
            assert it[0] in ("thinking", "content") and it[1]
            if it[0] == "thinking":
                thinking += it[1]
            else:
                content += it[1]
        elif isinstance(it, CallStart):
            assert it.index == len(calls) and it.id not in ids and re.fullmatch(r"call_[A-Za-z0-9]{24}", it.id)
            ids.add(it.id)
            calls[it.index] = [it.name, "", None]
        elif isinstance(it, CallArgs):
            assert it.index in calls and it.index not in ended
            calls[it.index][1] += it.text
        else:
            assert isinstance(it, CallEnd) and it.index in calls and it.index not in ended
            ended.add(it.index)
            calls[it.index][2] = it.error
    assert ended == set(calls), "every call ends"
    out = []
    for name, args, error in calls.values():
        if error is None:
            args = json.loads(args)
            assert isinstance(args, dict)
        out.append((name, args, error))
    return thinking, content, out


def read(fmt, pieces, *, tools, stream=True, reasoning=None, tail=""):
    """(thinking, content, [(name, args, error)], the parser's failures) of an answer fed in
    ``pieces`` (see ``summarize``)."""
    p = AnswerParser(fmt, tools, reasoning=reasoning, prompt_tail=tail, stream=stream)
    items = [it for piece in pieces for it in p.feed(piece)] + p.flush()
    return summarize(items) + (p.failed,)


def parse(fmt, pieces, *, tools, **kw):
    """(thinking, content, [(name, args)], failures counted) of an answer fed in ``pieces``; a
    call that ended with an error (it broke after it began) has args None."""
    thinking, content, calls, failed = read(fmt, pieces, tools=tools, **kw)
    return thinking, content, [(n, None if e is not None else a) for n, a, e in calls], len(failed)


def each_way(fmt, text, *, tools, stream=True, **kw):
    """The answer's one result, ``stream``ed or not: the same read whole, one character at a time
    and cut at each point."""
    one = parse(fmt, [text], tools=tools, stream=stream, **kw)
    assert parse(fmt, list(text), tools=tools, stream=stream, **kw) == one
    for i in range(len(text) + 1):
        assert parse(fmt, [text[:i], text[i:]], tools=tools, stream=stream, **kw) == one, i
    return one


def both_ways(fmt, text, *, tools, **kw):
    """(streamed, whole) results of the answer, each the same read whole, one character at a time
    and cut at each point."""
    return tuple(each_way(fmt, text, tools=tools, stream=stream, **kw) for stream in (True, False))


def every_way(fmt, text, *, tools, **kw):
    """The answer's one result, streamed or not (no call in it breaks after it began)."""
    streamed, whole = both_ways(fmt, text, tools=tools, **kw)
    assert streamed == whole
    return whole


def failing(fmt, text, *, tools, **kw):
    """An answer with a call that fails, read whole and one character at a time (the same either
    way): (its content not streamed, where it never holds a call; failures counted not streamed;
    the calls that began streamed, as (name, error); failures counted streamed)."""
    got = []
    for pieces in ([text], list(text)):
        _, content, calls, failed = read(fmt, pieces, tools=tools, stream=False, **kw)
        assert calls == []
        _, _, began, failed_streamed = read(fmt, pieces, tools=tools, stream=True, **kw)
        got.append((content, len(failed), [(n, e) for n, _, e in began], len(failed_streamed)))
    assert got[0] == got[1]
    return got[0]


def args_fed_before_the_end(fmt, text, *, tools, reasoning=None, tail=""):
    """The CallArgs pieces that left before the character that ended the first call, the answer
    fed one character at a time."""
    p = AnswerParser(fmt, tools, reasoning=reasoning, prompt_tail=tail)
    pieces = []
    for c in text:
        out = p.feed(c)
        if any(isinstance(it, CallEnd) for it in out):
            return pieces
        pieces += [it.text for it in out if isinstance(it, CallArgs)]
    raise AssertionError("the call did not end")
