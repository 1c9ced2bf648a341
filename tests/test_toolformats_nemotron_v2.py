"""Calls as a JSON array between two markers: Nemotron Nano v2's ``<TOOLCALL>[...]</TOOLCALL>``
(``toolformats/nemotron_v2.py``) and Apriel's ``<tool_calls>[...]</tool_calls>``
(``toolformats/apriel.py``): detection from the real templates, the parser whole, one character
at a time and cut at every point, its failures, the history the templates get (a call rendered
by the template reads back as the same call), and the grammar run by llama.cpp's sampler."""

import json
from functools import partial

import formatcheck
import pytest
from formatcheck import template
from test_toolgrammar import run
from test_toolgrammar import vocab as vocab  # noqa: F401 (the fixture)

from gateway.text import chat_template
from gateway.text.toolformats import detect
from gateway.worker import toolgrammar
from gateway.worker.toolhistory import for_template

TEMPLATES = {"NVIDIA-Nemotron-Nano-v2": "nemotron_v2", "unsloth-Apriel-1.5": "apriel",
             "Apriel-1.6-15b-Thinker-fixed": "apriel"}
MARKS = {"nemotron_v2": ("<TOOLCALL>", "</TOOLCALL>"), "apriel": ("<tool_calls>", "</tool_calls>")}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]

read = partial(formatcheck.read, tools=TOOLS)
each_way = partial(formatcheck.each_way, tools=TOOLS)


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_real_templates_detect(name):
    assert detect(template(name), []) == TEMPLATES[name]


def samples(fmt):
    o, c = MARKS[fmt]
    return [
        # answer, content, calls
        (f'{o}[{{"name": "get_weather", "arguments": {{"city": "Paris"}}}}]{c}', "",
         [("get_weather", {"city": "Paris"})]),
        (f'Let me check.\n{o}[\n  {{"name": "get_weather", "arguments": {{"city": "a{c}b", "days": 3}}}},\n'
         f'  {{"name": "noop", "arguments": {{}}}}\n]{c}\nDone.', "Let me check.Done.",
         [("get_weather", {"city": f"a{c}b", "days": 3}), ("noop", {})]),
        (f'{o}[{{"name": "noop", "arguments": {{}}}}]', "", [("noop", {})]),  # the closer never came
    ]


@pytest.mark.parametrize("fmt", MARKS)
@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("stream", [True, False])
def test_samples_whole_one_character_at_a_time_and_cut_anywhere(fmt, case, stream):
    answer, content, calls = samples(fmt)[case]
    assert each_way(fmt, answer, stream=stream) == ("", content, calls, 0)


@pytest.mark.parametrize("fmt", MARKS)
@pytest.mark.parametrize("body", [
    '[{"name": "nope", "arguments": {}}]',  # not one of the tools
    '[{"name": "get_weather", "arguments": {"city": "x"',  # the answer ends inside it
    'get_weather {"city": 1}',  # not an array
])
def test_a_broken_call_is_text_in_a_whole_answer(fmt, body):
    o, c = MARKS[fmt]
    answer = o + body + (c if body.endswith(("]", "}")) else "")
    thinking, content, calls, failed = read(fmt, [answer], stream=False)
    assert calls == [] and content == answer and failed


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_call_the_template_renders_reads_back(name):
    fmt = TEMPLATES[name]
    o, c = MARKS[fmt]
    args = {"city": "Paris", "days": 3}
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    [(history, tools)] = for_template(messages, TOOLS, fmt, template(name))
    text = chat_template.render(template(name), history, tools=tools)
    start = text.index(o + "[{\"name\": \"get_weather\"")  # not the example in the system prompt
    block = text[start:text.index(c, start) + len(c)]
    assert read(fmt, [block], stream=False)[2] == [("get_weather", args, None)]


@pytest.mark.parametrize("fmt", MARKS)
def test_the_grammar(vocab, fmt):  # noqa: F811
    o, c = MARKS[fmt]
    grammar = toolgrammar.build(fmt, TOOLS, required=False)
    assert grammar.lazy and grammar.triggers == (o,)
    call = {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}
    assert run(vocab, grammar, f"{o}[{json.dumps(call)}]{c}") == (True, True)
    assert run(vocab, grammar, f'{o}[{{"name": "nope"')[0] is False


def test_apriel_16_thinks_from_its_prompt_to_begin_final_response():
    from gateway.text.reasoning import detect as detect_reasoning

    source = template("Apriel-1.6-15b-Thinker-fixed")
    fmt = detect_reasoning(source, [])
    tail = chat_template.render(source, [{"role": "user", "content": "hi"}], tools=TOOLS)
    answer = ('Let me see.\n[BEGIN FINAL RESPONSE]\nSure.\n<tool_calls>[{"name": "noop", "arguments": {}}]'
              "</tool_calls>")
    for stream in (True, False):  # the prompt's first words of the thinking are the thinking's, as llama.cpp reads them
        assert read("apriel", list(answer), stream=stream, reasoning=fmt, tail=tail) == (
            "Here are my reasoning steps:\nLet me see.", "Sure.", [("noop", {}, None)], [])
    assert detect_reasoning(template("unsloth-Apriel-1.5"), []) is None


@pytest.mark.parametrize("fmt", MARKS)
def test_a_required_call(vocab, fmt):  # noqa: F811
    o, c = MARKS[fmt]
    grammar = toolgrammar.build(fmt, TOOLS, required=True)
    assert not grammar.lazy
    assert run(vocab, grammar, f'{o}[{{"name": "noop", "arguments": {{}}}}]{c}') == (True, True)
