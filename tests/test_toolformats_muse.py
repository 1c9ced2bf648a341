"""Muse Glimmer (``muse``, its messages framed by ``reasoning``'s ``muse``): detection from the real
template, thinking, answer and calls read whole, one character at a time and cut anywhere, call
markup outside a call message kept as text, failures kept as text, and the grammar under
llama.cpp's sampler."""

import json

from realmodel import CACHE

from gateway.engine import toolgrammar
from gateway.models import testmodels as tm
from gateway.text.reasoning import detect as detect_reasoning
from gateway.text.toolformats import AnswerParser, CallArgs, CallEnd, CallStart, Piece, detect

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]
TAIL = "<|start|>assistant"
INVOKE = ('<atem:function_calls>\n<atem:invoke name="get_weather">\n<atem:parameter name="city">New\nYork'
          '</atem:parameter>\n<atem:parameter name="days">3</atem:parameter>\n</atem:invoke>\n</atem:function_calls>')
WANT = ("get_weather", {"city": "New\nYork", "days": 3})


def template():
    return tm.llama_cpp_source_file("models/templates/muse-glimmer.jinja", CACHE / "templates").read_text()


def parse(pieces, stream=True, tools=TOOLS):
    """(thinking, content, [(name, args)], failed) of an answer fed in ``pieces``."""
    p = AnswerParser("muse", tools, reasoning="muse", prompt_tail=TAIL, stream=stream)
    items = [it for piece in pieces for it in p.feed(piece)] + p.flush()
    thinking = "".join(i.text for i in items if isinstance(i, Piece) and i.kind == "thinking")
    content = "".join(i.text for i in items if isinstance(i, Piece) and i.kind == "content")
    calls = {i.index: [i.name, ""] for i in items if isinstance(i, CallStart)}
    for i in items:
        if isinstance(i, CallArgs):
            calls[i.index][1] += i.text
    assert sorted(i.index for i in items if isinstance(i, CallEnd)) == sorted(calls)
    return thinking, content, [(n, json.loads(a)) for n, a in calls.values()], len(p.failed)


def every_way(text):
    whole = parse([text])
    assert parse(list(text)) == whole
    assert parse([text], stream=False) == whole
    for i in range(len(text) + 1):
        assert parse([text[:i], text[i:]]) == whole, i
    return whole


def test_detected_from_the_real_template():
    assert detect(template(), []) == "muse"
    assert detect_reasoning(template(), []) == "muse"


def test_thinking_answer_and_calls():
    answer = (" to=self<|message|>Let me think.<|eom|><|start|>assistant to=user<|message|>Checking.<|eom|>"
              f"<|start|>assistant to=get_weather<|message|>{INVOKE}<|eom|>"
              '<|start|>assistant to=noop<|message|><atem:function_calls>\n<atem:invoke name="noop">\n'
              "</atem:invoke>\n</atem:function_calls>")
    assert every_way(answer) == ("Let me think.", "Checking.", [WANT, ("noop", {})], 0)


def test_markup_outside_a_call_message_is_text():
    assert every_way(f" to=user<|message|>Like this: {INVOKE}<|eot|>") == ("", f"Like this: {INVOKE}", [], 0)
    assert every_way(f" to=self<|message|>Maybe {INVOKE}<|eom|><|start|>assistant to=user<|message|>Hi<|eot|>") \
        == (f"Maybe {INVOKE}", "Hi", [], 0)


def test_failures_stay_text():
    unknown = INVOKE.replace("get_weather", "nope")
    assert every_way(f" to=nope<|message|>{unknown}") == ("", unknown, [], 1)


def test_grammar_takes_calls_and_stops_a_bad_value():
    from helpers import vocab_only
    from test_toolgrammar import run

    grammar = toolgrammar.build("muse", TOOLS, required=False)
    assert grammar.lazy and grammar.triggers
    with vocab_only("qwen2") as vocab:
        assert run(vocab, grammar, f" to=get_weather<|message|>{INVOKE}") == (True, True)
        assert run(vocab, grammar, f" to=get_weather<|message|>{INVOKE.replace('>3<', '>three<')}")[0] is False


def test_a_required_call_may_follow_thinking():
    from helpers import vocab_only
    from test_toolgrammar import run

    grammar = toolgrammar.build("muse", TOOLS, required=True)
    with vocab_only("qwen2") as vocab:
        answer = f" to=self<|message|>Hm.<|eom|><|start|>assistant to=get_weather<|message|>{INVOKE}"
        assert run(vocab, grammar, answer) == (True, True)
        assert run(vocab, grammar, " to=user<|message|>Hi")[0] is False
