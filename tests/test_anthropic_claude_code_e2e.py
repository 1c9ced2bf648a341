"""Requests shaped as Claude Code sends them, through the real `gguf-gateway serve` process and the
official anthropic SDK: its beta headers and fields, a system message inside ``messages``, a tool
parameter without a type, its per-session billing header (a new session reuses the last one's
cache), adaptive thinking with an effort, ``count_tokens`` with thinking, structured output by
``output_config.format``, and context overflows in the words Claude Code parses (its own
regexes, from its 2.1.197 bundle)."""

import json
import re

import anthropic
import pytest
from helpers import WEATHER, ServerProcess, agent_model

from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config

pytestmark = pytest.mark.slow

S = tm.Special
BETAS = "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,an-unknown-beta-2099"
ASK = [{"role": "user", "content": "Weather in Paris?"}]
REMINDER = {"role": "system", "content": "The user's todo list is empty."}
TOOLS = [{"name": "get_weather", "description": "Weather in a city", "input_schema": WEATHER["function"]["parameters"],
          "cache_control": {"type": "ephemeral"}},
         {"name": "Config", "description": "Get or set a setting", "input_schema": {  # Claude Code's own
             "type": "object", "properties": {"setting": {"type": "string"},
                                              "value": {"description": "Optional input value..."}},
             "required": ["setting"], "additionalProperties": False, "$schema": "http://json-schema.org/draft-07/schema#"}},
         {"type": "web_search_20250305", "name": "web_search", "max_uses": 8}]
EXTRA = {"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
         "metadata": {"user_id": "user_x_account__session_1"}}
# Claude Code's regexes (cli bundle 2.1.197: nmc and t3t)
CC_MAX_TOKENS = re.compile(r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)")
CC_TOO_LONG = re.compile(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", re.I)
LONG_SYSTEM = "You are an interactive agent that helps users with software engineering tasks. " * 8


def session(n: int) -> list[dict]:
    """Claude Code's system blocks: the per-session header first, then its prompt."""
    return [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.197.{n:03x}; cc_entrypoint=sdk-cli;"},
            {"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("claude-code")
    agent_model(d / "agent.gguf", ["It", " is", " 18", " C", "."])
    tm.write_scripted_model(d / "think.gguf", [S("<think>"), "one", " two", " three", " four", " five", " six",
                                               S("</think>"), "Done", "."])
    tm.plain(d / "plain.gguf")
    tm.plain(d / "json.gguf", ['{"a":', ' 1}'])
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  events_path: {d}/events.jsonl\nmodels:\n"
                   f"  agent: {d}/agent.gguf\n"
                   f"  think:\n    path: {d}/think.gguf\n    reasoning_budgets: {{low: 3}}\n"
                   f"  plain: {d}/plain.gguf\n  json: {d}/json.gguf\n  small:\n    path: {d}/plain.gguf\n    n_ctx: 256\n")
    with ServerProcess("--config", str(cfg), env={"HOME": str(d)}) as srv:
        srv.events = d / "events.jsonl"
        yield srv


@pytest.fixture
def client(server):
    with anthropic.Anthropic(base_url=server.url, api_key="dummy", max_retries=0,
                             default_headers={"anthropic-beta": BETAS}) as c:
        yield c


# issue 67: dropped decided by the pipeline (web_search_20250305 is now an Ask in Parsed.hosted; the
# pipeline adds it to the dropped tools where no search backend is configured)
def test_a_tool_round_trip_as_claude_code_sends_it(client, server):
    raw = client.messages.with_raw_response.create(model="agent", max_tokens=200, system=session(1),
                                                   messages=[*ASK, REMINDER], tools=TOOLS, extra_body=EXTRA)
    assert raw.headers["X-Gateway-Dropped-Tools"] == "web_search_20250305"
    first = raw.parse()
    [use] = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris"}
    history = [*ASK, REMINDER, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 C",
                                             "cache_control": {"type": "ephemeral"}}]}]
    with client.messages.stream(model="agent", max_tokens=200, system=session(1), messages=history, tools=TOOLS,
                                extra_body=EXTRA) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "end_turn" and final.content[0].text == "It is 18 C."
    events = [json.loads(line) for line in server.events.read_text().splitlines()][-2:]
    assert [e["dropped_tools"] for e in events] == [["web_search_20250305"]] * 2  # left out, and said so


def test_a_new_session_reuses_the_last_ones_cached_prompt(client):
    ask = [{"role": "user", "content": "hello"}]
    first = client.messages.create(model="plain", max_tokens=20, system=session(2), messages=ask)
    second = client.messages.create(model="plain", max_tokens=20, system=session(3), messages=ask)
    prompt = second.usage.input_tokens + second.usage.cache_read_input_tokens
    assert first.usage.input_tokens + first.usage.cache_read_input_tokens == prompt > 100
    assert second.usage.cache_read_input_tokens >= prompt - 8, second.usage


async def test_with_keep_billing_header_a_new_session_starts_afresh(aiohttp_client, tmp_path, write_config):
    tm.plain(tmp_path / "plain.gguf")
    cfg = load_config(write_config(f"server:\n  keep_billing_header: true\nmodels:\n  plain: {tmp_path}/plain.gguf\n"))
    assert cfg.server.keep_billing_header
    http = await aiohttp_client(create_app(cfg))
    usage = []
    for n in (4, 5):
        r = await http.post("/v1/messages", json={"model": "plain", "max_tokens": 20, "system": session(n),
                                                  "messages": [{"role": "user", "content": "hello"}]})
        usage.append((await r.json())["usage"])
    assert usage[1]["cache_read_input_tokens"] < 16 < usage[1]["input_tokens"]  # the template's opening only


def test_adaptive_thinking_takes_its_effort_budget(client):
    low = client.messages.create(model="think", max_tokens=100, messages=ASK, thinking={"type": "adaptive"},
                                 extra_body={"output_config": {"effort": "low"}})
    blocks = {b.type: b for b in low.content}
    assert blocks["thinking"].thinking == "one two three" and blocks["text"].text == "Done."  # low: 3 tokens
    top = client.messages.create(model="think", max_tokens=100, messages=ASK, thinking={"type": "adaptive"},
                                 extra_body={"output_config": {"effort": "max"}})
    assert {b.type: b for b in top.content}["thinking"].thinking == "one two three four five six"


def test_count_tokens_with_thinking_and_no_max_tokens(client):
    history = [*ASK, {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                                       {"type": "text", "text": "Sunny."}]},
               {"role": "user", "content": "Thanks"}, REMINDER]
    count = client.messages.count_tokens(model="think", messages=history, system=session(6), tools=TOOLS,
                                         thinking={"type": "enabled", "budget_tokens": 31999})
    assert count.input_tokens > 100


def test_context_overflows_in_the_words_claude_code_parses(client):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="small", max_tokens=8000, messages=ASK)
    assert e.value.body["error"]["type"] == "invalid_request_error"
    prompt, max_tokens, limit = map(int, CC_MAX_TOKENS.search(str(e.value)).groups())
    assert (max_tokens, limit) == (8000, 256) and 0 < prompt < limit
    shrunk = client.messages.create(model="small", max_tokens=limit - prompt, messages=ASK)  # what Claude Code does
    assert shrunk.stop_reason == "end_turn"
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="small", max_tokens=10, messages=[{"role": "user", "content": "word " * 400}])
    tokens, maximum = map(int, CC_TOO_LONG.search(str(e.value)).groups())
    assert tokens > maximum == 255
    with pytest.raises(anthropic.BadRequestError) as e:  # streamed: refused before the stream opens
        with client.messages.stream(model="small", max_tokens=32000, messages=ASK) as stream:
            stream.get_final_message()
    assert CC_MAX_TOKENS.search(str(e.value))


def test_structured_output_by_output_config_format(client):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "note": {}}, "required": ["a"]}
    msg = client.messages.create(model="json", max_tokens=20, messages=ASK,
                                 extra_body={"output_config": {"format": {"type": "json_schema", "schema": schema}}})
    assert msg.content[0].text == '{"a": 1}'
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="json", max_tokens=20, messages=ASK, extra_body={"output_config": {
            "format": {"type": "json_schema", "schema": {"type": "object", "properties": {"a": False}}}}})
    assert "output_config.format.schema" in e.value.body["error"]["message"]
