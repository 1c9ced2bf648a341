"""Seed-OSS's ``<seed:tool_call><function=N><parameter=P>V</parameter></function></seed:tool_call>``
calls (``toolformats/seed_oss.py``): detection from the real template, the parser whole, one
character at a time and cut at every point, its failures, thinking before a call, the history
the template gets (a call rendered by the template reads back as the same call), and the
grammar run by llama.cpp's sampler."""

from functools import partial

import formatcheck
import pytest
from test_toolgrammar import run
from test_toolgrammar import vocab as vocab  # noqa: F401 (the fixture)

from gateway.text import chat_template
from gateway.text.reasoning import detect as detect_reasoning
from gateway.text.toolformats import detect
from gateway.worker import toolgrammar
from gateway.worker.toolhistory import for_template

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]

read = partial(formatcheck.read, tools=TOOLS)
each_way = partial(formatcheck.each_way, tools=TOOLS)


def template():
    return formatcheck.template("ByteDance-Seed-OSS")


def test_the_real_template_detects_as_seed_oss():
    assert detect(template(), []) == "seed_oss"
    assert detect_reasoning(template(), []) == "seed"


SAMPLES = [
    # answer, content, calls
    ("<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n</function>\n</seed:tool_call>",
     "", [("get_weather", {"city": "Paris"})]),
    ("Let me check.\n<seed:tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
     "<parameter=days>3</parameter>\n</function>\n</seed:tool_call>\n<seed:tool_call>\n<function=noop>\n</function>\n"
     "</seed:tool_call>\nDone.", "Let me check.Done.",
     [("get_weather", {"city": "\nParis\n", "days": 3}), ("noop", {})]),  # every newline of a value is its own
]


@pytest.mark.parametrize("answer, content, calls", SAMPLES)
@pytest.mark.parametrize("stream", [True, False])
def test_samples_whole_one_character_at_a_time_and_cut_anywhere(answer, content, calls, stream):
    assert each_way("seed_oss", answer, stream=stream) == ("", content, calls, 0)


@pytest.mark.parametrize("answer", [
    "<seed:tool_call>\n<function=nope>\n<parameter=city>x</parameter>\n</function>\n</seed:tool_call>",  # not a tool
    "<seed:tool_call>\n<function=get_weather>\n<parameter=city>x",  # the answer ends inside it
    '<seed:tool_call>{"name": "get_weather", "arguments": {}}</seed:tool_call>',  # not this syntax
])
def test_a_broken_call_is_text_in_a_whole_answer(answer):
    thinking, content, calls, failed = read("seed_oss", [answer], stream=False)
    assert calls == [] and content == answer and failed


def test_thinking_then_a_call():
    answer = ("<seed:think>Let me look.</seed:think>\n<seed:tool_call>\n<function=get_weather>\n"
              "<parameter=city>Oslo</parameter>\n</function>\n</seed:tool_call>")
    assert read("seed_oss", list(answer), reasoning="seed") == (
        "Let me look.", "", [("get_weather", {"city": "Oslo"}, None)], [])


def test_a_call_the_template_renders_reads_back():
    args = {"city": "Paris", "days": 3}
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    [(history, tools)] = for_template(messages, TOOLS, "seed_oss", template())
    text = chat_template.render(template(), history, tools=tools)
    start = text.index("<seed:tool_call>\n<function=get_weather>")
    block = text[start:text.index("</seed:tool_call>", start) + len("</seed:tool_call>")]
    assert read("seed_oss", [block], stream=False)[2] == [("get_weather", args, None)]


def test_the_grammar(vocab):  # noqa: F811
    grammar = toolgrammar.build("seed_oss", TOOLS, required=False)
    assert grammar.lazy and grammar.triggers == ("<seed:tool_call>",)
    assert run(vocab, grammar, SAMPLES[0][0]) == (True, True)
    assert run(vocab, grammar, "<seed:tool_call>\n<function=get_weather>\n<parameter=days>soon")[0] is False
