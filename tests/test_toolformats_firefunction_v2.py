"""FireFunction v2's ``functools[...]`` lists (``toolformats/firefunction_v2.py``): detection from
the real template, the parser whole, one character at a time and cut at every point, the word
``functools`` in prose as text, arguments that stream, its failures, the history the template
gets (the tools described in a system message; a call it renders reads back), and the grammar
run by llama.cpp's sampler."""

import json
import re
from functools import partial

import formatcheck
import pytest
from formatcheck import template
from test_toolgrammar import run
from test_toolgrammar import vocab as vocab  # noqa: F401 (the fixture)

from gateway.text import chat_template
from gateway.text.toolformats import CallArgs, CallStart, ToolCallParser, describes_tools, detect
from gateway.worker import toolgrammar
from gateway.worker.toolhistory import for_template

FIRE = "fireworks-ai-llama-3-firefunction-v2"
TOOLS = formatcheck.WEATHER_TOOLS

read = partial(formatcheck.read, tools=TOOLS)
each_way = partial(formatcheck.each_way, tools=TOOLS)
failing = partial(formatcheck.failing, tools=TOOLS)


def functools(*calls: tuple[str, dict]) -> str:
    return " functools[" + ", ".join(json.dumps({"name": n, "arguments": a}) for n, a in calls) + "]"


def test_the_real_template_detects_and_plain_llama_3_stays_llama3():
    assert detect(template(FIRE), []) == "firefunction_v2"
    assert detect(template("meta-llama-Llama-3.1-8B-Instruct"), []) == "llama3"


SAMPLES = [
    # answer, content, calls
    (functools(("get_weather", {"city": "Paris"})), "", [("get_weather", {"city": "Paris"})]),
    ("Let me check." + functools(("get_weather", {"city": "a]}\"functools[", "days": 2}), ("noop", {})) + " Done.",
     "Let me check.Done.", [("get_weather", {"city": "a]}\"functools[", "days": 2}), ("noop", {})]),
    ('functools [\n{"name": "noop", "arguments": {}}\n]', "", [("noop", {})]),
    ('functools[{"arguments": {"city": "x"}, "name": "get_weather"}]', "", [("get_weather", {"city": "x"})]),
    ('functools[{"name": "noop", "arguments": {}}', "", [("noop", {})]),  # the list never closed
    ("Use functools.partial, or functools [1, 2] and functools[", "Use functools.partial, or functools [1, 2] and functools[",
     []),  # the word, in prose and code: text
]


@pytest.mark.parametrize("answer, content, calls", SAMPLES)
@pytest.mark.parametrize("stream", [True, False])
def test_samples_whole_one_character_at_a_time_and_cut_anywhere(answer, content, calls, stream):
    assert each_way("firefunction_v2", answer, stream=stream) == ("", content, calls, 0)


def test_arguments_stream_as_they_are_generated():
    text = functools(("get_weather", {"city": "word " * 10}))
    p = ToolCallParser("firefunction_v2", TOOLS)
    seen = [(i, it) for i, c in enumerate(text) for it in p.feed(c)]
    start = next(i for i, it in seen if isinstance(it, CallStart))
    assert start == text.index('{"city"') and sum(isinstance(it, CallArgs) for _, it in seen) > 40


@pytest.mark.parametrize("answer, streamed", [
    (functools(("nope", {"city": "x"})), []),  # not one of the tools
    (functools(("get_weather", {"city": "x"}))[:-4], [("get_weather", "the answer ended inside the call")]),
    (' functools[{"name": "noop", "arguments": [1]}]', []),
    (' functools[{"name": "get_weather", "arguments": {"city": "x",}}]',
     [("get_weather", "the arguments are not one JSON object")]),
])
def test_a_broken_call_is_text_in_a_whole_answer_and_ends_with_an_error_streamed(answer, streamed):
    assert failing("firefunction_v2", answer) == (answer, 1, streamed, 1)


def test_a_call_the_template_renders_reads_back():
    args = {"city": "Paris", "days": 3}
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}},
                    {"id": "call_2", "type": "function", "function": {"name": "noop", "arguments": {}}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    assert not describes_tools(template(FIRE))  # it reads a `functions` text no caller gives
    history, tools = for_template(messages, TOOLS, "firefunction_v2", template(FIRE))[0]
    text = chat_template.render(template(FIRE), history, tools=tools)
    assert '"name": "get_weather"' in text[:text.index("weather?")]  # the tools, described before the chat
    assert "functools[{" in text[:text.index("weather?")]  # ... and the syntax to call them in
    start = text.index("Checking.")
    block = text[start:text.index("<|eot_id|>", start)]
    assert read("firefunction_v2", [block], stream=False) == (
        "", "Checking.", [("get_weather", args, None), ("noop", {}, None)], [])


def test_the_grammar(vocab):  # noqa: F811
    grammar = toolgrammar.build("firefunction_v2", TOOLS, required=False)
    assert grammar.lazy and grammar.triggers
    [trigger] = grammar.triggers
    assert re.search(trigger, "Sure. functools[") and not re.search(trigger, "import functools\n")
    both = functools(("get_weather", {"city": "Paris", "days": 2}), ("noop", {})).strip()
    assert run(vocab, grammar, both) == (True, True)
    assert run(vocab, grammar, "import functools; functools.reduce " + both) == (True, True)  # prose is free
    assert run(vocab, grammar, functools(("get_weather", {"city": "Paris", "days": "2"})).strip())[0] is False
    assert run(vocab, grammar, functools(("nope", {})).strip())[0] is False
