"""The Responses builder (gateway/wire/responses/) on its own: an answer that breaks
mid-way ends with OpenAI's error event and a failed response, each as OpenAI's schemas say."""

from openapi import validate_event

from gateway.base.errors import ApiError
from gateway.wire import responses
from gateway.wire.answer import Piece


def test_a_broken_answer_ends_with_an_error_event_and_a_failed_response():
    builder = responses.ResponseBuilder("m", responses.parse({"model": "m", "input": "hi"}))
    frames = [*builder.open(), *builder.feed(Piece("content", "Hel"))]
    frames += builder.fail(ApiError("the upstream server broke the stream", status=502, code="upstream_unavailable"))
    events = [event for event, _ in frames]
    for event in events:
        validate_event(event)
    error, failed = events[-2:]
    assert error["type"] == "error" and error["code"] == "upstream_unavailable"
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "server_error",  # the response's codes are OpenAI's
                                           "message": "the upstream server broke the stream"}
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
