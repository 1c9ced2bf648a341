"""Functionary medium v3.1's ``<function=N>{...}</function>`` calls (``toolformats/functionary_v31.py``):
detection from the real template, the parser whole, one character at a time and cut at every
point, its failures, the history the template gets (a call rendered by the template reads back
as the same call), and the grammar run by llama.cpp's sampler."""

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

TOOLS = formatcheck.WEATHER_TOOLS
V31 = "meetkai-functionary-medium-v3.1"

read = partial(formatcheck.read, tools=TOOLS)
each_way = partial(formatcheck.each_way, tools=TOOLS)


def test_the_real_template_detects():
    assert detect(template(V31), []) == "functionary_v31"


SAMPLES = [
    # answer, content, calls
    ('<function=get_weather>{"city": "Paris"}</function>', "", [("get_weather", {"city": "Paris"})]),
    ('Let me check.\n<function=get_weather>{"city": "a</function>b", "days": 3}</function>\n'
     '<function=noop>{}</function>\nDone.', "Let me check.Done.",
     [("get_weather", {"city": "a</function>b", "days": 3}), ("noop", {})]),
    ('<function=noop>{}', "", [("noop", {})]),  # the closer never came
]


@pytest.mark.parametrize("answer, content, calls", SAMPLES)
@pytest.mark.parametrize("stream", [True, False])
def test_v31_samples_whole_one_character_at_a_time_and_cut_anywhere(answer, content, calls, stream):
    assert each_way("functionary_v31", answer, stream=stream) == ("", content, calls, 0)


@pytest.mark.parametrize("answer", [
    '<function=nope>{"city": "x"}</function>',  # not one of the tools
    '<function=get_weather>{"city": "x',  # the answer ends inside it
    '<function=get_weather>"x"</function>',  # not an object
])
def test_v31_a_broken_call_is_text_in_a_whole_answer(answer):
    thinking, content, calls, failed = read("functionary_v31", [answer], stream=False)
    assert calls == [] and content == answer and failed


def test_v31_a_call_the_template_renders_reads_back():
    args = {"city": "Paris", "days": 3}
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    [(history, tools)] = for_template(messages, TOOLS, "functionary_v31", template(V31))
    text = chat_template.render(template(V31), history, tools=tools)
    start = text.index("<function=get_weather>")
    block = text[start:text.index("</function>", start) + len("</function>")]
    assert read("functionary_v31", [block], stream=False)[2] == [("get_weather", args, None)]


def test_v31_the_grammar(vocab):  # noqa: F811
    grammar = toolgrammar.build("functionary_v31", TOOLS, required=False)
    assert grammar.lazy and grammar.triggers == ("<function=",)
    assert run(vocab, grammar, SAMPLES[0][0]) == (True, True)
    assert run(vocab, grammar, '<function=get_weather>{"days": "soon"')[0] is False


# Functionary medium v3.2's recipients (``toolformats/functionary_v32.py``)
V32 = "meetkai-functionary-medium-v3.2"
V32_SAMPLES = [
    # answer (after the prompt's >>>), content, calls
    ('get_weather\n{"city": "Paris"}', "", [("get_weather", {"city": "Paris"})]),
    ("all\nLet me check.\n>>>get_weather\n{\"city\": \"a>>>b\", \"days\": 3}\n>>>noop\n{}", "Let me check.",
     [("get_weather", {"city": "a>>>b", "days": 3}), ("noop", {})]),
    ("all\nHello, world!\nWhat's up?", "Hello, world!\nWhat's up?", []),
    ("Hello there", "Hello there", []),  # no recipient: text
]


def v32_tail() -> str:
    return chat_template.render(template(V32), [{"role": "user", "content": "hi"}], tools=TOOLS)


def test_v32_the_real_template_detects_and_its_prompt_opens_a_part():
    assert detect(template(V32), []) == "functionary_v32"
    assert v32_tail().endswith(">>>")


@pytest.mark.parametrize("answer, content, calls", V32_SAMPLES)
@pytest.mark.parametrize("stream", [True, False])
def test_v32_samples_whole_one_character_at_a_time_and_cut_anywhere(answer, content, calls, stream):
    tail = v32_tail()
    assert each_way("functionary_v32", answer, stream=stream, tail=tail) == ("", content, calls, 0)


def test_v32_a_broken_call_is_text_in_a_whole_answer():
    answer = 'get_weather\n{"city": "x'  # the answer ends inside it
    thinking, content, calls, failed = read("functionary_v32", [answer], stream=False, tail=v32_tail())
    assert calls == [] and content == answer and failed


def test_v32_a_call_the_template_renders_reads_back():
    args = {"city": "Paris", "days": 3}
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    [(history, tools)] = for_template(messages, TOOLS, "functionary_v32", template(V32))
    text = chat_template.render(template(V32), history, tools=tools)
    start = text.index(">>>get_weather\n")
    block = text[start:text.index("<|eot_id|>", start)]
    assert read("functionary_v32", [block], stream=False)[2] == [("get_weather", args, None)]


def test_v32_the_grammar(vocab):  # noqa: F811
    grammar = toolgrammar.build("functionary_v32", TOOLS, required=False)
    assert grammar.lazy and grammar.triggers == (">>>(?!all)",)
    assert run(vocab, grammar, V32_SAMPLES[0][0]) == (True, True)
    assert run(vocab, grammar, '>>>get_weather\n{"city": "x"}\n>>>noop\n{}') == (True, True)
    assert run(vocab, grammar, '>>>get_weather\n{"days": "soon"')[0] is False


def test_v32_a_required_call_starts_at_the_prompts_recipient(vocab):  # noqa: F811
    grammar = toolgrammar.build("functionary_v32", TOOLS, required=True)
    assert not grammar.lazy
    assert run(vocab, grammar, V32_SAMPLES[0][0]) == (True, True)
    assert run(vocab, grammar, "all\nHello")[0] is False


def test_v32_an_answer_without_tools_is_read_by_its_recipients_too():
    """Text goes to a recipient too (``>>>all``), tools or not: a chat's answer is read by the
    format's parser without tools, as llama.cpp's parser of the family reads it; a completion's
    text is its own."""
    from gateway import protocol
    from gateway.text.formats import FORMATS, Formats
    from gateway.text.toolformats import frames_answers
    from gateway.wire import answer

    tail = chat_template.render(template(V32), [{"role": "user", "content": "hi"}])
    assert tail.endswith(">>>") and frames_answers("functionary_v32") and not frames_answers("functionary_v31")
    for text, content in (("all\nHello.", "Hello."), ("all\nHi>>>all\nthere", "Hithere"), ("Hi>>>x", "Hi>>>x")):
        for stream in (True, False):
            assert read("functionary_v32", list(text), stream=stream, tools=None, tail=tail) == ("", content, [], [])
    info = {FORMATS: Formats("think_leading", "functionary_v32")}
    chat, completion = protocol.GenerationRequest(messages=[{"role": "user", "content": "hi"}]), protocol.GenerationRequest(prompt="x")
    answer.prepare(chat, "m", info)
    answer.prepare(completion, "m", info)
    assert (chat.tool_format, chat.tools, completion.tool_format) == ("functionary_v32", None, None)
