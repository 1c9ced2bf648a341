"""GLM 4.6 / 4.7's ``<arg_key>`` calls (``toolformats/glm.py``): detection from the real templates,
the parser whole, one character at a time and cut at every point, its failures, the history
the templates get (a call rendered by the template reads back as the same call), and the
grammar run by llama.cpp's sampler."""

from functools import partial

import formatcheck
import pytest
from formatcheck import template
from test_toolgrammar import run
from test_toolgrammar import vocab as vocab  # noqa: F401 (the fixture)

from gateway.text import chat_template
from gateway.text.reasoning import detect as detect_reasoning
from gateway.text.toolformats import detect
from gateway.worker import toolgrammar
from gateway.worker.toolhistory import for_template

TEMPLATES = ("GLM-4.6", "GLM-4.7-Flash", "Spark2.5")
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "opts": {"type": "object"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]

read = partial(formatcheck.read, tools=TOOLS)
each_way = partial(formatcheck.each_way, tools=TOOLS)


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_real_templates_detect_as_glm(name):
    assert detect(template(name), []) == "glm"
    assert detect_reasoning(template(name), []) == "think"


SAMPLES = [
    # answer, content, calls
    ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>", "",
     [("get_weather", {"city": "Paris"})]),
    ("Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris\n2</arg_value>\n"
     "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>{\"a\": [1]}</arg_value>\n"
     "</tool_call>\nDone.", "Let me check.Done.",
     [("get_weather", {"city": "Paris\n2", "days": 3, "opts": {"a": [1]}})]),
    ("<tool_call>noop</tool_call><tool_call>get_weather<arg_key>city</arg_key><arg_value>1</arg_value></tool_call>",
     "", [("noop", {}), ("get_weather", {"city": "1"})]),
    ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>a</tool_call>b</arg_value></tool_call>", "",
     [("get_weather", {"city": "a</tool_call>b"})]),  # a value ends only at its closer
]


@pytest.mark.parametrize("answer, content, calls", SAMPLES)
@pytest.mark.parametrize("stream", [True, False])
def test_samples_whole_one_character_at_a_time_and_cut_anywhere(answer, content, calls, stream):
    assert each_way("glm", answer, stream=stream) == ("", content, calls, 0)


@pytest.mark.parametrize("answer", [
    "<tool_call>nope<arg_key>city</arg_key><arg_value>x</arg_value></tool_call>",  # not one of the tools
    "<tool_call>get_weather<arg_key>city</arg_key><arg_value>x",  # the answer ends inside it
    "<tool_call>get_weather{\"city\": 1}</tool_call>",  # not this syntax
])
def test_a_broken_call_is_text_in_a_whole_answer(answer):
    thinking, content, calls, failed = read("glm", [answer], stream=False)
    assert calls == [] and content == answer and failed


def test_thinking_then_a_call_as_the_flash_template_opens_it():
    tail = chat_template.render(template("GLM-4.7-Flash"), [{"role": "user", "content": "hi"}], tools=TOOLS)
    assert tail.endswith("<think>")
    answer = "Let me look.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>"
    assert read("glm", list(answer), reasoning="think", tail=tail) == (
        "Let me look.", "", [("get_weather", {"city": "Oslo"}, None)], [])


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_call_the_template_renders_reads_back(name):
    args = {"city": "Paris", "days": 3, "opts": {"a": [1, "x"]}}
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    [(history, tools)] = for_template(messages, TOOLS, "glm", template(name))
    text = chat_template.render(template(name), history, tools=tools)
    start = text.index("<tool_call>get_weather")
    block = text[start:text.index("</tool_call>", start) + len("</tool_call>")]
    assert read("glm", [block], stream=False)[2] == [("get_weather", args, None)]


def test_the_grammar_takes_both_spacings(vocab):  # noqa: F811
    grammar = toolgrammar.build("glm", TOOLS, required=False)
    assert grammar.lazy and grammar.triggers == ("<tool_call>",)
    for answer in (SAMPLES[0][0], SAMPLES[1][0].removesuffix("\nDone."), SAMPLES[2][0]):
        assert run(vocab, grammar, answer) == (True, True)
    assert run(vocab, grammar, "<tool_call>get_weather<arg_key>days</arg_key><arg_value>soon")[0] is False
