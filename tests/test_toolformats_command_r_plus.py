"""Command R+'s ``Action:`` lists (``toolformats/command_r_plus.py``): detection from the real
template, the parser whole, one character at a time and cut at every point, a call that starts
on its name, its failures, the ``<|CHATBOT_TOKEN|>`` wrapper dropped with tools or without, the
history the template gets (a call it renders reads back), and the grammar run by llama.cpp's
sampler."""

import json
import re
from functools import partial

import formatcheck
import pytest
from formatcheck import template
from test_toolgrammar import run
from test_toolgrammar import vocab as vocab  # noqa: F401 (the fixture)

from gateway.text import chat_template
from gateway.text.toolformats import AnswerParser, CallArgs, CallStart, detect, frames_answers
from gateway.worker import toolgrammar
from gateway.worker.toolhistory import for_template

PLUS = "CohereForAI-c4ai-command-r-plus-tool_use"
TOOLS = formatcheck.WEATHER_TOOLS

read = partial(formatcheck.read, tools=TOOLS)
each_way = partial(formatcheck.each_way, tools=TOOLS)
failing = partial(formatcheck.failing, tools=TOOLS)


def action(*calls: tuple[str, dict], indent: int | None = 4) -> str:
    """Calls as the template writes them: over lines, indented (the arguments too, by ``indent``)."""
    items = ",\n".join("    {\n        \"tool_name\": " + json.dumps(n) + ",\n        \"parameters\": "
                       + json.dumps(a, indent=indent).replace("\n", "\n        ") + "\n    }" for n, a in calls)
    return f"Action:\n```json\n[\n{items}\n]```"


def test_the_real_template_detects_and_r7b_stays_command_r():
    assert detect(template(PLUS), []) == "command_r_plus"
    assert detect(template("CohereForAI-c4ai-command-r7b-12-2024-tool_use"), []) == "command_r"


SAMPLES = [
    # answer, content, calls
    (action(("get_weather", {"city": "Paris"})), "", [("get_weather", {"city": "Paris"})]),
    ("Let me check.\n" + action(("get_weather", {"city": "a]```\"<|x", "days": 2}), ("noop", {})) + "\n",
     "Let me check.", [("get_weather", {"city": "a]```\"<|x", "days": 2}), ("noop", {})]),
    ('Action:\n```json\n[{"tool_name": "noop", "parameters": {}}]\n```', "", [("noop", {})]),  # llama.cpp's case
    ('Action: [{"tool_name": "noop", "parameters": {}}]', "", [("noop", {})]),  # no fence
    ('Action:\n```\n{"parameters": {"city": "x"}, "tool_name": "get_weather"}\n```', "",
     [("get_weather", {"city": "x"})]),  # one object, its keys in another order, a bare fence
    ('Action:\n```json\n[{"tool_name": "noop", "parameters": {}}]', "", [("noop", {})]),  # the fence never closed
    ("<|CHATBOT_TOKEN|>Hello, world!\nWhat's up?<|END_OF_TURN_TOKEN|>", "Hello, world!\nWhat's up?", []),
    ("Call to Action: buy now. Action:\n```python\nprint(1)\n```", "Call to Action: buy now. Action:\n```python\nprint(1)\n```",
     []),  # "Action:" with no list after it is words
]


@pytest.mark.parametrize("answer, content, calls", SAMPLES)
@pytest.mark.parametrize("stream", [True, False])
def test_samples_whole_one_character_at_a_time_and_cut_anywhere(answer, content, calls, stream):
    assert each_way("command_r_plus", answer, stream=stream) == ("", content, calls, 0)


def test_a_streamed_call_starts_on_its_name():
    p = AnswerParser("command_r_plus", TOOLS, stream=True)
    items = p.feed('Action:\n```json\n[\n    {\n        "tool_name": "get_weather",\n')
    assert [(i.index, i.name) for i in items if isinstance(i, CallStart)] == [(0, "get_weather")]


def test_arguments_stream_as_they_are_generated():
    text = action(("get_weather", {"city": "word " * 10}))
    p = AnswerParser("command_r_plus", TOOLS, stream=True)
    seen = [(i, it) for i, c in enumerate(text) for it in p.feed(c)]
    args = [i for i, it in seen if isinstance(it, CallArgs)]
    assert args[0] == text.index("{\n", text.index('"parameters"')) and len(args) > 40
    assert "".join(it.text for _, it in seen if isinstance(it, CallArgs)) == json.dumps(
        {"city": "word " * 10}, indent=4).replace("\n", "\n        ")  # as written


@pytest.mark.parametrize("answer, streamed", [
    (action(("nope", {"city": "x"})), []),  # not one of the tools
    (action(("get_weather", {"city": "x"}))[:-12], [("get_weather", "the answer ended inside the call")]),
    ('Action:\n```json\n[{"tool_name": "noop", "parameters": 3}]```', [("noop", "not a call object")]),
    ('Action:\n```json\n[{"tool_name": "noop", "parameters": {}\n```', [("noop", "the call was cut off")]),
    ("Action:\n```json\n[oops]```", []),  # a list with no call in it
])
def test_a_broken_call_is_text_in_a_whole_answer_and_ends_with_an_error_streamed(answer, streamed):
    assert failing("command_r_plus", answer) == (answer, 1, streamed, 1)


def test_every_answer_is_framed_so_the_wrapper_goes_without_tools_too():
    assert frames_answers("command_r_plus")
    p = AnswerParser("command_r_plus", None)
    items = [*p.feed("<|CHATBOT_TOKEN|>Hi<|END_OF_"), *p.feed("TURN_TOKEN|>"), *p.flush()]
    assert items == [("content", "Hi")]


def test_a_call_the_template_renders_reads_back():
    args = {"city": "Paris", "days": 3}
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}},
                    {"id": "call_2", "type": "function", "function": {"name": "noop", "arguments": {}}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    [(history, tools)] = for_template(messages, TOOLS, "command_r_plus", template(PLUS))
    text = chat_template.render(template(PLUS), history, tools=tools)
    assert "def get_weather(" in text  # the template lists the tools itself
    start = text.index("Checking.")
    block = text[start:text.index("```\n", text.index("```json", start) + 7) + 3]
    assert read("command_r_plus", [block], stream=False) == (
        "", "Checking.", [("get_weather", args, None), ("noop", {}, None)], [])


def test_the_grammar(vocab):  # noqa: F811
    grammar = toolgrammar.build("command_r_plus", TOOLS, required=False)
    assert grammar.lazy and grammar.triggers
    [trigger] = grammar.triggers
    assert re.search(trigger, "Sure.\nAction:\n```json") and not re.search(trigger, "Call to Action: now")
    # the frame the template writes; the arguments on one line, as the JSON-schema rules write them
    both = action(("get_weather", {"city": "Paris", "days": 2}), ("noop", {}), indent=None)
    assert run(vocab, grammar, both) == (True, True)
    assert run(vocab, grammar, "Call to Action: now. Action:\n" + both[8:]) == (True, True)  # prose is free
    assert run(vocab, grammar, SAMPLES[2][0].replace("]\n```", "]```")) == (True, True)
    assert run(vocab, grammar, action(("get_weather", {"city": "Paris", "days": "2"})))[0] is False
    assert run(vocab, grammar, action(("nope", {})))[0] is False
