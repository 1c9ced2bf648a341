"""Kimi K2 / K2-Instruct / K2-Thinking (``kimi``) and K3 (``kimi_k3``): detection from the real
templates, calls and thinking read whole, one character at a time and cut anywhere (calls written
before the thinking closed, section markers left out), failures kept as text, and the history's
call ids as the templates write them."""

import functools
import json
import re

import formatcheck
import pytest
from formatcheck import template

from gateway.text import chat_template
from gateway.text.reasoning import detect as detect_reasoning
from gateway.text.reasoning import unsplit
from gateway.text.toolformats import TABLE, AnswerParser, CallArgs, CallEnd, CallStart, Piece, detect, frames_answers

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "python", "parameters": {"type": "object", "properties": {
        "code": {"type": "string"}}}}},
]
SB, SE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CB, AB, CE = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
K3_TAIL = '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>'


parse = functools.partial(formatcheck.parse, tools=TOOLS)
both_ways = functools.partial(formatcheck.both_ways, tools=TOOLS)
every_way = functools.partial(formatcheck.every_way, tools=TOOLS)


@pytest.mark.parametrize("name, fmt, reasoning", [
    ("moonshotai-Kimi-K2", "kimi", None), ("Kimi-K2-Instruct", "kimi", None),
    ("Kimi-K2-Thinking", "kimi", "think_kimi"), ("Kimi-K3", "kimi_k3", "kimi_k3"),
])
def test_detected_from_the_real_templates(name, fmt, reasoning):
    assert detect(template(name)) == fmt
    assert detect_reasoning(template(name), []) == reasoning


def call(name, args, n=0, end=CE):
    return f"{CB}functions.{name}:{n}{AB}{json.dumps(args)}{end}"


def test_k2_calls():
    w, p = {"city": "Paris", "days": 2}, {"code": "print('<|tool_call_end|>')"}
    answer = f"Checking.{SB}{call('get_weather', w)}\n{call('python', p, 1)}{SE} Done."
    assert every_way("kimi", answer) == ("", "Checking.Done.", [("get_weather", w), ("python", p)], 0)
    # the section markers and the call's end left out, as llama.cpp accepts
    bare = call("get_weather", w, end="") + call("python", p, 1, end="")
    assert every_way("kimi", bare)[2] == [("get_weather", w), ("python", p)]


def test_k2_thinking_ends_where_a_call_begins():
    w = {"city": "Paris"}
    for marker in (SB, ""):
        got = every_way("kimi", f"<think>I should look{marker}{call('get_weather', w)}", reasoning="think_kimi")
        assert got == ("I should look", "", [("get_weather", w)], 0)
    # a closed thinking block is read as before
    assert every_way("kimi", "<think>a</think>b", reasoning="think_kimi") == ("a", "b", [], 0)


def test_k2_failures_stay_text():
    unknown = f"{SB}{call('nope', {})}{SE}"
    assert every_way("kimi", unknown) == ("", unknown, [], 1)
    broken = f"{SB}{CB}functions.get_weather:0{AB}[1]{CE}{SE}"
    assert every_way("kimi", broken) == ("", broken.removesuffix(CE + SE), [], 1)  # its closers are dropped


def k3_call(name, args, index=1):
    body = "".join(f'<|open|>argument key="{k}" type="x"<|sep|>{v}<|close|>argument<|sep|>' for k, v in args.items())
    return f'<|open|>call tool="{name}" index="{index}"<|sep|>{body}<|close|>call<|sep|>'


def test_k3_sections_and_calls():
    calls = k3_call("get_weather", {"city": "12", "days": "3"}) + k3_call("python", {"code": "x = 1"}, 2)
    answer = (f"Let me see<|close|>think<|sep|><|open|>response<|sep|>On it.<|close|>response<|sep|>"
              f"<|open|>tools<|sep|>{calls}<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>")
    want = ("Let me see", "On it.", [("get_weather", {"city": "12", "days": 3}), ("python", {"code": "x = 1"})], 0)
    assert every_way("kimi_k3", answer, reasoning="kimi_k3", tail=K3_TAIL) == want
    # thinking not split: the sections' markers are still dropped around the calls
    plain = answer.split("<|close|>think<|sep|>")[1]
    assert every_way("kimi_k3", plain) == ("", "On it.", want[2], 0)
    # arguments written as one JSON object
    json_args = '<|open|>call tool="get_weather" index="1"<|sep|><|open|>json type="object"<|sep|>{"days": 1}' \
                "<|close|>json<|sep|><|close|>call<|sep|>"
    assert every_way("kimi_k3", f"<|open|>tools<|sep|>{json_args}<|close|>tools<|sep|>")[2] == [("get_weather", {"days": 1})]
    # the budget ran out while thinking
    assert every_way("kimi_k3", "still thinking", reasoning="kimi_k3", tail=K3_TAIL) == ("still thinking", "", [], 0)


def test_k3_failures_stay_text():
    unknown = f"<|open|>tools<|sep|>{k3_call('nope', {})}<|close|>tools<|sep|>"
    assert every_way("kimi_k3", unknown) == ("", unknown, [], 1)
    # cut off (max_tokens) inside the call, even after a whole argument: streamed, the call ends
    # with an error; whole, its text is content
    whole = f"<|open|>tools<|sep|>{k3_call('python', {'code': 'x = 1'})}"
    for cut in (whole[:-len("<|close|>argument<|sep|><|close|>call<|sep|>")], whole[:-len("<|close|>call<|sep|>")]):
        assert both_ways("kimi_k3", cut) == (("", "", [("python", None)], 1), ("", cut, [], 1))
    assert every_way("kimi_k3", whole)[2] == [("python", {"code": "x = 1"})]
    bad_json = '<|open|>tools<|sep|><|open|>call tool="python" index="1"<|sep|><|open|>json<|sep|>[1]<|close|>json<|sep|>' \
               "<|close|>call<|sep|><|close|>tools<|sep|>"
    assert both_ways("kimi_k3", bad_json) == (("", "", [("python", None)], 1), ("", bad_json, [], 1))


def test_k3_arguments_stream_as_they_are_written():
    """A string argument leaves as it is written, any other at its end: the arguments come in
    several pieces before the call ends."""
    answer = f"<|open|>tools<|sep|>{k3_call('get_weather', {'days': '3', 'city': 'Paris'})}<|close|>tools<|sep|>"
    p = AnswerParser("kimi_k3", TOOLS)
    out = [it for c in answer[:answer.index("ris")] for it in p.feed(c)]
    assert isinstance(out[0], CallStart) and {type(i) for i in out[1:]} == {CallArgs}
    assert "".join(i.text for i in out if isinstance(i, CallArgs)) == '{"days": 3, "city": "Pa'
    pieces = []
    for c in answer[answer.index("ris"):]:
        pieces += p.feed(c)
    assert {type(i) for i in pieces[:-1]} == {CallArgs} and pieces[-1] == CallEnd(0)
    assert sum(isinstance(i, CallArgs) for i in out) > 1


def test_k3_sections_dropped_with_thinking_not_split():
    """With reasoning_format none and no tools, K3's sections are still dropped, as llama.cpp's
    parser of K3 reads every answer: the think section's text is content."""
    assert frames_answers("kimi_k3")
    answer = "Hm.<|close|>think<|sep|><|open|>response<|sep|>Hi<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
    assert every_way("kimi_k3", answer, tools=None, reasoning=unsplit("kimi_k3"), tail=K3_TAIL) == ("", "Hm.Hi", [], 0)


def test_history_ids_are_the_ones_kimi_writes():
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "python", "arguments": {"code": "1"}}},
        {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "tool_call_id": "call_b", "content": "cold"}]
    shaped, _ = TABLE["kimi"].history(messages, TOOLS)
    assert [c["id"] for c in shaped[1]["tool_calls"]] == ["functions.python:0", "functions.get_weather:1"]
    assert shaped[2]["tool_call_id"] == "functions.get_weather:1" and messages[2]["tool_call_id"] == "call_b"
    prompt = chat_template.render(template("moonshotai-Kimi-K2"), shaped, tools=TOOLS)
    assert "## Return of functions.get_weather:1" in prompt
    written = re.search(re.escape(SB) + ".*?" + re.escape(SE), prompt, re.S)
    assert written and every_way("kimi", written.group())[2] == [("python", {"code": "1"}), ("get_weather", {"city": "Oslo"})]


def test_a_qwen3_coder_call_ends_thinking_left_open():
    """The same rule for Qwen 3.5's calls (``qwen3_coder``'s ``THINKING_ENDS``), after a prompt
    that opened <think>: the call ends the thinking and is read."""
    tools = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {
        "command": {"type": "string"}}}}}]
    answer = "Look first.\n<tool_call>\n<function=run>\n<parameter=command>\npwd\n</parameter>\n</function>\n</tool_call>"
    for pieces in ([answer], list(answer)):
        p = AnswerParser("qwen3_coder", tools, reasoning="think", prompt_tail="<|im_start|>assistant\n<think>\n")
        items = [it for piece in pieces for it in p.feed(piece)] + p.flush()
        assert "".join(i.text for i in items if isinstance(i, Piece) and i.kind == "thinking") == "Look first."
        assert not [i for i in items if isinstance(i, Piece) and i.kind == "content"]
        assert [i.name for i in items if isinstance(i, CallStart)] == ["run"]
    # without tools nothing reads calls: the thinking goes on
    p = AnswerParser(None, None, reasoning="think", prompt_tail="<think>\n")
    assert [(i.kind, i.text) for i in p.feed(answer) + p.flush()] == [("thinking", answer)]


def test_a_ling_call_ends_thinking_left_open():
    """Ling 3.0 (``think_ling``): the same for its <tool_call>, and its turn's end is dropped."""
    assert detect_reasoning(template("inclusionai-ling-3.0-flash"), []) == "think_ling"
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}}}}]
    answer = "Check first.\n<tool_call>get_time\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call><|role_end|>"
    for pieces in ([answer], list(answer)):
        p = AnswerParser("glm", tools, reasoning="think_ling", prompt_tail="<role>ASSISTANT</role>\n<think>")
        items = [it for piece in pieces for it in p.feed(piece)] + p.flush()
        assert "".join(i.text for i in items if isinstance(i, Piece) and i.kind == "thinking") == "Check first."
        assert not [i for i in items if isinstance(i, Piece) and i.kind == "content"]
        assert [i.name for i in items if isinstance(i, CallStart)] == ["get_time"]
