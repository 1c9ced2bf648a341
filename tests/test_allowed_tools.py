"""OpenAI's ``allowed_tools`` tool choice (chat completions' and Responses' shapes): it narrows
the tools the model may call (the call grammar and the mode) while every tool stays in the
prompt; a name outside ``tools`` is a 400 naming its param. Checked on the wire and on a real
llama.cpp worker running a scripted model that calls get_weather."""

import json

import pytest
from realmodel import CACHE

from gateway.app import create_app
from gateway.base.errors import InvalidRequest
from gateway.models import testmodels as tm
from gateway.models.config import load_config
from gateway.wire import openai, responses
from gateway.worker import toolgrammar

S = tm.Special
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
R_TOOLS = [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]}
           for t in (WEATHER, TIME)]


def chat_allowed(names, mode="auto"):
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": [
        {"type": "function", "function": {"name": n}} for n in names]}}


def resp_allowed(names, mode="auto", extra=()):
    return {"type": "allowed_tools", "mode": mode, "tools": [*({"type": "function", "name": n} for n in names),
                                                             *extra]}


def chat(**body):
    return openai.parse_chat({"model": "m", "messages": ASK, "tools": [WEATHER, TIME], **body}).request


def resp(**body):
    return responses.parse({"model": "m", "input": "Weather in Paris?", "tools": R_TOOLS, **body}).request


def test_chat_allowed_tools_narrow_the_choice_and_keep_every_tool():
    req = chat(tool_choice=chat_allowed(["get_time"], "required"))
    assert req.tools == [WEATHER, TIME] and req.tool_choice == "required" and req.tool_names == ("get_time",)
    req = chat(tool_choice=chat_allowed(["get_time", "get_weather"]))  # every tool: no restriction
    assert req.tool_choice == "auto" and req.tool_names is None
    req = chat(tool_choice=chat_allowed(["get_weather"]), parallel_tool_calls=False)
    assert req.tool_choice == "auto" and req.tool_names == ("get_weather",)
    assert not req.parallel_tool_calls


def test_responses_allowed_tools_narrow_the_choice_and_skip_hosted_tools():
    req = resp(tool_choice=resp_allowed(["get_weather"], extra=[{"type": "web_search"}]))
    assert [t["function"]["name"] for t in req.tools] == ["get_weather", "get_time"]
    assert req.tool_choice == "auto" and req.tool_names == ("get_weather",)
    req = resp(tool_choice=resp_allowed(["get_time", "get_weather"], "required"))
    assert req.tool_choice == "required" and req.tool_names is None
    # only hosted tools allowed: none this server can call, so none
    assert resp(tool_choice=resp_allowed([], extra=[{"type": "web_search"}])).tools is None


@pytest.mark.parametrize("choice, param", [
    (chat_allowed(["get_news"]), "tool_choice.allowed_tools.tools[0].function.name"),
    (chat_allowed(["get_time", 7]), "tool_choice.allowed_tools.tools[1].function.name"),
    (chat_allowed(["get_time"], "sometimes"), "tool_choice.allowed_tools.mode"),
    (chat_allowed([]), "tool_choice.allowed_tools.tools"),
    ({"type": "allowed_tools"}, "tool_choice.allowed_tools.tools"),
    ({"type": "allowed_tools", "allowed_tools": {"tools": [{"type": "custom", "custom": {"name": "x"}}]}},
     "tool_choice.allowed_tools.tools[0]"),
])
def test_chat_allowed_tools_mistakes_name_their_param(choice, param):
    with pytest.raises(InvalidRequest) as e:
        chat(tool_choice=choice)
    assert e.value.param == param and e.value.status == 400


@pytest.mark.parametrize("choice, param", [
    (resp_allowed(["get_news"]), "tool_choice.tools[0].name"),
    (resp_allowed(["get_time"], "none"), "tool_choice.mode"),
    (resp_allowed([]), "tool_choice.tools"),
    ({"type": "allowed_tools", "mode": "auto", "tools": ["get_time"]}, "tool_choice.tools[0].type"),
    (resp_allowed([], "required", extra=[{"type": "web_search"}]), "tool_choice.tools"),
])
def test_responses_allowed_tools_mistakes_name_their_param(choice, param):
    with pytest.raises(InvalidRequest) as e:
        resp(tool_choice=choice)
    assert e.value.param == param and e.value.status == 400


def test_the_grammar_offers_the_allowed_tools_only():
    both = toolgrammar.build("hermes", [WEATHER, TIME], required=True).gbnf
    one = toolgrammar.build("hermes", [WEATHER, TIME], required=True, names=("get_time",)).gbnf
    assert "get_weather" in both and "get_time" in both
    assert "get_weather" not in one and "get_time" in one


# --- on a real worker ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def config(tmp_path_factory):
    d = tmp_path_factory.mktemp("allowed-tools")
    qwen = tm.llama_cpp_source_file("models/templates/Qwen-Qwen2.5-7B-Instruct.jinja", CACHE / "templates").read_text()
    tm.write_scripted_model(d / "caller.gguf", [S("<tool_call>"), "\n", '{"name":', ' "get_weather",', ' "arguments":',
                                                ' {"city":', ' "Paris"}}', "\n", S("</tool_call>")],
                            chat_template=qwen)
    (d / "models.yaml").write_text(f"server:\n  models_dirs: []\nmodels:\n  caller: {d}/caller.gguf\n")
    return load_config(d / "models.yaml")


@pytest.fixture
async def client(aiohttp_client, config):
    return await aiohttp_client(create_app(config))


async def post(client, path, body):
    r = await client.post(path, json={"model": "caller", "max_tokens": 40, **body})
    payload = await r.json()
    assert r.status == 200, payload
    return payload


def chat_calls(payload):
    return [c["function"]["name"] for c in payload["choices"][0]["message"].get("tool_calls") or []]


async def test_a_call_outside_the_allowed_tools_cannot_be_made(client):
    base = {"messages": ASK, "tools": [WEATHER, TIME]}
    free = await post(client, "/v1/chat/completions", base)
    assert chat_calls(free) == ["get_weather"]  # what the script writes when nothing narrows it
    allowed = await post(client, "/v1/chat/completions", {**base, "tool_choice": chat_allowed(["get_weather"])})
    assert chat_calls(allowed) == ["get_weather"]
    args = allowed["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(args) == {"city": "Paris"}
    for seed in range(3):
        for mode in ("auto", "required"):
            narrowed = await post(client, "/v1/chat/completions",
                                  {**base, "seed": seed, "tool_choice": chat_allowed(["get_time"], mode)})
            assert "get_weather" not in chat_calls(narrowed)
            assert "get_weather" not in (narrowed["choices"][0]["message"]["content"] or "")
            # every tool stays in the prompt: the same prompt, so the cache holds
            assert narrowed["usage"]["prompt_tokens"] == free["usage"]["prompt_tokens"]


async def test_responses_allowed_tools_hold_on_a_real_worker(client):
    base = {"input": "Weather in Paris?", "tools": R_TOOLS}
    ok = await post(client, "/v1/responses", {**base, "tool_choice": resp_allowed(["get_weather"], "required")})
    assert [o["name"] for o in ok["output"] if o["type"] == "function_call"] == ["get_weather"]
    narrowed = await post(client, "/v1/responses", {**base, "tool_choice": resp_allowed(["get_time"], "required")})
    assert "get_weather" not in json.dumps(narrowed["output"])
    r = await client.post("/v1/responses", json={"model": "caller", **base, "tool_choice": resp_allowed(["nope"])})
    body = await r.json()
    assert r.status == 400 and body["error"]["param"] == "tool_choice.tools[0].name"
