"""The worker's side of tools, on real llama.cpp workers: the call grammar really constrains
sampling (lazily, or from the first token when a call is required), and the prompt a template
sees for the plain fallback, for DeepSeek (calls but no tool list) and for Mistral (9-character
call ids), through /apply-template, which renders exactly what generation renders."""

import json

import pytest
from realmodel import CACHE

from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config
from gateway.text.toolformats.mistral import mistral_id

S = tm.Special
NUMBER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "integer"}}, "required": ["city"]}}}
TEXT = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL_ID = "call_" + "a1B2" * 6
HISTORY = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
    {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": CALL_ID, "content": "18 C"}]


def template(name: str) -> str:
    return tm.llama_cpp_source_file(f"models/templates/{name}.jinja", CACHE / "templates").read_text()


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    d = tmp_path_factory.mktemp("tool-worker")
    qwen = template("Qwen-Qwen2.5-7B-Instruct")
    tm.write_scripted_model(d / "caller.gguf", [S("<tool_call>"), "\n", '{"name":', ' "get_weather",', ' "arguments":',
                                                ' {"city":', ' "Paris"}}', "\n", S("</tool_call>")],
                            chat_template=qwen)
    tm.plain(d / "talker.gguf", ["Sunny", " today", "."], chat_template=qwen)
    models = {"caller": "caller.gguf", "talker": "talker.gguf"}
    for name, tmpl in (("gemma2", "google-gemma-2-2b-it"), ("deepseek", "deepseek-ai-DeepSeek-V3.1"),
                       ("mistral", "Mistral-Small-3.2-24B-Instruct-2506"), ("qwen", "Qwen-Qwen2.5-7B-Instruct")):
        tm.plain(d / f"{name}.gguf", ["x"], chat_template=template(tmpl))
        models[name] = f"{name}.gguf"
    (d / "models.yaml").write_text("server:\n  models_dirs: []\nmodels:\n" +
                                   "".join(f"  {k}: {d}/{v}\n" for k, v in models.items()))
    return load_config(d / "models.yaml")


@pytest.fixture
async def client(aiohttp_client, config):
    return await aiohttp_client(create_app(config))


async def chat(client, **body):
    r = await client.post("/v1/chat/completions", json={"messages": ASK, **body})
    payload = await r.json()
    assert r.status == 200, payload
    return payload["choices"][0]


async def test_the_grammar_keeps_arguments_to_the_schema(client):
    # the script writes "Paris" where the schema wants an integer: without the grammar the parser
    # would hand out {"city": "Paris"}; with it the string cannot be written, and the model's next
    # likeliest tokens that fit the schema are taken instead
    good = await chat(client, model="caller", tools=[TEXT])
    assert json.loads(good["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    for seed in range(3):
        forced = await chat(client, model="caller", tools=[NUMBER], seed=seed, max_tokens=40)
        for call in forced["message"].get("tool_calls") or []:
            assert isinstance(json.loads(call["function"]["arguments"])["city"], int)
        assert "Paris" not in (forced["message"]["content"] or "")


async def test_free_text_stays_free_and_a_required_call_is_forced(client):
    free = await chat(client, model="talker", tools=[TEXT])
    assert free["message"]["content"] == "Sunny today." and free["finish_reason"] == "stop"
    forced = await chat(client, model="talker", tools=[TEXT], tool_choice="required", max_tokens=8)
    # the scripted model has nothing to write that opens a call: the grammar refuses its text
    assert "Sunny" not in (forced["message"]["content"] or "")


async def prompt(client, model: str, messages=HISTORY, tools=(TEXT,)) -> str:
    r = await client.post("/apply-template", json={"model": model, "messages": messages, "tools": list(tools)})
    body = await r.json()
    assert r.status == 200, body
    return body["prompt"]


async def test_plain_fallback_describes_the_tools_and_writes_history_as_text(client):
    text = await prompt(client, "gemma2")  # Gemma 2 refuses a system role: the description opens the user turn
    assert text.index("<tools>") < text.index("Weather in Paris?")
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<tool_response>\n18 C\n</tool_response>" in text
    with_system = [{"role": "system", "content": "Be brief."}, *HISTORY]
    assert "Be brief.\n\n# Tools" in await prompt(client, "gemma2", with_system)


async def test_a_template_that_renders_calls_but_not_tools_gets_them_described(client):
    text = await prompt(client, "deepseek")
    assert "<tools>" in text and '"get_weather"' in text
    assert "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>" in text  # the history through the real template
    assert "<tools>" not in await prompt(client, "deepseek", ASK, tools=())


async def test_mistral_gets_nine_character_call_ids(client):
    text = await prompt(client, "mistral")
    short = mistral_id(CALL_ID)
    assert len(short) == 9 and short.isalnum() and short == mistral_id(CALL_ID) and short in text
    assert CALL_ID not in text
    assert mistral_id("abcDEF123") == "abcDEF123"


async def test_a_template_with_tool_syntax_gets_the_tools_untouched(client):
    text = await prompt(client, "qwen")
    assert text.count("# Tools") == 1 and "You are provided with function signatures" in text  # Qwen's own, once
    assert json.dumps(TEXT["function"]["name"]) in text
