"""The `real` tier on SmolLM2 135M Instruct (Q4_1, a ChatML instruct model whose template
knows no tools; see ``realmodel.smollm_path``), through the real server and the official
openai and anthropic clients: its greedy chat answers are llama.cpp's own decode of the same
prompt tokens, whole and streamed alike; and an answer with a tool call, cut by max_tokens at
every token, never carries a call whose arguments did not complete, nor a marker's fragment
as text (issue 37: on this model an Anthropic answer cut during a second call gave a
``tool_use`` with input ``{}`` and a text block ``</``)."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from helpers import WEATHER, ServerProcess, request, run_cli
from realmodel import Reference, smollm_path

pytestmark = [pytest.mark.real, pytest.mark.slow]

N_CTX, N_BATCH, MAX_TOKENS = 4096, 512, 32
SYSTEM_CHAT = [
    {"role": "system", "content": "You answer in one short sentence."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris is the capital of France."},
    {"role": "user", "content": "And of Italy?"},
]
ANTH_WEATHER = {"name": "get_weather", "description": WEATHER["function"]["description"],
                "input_schema": WEATHER["function"]["parameters"]}
# A second call: the first turn's call in the history leads this model to call again (greedy)
ASK_AGAIN = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "call_1", "type": "function",
                  "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
             {"role": "user", "content": "Weather in London?"}]
ANTH_ASK_AGAIN = [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": [
                      {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                  {"role": "user", "content": "Weather in London?"}]
MARKERS = ("<tool_call>", "</tool_call>")  # the syntax the gateway asks of a template without tools (plain)
GREEDY = {"temperature": 0}  # the anthropic client has no argument for it


@pytest.fixture(scope="module")
def smollm():
    return smollm_path()


@pytest.fixture(scope="module")
def server(smollm, tmp_path_factory):
    d = tmp_path_factory.mktemp("smollm")
    cfg = d / "models.yaml"
    cfg.write_text("server:\n  discover_default_stores: false\nmodels:\n"
                   f"  smol:\n    path: {smollm}\n    n_ctx: {N_CTX}\n    n_batch: {N_BATCH}\n    flash_attn: false\n")
    with ServerProcess("--config", str(cfg), env={"HOME": str(d)}) as srv:
        srv.config = cfg
        yield srv
    assert srv.proc.returncode == 0


@pytest.fixture(scope="module")
def reference(smollm):
    return Reference(smollm, n_ctx=N_CTX, n_batch=N_BATCH, flash_attn=False)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def anth(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def gateway_tokens(server, messages: list[dict]) -> list[int]:
    """The tokens the gateway decodes for a chat: its rendering of the model's template, its tokenizer."""
    status, rendered, _ = request(server.url + "/apply-template", {"model": "smol", "messages": messages})
    assert status == 200, rendered
    status, out, _ = request(server.url + "/tokenize", {"model": "smol", "content": rendered["prompt"],
                                                         "add_special": True})
    assert status == 200, out
    return out["tokens"]


def test_tool_format_is_the_plain_fallback(server):
    """The template knows no tools, so calls are asked for (and read) in hermes' syntax: MARKERS."""
    r = run_cli("models", "--json", "--config", str(server.config), env={"HOME": str(server.config.parent)})
    assert r.returncode == 0, r.stderr
    [row] = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    assert (row["name"], row["tool_format"], row["quantization"]) == ("smol", "plain", "Q4_1")


# --- fidelity: the gateway's greedy chat answer is llama.cpp's ----------------------------------

@pytest.mark.parametrize("messages", [SYSTEM_CHAT, [{"role": "user", "content": "Name three colors."}]],
                         ids=["system-chat", "default-system"])
def test_greedy_chat_equals_llama_cpps_own_decode(server, reference, oai, anth, messages):
    tokens = gateway_tokens(server, messages)
    if messages[0]["role"] == "system":  # the template is ChatML, as llama.cpp's own formatter writes it
        assert tokens == reference.tokenize(reference.chat_prompt(messages, template="chatml"))
    expected = reference.greedy(tokens, MAX_TOKENS)
    assert expected.strip()

    whole = oai.chat.completions.create(model="smol", messages=messages, temperature=0, max_tokens=MAX_TOKENS)
    assert whole.usage.prompt_tokens == len(tokens)
    assert whole.choices[0].message.content == expected
    parts, finish = [], None
    for chunk in oai.chat.completions.create(model="smol", messages=messages, temperature=0,
                                             max_tokens=MAX_TOKENS, stream=True):
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert ("".join(parts), finish) == (expected, whole.choices[0].finish_reason)

    system = [m["content"] for m in messages if m["role"] == "system"]
    turns = [m for m in messages if m["role"] != "system"]
    kw = {"system": system[0]} if system else {}
    answer = anth.messages.create(model="smol", messages=turns, max_tokens=MAX_TOKENS, extra_body=GREEDY, **kw)
    assert answer.usage.input_tokens + answer.usage.cache_read_input_tokens == len(tokens)
    assert "".join(b.text for b in answer.content if b.type == "text") == expected
    with anth.messages.stream(model="smol", messages=turns, max_tokens=MAX_TOKENS, extra_body=GREEDY, **kw) as s:
        streamed = s.get_final_message()
    assert "".join(b.text for b in streamed.content if b.type == "text") == expected
    assert streamed.stop_reason == answer.stop_reason


# --- a call cut by max_tokens (issue 37) -----------------------------------------------------------

def _openai_whole(oai, max_tokens: int):
    return oai.chat.completions.create(model="smol", messages=ASK_AGAIN, tools=[WEATHER], temperature=0,
                                       max_tokens=max_tokens).choices[0]


def _openai_streamed(oai, max_tokens: int) -> tuple[str, dict[int, list[str]], str | None]:
    """(content, {index: [name, arguments]}, finish) of a streamed answer."""
    content: list[str] = []
    calls: dict[int, list[str]] = {}
    finish: str | None = None
    for chunk in oai.chat.completions.create(model="smol", messages=ASK_AGAIN, tools=[WEATHER], temperature=0,
                                             max_tokens=max_tokens, stream=True):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content.append(choice.delta.content or "")
        for tc in choice.delta.tool_calls or []:
            call = calls.setdefault(tc.index, ["", ""])
            call[0] += (tc.function and tc.function.name) or ""
            call[1] += (tc.function and tc.function.arguments) or ""
        finish = choice.finish_reason or finish
    return "".join(content), calls, finish


def _complete(arguments: str) -> bool:
    try:
        return isinstance(json.loads(arguments), dict)
    except ValueError:
        return False


def _no_fragment(text: str, where: str) -> None:
    stripped = text.strip()
    assert not any(m in text for m in MARKERS), where
    assert not (stripped and any(m.startswith(stripped[-k:]) for m in MARKERS for k in range(1, len(stripped) + 1))), \
        f"{where}: a marker's fragment ends the text {text!r}"


def test_a_call_cut_at_every_token_is_never_given_incomplete(oai, anth):
    full = _openai_whole(oai, 200)
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in full.message.tool_calls or []]
    assert full.finish_reason == "tool_calls" and calls and all(args for _, args in calls), \
        f"the model no longer calls here: {full.message}"
    text = (full.message.content or "").strip()
    n = oai.chat.completions.create(model="smol", messages=ASK_AGAIN, tools=[WEATHER], temperature=0,
                                    max_tokens=200).usage.completion_tokens
    whole_anth = anth.messages.create(model="smol", messages=ANTH_ASK_AGAIN, tools=[ANTH_WEATHER], max_tokens=200,
                                      extra_body=GREEDY)
    assert [(b.name, b.input) for b in whole_anth.content if b.type == "tool_use"] == calls
    cut_calls = 0
    for max_tokens in range(1, n + 1):
        at = f"max_tokens={max_tokens}"
        # whole, openai: only calls whose arguments completed, each as the uncut answer has it
        cut = _openai_whole(oai, max_tokens)
        got = [(c.function.name, c.function.arguments) for c in cut.message.tool_calls or []]
        assert all(_complete(args) for _, args in got), (at, got)
        assert [(name, json.loads(args)) for name, args in got] == calls[:len(got)], (at, got)
        assert cut.finish_reason == "length", at
        content = cut.message.content or ""
        _no_fragment(content, at)
        assert text.startswith(content.strip()), (at, content)
        # whole, anthropic: the same, and never an input of {} for arguments cut short
        msg = anth.messages.create(model="smol", messages=ANTH_ASK_AGAIN, tools=[ANTH_WEATHER],
                                   max_tokens=max_tokens, extra_body=GREEDY)
        assert msg.stop_reason == "max_tokens", at
        assert [(b.name, b.input) for b in msg.content if b.type == "tool_use"] == calls[:len(got)], (at, msg.content)
        said = "".join(b.text for b in msg.content if b.type == "text")
        _no_fragment(said, f"anthropic {at}")
        assert said == content, at
        # streamed: a call cut inside its arguments ends the answer with "length"
        s_content, s_calls, finish = _openai_streamed(oai, max_tokens)
        _no_fragment(s_content, f"streamed {at}")
        assert s_content == content, at
        cut_calls += any(not _complete(args) for _, args in s_calls.values())
        assert finish == "length", (at, s_calls)
        with anth.messages.stream(model="smol", messages=ANTH_ASK_AGAIN, tools=[ANTH_WEATHER],
                                  max_tokens=max_tokens, extra_body=GREEDY) as s:
            streamed = s.get_final_message()
        assert streamed.stop_reason == "max_tokens", at
        _no_fragment("".join(b.text for b in streamed.content if b.type == "text"), f"anthropic streamed {at}")
    assert cut_calls, "no cut fell inside a call's arguments"
