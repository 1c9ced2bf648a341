"""What a ``response.steer`` may hold and the requests that carry it (``api/responses_steer``),
checked against the openai SDK's own types for the events it answers with."""

from __future__ import annotations

import pytest
from openai.types.responses import (
    ResponseSteerAcceptedEvent,
    ResponseSteerFailedEvent,
    ResponseSteerPendingEvent,
)

from gateway.api import responses_steer as steering
from gateway.api.responses_steer import Steer, SteerRefused


def test_user_messages_are_the_steering_input():
    assert steering.items("go left") == [{"type": "message", "role": "user", "content": "go left"}]
    parts = [{"type": "input_text", "text": "and"}, {"type": "input_image", "image_url": "data:image/png;base64,"}]
    assert steering.items([{"role": "user", "content": parts}]) == [{"type": "message", "role": "user",
                                                                     "content": parts}]


@pytest.mark.parametrize("given", [
    "", [], None, 3, [{"role": "assistant", "content": "x"}], [{"role": "system", "content": "x"}],
    [{"type": "function_call_output", "call_id": "c", "output": "x"}],
    [{"role": "user", "content": "x", "name": "extra"}], [{"role": "user", "content": [{"type": "output_text"}]}],
    [{"role": "user", "content": ""}], [{"role": "user", "content": "x"}] * (steering.MAX_ITEMS + 1),
])
def test_anything_else_is_invalid_input(given):
    with pytest.raises(SteerRefused) as refused:
        steering.items(given)
    assert refused.value.code == "invalid_input"


def test_a_steer_event_takes_three_fields():
    assert steering.accept({"type": "response.steer", "previous_response_id": "resp_1", "input": "x"})[0] == "resp_1"
    for event in ({"type": "response.steer", "input": "x"},
                  {"type": "response.steer", "previous_response_id": "resp_1", "input": "x", "stream_id": "a"}):
        with pytest.raises(SteerRefused):
            steering.accept(event)


def test_its_events_are_the_sdks():
    steer = Steer("resp_1", "x", steering.items("x"))
    assert ResponseSteerAcceptedEvent.model_validate(steering.accepted(steer, 0)).steer.id == steer.id
    pending = ResponseSteerPendingEvent.model_validate(
        steering.pending(steer, [{"type": "function_call_output", "call_id": "call_1", "name": "f"}], 1))
    assert pending.reason == "waiting_for_required_input" and pending.required_input[0].call_id == "call_1"
    failed = ResponseSteerFailedEvent.model_validate(steering.failed("response_not_found", "no", "resp_1", "x", 2))
    assert failed.error.code == "response_not_found" and failed.steer.id is None


def test_what_a_response_waits_for():
    output = [{"type": "message"}, {"type": "function_call", "call_id": "c1", "name": "get_weather"},
              {"type": "mcp_approval_request", "id": "mcpr_1"}]
    assert steering.required_input(output) == [{"type": "function_call_output", "call_id": "c1", "name": "get_weather"},
                                               {"type": "mcp_approval_response", "approval_request_id": "mcpr_1"}]


def test_the_successor_continues_the_steered_response():
    steers = [Steer("resp_1", "a", steering.items("a")), Steer("resp_1", "b", steering.items("b"))]
    body = {"model": "m", "input": "first", "instructions": "Be brief.", "max_output_tokens": 9, "stream": True}
    final = {"id": "resp_1", "output": [{"type": "message", "role": "assistant", "content": []}]}
    stored = steering.successor(body, final, steers)
    assert stored["previous_response_id"] == "resp_1" and [i["content"] for i in stored["input"]] == ["a", "b"]
    assert stored["instructions"] == "Be brief." and stored["max_output_tokens"] == 9
    inline = steering.successor({**body, "store": False}, final, steers)
    assert "previous_response_id" not in inline
    assert [i.get("content") for i in inline["input"]] == ["first", [], "a", "b"]
    assert [i["content"] for i in steering.prepended({"input": "own"}, steers)["input"]] == ["a", "b", "own"]
