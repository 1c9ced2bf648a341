"""MiniCPM5 (``minicpm5``): detection from the real template, calls (CDATA values included) and
thinking read whole, one character at a time and cut anywhere, failures kept as text, a call the
template writes into the history read back as the same call, and the grammar under llama.cpp's
sampler."""

import json
import re

import pytest
from realmodel import CACHE

from gateway.engine import toolgrammar
from gateway.models import testmodels as tm
from gateway.text import chat_template
from gateway.text.reasoning import detect as detect_reasoning
from gateway.text.toolformats import AnswerParser, CallArgs, CallEnd, CallStart, Piece, detect

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "hot": {"type": "boolean"}}}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]


def template():
    return tm.llama_cpp_source_file("models/templates/openbmb-MiniCPM5-1B.jinja", CACHE / "templates").read_text()


def parse(pieces, reasoning=None, tail="", stream=True):
    """(thinking, content, [(name, args)], failed) of an answer fed in ``pieces``."""
    p = AnswerParser("minicpm5", TOOLS, reasoning=reasoning, prompt_tail=tail, stream=stream)
    items = [it for piece in pieces for it in p.feed(piece)] + p.flush()
    thinking = "".join(i.text for i in items if isinstance(i, Piece) and i.kind == "thinking")
    content = "".join(i.text for i in items if isinstance(i, Piece) and i.kind == "content")
    calls = {i.index: [i.name, ""] for i in items if isinstance(i, CallStart)}
    for i in items:
        if isinstance(i, CallArgs):
            calls[i.index][1] += i.text
    assert sorted(i.index for i in items if isinstance(i, CallEnd)) == sorted(calls)
    return thinking, content, [(n, json.loads(a)) for n, a in calls.values()], len(p.failed)


def every_way(text, **kw):
    """The answer read whole, one character at a time, cut at each point, streamed or not: one result."""
    whole = parse([text], **kw)
    assert parse(list(text), **kw) == whole
    assert parse([text], stream=False, **kw) == whole
    for i in range(len(text) + 1):
        assert parse([text[:i], text[i:]], **kw) == whole, i
    return whole


def test_detected_from_the_real_template():
    assert detect(template(), []) == "minicpm5"
    assert detect_reasoning(template(), []) == "think"


CALLS = ('Let me check.\n<function name="get_weather"><param name="city">New\nYork</param>\n'
         '<param name="days">3</param><param name="hot">true</param></function>\n<function name="noop"></function>')


def test_calls_typed_by_the_schema():
    assert every_way(CALLS) == (
        "", "Let me check.", [("get_weather", {"city": "New\nYork", "days": 3, "hot": True}), ("noop", {})], 0)
    got = every_way("Hm.\n</think>\n\n" + CALLS + "\nDone.", reasoning="think", tail="<|im_start|>assistant\n<think>\n")
    assert got[0] == "Hm." and got[1] == "Let me check.Done." and len(got[2]) == 2


def test_a_cdata_value_is_its_inner_text():
    text = '<function name="get_weather"><param name="city"><![CDATA[<a> </param> & b]]></param></function>'
    assert every_way(text)[2] == [("get_weather", {"city": "<a> </param> & b"})]


def test_failures_stay_text():
    unknown = '<function name="nope"></function> ok'
    assert every_way(unknown) == ("", unknown, [], 1)
    cut = '<function name="get_weather"><param name="city">Par'
    assert every_way(cut) == ("", cut, [], 1)
    # the answer ended after a whole parameter: the call is whole
    assert every_way(cut + "is</param>")[2] == [("get_weather", {"city": "Paris"})]


def test_a_call_the_template_writes_reads_back():
    args = {"city": "Paris <x>", "days": 2}  # (the template writes a boolean as Python's True/False)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    prompt = chat_template.render(template(), messages, tools=TOOLS)
    written = re.findall(r'<function name="get_weather">.*?</function>', prompt, re.S)[-1]
    assert every_way(written)[2] == [("get_weather", args)]


def test_grammar_takes_calls_and_stops_a_bad_value():
    from helpers import vocab_only
    from test_toolgrammar import run

    grammar = toolgrammar.build("minicpm5", TOOLS, required=False)
    assert grammar.lazy and grammar.triggers
    with vocab_only("qwen2") as vocab:
        assert run(vocab, grammar, "Sure. " + CALLS.split("\n", 1)[1]) == (True, True)
        cdata = '<function name="get_weather"><param name="city"><![CDATA[a</param>b]]></param></function>'
        assert run(vocab, grammar, cdata) == (True, True)
        assert run(vocab, grammar, '<function name="get_weather"><param name="days">two')[0] is False


@pytest.mark.parametrize("text", ['<function name="get_weather"><param name="city">x</param></function>'])
def test_no_marker_reaches_content(text):
    assert parse([text])[1] == ""
