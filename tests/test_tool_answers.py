"""Tool calls in answers, end to end through the gateway: scripted models that write each
model family's call syntax (markers as single control tokens and as ordinary pieces), under the
family's real chat template (llama.cpp's collection), read back in OpenAI's and Anthropic's
shapes, whole and streamed."""

import json

import pytest
from openapi import validate
from realmodel import CACHE

from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config

S = tm.Special
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ANTH_WEATHER = {"name": "get_weather", "description": "Weather in a city",
                "input_schema": WEATHER["function"]["parameters"]}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
PARIS = {"city": "Paris"}
ARGS = ['{"city":', ' "Paris"}']
JSON_CALL = ['{"name":', ' "get_weather",', ' "arguments":', ' {"city":', ' "Paris"}}']


def split(marker: str) -> list[tm.Step]:
    """A marker spelled over ordinary pieces, cut in the middle of its name (in bytes where it
    holds a character the scripted vocabulary reads as a space)."""
    cut = len(marker) // 2
    if "\u2581" in marker:  # DeepSeek's markers: bytes, cut inside a character
        data = marker.encode()
        return [data[:cut + 1], data[cut + 1:]]
    return [marker[:cut], marker[cut:]]


def m(marker: str, special: bool) -> list[tm.Step]:
    return [S(marker)] if special else split(marker)


def hermes(sp: bool) -> list[tm.Step]:
    return ["Let", " me", " check", ".", "\n", *m("<tool_call>", sp), "\n", *JSON_CALL, "\n", *m("</tool_call>", sp)]


def qwen3(sp: bool) -> list[tm.Step]:  # thinks, then calls
    return [*m("<think>", sp), "Paris", " weather", " needed.", *m("</think>", sp), "\n\n", *m("<tool_call>", sp),
            "\n", *JSON_CALL, "\n", *m("</tool_call>", sp)]


def qwen3_coder(sp: bool) -> list[tm.Step]:
    return [*m("<tool_call>", sp), "\n", "<function=get_weather>", "\n", "<parameter=city>", "\n", "Paris", "\n",
            "</parameter>", "\n", "</function>", "\n", *m("</tool_call>", sp)]


def llama3(sp: bool) -> list[tm.Step]:
    head = [S("<|python_tag|>")] if sp else []  # without the tag: a JSON call at the start of the answer
    return [*head, '{"name":', ' "get_weather",', ' "parameters":', ' {"city":', ' "Paris"}}']


def mistral(sp: bool) -> list[tm.Step]:  # Small 3.2: name[ARGS]{...}
    return [*m("[TOOL_CALLS]", sp), "get_weather", *m("[ARGS]", sp), *ARGS]


def mistral_array(sp: bool) -> list[tm.Step]:  # Nemo: a JSON array of calls
    return [*m("[TOOL_CALLS]", sp), "[", *JSON_CALL, "]"]


def harmony(sp: bool) -> list[tm.Step]:
    # thinking first on the analysis channel, then the call on commentary; the second header's
    # markers are spelled in bytes (a control token appears once per scripted model)
    return [*m("<|channel|>", sp), "analysis", *m("<|message|>", sp), "Need", " the", " weather.",
            *m("<|end|>", sp), *m("<|start|>", sp), b"assistant<|channel|>", "commentary", " to=functions",
            ".get_weather", b" <|constrain|>json<|message|>", *ARGS, *m("<|call|>", sp)]


def deepseek(sp: bool) -> list[tm.Step]:  # V3.1
    return [*m("<｜tool▁calls▁begin｜>", sp), *m("<｜tool▁call▁begin｜>", sp), "get_weather",
            *m("<｜tool▁sep｜>", sp), *ARGS, *m("<｜tool▁call▁end｜>", sp), *m("<｜tool▁calls▁end｜>", sp)]


def lfm2(sp: bool) -> list[tm.Step]:  # Python-style calls in a list
    return [*m("<|tool_call_start|>", sp), "[get_weather(", "city=", '"Paris"', ")]", *m("<|tool_call_end|>", sp)]


def gemma4(sp: bool) -> list[tm.Step]:  # strings between <|"|> (the second one ordinary text: a control token appears once)
    return [*m("<|tool_call>", sp), "call:get_weather", "{", "city:", *m('<|"|>', sp), "Paris", '<|"|>', "}",
            *m("<tool_call|>", sp)]


def kimi(sp: bool) -> list[tm.Step]:  # Kimi K2: the call's id names the tool
    return [*m("<|tool_calls_section_begin|>", sp), *m("<|tool_call_begin|>", sp), "functions.get_weather:0",
            *m("<|tool_call_argument_begin|>", sp), *ARGS, *m("<|tool_call_end|>", sp),
            *m("<|tool_calls_section_end|>", sp)]


def plain(sp: bool) -> list[tm.Step]:  # Gemma 2 has no tool syntax: the gateway asks for hermes' in a system message
    return ["<tool", "_call>", "\n", *JSON_CALL, "\n", "</tool", "_call>"]


# format -> (real template, trigger (the last character of its generation prompt), script, text before the call)
FAMILIES = {
    "hermes": ("Qwen-Qwen2.5-7B-Instruct", "\n", hermes, "Let me check."),
    "qwen3": ("Qwen-Qwen3-0.6B", "\n", qwen3, None),
    "qwen3_coder": ("Qwen3-Coder", "\n", qwen3_coder, None),
    "llama3": ("meta-llama-Llama-3.1-8B-Instruct", "\n", llama3, None),
    "mistral": ("Mistral-Small-3.2-24B-Instruct-2506", "]", mistral, None),
    "mistral_array": ("mistralai-Mistral-Nemo-Instruct-2407", "]", mistral_array, None),
    "harmony": ("openai-gpt-oss-120b", "t", harmony, None),
    "deepseek": ("deepseek-ai-DeepSeek-V3.1", ">", deepseek, None),
    "lfm2": ("LFM2-8B-A1B", "\n", lfm2, None),
    "gemma4": ("google-gemma-4-31B-it", ">", gemma4, None),
    "kimi": ("Kimi-K2-Instruct", ">", kimi, None),
    "plain": ("google-gemma-2-2b-it", "\n", plain, None),
}
THINKING = {"harmony": "Need the weather.", "qwen3": "Paris weather needed."}
CASES = [(f, sp) for f in FAMILIES for sp in (True, False) if not (f == "plain" and sp)]


def template(name: str) -> str:
    return tm.llama_cpp_source_file(f"models/templates/{name}.jinja", CACHE / "templates").read_text()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tool-models")
    lines = ["server:", "  models_dirs: []", "models:"]
    for fmt, sp in CASES:
        name, trigger, script, _ = FAMILIES[fmt]
        # with <|return|> in the vocabulary llama.cpp ends gpt-oss answers at <|return|> and <|call|>
        # only, not at <|end|> (which separates the messages of one answer), as in the real model
        extra = ["<|return|>"] if fmt == "harmony" else []
        tm.write_scripted_model(d / f"{fmt}-{sp}.gguf", tm.Script(script(sp), trigger=trigger),
                                chat_template=template(name), extra_special=extra)
        lines.append(f"  {fmt}-{sp}: {d}/{fmt}-{sp}.gguf")
    tm.plain(d / "say.gguf", ["Hello", "."])
    lines += [f"  refuses:\n    path: {d}/say.gguf\n    tool_format: none",
              f"  chatml: {d}/say.gguf"]
    (d / "models.yaml").write_text("\n".join(lines) + "\n")
    return d / "models.yaml"


async def sse(resp) -> list:
    assert resp.status == 200, await resp.text()
    out = []
    async for line in resp.content:
        line = line.decode().rstrip("\n")
        if line.startswith("data: "):
            out.append(line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]))
    return out


@pytest.fixture
async def gw(aiohttp_client, models):
    return await aiohttp_client(create_app(load_config(models)))


@pytest.mark.parametrize("fmt, special", CASES)
async def test_openai_whole(gw, fmt, special):
    r = await gw.post("/v1/chat/completions", json={"model": f"{fmt}-{special}", "messages": ASK, "tools": [WEATHER]})
    body = await r.json()
    assert r.status == 200, body
    validate(body, "CreateChatCompletionResponse")
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == PARIS
    assert choice["message"]["content"] == FAMILIES[fmt][3]
    assert choice["message"].get("reasoning_content") == THINKING.get(fmt)


@pytest.mark.parametrize("fmt, special", CASES)
async def test_openai_streamed(gw, fmt, special):
    r = await gw.post("/v1/chat/completions", json={"model": f"{fmt}-{special}", "messages": ASK, "tools": [WEATHER],
                                                   "stream": True})
    events = await sse(r)
    assert events[-1] == "[DONE]"
    content, thinking, calls, finish = "", "", {}, None
    for chunk in events[:-1]:
        validate(chunk, "CreateChatCompletionStreamResponse")
        delta = chunk["choices"][0]["delta"]
        content += delta.get("content") or ""
        thinking += delta.get("reasoning_content") or ""
        for tc in delta.get("tool_calls") or []:
            if "id" in tc:  # the first piece of a call carries its id, type and name
                assert tc["type"] == "function" and tc["function"]["name"] == "get_weather"
                calls[tc["index"]] = {"id": tc["id"], "arguments": tc["function"].get("arguments", "")}
            else:
                calls[tc["index"]]["arguments"] += tc["function"]["arguments"]
        finish = chunk["choices"][0]["finish_reason"] or finish
    assert finish == "tool_calls"
    assert [json.loads(c["arguments"]) for c in calls.values()] == [PARIS]
    assert content == (FAMILIES[fmt][3] or "") and thinking == (THINKING.get(fmt) or "")
    pieces = sum(1 for c in events[:-1] for tc in c["choices"][0]["delta"].get("tool_calls") or [] if "id" not in tc)
    assert pieces >= 2  # the arguments arrive in pieces as they are generated, not whole at the end


@pytest.mark.parametrize("fmt, special", CASES)
async def test_anthropic_whole_and_streamed(gw, fmt, special):
    body = {"model": f"{fmt}-{special}", "max_tokens": 200, "messages": ASK, "tools": [ANTH_WEATHER]}
    r = await gw.post("/v1/messages", json=body)
    msg = await r.json()
    assert r.status == 200, msg
    assert msg["stop_reason"] == "tool_use"
    uses = [b for b in msg["content"] if b["type"] == "tool_use"]
    assert len(uses) == 1 and uses[0]["id"].startswith("toolu_") and uses[0]["input"] == PARIS
    assert msg["content"][-1]["type"] == "tool_use"
    r = await gw.post("/v1/messages", json={**body, "stream": True})
    assert r.status == 200
    blocks: dict[int, dict] = {}
    stop = None
    async for line in r.content:
        line = line.decode().strip()
        if not line.startswith("data: "):
            continue
        ev = json.loads(line[6:])
        if ev["type"] == "content_block_start":
            blocks[ev["index"]] = dict(ev["content_block"], json="")
        elif ev["type"] == "content_block_delta" and ev["delta"]["type"] == "input_json_delta":
            blocks[ev["index"]]["json"] += ev["delta"]["partial_json"]
        elif ev["type"] == "message_delta":
            stop = ev["delta"]["stop_reason"]
    [use] = [b for b in blocks.values() if b["type"] == "tool_use"]
    assert json.loads(use["json"]) == PARIS and use["name"] == "get_weather" and stop == "tool_use"


async def test_tool_format_none_refuses_tools_naming_the_model(gw):
    r = await gw.post("/v1/chat/completions", json={"model": "refuses", "messages": ASK, "tools": [WEATHER]})
    err = (await r.json())["error"]
    assert r.status == 400 and err["code"] == "tools_unsupported" and "refuses" in err["message"]
    assert err["param"] == "tools"
    r = await gw.post("/v1/messages", json={"model": "refuses", "max_tokens": 9, "messages": ASK,
                                            "tools": [ANTH_WEATHER]})
    assert r.status == 400 and (await r.json())["error"]["type"] == "invalid_request_error"
    # without tools the model answers as ever
    r = await gw.post("/v1/chat/completions", json={"model": "refuses", "messages": ASK})
    assert r.status == 200


async def test_an_answer_without_a_call_stays_content(gw):
    r = await gw.post("/v1/chat/completions", json={"model": "chatml", "messages": ASK, "tools": [WEATHER]})
    choice = (await r.json())["choices"][0]
    assert choice["message"]["content"] == "Hello." and choice["finish_reason"] == "stop"
    assert "tool_calls" not in choice["message"] or not choice["message"]["tool_calls"]
