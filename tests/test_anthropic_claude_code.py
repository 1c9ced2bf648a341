"""Anthropic Messages as Claude Code sends them, read by the parser (pure): system messages inside
``messages``, its per-session billing header, adaptive thinking and ``output_config.effort``,
``count_tokens`` without ``max_tokens``, fields that do not apply, and context overflows told
in the words Claude Code parses."""

import re

import pytest

from gateway.base.errors import ApiError, InvalidRequest
from gateway.text.schemacheck import allows_any, schema_problem
from gateway.wire import anthropic
from gateway.wire import media as wire_media
from gateway.wire.media import MARKER
from gateway.wire.tools import IMAGE_NOTE, anthropic_left_out

USER = {"role": "user", "content": "hi"}
BILLING = "x-anthropic-billing-header: cc_version=2.1.197.4f2; cc_entrypoint=sdk-cli; cch=00000;"
# Claude Code 2.1.197's own regexes (its cli bundle), in Python's spelling
CC_MAX_TOKENS = re.compile(r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)")
CC_TOO_LONG = re.compile(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", re.I)


def parse(**body):
    return anthropic.parse({"model": "m", "max_tokens": 64, "messages": [USER], **body})


def messages(*raw, **body):
    return parse(messages=list(raw), **body).request.messages


def reminder(text: str) -> str:
    return f"<system-reminder>\n{text}\n</system-reminder>"


# --- system messages inside messages ---------------------------------------------------------

def test_a_leading_system_message_joins_the_system_prompt():
    assert messages({"role": "system", "content": "rules"}, USER) == [{"role": "system", "content": "rules"}, USER]
    assert messages({"role": "system", "content": [{"type": "text", "text": "more"}]}, USER, system="top") == [
        {"role": "system", "content": "top\n\nmore"}, USER]


def test_a_later_system_message_is_folded_into_the_next_user_turn():
    got = messages(USER, {"role": "assistant", "content": "ok"}, {"role": "system", "content": "note"},
                   {"role": "user", "content": [{"type": "text", "text": "go", "cache_control": {"type": "ephemeral"}}]})
    assert got[-1] == {"role": "user", "content": reminder("note") + "\ngo"}
    assert [m["role"] for m in got] == ["user", "assistant", "user"]


def test_with_no_user_turn_next_it_joins_the_one_before_or_stands_alone():
    assert messages(USER, {"role": "system", "content": "a"}, {"role": "system", "content": "b"}) == [
        {"role": "user", "content": "hi\n" + reminder("a") + "\n" + reminder("b")}]
    got = messages(USER, {"role": "assistant", "content": "ok"}, {"role": "system", "content": "c"})
    assert got[-1] == {"role": "user", "content": reminder("c")} and [m["role"] for m in got] == [
        "user", "assistant", "user"]
    between = messages(USER, {"role": "system", "content": "d"}, {"role": "assistant", "content": "ok"})
    assert between[0] == {"role": "user", "content": "hi\n" + reminder("d")}


def test_a_system_message_between_a_call_and_its_result_keeps_the_result_first():
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"}]}
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    got = messages(USER, call, {"role": "system", "content": "r"}, result, tools=tools)
    assert [m["role"] for m in got] == ["user", "assistant", "tool", "user"]
    assert got[-1]["content"] == reminder("r")


@pytest.mark.parametrize("bad", [{"role": "tool", "content": "x"}, {"role": "system", "content": 5},
                                 {"role": "system", "content": [{"type": "image"}]}])
def test_other_roles_and_bad_system_content_are_still_refused(bad):
    with pytest.raises(InvalidRequest) as e:
        messages(USER, bad)
    assert e.value.param.startswith("messages.1")


# --- the per-session billing header ------------------------------------------------------------

def test_the_billing_header_block_is_left_out_unless_kept():
    system = [{"type": "text", "text": BILLING}, {"type": "text", "text": "You are Claude Code.",
                                                  "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    assert parse(system=system).request.messages[0] == {"role": "system", "content": "You are Claude Code."}
    kept = anthropic.parse({"model": "m", "max_tokens": 9, "messages": [USER], "system": system},
                           keep_billing_header=True)
    assert kept.request.messages[0]["content"] == BILLING + "You are Claude Code."
    assert parse(system=BILLING + "\n").request.messages == [USER]  # a string that is only the header


def test_only_a_block_of_nothing_but_header_lines_is_left_out():
    mixed = f"{BILLING}\nYou are Claude Code."
    assert parse(system=[{"type": "text", "text": mixed}]).request.messages[0]["content"] == mixed
    assert anthropic.per_session_header(f"{BILLING}\n\nX-Anthropic-Billing-Header: again")
    assert not anthropic.per_session_header("") and not anthropic.per_session_header("x-anthropic-other: 1")


def test_a_bad_block_after_the_header_is_named_by_its_own_index():
    with pytest.raises(InvalidRequest) as e:
        parse(system=[{"type": "text", "text": BILLING}, {"type": "image"}])
    assert e.value.param == "system.1.type"


# --- thinking ------------------------------------------------------------------------------------

@pytest.mark.parametrize("effort, mapped", [("low", "low"), ("medium", "medium"), ("high", "high"),
                                            ("xhigh", "high"), ("max", "high")])
def test_adaptive_thinking_and_effort_map_onto_the_effort_budgets(effort, mapped):
    p = parse(thinking={"type": "adaptive", "display": "summarized"}, output_config={"effort": effort})
    assert p.reasoning_effort == mapped and p.request.chat_template_kwargs == {"enable_thinking": True}
    assert p.request.thinking_budget is None  # set from the model's budgets once it is known
    assert parse(thinking={"type": "adaptive"}).reasoning_effort is None


@pytest.mark.parametrize("body, param", [
    ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
    ({"output_config": "low"}, "output_config"),
    ({"thinking": {"type": "sometimes"}}, "thinking.type"),
])
def test_bad_effort_and_thinking_are_refused(body, param):
    with pytest.raises(InvalidRequest) as e:
        parse(**body)
    assert e.value.param == param


def test_count_tokens_needs_no_max_tokens_even_with_thinking():
    body = {"model": "m", "messages": [USER], "thinking": {"type": "enabled", "budget_tokens": 10000}}
    p = anthropic.parse(body, counting=True)
    assert p.request.max_tokens is None and p.request.thinking_budget == 10000
    with pytest.raises(InvalidRequest, match="max_tokens"):
        anthropic.parse(body)
    assert anthropic.parse({**body, "max_tokens": 1}, counting=True).request.thinking_budget == 10000


# --- what does not apply is accepted -----------------------------------------------------------

def test_fields_that_do_not_apply_are_accepted_and_ignored():
    p = parse(context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
              metadata={"user_id": "u"}, container="c1", mcp_servers=[{"type": "url", "url": "http://x", "name": "x"}],
              service_tier="auto", betas=["x"], output_config={"format": None, "task_budget": 1},
              system=[{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
              messages=[{"role": "user", "content": [{"type": "text", "text": "q", "cache_control": {}}]}])
    assert p.request.messages == [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    assert [(a.kind.value, a.server) for a in p.hosted] == [("mcp", "x")]  # the pipeline runs it, or drops it


def test_anthropics_own_tools_are_left_out():
    custom = {"name": "Bash", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"},
              "defer_loading": False}
    p = parse(tools=[{"type": "web_search_20250305", "name": "web_search", "max_uses": 8}, custom,
                     {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}])
    assert [t["function"]["name"] for t in p.request.tools] == ["Bash"]
    # issue 67: web search is a hosted tool the gateway can run: asked for, not left out
    assert p.dropped == ["text_editor_20250728"] and [a.type for a in p.hosted] == ["web_search_20250305"]
    assert anthropic_left_out({"tools": [*[{"type": "web_search_20250305"}] * 2, custom, {"type": "custom"},
                                         {"type": "bash_20250124"}]}) == ["bash_20250124"]
    assert parse(tools=[{"type": "web_search_20250305", "name": "web_search"}]).request.tools is None


def test_claude_codes_untyped_parameter_is_any_value():
    schema = {"type": "object", "properties": {"value": {"description": "Optional input value..."}}}
    p = parse(tools=[{"name": "Config", "input_schema": schema}])
    assert p.request.tools[0]["function"]["parameters"] == schema
    assert schema_problem(schema) is None and allows_any(schema["properties"]["value"])


@pytest.mark.parametrize("schema, any_value", [
    (True, True), ({}, True), ({"description": "d", "title": "t", "default": 1}, True),
    ({"minLength": 2, "format": "date"}, True), ({"additionalProperties": True}, True),
    (False, False), ({"type": "string"}, False), ({"enum": [1]}, False), ({"properties": {}}, False),
    ({"items": {}}, False), ({"anyOf": [{}]}, False), ({"$ref": "#"}, False), ({"pattern": "^a$"}, False),
    ({"additionalProperties": False}, False), ("string", False),
])
def test_which_schemas_allow_any_value(schema, any_value):
    assert allows_any(schema) is any_value


# --- context overflows in Anthropic's words ----------------------------------------------------

PROMPTS_REFUSAL = ("This model's maximum context length is 4096 tokens. However, you requested {want} tokens "
                   "({prompt} in the prompt, {completion} for the completion). Please reduce the prompt or max_tokens.")


def overflow(message: str) -> ApiError:
    return ApiError(message, param="messages", code="context_length_exceeded")


def test_the_prompt_and_max_tokens_past_the_context_is_claude_codes_max_tokens_error():
    err = anthropic.context_error(overflow(PROMPTS_REFUSAL.format(want=5000, prompt=1000, completion=4000)))
    assert err.status == 400 and err.anthropic_body()["error"]["type"] == "invalid_request_error"
    assert err.message == ("input length and `max_tokens` exceed context limit: 1000 + 4000 > 4096, "
                           "decrease input length or `max_tokens` and try again")
    assert CC_MAX_TOKENS.search(err.message).groups() == ("1000", "4000", "4096")


def test_the_prompt_alone_past_the_context_is_claude_codes_prompt_too_long():
    err = anthropic.context_error(overflow(PROMPTS_REFUSAL.format(want=4100, prompt=4100, completion=0)))
    assert err.message == "prompt is too long: 4100 tokens > 4095 maximum"
    assert CC_TOO_LONG.search(err.message).groups() == ("4100", "4095")
    by_bytes = anthropic.context_error(overflow(
        "This model's maximum context length is 4096 tokens. However, the messages is 90000 bytes long, at least "
        "9000 tokens (no token of this model stands for more than 10 bytes). Please reduce the messages."))
    assert by_bytes.message == "prompt is too long: at least 9000 tokens > 4095 maximum (the prompt is 90000 bytes long)"
    assert CC_TOO_LONG.search(by_bytes.message).groups() == ("9000", "4095")


def test_other_errors_pass_as_they_are():
    for err in (ApiError("busy", status=429), overflow("an upstream's own words about its context")):
        assert anthropic.context_error(err) is err


# --- structured output ---------------------------------------------------------------------------

def test_output_config_format_is_a_json_schema_response_format():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    for body in ({"output_config": {"format": {"type": "json_schema", "schema": schema}, "effort": "low"}},
                 {"output_format": {"type": "json_schema", "schema": schema}}):
        req = parse(**body).request
        assert (req.response_format, req.json_schema) == ("json_schema", schema)
    assert parse().request.response_format is None
    with pytest.raises(InvalidRequest) as e:
        parse(output_config={"format": {"type": "json_schema", "schema": {"type": "string", "minLength": -1}}})
    assert e.value.param == "output_config.format.schema.minLength"
    with pytest.raises(InvalidRequest) as e:
        parse(output_config={"format": {"type": "xml"}})
    assert e.value.param == "output_config.format"


def test_an_image_in_a_tool_result_is_told_not_refused():
    """Claude Code's Read of a picture answers with an image block: a 400 there would fail every
    later turn of the session, as the image stays in the history."""
    body = {"model": "m", "max_tokens": 10, "messages": [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"p": "a.png"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]}]}
    req = anthropic.parse(body).request
    assert req.messages[-1]["role"] == "tool" and req.messages[-1]["content"] == MARKER
    assert [(m.param, m.note) for m in req.media] == [("messages.2.content.0.content.0", IMAGE_NOTE)]
    wire_media.require(req, {"vision": False}, "m")  # a model that takes no pictures reads the note
    assert req.messages[-1]["content"] == IMAGE_NOTE and req.media == []
    body["messages"].append({"role": "user", "content": [{"type": "image", "source": {"type": "base64",
                                                                                      "data": "iVBORw0KGgo="}}]})
    req = anthropic.parse(body).request
    with pytest.raises(InvalidRequest) as e:  # an image the user sends is refused by such a model
        wire_media.require(req, {"vision": False}, "m")
    assert e.value.param == "messages.3.content.0"
