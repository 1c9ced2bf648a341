"""MiniCPM5 (``minicpm5``): detection from the real template, calls (CDATA values included) and
thinking read whole, one character at a time and cut anywhere, arguments streamed as they are
written, a call cut off before its closer never a call, failures kept as text, a call the
template writes into the history read back as the same call, and the grammar under llama.cpp's
sampler."""

import functools
import json
import re

import formatcheck
import pytest

from gateway.text import chat_template
from gateway.text.reasoning import detect as detect_reasoning
from gateway.text.toolformats import detect
from gateway.worker import toolgrammar

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "hot": {"type": "boolean"}}}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]


def template():
    return formatcheck.template("openbmb-MiniCPM5-1B")


parse = functools.partial(formatcheck.parse, "minicpm5", tools=TOOLS)
both_ways = functools.partial(formatcheck.both_ways, "minicpm5", tools=TOOLS)
every_way = functools.partial(formatcheck.every_way, "minicpm5", tools=TOOLS)


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
    # typed by the schema where it names no string; a string where it names no type
    typed = ('<function name="get_weather"><param name="days"><![CDATA[3]]></param>'
             '<param name="extra"><![CDATA[4]]></param></function>')
    assert every_way(typed)[2] == [("get_weather", {"days": 3, "extra": "4"})]
    # its ]]> not followed by </param>: a malformed value, the call's text stays text
    bad = '<function name="get_weather"><param name="days"><![CDATA[3]]> </param></function>'
    assert both_ways(bad)[1] == ("", bad, [], 1)


def test_failures_stay_text():
    unknown = '<function name="nope"></function> ok'
    assert every_way(unknown) == ("", unknown, [], 1)


CALL = ('<function name="get_weather"><param name="city">New\nYork</param><param name="days">3</param>'
        '<param name="hot"><![CDATA[true]]></param></function>')


@pytest.mark.parametrize("text", [CALL, 'Sure.\n<function name="noop"></function>'])
def test_a_call_cut_off_is_never_a_call(text):
    """The answer cut anywhere before its </function> (max_tokens): streamed, the call that began
    ends with an error; whole, its text is content. Only the closer makes it a call."""
    end = text.index("</function>") + len("</function>")
    for i in range(len(text) + 1):  # (one prefix, below, is also cut at every point)
        cut = text[:i]
        streamed, whole = parse([cut]), parse([cut], stream=False)
        assert parse(list(cut)) == streamed, i
        if i < end:
            assert whole[2] == [] and all(args is None for _, args in streamed[2]), i
        else:
            assert streamed == whole and len(whole[2]) == 1 and whole[2][0][1] is not None, i
    cut = CALL[:CALL.index("Yo")]
    assert both_ways(cut) == (("", "", [("get_weather", None)], 1), ("", cut, [], 1))


def test_arguments_stream_as_they_are_written():
    """A string value leaves as it is written, any other at its parameter's end: the arguments
    come in several pieces before the call ends."""
    pieces = formatcheck.args_fed_before_the_end("minicpm5", CALL, tools=TOOLS)
    assert pieces[0].startswith('{"city": "') and "York" not in pieces[0] and len(pieces) > 3
    assert json.loads("".join(pieces) + "}") == {"city": "New\nYork", "days": 3, "hot": True}


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
