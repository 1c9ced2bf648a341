"""Tool calls: format detection on llama.cpp's real templates, then each format's incremental
parser whole, cut at every point and at random points, and its failures."""

import json
import re

import pytest
from formatcheck import read
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from realmodel import CACHE

from gateway.models import testmodels as tm
from gateway.text.toolformats import (
    FORMATS,
    AnswerParser,
    CallArgs,
    CallEnd,
    CallStart,
    ToolCallParser,
    describes_tools,
    detect,
    plain_system_prompt,
)
from gateway.text.toolformats.deepseek import CALL_BEGIN as DS_CALL_BEGIN
from gateway.text.toolformats.deepseek import CALL_END as DS_CALL_END
from gateway.text.toolformats.deepseek import CALLS_BEGIN as DS_CALLS_BEGIN
from gateway.text.toolformats.deepseek import CALLS_END as DS_CALLS_END
from gateway.text.toolformats.deepseek import SEP as DS_SEP

# --- detection on the real templates -----------------------------------------------------------

DETECTED = {
    "Qwen-Qwen2.5-7B-Instruct": "hermes",
    "Qwen-Qwen3-0.6B": "hermes",
    "Qwen-QwQ-32B": "hermes",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": "hermes",
    "ibm-granite-granite-4.0": "hermes",
    "Qwen3-Coder": "qwen3_coder",
    "Qwen3.5-4B": "qwen3_coder",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": "qwen3_coder",
    "meta-llama-Llama-3.1-8B-Instruct": "llama3",
    "meta-llama-Llama-3.2-3B-Instruct": "llama3",
    "meta-llama-Llama-3.3-70B-Instruct": "llama3",
    "mistralai-Mistral-Nemo-Instruct-2407": "mistral",
    "Mistral-Small-3.2-24B-Instruct-2506": "mistral",
    "unsloth-mistral-Devstral-Small-2507": "mistral",
    "mistralai-Ministral-3-14B-Reasoning-2512": "mistral",
    "openai-gpt-oss-120b": "harmony",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": "deepseek",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": "deepseek",
    "deepseek-ai-DeepSeek-V3.1": "deepseek",
    "llama-cpp-deepseek-r1": "deepseek",
    "LFM2-8B-A1B": "lfm2",
    "LFM2.5-8B-A1B": "lfm2",
    "LFM2.5-Instruct": "lfm2",
    "google-gemma-4-31B-it": "gemma4",
    "MiniMax-M2": "minimax",
    "MiniMax-M3": "minimax_m3",
    "moonshotai-Kimi-K2": "kimi",
    "Kimi-K2-Instruct": "kimi",
    "Kimi-K2-Thinking": "kimi",
    "Kimi-K3": "kimi_k3",
    "openbmb-MiniCPM5-1B": "minicpm5",
    "GigaChat3-10B-A1.8B": "gigachat",
    "GigaChat3.1-10B-A1.8B": "gigachat",
    "muse-glimmer": "muse",
    # tools in a syntax of their own: the gateway describes the tools itself
    "GLM-4.6": "glm",
    "GLM-4.7-Flash": "glm",
    "deepseek-ai-DeepSeek-V3.2": "deepseek_dsml",
    "deepseek-ai-DeepSeek-V4": "deepseek_dsml",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": "command_r",
    "Cohere2MoE": "command_r",
    "meetkai-functionary-medium-v3.1": "functionary_v31",
    "meetkai-functionary-medium-v3.2": "functionary_v32",
    "NVIDIA-Nemotron-Nano-v2": "nemotron_v2",
    "unsloth-Apriel-1.5": "apriel",
    "Apriel-1.6-15b-Thinker-fixed": "apriel",
    "Apertus-8B-Instruct": "apertus",
    "ByteDance-Seed-OSS": "seed_oss",
    "CohereForAI-c4ai-command-r-plus-tool_use": "command_r_plus",
    "fireworks-ai-llama-3-firefunction-v2": "firefunction_v2",
    "ibm-granite-granite-3.3-2B-Instruct": "plain",  # its own syntax, which no format reads yet
    # no tools at all
    "google-gemma-2-2b-it": None,
    "microsoft-Phi-3.5-mini-instruct": None,
}


@pytest.fixture(scope="module")
def template():
    def read(name: str) -> str:
        return tm.llama_cpp_source_file(f"models/templates/{name}.jinja", CACHE / "templates").read_text()
    return read


@pytest.mark.parametrize("name, fmt", DETECTED.items())
def test_detect_on_real_templates(template, name, fmt):
    assert detect(template(name), []) == fmt


def test_every_format_is_detected_from_a_real_template():
    assert set(DETECTED.values()) == set(FORMATS) | {None}


def test_which_templates_describe_the_tools(template):
    assert describes_tools(template("Qwen-Qwen2.5-7B-Instruct"))
    assert describes_tools(template("openai-gpt-oss-120b"))
    # DeepSeek's own templates render calls but never list the tools: the caller must
    assert not describes_tools(template("deepseek-ai-DeepSeek-V3.1"))
    assert not describes_tools(template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"))
    assert not describes_tools(template("google-gemma-2-2b-it"))
    assert not describes_tools(None)


def test_the_vocabulary_decides_when_the_template_syntax_is_unknown():
    tmpl = "{% for t in tools %}{{ t | tojson }}{% endfor %}{{ messages }}"
    assert detect(tmpl, []) == "plain"
    assert detect(tmpl, ["[TOOL_CALLS]"]) == "mistral"
    assert detect(tmpl, [DS_CALLS_BEGIN]) == "deepseek"
    assert detect(tmpl, ["<|python_tag|>"]) == "llama3"
    assert detect(None, ["[TOOL_CALLS]"]) is None  # no template: nothing shows the tools to the model
    assert detect("{{ messages }}", ["<tool_call>"]) is None


def test_plain_system_prompt(template):
    prompt = plain_system_prompt(TOOLS)
    assert "<tool_call>" in prompt and json.dumps(TOOLS[0]) in prompt
    assert f"function{DS_SEP}" in plain_system_prompt(TOOLS, "deepseek", template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"))
    v31 = plain_system_prompt(TOOLS, "deepseek", template("deepseek-ai-DeepSeek-V3.1"))
    assert f"{DS_CALL_BEGIN}<function-name>{DS_SEP}" in v31
    for fmt in FORMATS:
        assert "get_weather" in plain_system_prompt(TOOLS, fmt)


# --- the parsers ---------------------------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a place", "parameters": {
        "type": "object", "properties": {"location": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["location"]}}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "typed", "parameters": {"type": "object", "properties": {
        "s": {"type": "string"}, "n": {"type": "integer"}, "f": {"type": "number"}, "b": {"type": "boolean"},
        "o": {"type": "object"}, "a": {"type": "array"}, "u": {"type": ["string", "null"]},
        "e": {"enum": ["x", 1]}, "any": {}}}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]
HARMONY_TAIL = "<|start|>assistant"


def parse(fmt, pieces, stream=True, tools=TOOLS, reasoning=None, tail=None):
    """Feed ``pieces`` to an AnswerParser; returns (thinking, content, calls, failed), calls as
    (name, args as parsed or raw text, error)."""
    if tail is None:
        tail = HARMONY_TAIL if fmt in ("harmony", "muse") else ""
    return read(fmt, pieces, tools=tools, stream=stream, reasoning=reasoning, tail=tail)


def cuts(text, points):
    points = sorted({p % (len(text) + 1) for p in points})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]


W = ("get_weather", {"location": "Tokyo", "days": 3})
S = ("search", {"q": "a </tool_call> [TOOL_CALLS] } \" \\ é"})

SAMPLES = [
    # fmt, answer, content, calls (thinking for harmony)
    ("hermes", 'Let me check.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"location": "Tokyo", "days": 3}}\n'
               '</tool_call>\n<tool_call>\n' + json.dumps({"name": S[0], "arguments": S[1]}) + "\n</tool_call>",
     "Let me check.", [W, S]),
    ("hermes", "No tools needed: 4.", "No tools needed: 4.", []),
    ("hermes", '<tool_call>{"arguments": {"q": "x"}, "name": "search"}</tool_call>', "", [("search", {"q": "x"})]),
    ("hermes", '<tool_call>{"name": "search", "arguments": "{\\"q\\": \\"x\\"}"}</tool_call>', "", [("search", {"q": "x"})]),
    ("hermes", '<tool_call>{"type": "function", "name": "noop", "parameters": {}}</tool_call> Done.', "Done.",
     [("noop", {})]),
    ("hermes", 'a <tool_call>{"name": "noop", "arguments": {}}{"name": "search", "arguments": {"q": "y"}}</tool_call>',
     "a", [("noop", {}), ("search", {"q": "y"})]),
    ("hermes", 'x </tool_call> y <tool', "x  y <tool", []),  # a stray closer is dropped, a partial opener is text
    ("plain", 'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"location": "Tokyo", "days": 3}}\n</tool_call>',
     "Sure.", [W]),
    ("qwen3_coder", "I'll look.\n<tool_call>\n<function=get_weather>\n<parameter=location>\nTokyo\n</parameter>\n"
                    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>", "I'll look.", [W]),
    ("qwen3_coder", "<tool_call>\n<function=typed>\n<parameter=s>\n\n two\nlines\n\n</parameter>\n<parameter=n>\n 7 \n"
                    "</parameter>\n<parameter=f>\n1.5\n</parameter>\n<parameter=b>\ntrue\n</parameter>\n<parameter=o>\n"
                    '{"k": [1, "v"]}\n</parameter>\n<parameter=a>\n[1, 2]\n</parameter>\n<parameter=u>\nnull\n</parameter>\n'
                    "<parameter=e>\n1\n</parameter>\n<parameter=any>\n{\"z\": 0}\n</parameter>\n</function>\n</tool_call>",
     "", [("typed", {"s": "\n two\nlines\n", "n": 7, "f": 1.5, "b": True, "o": {"k": [1, "v"]}, "a": [1, 2], "u": None,
                     "e": 1, "any": {"z": 0}})]),
    ("qwen3_coder", "<tool_call>\n<function=typed>\n<parameter=s>\n42\n</parameter>\n<parameter=u>\nnone\n</parameter>\n"
                    "<parameter=n>\nmany\n</parameter>\n</function>\n</tool_call>",  # typed by the schema, or text
     "", [("typed", {"s": "42", "u": "none", "n": "many"})]),
    ("qwen3_coder", "<tool_call>\n<function=noop>\n</function>\n</tool_call>\n<tool_call>\n<function=search>\n"
                    "<parameter=q>\nif a < b: x = '<tool_call>'\n</parameter>\n</function>\n</tool_call>",
     "", [("noop", {}), ("search", {"q": "if a < b: x = '<tool_call>'"})]),
    ("qwen3_coder", "Bare: <function=search>\n<parameter=q>\nhi\n</parameter>\n</function>\n</tool_call> after",
     "Bare:after", [("search", {"q": "hi"})]),
    ("qwen3_coder", "<tool_call>\n" + json.dumps({"name": S[0], "arguments": S[1]}) + "\n</tool_call>", "", [S]),
    ("qwen3_coder", "html <function=unknown>x</function> and <function=\nx", "html <function=unknown>x</function> and <function=\nx",
     []),
    ("llama3", '{"name": "get_weather", "parameters": {"location": "Tokyo", "days": 3}}', "", [W]),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"location": "Tokyo", "days": 3}}<|eom_id|>', "", [W]),
    ("llama3", '\n{"type": "function", "name": "noop", "parameters": {}}; ' + json.dumps({"name": S[0], "parameters": S[1]}),
     "", [("noop", {}), S]),
    ("llama3", 'Here: {"name": "noop", "parameters": {}}', 'Here: {"name": "noop", "parameters": {}}', []),
    ("llama3", '{"answer": 42}', '{"answer": 42}', []),
    ("llama3", 'Text then <|python_tag|>{"name": "noop", "arguments": {}}', "Text then", [("noop", {})]),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"location": "Tokyo", "days": 3}, "id": "a1b2c3d4e"}, '
                + json.dumps({"name": S[0], "arguments": S[1]}) + "]", "", [W, S]),
    ("mistral", 'Checking.[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"location": "Tokyo", "days": 3}'
                "[TOOL_CALLS]search[ARGS]" + json.dumps(S[1]), "Checking.", [W, S]),
    ("mistral", '[TOOL_CALLS]noop[ARGS]{}search[ARGS]{"q": "y"} Done', "Done", [("noop", {}), ("search", {"q": "y"})]),
    ("mistral", "a [ARGS] b [TOOL", "a  b [TOOL", []),
    ("deepseek", f"Let me see.{DS_CALLS_BEGIN}{DS_CALL_BEGIN}function{DS_SEP}get_weather\n```json\n"
                 f'{{"location": "Tokyo", "days": 3}}\n```{DS_CALL_END}\n{DS_CALL_BEGIN}function{DS_SEP}search\n```json\n'
                 f"{json.dumps(S[1])}\n```{DS_CALL_END}{DS_CALLS_END}", "Let me see.", [W, S]),
    ("deepseek", f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}get_weather{DS_SEP}{{\"location\": \"Tokyo\", \"days\": 3}}{DS_CALL_END}"
                 f"{DS_CALL_BEGIN}search{DS_SEP}{json.dumps(S[1])}{DS_CALL_END}{DS_CALLS_END} ok", "ok", [W, S]),
    ("deepseek", f"<｜tool_calls_begin｜>{DS_CALL_BEGIN}noop{DS_SEP}{{}}{DS_CALL_END}", "", [("noop", {})]),
    ("harmony", "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
                'to=functions.get_weather <|constrain|>json<|message|>{"location": "Tokyo", "days": 3}<|call|>',
     "", [W], "Need the weather."),
    ("harmony", ' to=functions.search<|channel|>commentary json<|message|>' + json.dumps(S[1]) + "<|call|>", "", [S], ""),
    ("harmony", "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|channel|>commentary<|message|>Let me look."
                "<|end|><|start|>assistant<|channel|>analysis to=functions.noop<|message|>{}<|call|><|start|>assistant"
                "<|channel|>final<|message|>Done.<|return|>", "Let me look.Done.", [("noop", {})], "hmm"),
    ("harmony", "<|channel|>final<|message|>Just text.", "Just text.", [], ""),
]


def sample_id(s):
    return f"{s[0]}:{s[1][:30]}"


def expected(sample):
    fmt, text, content, calls, *thinking = sample
    return (thinking[0] if thinking else "", content, [(n, a, None) for n, a in calls], [])


@pytest.mark.parametrize("sample", SAMPLES, ids=sample_id)
@pytest.mark.parametrize("stream", [True, False])
def test_samples_whole_and_one_character_at_a_time(sample, stream):
    fmt, text = sample[:2]
    assert parse(fmt, [text], stream) == expected(sample)
    assert parse(fmt, list(text), stream) == expected(sample)


@pytest.mark.parametrize("sample", SAMPLES, ids=sample_id)
def test_samples_cut_at_every_point(sample):
    fmt, text = sample[:2]
    for i in range(len(text) + 1):
        assert parse(fmt, [text[:i], text[i:]]) == expected(sample), i


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SAMPLES), st.lists(st.integers(0, 10_000), max_size=20), st.booleans())
def test_samples_in_random_cuts(sample, points, stream):
    assert parse(sample[0], cuts(sample[1], points), stream) == expected(sample)


def test_arguments_stream_as_they_are_generated():
    text = '<tool_call>{"name": "search", "arguments": {"q": "' + "word " * 20 + '"}}</tool_call>'
    p = ToolCallParser("hermes", TOOLS)
    seen = []
    for i, c in enumerate(text):
        seen += [(i, it) for it in p.feed(c)]
    start = next(i for i, it in seen if isinstance(it, CallStart))
    args = [i for i, it in seen if isinstance(it, CallArgs)]
    assert start == text.index('{"q"') and len(args) > 50 and args[0] == start
    assert next(i for i, it in seen if isinstance(it, CallEnd)) == text.index("}}") + 1  # before </tool_call>
    # and in XML formats: a string parameter streams, the object around it is built as it goes
    p = ToolCallParser("qwen3_coder", TOOLS)
    pieces = [it for c in "<tool_call>\n<function=search>\n<parameter=q>\nabc\ndef" for it in p.feed(c)]
    assert "".join(it.text for it in pieces if isinstance(it, CallArgs)) == '{"q": "abc\\ndef'


def test_a_whole_answer_holds_each_call_until_it_is_known_good():
    p = ToolCallParser("hermes", TOOLS, stream=False)
    assert p.feed('Hi <tool_call>{"name": "search", "arguments": {"q": "x"') == [("content", "Hi")]
    items = p.feed("}}</tool_call>")
    assert [type(i) for i in items] == [CallStart, CallArgs, CallEnd]


def test_markers_as_one_control_token_or_as_pieces_are_the_same_text():
    text = 'a<tool_call>{"name": "noop", "arguments": {}}</tool_call>b'
    as_tokens = ["a", "<tool_call>", '{"name": "noop", "arguments": {}}', "</tool_call>", "b"]
    as_pieces = ["a<", "tool", "_call", ">", '{"name": "noop", "arguments": {}}</', "tool_", "call>b"]
    assert parse("hermes", as_tokens) == parse("hermes", as_pieces) == parse("hermes", [text]) == \
        ("", "ab", [("noop", {}, None)], [])


# --- failures ----------------------------------------------------------------------------------

BROKEN = [
    # fmt, answer, content when whole, calls when streamed (name, error or None), failures
    ("hermes", 'Hi <tool_call>{"name": "nope", "arguments": {}}</tool_call> there',
     'Hi <tool_call>{"name": "nope", "arguments": {}}</tool_call> there', [], 1),
    ("hermes", 'Hi <tool_call>{"name": "search", "arguments": {"q": 1</tool_call>',
     'Hi <tool_call>{"name": "search", "arguments": {"q": 1</tool_call>', [("search", "the call was cut off")], 1),
    ("hermes", 'Hi <tool_call>{"name": "search", "arguments": {"q": "x",}}</tool_call>',
     'Hi <tool_call>{"name": "search", "arguments": {"q": "x",}}</tool_call>',
     [("search", "the arguments are not one JSON object")], 1),
    ("hermes", 'Hi <tool_call>{"name": "search", "arguments": {"q": "unterminated',
     'Hi <tool_call>{"name": "search", "arguments": {"q": "unterminated',
     [("search", "the answer ended inside the call")], 1),
    ("hermes", 'Hi <tool_call>{"name": "search", "arguments": ["x"]}</tool_call>',
     'Hi <tool_call>{"name": "search", "arguments": ["x"]}</tool_call>', [], 1),
    ("hermes", "Hi <tool_call>search(q='x')</tool_call>", "Hi <tool_call>search(q='x')</tool_call>", [], 1),
    ("hermes", "Hi <tool_call>\n</tool_call>", "Hi <tool_call>\n</tool_call>", [], 1),
    ("hermes", "Hi <tool_call>", "Hi <tool_call>", [], 1),
    ("hermes", '<tool_call>{"name": "search", "arguments": {"q": "a"}, "name": "x"}</tool_call> ok',
     "ok", [("search", None)], 0),  # the arguments are complete: trailing keys do not matter
    ("qwen3_coder", "<tool_call>\n<function=nope>\n<parameter=q>\nx\n</parameter>\n</function>\n</tool_call>",
     "<tool_call>\n<function=nope>\n<parameter=q>\nx\n</parameter>\n</function>\n</tool_call>", [], 1),
    ("qwen3_coder", "<tool_call>\n<function=search>\n<parameter=q>\nx", "<tool_call>\n<function=search>\n<parameter=q>\nx",
     [("search", "the answer ended inside the call")], 1),
    ("llama3", '<|python_tag|>brave_search.call(query="x")', '<|python_tag|>brave_search.call(query="x")', [], 1),
    ("llama3", '{"name": "nope", "parameters": {}}', '{"name": "nope", "parameters": {}}', [], 1),
    ("mistral", '[TOOL_CALLS]nope[ARGS]{"a": 1} tail', '[TOOL_CALLS]nope[ARGS]{"a": 1}tail', [], 1),
    ("mistral", "[TOOL_CALLS]", "[TOOL_CALLS]", [], 1),
    ("mistral", '[TOOL_CALLS]search[ARGS]{"q": ', '[TOOL_CALLS]search[ARGS]{"q": ',
     [("search", "the answer ended inside the call")], 1),
    ("deepseek", f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}nope{DS_SEP}{{}}{DS_CALL_END}{DS_CALLS_END}",
     f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}nope{DS_SEP}{{}}{DS_CALL_END}{DS_CALLS_END}", [], 1),
    ("harmony", "<|channel|>commentary to=functions.nope <|constrain|>json<|message|>{\"a\": 1}<|call|>",
     '{"a": 1}', [], 1),
    ("harmony", "<|channel|>commentary to=browser.search<|message|>{}<|call|>", "{}", [], 1),
]


@pytest.mark.parametrize("fmt, text, content, streamed, failures", BROKEN, ids=lambda v: str(v)[:40])
def test_broken_calls_are_never_broken_items(fmt, text, content, streamed, failures):
    for pieces in ([text], list(text)):
        _, whole_content, whole_calls, failed = parse(fmt, pieces, stream=False)
        assert (whole_content, len(failed)) == (content, failures)
        assert all(error is None for _, _, error in whole_calls)
        _, _, calls, failed = parse(fmt, pieces, stream=True)
        assert [(name, error) for name, _, error in calls] == streamed and len(failed) == failures


# --- generated answers ------------------------------------------------------------------------

MARKERS = ["<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>", "<|python_tag|>",
           "<|eom_id|>", "<|eot_id|>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|tool_call_start|>",
           "<|tool_call_end|>", "<|tool_call>", "<tool_call|>", '<|"|>', DS_CALLS_BEGIN, DS_CALLS_END,
           DS_CALL_BEGIN, DS_CALL_END, DS_SEP, "<｜tool▁calls｜>", "<|channel|>", "<|message|>", "<|start|>", "<|end|>",
           "<|call|>", "<|return|>", "<|constrain|>", '<function name="', "<|function_call|>"]
HARMONY_MARKERS = MARKERS[-7:]
XML_MARKERS = ["</parameter>", "<parameter=", "</function>", "</tool_call>"]

words = st.lists(st.sampled_from(["a", "b", " ", "\n", "<", ">", "[", "]", "{", "}", "|", "/", '"', ":", ",", "é", "`",
                                  "tool", "_call", "ARGS", "name", "=", "function"]), min_size=1, max_size=12)
texts = words.map(lambda w: "".join(w).strip()).filter(lambda t: t and not any(m in t for m in MARKERS))
strings = st.lists(st.sampled_from(["x", " ", "\n", "\t", '"', "\\", "{", "}", "[", "]", "é", "</tool_call>", "[TOOL_CALLS]",
                                    DS_CALL_END, "<|python_tag|>", "</parameter>", "<|call|>"]), max_size=6).map("".join)
json_values = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | strings
                           | st.floats(allow_nan=False, allow_infinity=False),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(strings, inner, max_size=3),
                           max_leaves=8)
json_args = st.dictionaries(st.sampled_from(["location", "q", "k", "é", "</tool_call>"]), json_values, max_size=4)
typed_args = st.fixed_dictionaries({}, optional={
    "s": strings, "n": st.integers(-10**6, 10**6), "f": st.floats(allow_nan=False, allow_infinity=False),
    "b": st.booleans(), "o": st.dictionaries(strings, json_values, max_size=3), "a": st.lists(json_values, max_size=3)})


def gemma(value):
    """A value in Gemma 4's notation (keys bare where they can be)."""
    if isinstance(value, str):
        return f'<|"|>{value}<|"|>'
    if isinstance(value, dict):
        keys = [k if re.fullmatch(r"\w+", k) else f'<|"|>{k}<|"|>' for k in value]
        return "{" + ",".join(f"{k}:{gemma(v)}" for k, v in zip(keys, value.values(), strict=True)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(gemma(v) for v in value) + "]"
    return json.dumps(value)


def render(fmt, parts, draw):
    """An answer in ``fmt`` made of ("text", t), ("think", t) and ("call", name, args) parts."""
    out, prev = [], "start"
    i = 0
    while i < len(parts):
        part = parts[i]
        kind = part[0]
        if fmt == "harmony":
            head = "" if prev == "start" else "<|start|>assistant"
            if kind == "call":
                where = draw(st.sampled_from(["channel", "role", "analysis"]))
                body = json.dumps(part[2])
                if where == "role":
                    out.append(f"{head} to=functions.{part[1]}<|channel|>commentary json<|message|>{body}<|call|>")
                else:
                    channel = "commentary" if where == "channel" else "analysis"
                    out.append(f"{head}<|channel|>{channel} to=functions.{part[1]} <|constrain|>json<|message|>{body}"
                               "<|call|>")
            else:
                channel = "analysis" if kind == "think" else draw(st.sampled_from(["final", "commentary"]))
                out.append(f"{head}<|channel|>{channel}<|message|>{part[1]}<|end|>")
        elif fmt == "muse":  # messages: the text to the user, each call to its tool
            head = "" if prev == "start" else "<|eom|><|start|>assistant"
            if kind == "call":
                out.append(f"{head} to={part[1]}<|message|>" + render_invokes(fmt, [part]))
            else:
                out.append(f"{head} to=user<|message|>{part[1]}")
        elif kind == "text":
            out.append(part[1])
        elif fmt in ("hermes", "plain"):
            out.append(f"<tool_call>\n{json.dumps({'name': part[1], 'arguments': part[2]}, ensure_ascii=False)}\n</tool_call>")
        elif fmt == "qwen3_coder":
            params = "".join(f"<parameter={k}>\n{v if k == 's' else json.dumps(v)}\n</parameter>\n"
                             for k, v in part[2].items())
            out.append(f"<tool_call>\n<function={part[1]}>\n{params}</function>\n</tool_call>")
        elif fmt == "llama3":
            tag = "<|python_tag|>" if prev == "text" or draw(st.booleans()) else ""
            sep = draw(st.sampled_from(["", "\n", "; "])) if prev == "call" else ""
            out.append(sep + tag + json.dumps({"name": part[1], "parameters": part[2]}))
        elif fmt == "mistral":
            group = [part]
            while i + 1 < len(parts) and parts[i + 1][0] == "call":
                i += 1
                group.append(parts[i])
            if draw(st.booleans()):
                out.append("[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a, "id": "abcdefghi"} for _, n, a in group]))
            else:
                out.append("".join(f"[TOOL_CALLS]{n}{draw(st.sampled_from(['', '[CALL_ID]abcdefghi']))}[ARGS]"
                                   f"{json.dumps(a)}" for _, n, a in group))
        elif fmt in ("nemotron_v2", "apriel", "apertus"):
            group = [part]
            while i + 1 < len(parts) and parts[i + 1][0] == "call":
                i += 1
                group.append(parts[i])
            items = [{n: a} if fmt == "apertus" else {"name": n, "arguments": a} for _, n, a in group]
            opener, closer = {"nemotron_v2": ("<TOOLCALL>", "</TOOLCALL>"), "apriel": ("<tool_calls>", "</tool_calls>"),
                              "apertus": ("<|tools_prefix|>", "<|tools_suffix|>")}[fmt]
            out.append(opener + json.dumps(items, ensure_ascii=False) + closer)
        elif fmt == "functionary_v31":
            out.append(f"<function={part[1]}>{json.dumps(part[2], ensure_ascii=False)}</function>")
        elif fmt == "seed_oss":
            params = "".join(f"<parameter={k}>{v if k == 's' else json.dumps(v)}</parameter>\n"
                             for k, v in part[2].items())
            out.append(f"<seed:tool_call>\n<function={part[1]}>\n{params}</function>\n</seed:tool_call>")
        elif fmt == "gigachat":
            out.append("<|function_call|>" + json.dumps({"name": part[1], "arguments": part[2]}))
        elif fmt == "gemma4":
            out.append(f"<|tool_call>call:{part[1]}{gemma(part[2])}<tool_call|>")
        elif fmt == "lfm2":
            group = [part]
            while i + 1 < len(parts) and parts[i + 1][0] == "call":
                i += 1
                group.append(parts[i])
            calls = [n + "(" + ", ".join(f"{k}={json.dumps(v)}" for k, v in a.items()) + ")" for _, n, a in group]
            out.append("<|tool_call_start|>[" + ", ".join(calls) + "]<|tool_call_end|>")
        elif fmt == "glm":
            args = "".join(f"<arg_key>{k}</arg_key><arg_value>{v if k == 's' else json.dumps(v)}</arg_value>"
                           for k, v in part[2].items())
            out.append(f"<tool_call>{part[1]}{args}</tool_call>")
        elif fmt == "deepseek_dsml":
            dsml = "｜DSML｜"
            args = "".join(f'<{dsml}parameter name="{k}" string="{str(k == "s").lower()}">'
                           f'{v if k == "s" else json.dumps(v)}</{dsml}parameter>\n' for k, v in part[2].items())
            out.append(f'<{dsml}tool_calls>\n<{dsml}invoke name="{part[1]}">\n{args}</{dsml}invoke>\n</{dsml}tool_calls>')
        elif fmt == "command_r":
            group = [part]
            while i + 1 < len(parts) and parts[i + 1][0] == "call":
                i += 1
                group.append(parts[i])
            calls = [{"tool_call_id": str(k), "tool_name": n, "parameters": a} for k, (_, n, a) in enumerate(group)]
            out.append("<|START_ACTION|>" + json.dumps(calls, ensure_ascii=False) + "<|END_ACTION|>")
        elif fmt in ("command_r_plus", "firefunction_v2"):
            group = [part]
            while i + 1 < len(parts) and parts[i + 1][0] == "call":
                i += 1
                group.append(parts[i])
            if fmt == "command_r_plus":
                calls = [{"tool_name": n, "parameters": a} for _, n, a in group]
                out.append("\nAction:\n```json\n" + json.dumps(calls, ensure_ascii=False, indent=4) + "```\n")
            else:
                out.append(" functools" + json.dumps([{"name": n, "arguments": a} for _, n, a in group], ensure_ascii=False))
        elif fmt in ("minimax", "minimax_m3", "kimi_k3", "minicpm5"):
            group = [part]
            while i + 1 < len(parts) and parts[i + 1][0] == "call":
                i += 1
                group.append(parts[i])
            out.append(render_invokes(fmt, group))
        elif fmt == "kimi":
            group = [part]
            while i + 1 < len(parts) and parts[i + 1][0] == "call":
                i += 1
                group.append(parts[i])
            out.append("<|tool_calls_section_begin|>" + "".join(
                f"<|tool_call_begin|>functions.{n}:{k}<|tool_call_argument_begin|>{json.dumps(a)}<|tool_call_end|>"
                for k, (_, n, a) in enumerate(group)) + "<|tool_calls_section_end|>")
        elif fmt == "deepseek":
            group = [part]
            while i + 1 < len(parts) and parts[i + 1][0] == "call":
                i += 1
                group.append(parts[i])
            calls = []
            for _, n, a in group:
                if draw(st.booleans()):
                    calls.append(f"{DS_CALL_BEGIN}function{DS_SEP}{n}\n```json\n{json.dumps(a)}\n```{DS_CALL_END}")
                else:
                    calls.append(f"{DS_CALL_BEGIN}{n}{DS_SEP}{json.dumps(a)}{DS_CALL_END}")
            out.append(DS_CALLS_BEGIN + "\n".join(calls) + DS_CALLS_END)
        prev = "call" if kind == "call" else "text"
        i += 1
    return "".join(out)


def render_invokes(fmt, group):
    """Calls to ``typed`` as MiniMax M2, M3, Kimi K3 or MiniCPM5 write them (strings raw, other values JSON)."""
    def value(k, v):
        return v if k == "s" else json.dumps(v)
    if fmt == "minimax":
        calls = "".join(f'<invoke name="{n}">\n' + "".join(f'<parameter name="{k}">{value(k, v)}</parameter>\n'
                                                            for k, v in a.items()) + "</invoke>\n" for _, n, a in group)
        return f"<minimax:tool_call>\n{calls}</minimax:tool_call>"
    if fmt == "muse":
        return "".join(f'<atem:function_calls>\n<atem:invoke name="{n}">\n' + "".join(
            f'<atem:parameter name="{k}">{value(k, v)}</atem:parameter>\n' for k, v in a.items())
            + "</atem:invoke>\n</atem:function_calls>" for _, n, a in group)
    if fmt == "minicpm5":
        return "\n".join(f'<function name="{n}">' + "".join(f'<param name="{k}">{value(k, v)}</param>' for k, v in a.items())
                         + "</function>" for _, n, a in group)
    if fmt == "minimax_m3":
        ns = "]<]minimax[>["
        calls = "".join(f'{ns}<invoke name="{n}">' + "".join(f"{ns}<{k}>{value(k, v)}{ns}</{k}>" for k, v in a.items())
                        + f"{ns}</invoke>\n" for _, n, a in group)
        return f"{ns}<tool_call>\n{calls}{ns}</tool_call>"
    calls = "".join(f'<|open|>call tool="{n}" index="{j + 1}"<|sep|>' + "".join(
        f'<|open|>argument key="{k}" type="x"<|sep|>{value(k, v)}<|close|>argument<|sep|>' for k, v in a.items())
        + "<|close|>call<|sep|>" for j, (_, n, a) in enumerate(group))
    return f"<|open|>tools<|sep|>{calls}<|close|>tools<|sep|>"


@st.composite
def answers(draw):
    # functionary_v32 labels every part, text too, with its recipient: its own tests
    # (test_toolformats_functionary.py) cut its answers at every point
    fmt = draw(st.sampled_from([f for f in FORMATS if f != "functionary_v32"]))
    kinds = ["text", "call"] + (["think"] if fmt == "harmony" else [])
    parts = []
    for kind in draw(st.lists(st.sampled_from(kinds), max_size=6)):
        if kind == "call":
            if fmt in ("qwen3_coder", "seed_oss"):
                parts.append(("call", "typed", draw(typed_args.filter(lambda a: not any(
                    m in json.dumps(a) or m in a.get("s", "") for m in XML_MARKERS)))))
            elif fmt in ("minimax", "minimax_m3", "kimi_k3", "minicpm5", "muse"):  # values typed by the schema, raw strings
                args = draw(typed_args.filter(lambda a: "</parameter>" not in a.get("s", "")
                                              and "</parameter>" not in json.dumps(a)))
                parts.append(("call", "typed", {k: v for k, v in args.items() if fmt != "minimax_m3" or k in "snfb"}))
            elif fmt in ("glm", "deepseek_dsml"):  # values typed by the schema, ended by their closer
                parts.append(("call", "typed", draw(typed_args)))
            else:
                args = draw(json_args)
                if fmt == "harmony":
                    assume(not any(m in json.dumps(args) for m in HARMONY_MARKERS))
                if fmt == "lfm2":  # keyword arguments: names
                    assume(all(re.fullmatch(r"\w+", k) for k in args))
                parts.append(("call", draw(st.sampled_from(["get_weather", "search", "noop"])), args))
        elif parts and parts[-1][0] == kind:
            continue
        else:
            parts.append((kind, draw(texts)))
    if fmt == "llama3":  # text only after the calls (a JSON call is read only at the start)
        calls = [p for p in parts if p[0] == "call"]
        texts_ = [p for p in parts if p[0] == "text"]
        parts = calls + texts_[:1]
    text = render(fmt, parts, draw)
    thinking = "".join(p[1] for p in parts if p[0] == "think")
    content = "".join(p[1] for p in parts if p[0] == "text")
    calls = [(p[1], p[2], None) for p in parts if p[0] == "call"]
    return fmt, text, (thinking, content, calls, [])


@settings(max_examples=400, deadline=None)
@given(answers(), st.lists(st.integers(0, 100_000), max_size=30), st.booleans())
@example(("hermes", '<function<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>=',
          ("", "<function=", [("get_weather", {}, None)], [])), [], False)  # texts that join into a marker
def test_generated_answers_in_random_cuts(answer, points, stream):
    fmt, text, want = answer
    got = parse(fmt, cuts(text, points), stream)
    assert got == want
    # no marker reaches content, unless the answer's own text spelled one (texts drawn apart
    # may join into one across a call: "<function" + "=")
    assert not any(m in got[1] and m not in want[1] for m in MARKERS), "no marker reaches content"


@settings(max_examples=300, deadline=None)
@given(answers(), st.integers(0, 100_000), st.lists(st.integers(0, 100_000), max_size=10))
def test_an_answer_cut_short_never_yields_a_broken_call(answer, end, points):
    """Stopped anywhere (max_tokens): a whole answer has only good calls, a streamed one ends
    each call it started, and both agree on the good ones."""
    fmt, text, _ = answer
    text = text[:end % (len(text) + 1)]
    _, _, whole_calls, whole_failed = parse(fmt, cuts(text, points), stream=False)
    _, _, stream_calls, stream_failed = parse(fmt, cuts(text, points), stream=True)
    assert all(error is None for _, _, error in whole_calls)
    assert [c for c in stream_calls if c[2] is None] == whole_calls
    assert len(stream_failed) == len(whole_failed) >= sum(c[2] is not None for c in stream_calls)


# --- with thinking -------------------------------------------------------------------------------

def test_answer_parser_splits_thinking_then_calls():
    text = '<think>\nI should search.\n</think>\n\nOn it.\n<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>'
    want = ("I should search.", "On it.", [("search", {"q": "x"}, None)], [])
    for pieces in ([text], list(text)):
        assert parse("hermes", pieces, reasoning="think") == want
    # a template that opens <think> in the prompt
    assert parse("qwen3_coder", ["hmm</think>\n<tool_call>\n<function=noop>\n</function>\n</tool_call>"],
                 reasoning="think", tail="<|im_start|>assistant\n<think>\n") == ("hmm", "", [("noop", {}, None)], [])
    # no tools: the splitter alone; neither: the text as it is
    assert parse(None, ["<think>a</think>b"], reasoning="think") == ("a", "b", [], [])
    assert parse(None, ["<tool_call>"]) == ("", "<tool_call>", [], [])


def test_answer_parser_reports_thinking_while_inside_it():
    p = AnswerParser("harmony", TOOLS, prompt_tail=HARMONY_TAIL)
    p.feed("<|channel|>analysis<|message|>hm")
    assert p.thinking
    p.feed("<|end|><|start|>assistant<|channel|>final<|message|>x")
    assert not p.thinking
    p = AnswerParser("hermes", TOOLS, reasoning="think")
    p.feed("<think>a")
    assert p.thinking


def test_unknown_formats_are_refused():
    with pytest.raises(ValueError):
        ToolCallParser("nope", TOOLS)


FRAGMENTS = MARKERS + ["<think>", "</think>", "assistant", " to=functions.search", " to=functions.nope", "commentary",
                       "analysis", "final", " json", '{"name": "search", "arguments": ', '{"name": "nope", "parameters": ',
                       '{"q": "x"}', "{", "}", "[", "]", '"', "\\", ",", ";", " ", "\n", "```json\n", "```", "search",
                       "function", "get_weather", "typed", "q>", "s>", "n>", ">", "1", "true", "abc", "<", "|", "é"]


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(FORMATS), st.lists(st.sampled_from(FRAGMENTS), max_size=25),
       st.lists(st.integers(0, 100_000), max_size=20), st.booleans())
def test_any_text_in_any_cuts_parses_the_same(fmt, fragments, points, stream):
    """Garbage made of markers and JSON pieces: never an error, the same items however it is cut,
    and good calls only in a whole answer."""
    text = "".join(fragments)
    whole = parse(fmt, [text], stream)
    assert parse(fmt, cuts(text, points), stream) == whole
    if not stream:
        assert all(error is None for _, _, error in whole[2])


def test_an_answer_cut_inside_the_closer_keeps_its_call_and_no_failure():
    """Cut by max_tokens after the arguments, inside ``</tool_call>`` (as SmolLM2 was): the call
    stands, the closer's beginning is not text, and no call is counted as failed."""
    text = '<tool_call>\n{"name": "search", "arguments": {"q": 1}}\n</tool_ca'
    for stream in (True, False):
        for pieces in ([text], list(text)):
            _, content, calls, failed = parse("hermes", pieces, stream=stream)
            assert content == "" and failed == [] and [(n, e) for n, _, e in calls] == [("search", None)]
