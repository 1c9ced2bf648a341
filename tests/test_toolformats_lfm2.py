"""LFM2 / LFM2.5's Python-style calls (``toolformats/lfm2.py``): detection from the real
templates, the parser whole, one character at a time and cut at every point, its failures, the
history the templates get, and the grammar run by llama.cpp's sampler."""

import json
from functools import partial

import formatcheck
import pytest
from formatcheck import template
from test_toolgrammar import run
from test_toolgrammar import vocab as vocab  # noqa: F401 (the fixture)

from gateway.text import chat_template
from gateway.text.reasoning import detect as detect_reasoning
from gateway.text.toolformats import detect
from gateway.text.toolformats.lfm2 import TOOL_CALL_END, TOOL_CALL_START, history, value_json
from gateway.worker import toolgrammar
from gateway.worker.toolhistory import for_template

TEMPLATES = ("LFM2-8B-A1B", "LFM2.5-8B-A1B", "LFM2.5-Instruct")
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "Calendar.create_event", "parameters": {"type": "object", "properties": {
        "title": {"type": "string"}, "people": {"type": "array"}, "meta": {"type": "object"}}}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]

read = partial(formatcheck.read, tools=TOOLS)
each_way = partial(formatcheck.each_way, tools=TOOLS)
failing = partial(formatcheck.failing, tools=TOOLS)


def call(text: str) -> str:
    return f"{TOOL_CALL_START}[{text}]{TOOL_CALL_END}"


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_real_templates_detect_as_lfm2(name):
    assert detect(template(name), []) == "lfm2"
    assert detect_reasoning(template(name), []) in ("think", None)


SAMPLES = [
    # answer, content, calls
    (call('get_weather(city="Paris")'), "", [("get_weather", {"city": "Paris"})]),
    ("Let me check." + call("get_weather(city='Paris', days=3)") + " Done.", "Let me check.Done.",
     [("get_weather", {"city": "Paris", "days": 3})]),
    (call('Calendar.create_event(title="demo", people=["Alice", \'Bob\'], meta={"on": True, "note": None, "n": -1.5})'),
     "", [("Calendar.create_event", {"title": "demo", "people": ["Alice", "Bob"],
                                     "meta": {"on": True, "note": None, "n": -1.5}})]),
    (call('get_weather(city="a\\nb \\"q\\" (x), [y]"), noop()'), "",
     [("get_weather", {"city": 'a\nb "q" (x), [y]'}), ("noop", {})]),
    (call("get_weather(city='it\\'s', days=null)"), "", [("get_weather", {"city": "it's", "days": None})]),
    (call("Calendar.create_event(meta={'k': (1, 2), 'e': {}}, people=[])"), "",
     [("Calendar.create_event", {"meta": {"k": [1, 2], "e": {}}, "people": []})]),
    ("no calls [x(y=1)] here", "no calls [x(y=1)] here", []),
]


@pytest.mark.parametrize("text, content, calls", SAMPLES)
@pytest.mark.parametrize("stream", [True, False])
def test_samples_whole_one_character_at_a_time_and_cut_anywhere(text, content, calls, stream):
    assert each_way("lfm2", text, stream=stream) == ("", content, calls, 0)


def test_thinking_is_split_before_the_calls():
    text = "<think>I should\nlook.</think>" + call("noop()")
    assert read("lfm2", list(text), reasoning="think") == ("I should\nlook.", "", [("noop", {}, None)], [])


BROKEN = [
    # answer, content when whole, calls when streamed (name, error), failures
    (call("nope(a=1)"), call("nope(a=1)"), [], 1),
    (call("get_weather(city=Paris)"), call("get_weather(city=Paris)"),
     [("get_weather", "an argument's value is not a literal")], 1),
    (TOOL_CALL_START + '[get_weather(city="Pa', TOOL_CALL_START + '[get_weather(city="Pa',
     [("get_weather", "the answer ended inside the call")], 1),
    (TOOL_CALL_START + "[get_weather(days=1" + TOOL_CALL_END + "x", TOOL_CALL_START + "[get_weather(days=1" + TOOL_CALL_END
     + "x", [("get_weather", "the call was cut off")], 1),
    (call(""), call(""), [], 1),
    (TOOL_CALL_START + "get_weather()" + TOOL_CALL_END, TOOL_CALL_START + "get_weather()" + TOOL_CALL_END, [], 1),
]


@pytest.mark.parametrize("text, content, streamed, failures", BROKEN)
def test_broken_calls_are_never_broken_items(text, content, streamed, failures):
    assert failing("lfm2", text) == (content, failures, streamed, failures)


def test_values_are_json_or_python_literals():
    assert value_json(' "x\\u00e9" ') == '"xé"'
    assert value_json("True") == "true" and value_json("None") == "null" and value_json("false") == "false"
    assert value_json("{'a': [1, -2.5, 'b']}") == '{"a": [1, -2.5, "b"]}'
    for bad in ("Paris", "f'x'", "1 + 2", "{1: 2}", "float('nan')", "1e999", "b'x'"):
        assert value_json(bad) is None, bad


@pytest.mark.parametrize("name", TEMPLATES)
def test_earlier_calls_reach_every_template_as_the_model_writes_them(name):
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "Sure.", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                                  "arguments": {"city": "Paris", "days": 2}}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    (msgs, tools), *_ = for_template(messages, TOOLS, "lfm2", template(name))
    prompt = chat_template.render(template(name), msgs, tools=tools)
    assert 'Sure.<|tool_call_start|>[get_weather(city="Paris", days=2)]<|tool_call_end|>' in prompt
    assert "sunny" in prompt and "get_weather" in prompt.split("<|im_end|>")[0]  # the tools are listed
    # the history is read back as the calls it holds
    text = msgs[1]["content"].removeprefix("Sure.")
    assert read("lfm2", [text])[2] == [("get_weather", {"city": "Paris", "days": 2}, None)]
    assert history(messages[:1], None) == (messages[:1], None)


def test_the_grammar_takes_a_call_and_stops_a_wrong_one(vocab):  # noqa: F811
    tools = TOOLS[:1] + TOOLS[2:]
    grammar = toolgrammar.build("lfm2", tools, required=False)
    assert grammar.lazy and grammar.triggers
    good = call('get_weather(city="Paris", days=2)')
    assert run(vocab, grammar, "Let me check. " + good) == (True, True)
    assert run(vocab, grammar, call('get_weather(days=2, city="Paris"), noop()')) == (True, True)
    assert run(vocab, grammar, good.replace("days=2", 'days="2"'))[0] is False
    assert run(vocab, grammar, good.replace("get_weather", "get_wether"))[0] is False
    single = toolgrammar.build("lfm2", tools, required=True, parallel=False)
    assert not single.lazy and run(vocab, single, good) == (True, True)
    assert run(vocab, single, call('get_weather(city="Paris"), noop()'))[0] is False
    parse_back = read("lfm2", [good], tools=tools)[2]
    assert parse_back == [("get_weather", {"city": "Paris", "days": 2}, None)]
    assert json.loads(json.dumps(parse_back[0][1])) == {"city": "Paris", "days": 2}
