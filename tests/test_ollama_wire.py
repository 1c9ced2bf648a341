"""Ollama's request shapes (gateway/wire/ollama.py): fields into a GenerationRequest, every
mistake a 400 naming its field, and no input that raises anything else."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.base.errors import InvalidRequest
from gateway.wire import ollama

ASK = [{"role": "user", "content": "hi"}]


def test_chat_fields_and_options():
    p = ollama.parse_chat({"model": "m", "messages": ASK, "stream": False, "format": "json", "keep_alive": "10m",
                           "think": True, "options": {"temperature": 0.1, "top_k": 5, "num_predict": 7,
                                                      "stop": ["x"], "seed": 3, "num_ctx": 8192, "mirostat": 0}})
    r = p.request
    assert not p.stream and p.keep_alive == 600 and p.explicit == {"temperature", "top_k", "seed"}
    assert (r.temperature, r.top_k, r.max_tokens, r.stop, r.seed) == (0.1, 5, 7, ["x"], 3)
    assert r.response_format == "json_object" and r.chat_template_kwargs == {"enable_thinking": True}
    assert ollama.parse_chat({"model": "m", "messages": ASK}).stream  # Ollama streams unless told not to


def test_num_predict_keep_alive_and_think_edges():
    assert ollama.parse_chat({"model": "m", "messages": ASK, "options": {"num_predict": -1}}).request.max_tokens is None
    assert ollama.parse_chat({"model": "m", "messages": ASK, "keep_alive": -1}).keep_alive == float("inf")
    assert ollama.parse_chat({"model": "m", "messages": ASK, "keep_alive": "-1m"}).keep_alive == float("inf")
    assert ollama.parse_chat({"model": "m", "messages": ASK, "keep_alive": 0}).keep_alive == 0
    assert ollama.parse_chat({"model": "m", "messages": ASK, "keep_alive": 1e308}).keep_alive == 1e308
    off = ollama.parse_chat({"model": "m", "messages": ASK, "think": False})
    assert off.request.chat_template_kwargs == {"enable_thinking": False} and off.request.thinking_budget == 0
    assert ollama.parse_chat({"model": "m", "messages": ASK, "think": "high"}).reasoning_effort == "high"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    p = ollama.parse_chat({"model": "m", "messages": ASK, "format": schema})
    assert p.request.response_format == "json_schema" and p.request.json_schema == schema


def test_tool_history_is_matched_by_tool_name():
    p = ollama.parse_chat({"model": "m", "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "w", "arguments": {"c": "P"}}}]},
        {"role": "tool", "content": "18 C", "tool_name": "w"}]})
    call = p.request.messages[1]["tool_calls"][0]
    assert call["function"] == {"name": "w", "arguments": {"c": "P"}}
    assert p.request.messages[2] == {"role": "tool", "content": "18 C", "tool_call_id": call["id"], "name": "w"}


def test_generate_with_system_raw_and_embed():
    p = ollama.parse_generate({"model": "m", "prompt": "hi", "system": "be brief"})
    assert p.request.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    raw = ollama.parse_generate({"model": "m", "prompt": "hi", "raw": True})
    assert raw.request.prompt == "hi" and raw.request.messages is None
    assert ollama.parse_embed({"model": "e", "input": "x"}) == ("e", ["x"], None)
    assert ollama.parse_embed({"model": "e", "prompt": "x", "keep_alive": "1s"}, legacy=True) == ("e", ["x"], 1.0)


@pytest.mark.parametrize("body, param", [
    ({"messages": ASK}, "model"),
    ({"model": "m", "messages": "hi"}, "messages"),
    ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"model": "m", "messages": [{"role": "user", "content": "x", "images": "aGk="}]}, "messages[0].images"),
    ({"model": "m", "messages": [{"role": "user", "content": "x", "images": [5]}]}, "messages[0].images[0]"),
    ({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_name"),
    ({"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "w", "arguments": 3}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"model": "m", "messages": ASK, "options": []}, "options"),
    ({"model": "m", "messages": ASK, "options": {"temperature": "hot"}}, "options.temperature"),
    ({"model": "m", "messages": ASK, "options": {"num_predict": 1.5}}, "options.num_predict"),
    ({"model": "m", "messages": ASK, "options": {"stop": 5}}, "options.stop"),
    ({"model": "m", "messages": ASK, "format": "yaml"}, "format"),
    ({"model": "m", "messages": ASK, "keep_alive": "soon"}, "keep_alive"),
    ({"model": "m", "messages": ASK, "keep_alive": 10 ** 400}, "keep_alive"),  # past any float
    ({"model": "m", "messages": ASK, "think": "very"}, "think"),
    ({"model": "m", "messages": ASK, "stream": "yes"}, "stream"),
    ({"model": "m", "messages": ASK, "tools": [{"type": "function", "function": {"name": "bad name"}}]},
     "tools[0].function.name"),
])
def test_chat_mistakes_name_their_field(body, param):
    with pytest.raises(InvalidRequest) as e:
        ollama.parse_chat(body)
    assert e.value.param == param and e.value.status == 400


@pytest.mark.parametrize("body, param", [
    ({"model": "m", "prompt": 5}, "prompt"),
    ({"model": "m", "prompt": "x", "images": {"a": 1}}, "images"),
    ({"model": "m", "prompt": "x", "suffix": "y", "images": ["aGk="]}, "images"),
    ({"model": "m", "prompt": "x", "suffix": 5}, "suffix"),  # a string: fill in the middle (test_infill.py)
    ({"model": "m", "prompt": "x", "template": "{{ .Prompt }}"}, "template"),
    ({"model": "m", "prompt": "x", "raw": "yes"}, "raw"),
])
def test_generate_mistakes_name_their_field(body, param):
    with pytest.raises(InvalidRequest) as e:
        ollama.parse_generate(body)
    assert e.value.param == param


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=12)
FIELDS = st.sampled_from(["model", "messages", "prompt", "options", "format", "keep_alive", "think", "stream",
                          "tools", "raw", "system", "images", "input"])


@given(st.dictionaries(FIELDS, JSON, max_size=6))
def test_no_body_raises_anything_but_a_400(body):
    for parse in (ollama.parse_chat, ollama.parse_generate, ollama.parse_embed):
        try:
            parse(body)
        except InvalidRequest:
            pass
