"""DeepSeek V3.2 / V4's DSML calls (``toolformats/deepseek_dsml.py``): detection from the real
templates (V3/R1/V3.1 stay ``deepseek``), the parser whole, one character at a time and cut at
every point, its failures, thinking that a call block ends (``think_dsml``), the history the
templates get, and the grammar run by llama.cpp's sampler."""

from functools import partial

import formatcheck
import pytest
from formatcheck import template
from test_toolgrammar import run
from test_toolgrammar import vocab as vocab  # noqa: F401 (the fixture)

from gateway.text import chat_template
from gateway.text.reasoning import detect as detect_reasoning
from gateway.text.toolformats import detect
from gateway.text.toolformats.deepseek_dsml import DSML, example
from gateway.worker import toolgrammar
from gateway.worker.toolhistory import for_template

TEMPLATES = ("deepseek-ai-DeepSeek-V3.2", "deepseek-ai-DeepSeek-V4", "deepseek-ai-DeepSeek-V4-Flash-0731")
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "opts": {"type": "object"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]

read = partial(formatcheck.read, tools=TOOLS)
each_way = partial(formatcheck.each_way, tools=TOOLS)


def block(invokes: str, name: str = "function_calls") -> str:
    return f"<{DSML}{name}>\n{invokes}</{DSML}{name}>"


def invoke(name: str, *params: tuple[str, bool, str]) -> str:
    body = "".join(f'<{DSML}parameter name="{k}" string="{str(s).lower()}">{v}</{DSML}parameter>\n' for k, s, v in params)
    return f'<{DSML}invoke name="{name}">\n{body}</{DSML}invoke>\n'


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_real_templates_detect_as_dsml(name):
    assert detect(template(name), []) == "deepseek_dsml"
    assert detect_reasoning(template(name), []) == "think_dsml"
    assert detect(template("deepseek-ai-DeepSeek-V3.1"), []) == "deepseek"
    assert detect_reasoning(template("deepseek-ai-DeepSeek-V3.1"), []) == "think"


def test_the_example_names_the_block_as_the_template_does():
    assert f"<{DSML}function_calls>" in example(template("deepseek-ai-DeepSeek-V3.2"))
    assert f"<{DSML}tool_calls>" in example(template("deepseek-ai-DeepSeek-V4"))


SAMPLES = [
    # answer, content, calls
    (block(invoke("get_weather", ("city", True, "Paris"))), "", [("get_weather", {"city": "Paris"})]),
    ("Let me check.\n\n" + block(invoke("get_weather", ("city", True, "Paris \"x\"\n"), ("days", False, "-3"),
                                        ("opts", False, '{"a": [1, 2.5]}')), "tool_calls"),
     "Let me check.", [("get_weather", {"city": "Paris \"x\"\n", "days": -3, "opts": {"a": [1, 2.5]}})]),
    (block(invoke("noop") + invoke("get_weather", ("city", True, "1"))), "",
     [("noop", {}), ("get_weather", {"city": "1"})]),
]


@pytest.mark.parametrize("answer, content, calls", SAMPLES)
@pytest.mark.parametrize("stream", [True, False])
def test_samples_whole_one_character_at_a_time_and_cut_anywhere(answer, content, calls, stream):
    assert each_way("deepseek_dsml", answer, stream=stream) == ("", content, calls, 0)


@pytest.mark.parametrize("answer", [
    block(invoke("nope", ("city", True, "x"))),  # not one of the tools
    block(invoke("get_weather", ("city", True, "x")))[:-30],  # the answer ends inside it
    block("get_weather{}"),  # no invocation
])
def test_a_broken_call_is_text_in_a_whole_answer(answer):
    thinking, content, calls, failed = read("deepseek_dsml", [answer], stream=False)
    assert calls == [] and content == answer.strip() and failed


@pytest.mark.parametrize("name", TEMPLATES[:2])
def test_a_call_block_ends_the_thinking(name):
    tail = chat_template.render(template(name), [{"role": "user", "content": "hi"}], tools=TOOLS,
                                extra={"enable_thinking": True})
    assert tail.endswith("<think>")
    call = block(invoke("get_weather", ("city", True, "Oslo")), "tool_calls")
    want = ("Let me look.", "", [("get_weather", {"city": "Oslo"}, None)], [])
    for answer in ("Let me look.</think>\n\n" + call, "Let me look.\n\n" + call):
        assert read("deepseek_dsml", list(answer), reasoning="think_dsml", tail=tail) == want
        assert read("deepseek_dsml", [answer], stream=False, reasoning="think_dsml", tail=tail) == want


@pytest.mark.parametrize("name", TEMPLATES[:2])
def test_a_call_the_template_renders_reads_back(name):
    args = {"city": "Paris", "days": 3, "opts": {"a": [1, "x"]}}
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    [(history, tools)] = for_template(messages, TOOLS, "deepseek_dsml", template(name))
    text = chat_template.render(template(name), history, tools=tools)
    start = text.index(f'<{DSML}invoke name="get_weather">')
    start = text.rindex("<", 0, start - 1)
    end = text.index(">", text.index(f"</{DSML}", text.index(f"</{DSML}invoke>", start) + 2)) + 1
    assert read("deepseek_dsml", [text[start:end]], stream=False)[2] == [("get_weather", args, None)]


def test_the_grammar(vocab):  # noqa: F811
    grammar = toolgrammar.build("deepseek_dsml", TOOLS, required=False)
    assert grammar.lazy and len(grammar.triggers) == 2
    for answer, _, _ in SAMPLES:
        assert run(vocab, grammar, answer) == (True, True)
    bad = block(invoke("get_weather", ("city", True, "x"), ("days", False, "soon")))
    assert run(vocab, grammar, bad)[0] is False
