"""Apertus' ``<|tools_prefix|>[{"N": {...}}]<|tools_suffix|>`` calls (``toolformats/apertus.py``):
detection from the real template, the parser whole, one character at a time and cut at every
point, its failures, the history the template gets (a call rendered by the template reads back
as the same call), and the grammar run by llama.cpp's sampler."""

from functools import partial

import formatcheck
import pytest
from test_toolgrammar import run
from test_toolgrammar import vocab as vocab  # noqa: F401 (the fixture)

from gateway.text import chat_template
from gateway.text.toolformats import detect
from gateway.worker import toolgrammar
from gateway.worker.toolhistory import for_template

TOOLS = formatcheck.WEATHER_TOOLS
OPEN, CLOSE = "<|tools_prefix|>", "<|tools_suffix|>"

read = partial(formatcheck.read, tools=TOOLS)
each_way = partial(formatcheck.each_way, tools=TOOLS)


def template():
    return formatcheck.template("Apertus-8B-Instruct")


def test_the_real_template_detects_as_apertus():
    assert detect(template(), []) == "apertus"


SAMPLES = [
    # answer, content, calls
    (f'{OPEN}[{{"get_weather": {{"city": "Paris"}}}}]{CLOSE}', "", [("get_weather", {"city": "Paris"})]),
    (f'Let me check.\n{OPEN}[\n {{ "get_weather" : {{"city": "a{CLOSE}b", "days": 3}} }},\n {{"noop": {{}}}}\n]{CLOSE}\nDone.',
     "Let me check.Done.", [("get_weather", {"city": f"a{CLOSE}b", "days": 3}), ("noop", {})]),
    (f'{OPEN}[{{"noop": {{}}}}]', "", [("noop", {})]),  # the closer never came
]


@pytest.mark.parametrize("answer, content, calls", SAMPLES)
@pytest.mark.parametrize("stream", [True, False])
def test_samples_whole_one_character_at_a_time_and_cut_anywhere(answer, content, calls, stream):
    assert each_way("apertus", answer, stream=stream) == ("", content, calls, 0)


@pytest.mark.parametrize("answer", [
    f'{OPEN}[{{"nope": {{"city": "x"}}}}]{CLOSE}',  # not one of the tools
    f'{OPEN}[{{"get_weather": {{"city": "x',  # the answer ends inside it
    f'{OPEN}[{{"name": "get_weather", "arguments": {{}}}}]{CLOSE}',  # another syntax: "name" is no tool here
    f'{OPEN}[{{"get_weather": "x"}}]{CLOSE}',  # not an object
])
def test_a_broken_call_is_text_in_a_whole_answer(answer):
    thinking, content, calls, failed = read("apertus", [answer], stream=False)
    assert calls == [] and content == answer and failed


def test_a_call_the_template_renders_reads_back():
    args = {"city": "Paris", "days": 3}
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    [(history, tools)] = for_template(messages, TOOLS, "apertus", template())
    text = chat_template.render(template(), history, tools=tools)
    start = text.index(OPEN + "[")
    block = text[start:text.index(CLOSE, start) + len(CLOSE)]
    assert read("apertus", [block], stream=False)[2] == [("get_weather", args, None)]


def test_the_grammar(vocab):  # noqa: F811
    grammar = toolgrammar.build("apertus", TOOLS, required=False)
    assert grammar.lazy and grammar.triggers == (r"<\|tools_prefix\|>",)
    assert run(vocab, grammar, SAMPLES[0][0]) == (True, True)
    assert run(vocab, grammar, f'{OPEN}[{{"get_weather": {{"city": "x"}}}}, {{"noop": {{}}}}]{CLOSE}') == (True, True)
    assert run(vocab, grammar, f'{OPEN}[{{"get_weather": {{"days": "soon"')[0] is False
