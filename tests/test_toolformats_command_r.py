"""Command R7B / Cohere2 MoE's action lists (``toolformats/command_r.py``) and their thinking
(``cohere`` in ``text/reasoning.py``): detection from the real templates, the parser whole, one
character at a time and cut at every point, a call that starts on its name, its failures, the
text wrappers dropped, the history the templates get, and the grammar run by llama.cpp's sampler."""

import json
from functools import partial

import formatcheck
import pytest
from formatcheck import template
from test_toolgrammar import run
from test_toolgrammar import vocab as vocab  # noqa: F401 (the fixture)

from gateway.text import chat_template
from gateway.text.reasoning import detect as detect_reasoning
from gateway.text.toolformats import AnswerParser, CallArgs, CallStart, detect
from gateway.worker import toolgrammar
from gateway.worker.toolhistory import for_template

TEMPLATES = ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", "Cohere2MoE")
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]

read = partial(formatcheck.read, tools=TOOLS)
each_way = partial(formatcheck.each_way, tools=TOOLS)


def action(*calls: tuple[str, dict]) -> str:
    listed = ",\n    ".join(json.dumps({"tool_call_id": str(i), "tool_name": n, "parameters": a})
                            for i, (n, a) in enumerate(calls))
    return f"<|START_ACTION|>[\n    {listed}\n]<|END_ACTION|>"


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_real_templates_detect_as_command_r(name):
    assert detect(template(name), []) == "command_r"
    assert detect_reasoning(template(name), []) == "cohere"


SAMPLES = [
    # answer, content, calls
    (action(("get_weather", {"city": "Paris"})), "", [("get_weather", {"city": "Paris"})]),
    ("<|START_RESPONSE|>Let me check.<|END_RESPONSE|>" + action(("get_weather", {"city": "a]\"<|x", "days": 2}),
                                                                ("noop", {})),
     "Let me check.", [("get_weather", {"city": "a]\"<|x", "days": 2}), ("noop", {})]),
    ('<|START_ACTION|>{"tool_name": "noop", "parameters": {}}<|END_ACTION|>', "", [("noop", {})]),
    ("<|START_TEXT|>Hello<|END_TEXT|>", "Hello", []),
]


@pytest.mark.parametrize("answer, content, calls", SAMPLES)
@pytest.mark.parametrize("stream", [True, False])
def test_samples_whole_one_character_at_a_time_and_cut_anywhere(answer, content, calls, stream):
    assert each_way("command_r", answer, stream=stream) == ("", content, calls, 0)


def test_a_streamed_call_starts_on_its_name():
    p = AnswerParser("command_r", TOOLS, stream=True)
    items = p.feed('<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", ')
    assert [(i.index, i.name) for i in items if isinstance(i, CallStart)] == [(0, "get_weather")]
    items = p.feed('"parameters": {"city": "Pa')  # the arguments stream as they come
    assert [i.text for i in items if isinstance(i, CallArgs)] == ['{"city": "Pa']


@pytest.mark.parametrize("answer", [
    action(("nope", {"city": "x"})),  # not one of the tools
    action(("get_weather", {"city": "x"}))[:-20],  # the answer ends inside it
    '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "noop", "parameters": 3}]<|END_ACTION|>',
])
def test_a_broken_call_is_text_in_a_whole_answer(answer):
    thinking, content, calls, failed = read("command_r", [answer], stream=False)
    assert calls == [] and content == answer and failed


@pytest.mark.parametrize("name", TEMPLATES)
def test_thinking_then_a_call(name):
    tail = chat_template.render(template(name), [{"role": "user", "content": "hi"}], tools=TOOLS,
                                extra={"enable_thinking": True})
    opened = "" if tail.endswith("<|START_THINKING|>") else "<|START_THINKING|>"
    call = action(("get_weather", {"city": "Oslo"}))
    want = ("Let me look.", "", [("get_weather", {"city": "Oslo"}, None)], [])
    for answer in (opened + "Let me look.<|END_THINKING|>" + call, opened + "Let me look." + call):
        assert read("command_r", list(answer), reasoning="cohere", tail=tail) == want
        assert read("command_r", [answer], stream=False, reasoning="cohere", tail=tail) == want
    answer = opened + "Hm.<|END_THINKING|><|START_RESPONSE|>Hi there<|END_RESPONSE|>"
    assert read("command_r", list(answer), reasoning="cohere", tail=tail) == ("Hm.", "Hi there", [], [])


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_call_the_template_renders_reads_back(name):
    args = {"city": "Paris", "days": 3}
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    [(history, tools)] = for_template(messages, TOOLS, "command_r", template(name))
    text = chat_template.render(template(name), history, tools=tools)
    start = text.index("<|START_ACTION|>", text.index("weather?"))
    block = text[start:text.index("<|END_ACTION|>", start) + len("<|END_ACTION|>")]
    assert read("command_r", [block], stream=False)[2] == [("get_weather", args, None)]


def test_the_grammar(vocab):  # noqa: F811
    grammar = toolgrammar.build("command_r", TOOLS, required=False)
    assert grammar.lazy and grammar.triggers
    assert run(vocab, grammar, SAMPLES[0][0]) == (True, True)
    assert run(vocab, grammar, action(("get_weather", {"city": "Paris", "days": 2}), ("noop", {}))) == (True, True)
    assert run(vocab, grammar, action(("get_weather", {"city": "Paris", "days": "2"})))[0] is False
