"""MiniMax M2 (``minimax``) and M3 (``minimax_m3``): detection from the real templates, calls and
thinking read whole, one character at a time and cut anywhere, failures kept as text, and a call
the template writes into the history read back as the same call."""

import functools
import json
import re

import formatcheck
import pytest
from formatcheck import template

from gateway.text import chat_template
from gateway.text.reasoning import detect as detect_reasoning
from gateway.text.reasoning import pair_format
from gateway.text.toolformats import AnswerParser, CallArgs, CallEnd, CallStart, Piece, detect

NS = "]<]minimax[>["
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "hot": {"type": "boolean"}}}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "nested", "parameters": {"type": "object", "properties": {
        "point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}},
        "tags": {"type": "array", "items": {"type": "string"}},
        "rows": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"}}}},
        "limit": {"oneOf": [{"type": "integer"}, {"type": "object", "properties": {"max": {"type": "integer"}}}]},
        "label": {"anyOf": [{"type": "string"}, {"type": "object"}]}, "any": {}}}}},
    {"type": "function", "function": {"name": "same", "parameters": {"type": "object", "properties": {
        "a": {"type": "object", "properties": {"a": {"type": "integer"}}}}}}},
]
MM_THINK = pair_format("<mm:think>", "</mm:think>")


parse = functools.partial(formatcheck.parse, tools=TOOLS)
both_ways = functools.partial(formatcheck.both_ways, tools=TOOLS)
every_way = functools.partial(formatcheck.every_way, tools=TOOLS)


def args_before_the_end(fmt, text, **kw):
    """The first call's CallArgs pieces that left before its CallEnd, the answer fed one
    character at a time."""
    p = AnswerParser(fmt, TOOLS, **kw)
    pieces = []
    for c in text:
        for it in p.feed(c):
            if isinstance(it, CallEnd):
                return pieces
            if isinstance(it, CallArgs) and it.index == 0:
                pieces.append(it.text)
    raise AssertionError("the call did not end")


def test_detected_from_the_real_templates():
    m2, m3 = template("MiniMax-M2"), template("MiniMax-M3")
    assert detect(m2) == "minimax" and detect(m3) == "minimax_m3"
    assert detect_reasoning(m2, []) == "think" and detect_reasoning(m3, []) == MM_THINK


M2_CALLS = ('Let me check.\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">New\nYork</parameter>\n'
            '<parameter name="days">3</parameter>\n<parameter name="hot">true</parameter>\n</invoke>\n'
            '<invoke name="noop">\n</invoke>\n</minimax:tool_call>')


def test_m2_calls_typed_by_the_schema():
    assert every_way("minimax", M2_CALLS) == (
        "", "Let me check.", [("get_weather", {"city": "New\nYork", "days": 3, "hot": True}), ("noop", {})], 0)
    # a value runs to its closer, a parameter's opener inside it included
    inner = M2_CALLS.replace("New\nYork", 'a <parameter name="days">b')
    assert every_way("minimax", inner)[2][0] == ("get_weather", {"city": 'a <parameter name="days">b', "days": 3, "hot": True})
    # after the prompt's <think>: thinking, then the calls
    got = every_way("minimax", "Hm.\n</think>\n\n" + M2_CALLS, reasoning="think", tail="]~b]ai\n<think>\n")
    assert got[0] == "Hm." and len(got[2]) == 2


def test_m2_failures_stay_text():
    unknown = '<minimax:tool_call>\n<invoke name="nope">\n</invoke>\n</minimax:tool_call> ok'
    assert every_way("minimax", unknown) == ("", unknown, [], 1)
    cut = '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Par'
    # cut off (max_tokens): streamed, the call ends with an error; whole, its text is content
    for text in (cut, cut + "is</parameter>"):
        assert both_ways("minimax", text) == (("", "", [("get_weather", None)], 1), ("", text, [], 1))
    # the block's closer left out: the invoke's is enough
    assert every_way("minimax", cut + "is</parameter>\n</invoke>")[2] == [("get_weather", {"city": "Paris"})]


def m3(invoke_body, name="nested"):
    return f'{NS}<tool_call>\n{NS}<invoke name="{name}">{invoke_body}{NS}</invoke>\n{NS}</tool_call>'


def el(tag, value):
    return f"{NS}<{tag}>{value}{NS}</{tag}>"


def test_m3_values_read_by_the_schema():
    body = (el("point", el("x", "1.5") + el("y", "-2")) + el("tags", el("item", "a b") + el("item", "7"))
            + el("rows", el("item", el("id", "1"))) + el("limit", el("max", "10")) + el("label", el("text", "hi"))
            + el("any", "[1]"))
    args = {"point": {"x": 1.5, "y": -2}, "tags": ["a b", "7"], "rows": [{"id": 1}], "limit": {"max": 10},
            "label": f"{NS}<text>hi{NS}</text>", "any": [1]}
    answer = "<mm:think>Think.</mm:think>Sure." + m3(body)
    assert every_way("minimax_m3", answer, reasoning=MM_THINK) == ("Think.", "Sure.", [("nested", args)], 0)
    assert every_way("minimax_m3", m3(el("limit", "5")))[2] == [("nested", {"limit": 5})]


def test_m3_thinking_and_failures():
    # a turn without thinking opens with a bare </mm:think>
    assert every_way("minimax_m3", "</mm:think>Hello", reasoning=MM_THINK) == ("", "Hello", [], 0)
    for bad in (m3(el("point", el("z", "1"))), m3(el("days", "x"), name="get_weather")):  # not a key; not the schema's
        assert both_ways("minimax_m3", bad)[1] == ("", bad, [], 1)
        assert both_ways("minimax_m3", bad)[0][1:] == ("", [(bad.split('"')[1], None)], 1)
    # an element nested in one of the same name, spaces around the elements
    assert every_way("minimax_m3", m3(el("a", " " + el("a", "1") + "\n"), name="same"))[2] == [("same", {"a": {"a": 1}})]
    unknown = m3("", name="nope")
    assert every_way("minimax_m3", unknown) == ("", unknown, [], 1)


def test_arguments_stream_as_they_are_written():
    """A value that is text leaves as it is written, any other at its parameter's end: the
    arguments come in several pieces before the call ends."""
    p = AnswerParser("minimax", TOOLS)
    out = [it for c in M2_CALLS[:M2_CALLS.index("York")] for it in p.feed(c)]
    calls = [i for i in out if not isinstance(i, Piece)]
    assert isinstance(calls[0], CallStart) and {type(i) for i in calls[1:]} == {CallArgs}
    assert "".join(i.text for i in out if isinstance(i, CallArgs)) == '{"city": "New\\n'
    assert len(args_before_the_end("minimax", M2_CALLS)) > 2
    m3_calls = m3(el("point", el("x", "1")) + el("label", "a long label") + el("tags", el("item", "b")))
    pieces = args_before_the_end("minimax_m3", m3_calls)
    assert pieces[0] == '{"point": {"x": 1}' and len(pieces) > 3
    assert json.loads("".join(pieces)) == {"point": {"x": 1}, "label": "a long label", "tags": ["b"]}


@pytest.mark.parametrize("name, fmt, pattern", [
    ("MiniMax-M2", "minimax", r"<minimax:tool_call>.*</minimax:tool_call>"),
    ("MiniMax-M3", "minimax_m3", re.escape(NS) + r"<tool_call>.*" + re.escape(NS) + "</tool_call>"),
])
def test_a_call_the_template_writes_reads_back(name, fmt, pattern):
    args = {"city": "Paris", "days": 2, "hot": False}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    prompt = chat_template.render(template(name), messages, tools=TOOLS)
    written = re.findall(pattern, prompt, re.S)[-1]
    assert every_way(fmt, written)[2] == [("get_weather", args)]


def test_m3_grammar_takes_nested_values():
    """Under llama.cpp's grammar sampler (Qwen2's vocabulary): elements by the schema, a union's
    alternatives, raw text ending in "]" before the namespace token, and a value that breaks the
    schema stopped."""
    from helpers import vocab_only
    from test_toolgrammar import run

    from gateway.worker import toolgrammar

    body = (el("point", el("x", "1.5") + el("y", "-2")) + el("tags", el("item", "a b")) + el("rows", el("item", el("id", "1")))
            + el("limit", el("max", "10")) + el("label", el("text", "hi")) + el("any", "[1]"))
    grammar = toolgrammar.build("minimax_m3", TOOLS, required=False)
    with vocab_only("qwen2") as vocab:
        assert run(vocab, grammar, "Sure. " + m3(body)) == (True, True)
        assert run(vocab, grammar, m3(el("limit", "5"))) == (True, True)
        assert run(vocab, grammar, m3(el("point", el("x", "one"))))[0] is False
