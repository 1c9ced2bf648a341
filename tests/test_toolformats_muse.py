"""Muse Glimmer (``muse``, its messages framed by ``reasoning``'s ``muse``): detection from the real
template, thinking, answer and calls read whole, one character at a time and cut anywhere,
arguments streamed as they are written, a call cut off before its closer never a call, call
markup outside a call message kept as text, failures kept as text, and the grammar under
llama.cpp's sampler."""

import functools
import json

import formatcheck
import pytest

from gateway.text.reasoning import detect as detect_reasoning
from gateway.text.toolformats import detect
from gateway.worker import toolgrammar

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
    return formatcheck.template("muse-glimmer")


KW = {"tools": TOOLS, "reasoning": "muse", "tail": TAIL}
parse = functools.partial(formatcheck.parse, "muse", **KW)
both_ways = functools.partial(formatcheck.both_ways, "muse", **KW)
every_way = functools.partial(formatcheck.every_way, "muse", **KW)


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


CALL = f" to=get_weather<|message|>{INVOKE}"


@pytest.mark.parametrize("after", ["", "<|eom|><|start|>assistant to=user<|message|>Done.<|eot|>"])
def test_a_call_cut_off_is_never_a_call(after):
    """The call message cut anywhere before its invoke's closer, the answer ending there
    (max_tokens) or the message ending there: streamed, the call that began ends with an error;
    whole, its text is content. Only the invoke's closer makes it a call."""
    end = CALL.index("</atem:invoke>") + len("</atem:invoke>")
    for i in range(len(CALL) + 1):  # (one prefix, below, is also cut at every point)
        cut = CALL[:i] + after
        streamed, whole = parse([cut]), parse([cut], stream=False)
        assert parse(list(cut)) == streamed, i
        if i < end:
            assert whole[2] == [] and all(args is None for _, args in streamed[2]), i
        else:
            assert streamed == whole and whole[2] == [WANT], i
    cut = INVOKE[:INVOKE.index("Yo")]
    assert both_ways(f" to=get_weather<|message|>{cut}") == (("", "", [("get_weather", None)], 1), ("", cut, [], 1))


def test_arguments_stream_as_they_are_written():
    """As MiniMax M2's: a string value leaves as it is written, any other at its parameter's end,
    so the arguments come in several pieces before the call ends."""
    pieces = formatcheck.args_fed_before_the_end("muse", CALL, **KW)
    assert pieces[0].startswith('{"city": "') and "York" not in pieces[0] and len(pieces) > 3
    assert json.loads("".join(pieces) + "}") == WANT[1]


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
