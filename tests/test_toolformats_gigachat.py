"""GigaChat 3 and 3.1 (``gigachat``): detection from the real templates, the call read whole,
one character at a time and cut anywhere, failures kept as text, a call the template writes into
the history read back as the same call, and the grammar under llama.cpp's sampler."""

import json
import re

import pytest
from realmodel import CACHE

from gateway.engine import toolgrammar
from gateway.models import testmodels as tm
from gateway.text import chat_template
from gateway.text.toolformats import AnswerParser, CallArgs, CallEnd, CallStart, Piece, detect
from gateway.text.toolformats.gigachat import V3_OPEN, V31_OPEN

TEMPLATES = ("GigaChat3-10B-A1.8B", "GigaChat3.1-10B-A1.8B")
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]
CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'


def template(name):
    return tm.llama_cpp_source_file(f"models/templates/{name}.jinja", CACHE / "templates").read_text()


def parse(pieces, stream=True):
    """(content, [(name, args)], failed) of an answer fed in ``pieces``."""
    p = AnswerParser("gigachat", TOOLS, stream=stream)
    items = [it for piece in pieces for it in p.feed(piece)] + p.flush()
    content = "".join(i.text for i in items if isinstance(i, Piece))
    calls = {i.index: [i.name, ""] for i in items if isinstance(i, CallStart)}
    for i in items:
        if isinstance(i, CallArgs):
            calls[i.index][1] += i.text
    assert sorted(i.index for i in items if isinstance(i, CallEnd)) == sorted(calls)
    return content, [(n, json.loads(a)) for n, a in calls.values()], len(p.failed)


def every_way(text):
    whole = parse([text])
    assert parse(list(text)) == whole
    assert parse([text], stream=False) == whole
    for i in range(len(text) + 1):
        assert parse([text[:i], text[i:]]) == whole, i
    return whole


@pytest.mark.parametrize("name", TEMPLATES)
def test_detected_from_the_real_templates(name):
    assert detect(template(name), []) == "gigachat"


@pytest.mark.parametrize("opener", [V3_OPEN, V31_OPEN])
def test_the_call_after_either_opener(opener):
    want = [("get_weather", {"city": "Paris", "days": 2})]
    assert every_way(opener + CALL) == ("", want, 0)
    assert every_way("Let me check." + opener + CALL) == ("Let me check.", want, 0)


def test_failures_stay_text():
    unknown = V31_OPEN + '{"name": "nope", "arguments": {}}'
    assert every_way(unknown) == (unknown, [], 1)
    cut = V31_OPEN + '{"name": "get_weather", "arguments": {"city": "Par'
    assert parse([cut], stream=False) == (cut, [], 1)  # a whole answer never carries a broken call
    assert every_way("Hi " + V31_OPEN) == ("Hi " + V31_OPEN, [], 1)


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
    assert every_way(written)[1] == [("get_weather", args)]


def test_grammar_takes_a_call_and_stops_a_bad_one():
    from helpers import vocab_only
    from test_toolgrammar import run

    grammar = toolgrammar.build("gigachat", TOOLS, required=False)
    assert grammar.lazy and grammar.triggers
    with vocab_only("qwen2") as vocab:
        assert run(vocab, grammar, "Sure. " + V31_OPEN + CALL) == (True, True)
        assert run(vocab, grammar, V3_OPEN + CALL) == (True, True)
        assert run(vocab, grammar, V31_OPEN + '{"name": "nope"')[0] is False
