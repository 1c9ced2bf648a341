"""GigaChat 3 and 3.1 (``gigachat``): detection from the real templates, the call read whole,
one character at a time and cut anywhere, failures kept as text, a call the template writes into
the history read back as the same call, and the grammar under llama.cpp's sampler."""

import functools
import re

import formatcheck
import pytest
from formatcheck import template

from gateway.text import chat_template
from gateway.text.toolformats import detect
from gateway.text.toolformats.gigachat import V3_OPEN, V31_OPEN
from gateway.worker import toolgrammar

TEMPLATES = ("GigaChat3-10B-A1.8B", "GigaChat3.1-10B-A1.8B")
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]
CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'


parse = functools.partial(formatcheck.parse, "gigachat", tools=TOOLS)
every_way = functools.partial(formatcheck.every_way, "gigachat", tools=TOOLS)


@pytest.mark.parametrize("name", TEMPLATES)
def test_detected_from_the_real_templates(name):
    assert detect(template(name), []) == "gigachat"


@pytest.mark.parametrize("opener", [V3_OPEN, V31_OPEN])
def test_the_call_after_either_opener(opener):
    want = [("get_weather", {"city": "Paris", "days": 2})]
    assert every_way(opener + CALL) == ("", "", want, 0)
    assert every_way("Let me check." + opener + CALL) == ("", "Let me check.", want, 0)


def test_failures_stay_text():
    unknown = V31_OPEN + '{"name": "nope", "arguments": {}}'
    assert every_way(unknown) == ("", unknown, [], 1)
    cut = V31_OPEN + '{"name": "get_weather", "arguments": {"city": "Par'
    assert parse([cut], stream=False) == ("", cut, [], 1)  # a whole answer never carries a broken call
    assert every_way("Hi " + V31_OPEN) == ("", "Hi " + V31_OPEN, [], 1)


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_call_the_template_writes_reads_back(name):
    args = {"city": "Paris", "days": 2}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    prompt = chat_template.render(template(name), messages, tools=TOOLS)
    at = max(prompt.rfind(V3_OPEN), prompt.rfind(V31_OPEN))
    written = prompt[at:]
    written = written[:re.search(r"\}\s*\}", written).end()]
    assert every_way(written)[2] == [("get_weather", args)]


def test_grammar_takes_a_call_and_stops_a_bad_one():
    from helpers import vocab_only
    from test_toolgrammar import run

    grammar = toolgrammar.build("gigachat", TOOLS, required=False)
    assert grammar.lazy and grammar.triggers
    with vocab_only("qwen2") as vocab:
        assert run(vocab, grammar, "Sure. " + V31_OPEN + CALL) == (True, True)
        assert run(vocab, grammar, V3_OPEN + CALL) == (True, True)
        assert run(vocab, grammar, V31_OPEN + '{"name": "nope"')[0] is False
