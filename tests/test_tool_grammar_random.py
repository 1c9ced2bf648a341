"""Required tool calls on a random-weight model with Qwen 2's real 152k vocabulary: whatever
the weights say, every call's arguments parse and validate against the tool's schema, because
the worker samples them under the grammar made from it."""

import json

import jsonschema
import pytest
from helpers import tiny_random_model

from gateway.app import create_app
from gateway.models.config import load_config

pytestmark = pytest.mark.slow

PARAMS = {"type": "object", "additionalProperties": False, "required": ["city", "days", "unit", "tags"],
          "properties": {"city": {"type": "string", "maxLength": 12},
                         "days": {"type": "integer", "minimum": 1, "maximum": 14},
                         "unit": {"enum": ["celsius", "fahrenheit"]},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}}}
TOOL = {"type": "function", "function": {"name": "get_forecast", "description": "Weather forecast", "parameters": PARAMS}}


@pytest.fixture(scope="module")
def model():
    return tiny_random_model("qwen2", seed=7)


async def test_twenty_seeded_required_calls_fit_the_schema(aiohttp_client, model, write_config):
    cfg = load_config(write_config(f"models:\n  random:\n    path: {model}\n    n_ctx: 2048\n    tool_format: hermes\n"))
    client = await aiohttp_client(create_app(cfg))
    # one call per answer: with parallel calls allowed, a random model rarely chooses to end
    for seed in range(20):
        r = await client.post("/v1/chat/completions", json={
            "model": "random", "messages": [{"role": "user", "content": "Forecast for Paris?"}], "tools": [TOOL],
            "tool_choice": "required", "parallel_tool_calls": False, "seed": seed, "temperature": 1.0,
            "max_tokens": 400})
        body = await r.json()
        assert r.status == 200, body
        choice = body["choices"][0]
        assert choice["finish_reason"] == "tool_calls", (seed, choice)
        for call in choice["message"]["tool_calls"]:
            assert call["function"]["name"] == "get_forecast"
            jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMS)
