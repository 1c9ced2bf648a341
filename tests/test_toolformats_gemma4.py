"""Gemma 4's calls (``toolformats/gemma4.py``): detection from the real template, the parser
whole, one character at a time and cut at every point, its failures, the history the template
gets, and the grammar run by llama.cpp's sampler."""

from functools import partial

import formatcheck
import pytest
from test_toolgrammar import run
from test_toolgrammar import vocab as vocab  # noqa: F401 (the fixture)

from gateway.text import chat_template
from gateway.text.reasoning import detect as detect_reasoning
from gateway.text.toolformats import detect
from gateway.text.toolformats.gemma4 import QUOTE, TOOL_CALL, TOOL_CALL_END, args_json
from gateway.worker import toolgrammar
from gateway.worker.toolhistory import for_template

NAME = "google-gemma-4-31B-it"
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "set_config", "description": "Config", "parameters": {
        "type": "object", "properties": {"config": {"type": "object"}, "tags": {"type": "array"}}}}},
    {"type": "function", "function": {"name": "noop", "description": "Nothing",
                                      "parameters": {"type": "object", "properties": {}}}},
]
Q = QUOTE

read = partial(formatcheck.read, tools=TOOLS)
each_way = partial(formatcheck.each_way, tools=TOOLS)
failing = partial(formatcheck.failing, tools=TOOLS)


def template():
    return formatcheck.template(NAME)


def call(text: str) -> str:
    return f"{TOOL_CALL}call:{text}{TOOL_CALL_END}"


def test_the_real_template_detects_as_gemma4():
    assert detect(template(), []) == "gemma4"
    assert detect_reasoning(template(), []) == "channel"


SAMPLES = [
    # answer, content, calls
    (call(f"get_weather{{city:{Q}Paris{Q}}}"), "", [("get_weather", {"city": "Paris"})]),
    ("Let me check." + call(f"get_weather{{city:{Q}a, b: {{c}} [d] \"e\" \\ <x>{Q},days:-3}}") + " Done.",
     "Let me check.Done.", [("get_weather", {"city": 'a, b: {c} [d] "e" \\ <x>', "days": -3})]),
    (call(f"set_config{{config:{{theme:{Q}dark{Q},n:1.5e10,on:true,off:false,none:null,{Q}odd key{Q}:{{}}}},"
          f"tags:[{Q}a{Q}, [], 2]}}") + call("noop{}"),
     "", [("set_config", {"config": {"theme": "dark", "n": 1.5e10, "on": True, "off": False, "none": None,
                                     "odd key": {}}, "tags": ["a", [], 2]}), ("noop", {})]),
    ("plain text { with: braces }", "plain text { with: braces }", []),
]


@pytest.mark.parametrize("text, content, calls", SAMPLES)
@pytest.mark.parametrize("stream", [True, False])
def test_samples_whole_one_character_at_a_time_and_cut_anywhere(text, content, calls, stream):
    assert each_way("gemma4", text, stream=stream) == ("", content, calls, 0)


def test_thinking_on_its_channel_is_split_before_the_calls():
    text = "<|channel>thought\nI should\nlook.<channel|>" + call("noop{}")
    assert read("gemma4", list(text), reasoning="channel") == (
        "I should\nlook.", "", [("noop", {}, None)], [])


BROKEN = [
    # answer, content when whole, calls when streamed (name, error), failures
    (call("nope{a:1}"), call("nope{a:1}"), [], 1),
    (call("get_weather{city:Paris}"), call("get_weather{city:Paris}"),
     [("get_weather", "the arguments are not Gemma's notation: not a value")], 1),
    (f"{TOOL_CALL}call:get_weather{{city:{Q}Pa", f"{TOOL_CALL}call:get_weather{{city:{Q}Pa",
     [("get_weather", "the answer ended inside the call")], 1),
    (f"{TOOL_CALL}call:get_weather{{days:1{TOOL_CALL_END}x", f"{TOOL_CALL}call:get_weather{{days:1x",
     [("get_weather", "the call was cut off")], 1),
    (call("get weather{}"), call("get weather{}"), [], 1),
]


@pytest.mark.parametrize("text, content, streamed, failures", BROKEN)
def test_broken_calls_are_never_broken_items(text, content, streamed, failures):
    assert failing("gemma4", text) == (content, failures, streamed, failures)


def test_arguments_in_gemmas_notation_as_json():
    assert args_json(f"{{ a : {Q}x{Q} , b:[1, {Q}{Q}] }}") == '{"a": "x", "b": [1, ""]}'
    for bad in ("{a:x}", "{a:1,}", "{:1}", "{a:1} tail", f"{{a:{Q}x}}", "[1]", "{a:01}"):
        assert args_json(bad) is None, bad


def test_earlier_calls_and_results_reach_the_template():
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                                  "arguments": {"city": "Paris", "days": 2}}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    (msgs, tools), *_ = for_template(messages, TOOLS, "gemma4", template())
    prompt = chat_template.render(template(), msgs, tools=tools)
    written = call(f"get_weather{{city:{Q}Paris{Q},days:2}}")
    assert written in prompt and "<|tool_response>response:get_weather{value:" in prompt
    assert read("gemma4", [written])[2] == [("get_weather", {"city": "Paris", "days": 2}, None)]


def test_the_grammar_takes_a_call_and_stops_a_wrong_one(vocab):  # noqa: F811
    tools = TOOLS[:1] + TOOLS[2:]
    grammar = toolgrammar.build("gemma4", tools, required=False)
    assert grammar.lazy and grammar.triggers
    good = call(f"get_weather{{city:{Q}Paris{Q},days:2}}")
    assert run(vocab, grammar, "Let me check. " + good) == (True, True)
    assert run(vocab, grammar, good + call("noop{}")) == (True, True)
    assert run(vocab, grammar, good.replace("days:2", f"days:{Q}2{Q}"))[0] is False
    assert run(vocab, grammar, good.replace("get_weather", "get_wether"))[0] is False
    single = toolgrammar.build("gemma4", TOOLS, required=True, parallel=False)
    assert not single.lazy and run(vocab, single, good) == (True, True)
    nested = call(f"set_config{{config:{{a:[1,{Q}x{Q},{{b:null}}]}},tags:[]}}")
    assert run(vocab, single, nested) == (True, True)
    assert run(vocab, single, good + call("noop{}"))[0] is False
