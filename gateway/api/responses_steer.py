"""``response.steer`` on the Responses WebSocket (``responses_socket``): what a steering
submission may hold, its acknowledgements as OpenAI's SDK types them, and the request that
carries it into the conversation. Pure: no socket here.

OpenAI's semantics (the SDK's ``ResponseSteerEvent`` and its accepted, pending and failed
events), as this gateway keeps them:

- A steer names the response it steers (``previous_response_id``): the one running on this
  socket. Its input is user messages only (text, images, files); anything else is
  ``invalid_input``. A steer for a response that is not running is refused with
  ``response_already_completed`` (it ran here and ended) or ``response_not_found``.
- Accepted (``response.steer.accepted``, with the steer's id) means the gateway holds it, not
  that it was applied. The running generation is not cut: it ends as it would (OpenAI's
  "normal completion can also be followed by an automatic successor"), and a successor
  response then starts by itself (``successor``): the steered response's settings, continuing
  from it (``previous_response_id`` where it was stored, its history inline where not), with
  the queued input as its input. The successor's ``response.created`` is the commit point; a
  successor that is never created fails each of its steers (``successor_creation_failed``).
- A response that ended waiting for the client (a function call's output, an MCP approval)
  keeps its steers (``response.steer.pending``, with the ``required_input`` stubs it waits
  for); the client's next ``response.create`` continuing it gets them prepended to its input.
- At most ``MAX_STEERS`` wait for one response (``too_many_pending_steers``)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

MAX_STEERS = 16  # steering submissions waiting for one response
MAX_ITEMS = 64  # messages in one submission
_PARTS = frozenset({"input_text", "input_image", "input_file"})
_MESSAGE_KEYS = frozenset({"type", "role", "content", "id", "status"})
# an output item that waits for the client, and the stub of the input that answers it
_REQUIRED = {"function_call": ("function_call_output", "call_id"),
             "custom_tool_call": ("custom_tool_call_output", "call_id"),
             "mcp_approval_request": ("mcp_approval_response", "id")}


class SteerRefused(Exception):
    """A steer the gateway will not queue: ``code`` is one of OpenAI's ``ResponseSteerErrorCode``."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


@dataclass
class Steer:
    """One accepted submission: its id, the response it steers, its input as sent and as items."""

    previous_response_id: str
    input: Any
    items: list[dict[str, Any]]
    size: int = 0  # its frame's bytes (the socket bounds what waits)
    id: str = field(default_factory=lambda: "steer_" + secrets.token_hex(12))


def accept(event: dict[str, Any]) -> tuple[str, Any, list[dict[str, Any]]]:
    """A ``response.steer`` event's target, input and input items; ``SteerRefused``
    (``invalid_input``) where it holds anything but what OpenAI allows."""
    extra = sorted(set(event) - {"type", "previous_response_id", "input"})
    if extra:
        raise SteerRefused("invalid_input", "response.steer accepts only `type`, `previous_response_id` and "
                           f"`input`; it has {', '.join(repr(k[:40]) for k in extra[:5])}")
    target = event.get("previous_response_id")
    if not isinstance(target, str) or not target:
        raise SteerRefused("invalid_input", "response.steer needs `previous_response_id`, the running response's id")
    return target, event.get("input"), items(event.get("input"))


def items(value: Any) -> list[dict[str, Any]]:
    """Steering input as the input items of a ``response.create``: user messages alone."""
    if isinstance(value, str):
        if not value:
            raise SteerRefused("invalid_input", "`input` is empty")
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise SteerRefused("invalid_input", "`input` must be a string or a non-empty array of user messages")
    if len(value) > MAX_ITEMS:
        raise SteerRefused("invalid_input", f"`input` has {len(value)} items; at most {MAX_ITEMS}")
    out = []
    for n, item in enumerate(value):
        where = f"`input[{n}]`"
        if not isinstance(item, dict) or item.get("type", "message") != "message" or item.get("role") != "user":
            raise SteerRefused("invalid_input", f"{where}: steering takes user messages only")
        if set(item) - _MESSAGE_KEYS:
            raise SteerRefused("invalid_input", f"{where}: a message holds only `type`, `role` and `content`")
        content = item.get("content")
        if isinstance(content, list):
            if not content or any(not isinstance(p, dict) or p.get("type") not in _PARTS for p in content):
                raise SteerRefused("invalid_input", f"{where}.content: parts are input_text, input_image or "
                                   "input_file")
        elif not isinstance(content, str) or not content:
            raise SteerRefused("invalid_input", f"{where}.content must be a string or an array of parts")
        out.append({"type": "message", "role": "user", "content": content})
    return out


def accepted(steer: Steer, seq: int) -> dict[str, Any]:
    return {"type": "response.steer.accepted", "sequence_number": seq,
            "steer": {"id": steer.id, "previous_response_id": steer.previous_response_id}}


def pending(steer: Steer, required: list[dict[str, Any]], seq: int) -> dict[str, Any]:
    return {"type": "response.steer.pending", "sequence_number": seq, "reason": "waiting_for_required_input",
            "required_input": required, "steer": {"id": steer.id, "previous_response_id": steer.previous_response_id}}


def failed(code: str, message: str, target: str, given: Any, seq: int, steer_id: str | None = None) -> dict[str, Any]:
    steer: dict[str, Any] = {"previous_response_id": target, "input": given}
    if steer_id is not None:
        steer["id"] = steer_id
    return {"type": "response.steer.failed", "sequence_number": seq, "steer": steer,
            "error": {"type": "invalid_request_error", "code": code, "message": message}}


def required_input(output: list[Any]) -> list[dict[str, Any]]:
    """The stubs of what a finished response waits for from its client (its calls of the
    client's tools, its MCP approval requests), in its output's order."""
    stubs = []
    for item in output:
        if isinstance(item, dict) and item.get("type") in _REQUIRED:
            kind, key = _REQUIRED[item["type"]]
            if kind == "mcp_approval_response":
                stubs.append({"type": kind, "approval_request_id": item.get(key)})
            elif kind == "function_call_output":  # the SDK's stub names the function
                stubs.append({"type": kind, "call_id": item.get(key), "name": item.get("name")})
            else:
                stubs.append({"type": kind, "call_id": item.get(key)})
    return stubs


def successor(body: dict[str, Any], final: dict[str, Any], steers: list[Steer]) -> dict[str, Any]:
    """The ``response.create`` body of the response that continues ``final`` (made from
    ``body``) with ``steers``' input: the same settings; stored, it continues by its id,
    otherwise its input and output are carried inline before the steers'."""
    out = dict(body)
    queued = [item for steer in steers for item in steer.items]
    if out.get("store", True) is not False:
        out["previous_response_id"] = final["id"]
        out["input"] = queued
    else:
        out["input"] = [*as_items(body.get("input")), *final.get("output", []), *queued]
    return out


def prepended(body: dict[str, Any], steers: list[Steer]) -> dict[str, Any]:
    """``body`` with ``steers``' input before its own, in submission order."""
    return {**body, "input": [*(item for steer in steers for item in steer.items), *as_items(body.get("input"))]}


def as_items(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value) if isinstance(value, list) else [value]
