"""Thinking budgets on real workers: Anthropic's ``thinking.budget_tokens`` and OpenAI's
``reasoning_effort`` (through a model's ``reasoning_budgets``) cut a scripted model's thinking
after that many tokens; the worker writes the format's closing marker and the answer goes on
from there (a scripted model continues from the marker's successor: the answer)."""

import pytest

from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config

S = tm.Special
ASK = [{"role": "user", "content": "Think."}]
THOUGHT = ["one", " two", " three", " four", " five", " six", " seven", " eight"]


@pytest.fixture
async def client(aiohttp_client, tmp_path, write_config):
    tm.write_scripted_model(tmp_path / "think.gguf", [S("<think>"), *THOUGHT, S("</think>"), "Done", "."])
    tm.write_scripted_model(tmp_path / "mistral.gguf", [S("[THINK]"), *THOUGHT, S("[/THINK]"), "Done", "."])
    cfg = load_config(write_config(f"""
        models:
          think:
            path: {tmp_path}/think.gguf
            reasoning_budgets: {{low: 4}}
          mistral: {tmp_path}/mistral.gguf
    """))
    return await aiohttp_client(create_app(cfg))


async def test_anthropic_budget_cuts_the_thinking(client):
    for model in ("think", "mistral"):
        r = await client.post("/v1/messages", json={"model": model, "max_tokens": 100, "messages": ASK,
                                                    "thinking": {"type": "enabled", "budget_tokens": 3}})
        body = await r.json()
        assert r.status == 200, body
        blocks = {b["type"]: b for b in body["content"]}
        assert blocks["thinking"]["thinking"] == "one two three" and blocks["text"]["text"] == "Done.", body
    r = await client.post("/v1/messages", json={"model": "think", "max_tokens": 100, "messages": ASK,
                                                "thinking": {"type": "enabled", "budget_tokens": 50}})
    blocks = {b["type"]: b for b in (await r.json())["content"]}
    assert blocks["thinking"]["thinking"] == "".join(THOUGHT)  # within the budget: untouched


@pytest.mark.parametrize("budget", [1, 2, 5])
async def test_a_budget_of_n_is_n_thinking_tokens(client, budget):
    """The opening marker is not thinking: a budget of 1 gives one token of it (issue 37)."""
    r = await client.post("/v1/messages", json={"model": "think", "max_tokens": 100, "messages": ASK,
                                                "thinking": {"type": "enabled", "budget_tokens": budget}})
    blocks = {b["type"]: b for b in (await r.json())["content"]}
    assert blocks["thinking"]["thinking"] == "".join(THOUGHT[:budget]) and blocks["text"]["text"] == "Done."


async def test_openai_effort_maps_to_the_models_budget(client):
    r = await client.post("/v1/chat/completions", json={"model": "think", "messages": ASK, "reasoning_effort": "low"})
    message = (await r.json())["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("one two three four", "Done.")
    r = await client.post("/v1/chat/completions", json={"model": "think", "messages": ASK, "reasoning_effort": "none"})
    message = (await r.json())["choices"][0]["message"]
    assert not message.get("reasoning_content") and message["content"] == "Done."
    r = await client.post("/v1/chat/completions", json={"model": "think", "messages": ASK, "reasoning_effort": "high"})
    assert (await r.json())["choices"][0]["message"]["reasoning_content"] == "".join(THOUGHT)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/messages", {"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ("/v1/messages", {"thinking": {"type": "enabled", "budget_tokens": -1}}, "thinking.budget_tokens"),
    ("/v1/messages", {"thinking": {"type": "enabled", "budget_tokens": 100}}, "thinking.budget_tokens"),
    ("/v1/chat/completions", {"reasoning_effort": "extreme"}, "reasoning_effort"),
])
async def test_bad_thinking_fields(client, path, body, param):
    r = await client.post(path, json={"model": "think", "max_tokens": 100, "messages": ASK, **body})
    out = await r.json()
    assert r.status == 400 and out["error"].get("param", param) == param, out
    assert param in out["error"]["message"] or param.split(".")[-1] in out["error"]["message"]
