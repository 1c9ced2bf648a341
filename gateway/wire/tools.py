"""Tools on the wire: OpenAI's and Anthropic's tool definitions, tool choice and tool history,
read into one shape (the convention of Hugging Face's chat templates, which llama.cpp's own
server follows too):

- a tool: ``{"type": "function", "function": {"name", "description", "parameters"}}``;
- an assistant's calls: ``{"role": "assistant", "content": ..., "tool_calls": [{"id", "type":
  "function", "function": {"name", "arguments": {...}}}]}`` (arguments as an object; the chat
  template renderer hands them as a JSON string to templates that read them as one);
- a result: ``{"role": "tool", "tool_call_id", "name", "content"}``.

A choice is one of ``auto``, ``none``, ``required`` and optionally the tools the model may call
when not all of them: a tool's name (which makes it ``required`` for that one tool), or the
names of OpenAI's ``allowed_tools`` (in their mode; every tool stays in the prompt, as on
OpenAI, so the prompt cache holds, and the call grammar offers the allowed ones only). Every
mistake is an ``InvalidRequest`` naming the param.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..base import strictjson
from ..base.errors import InvalidRequest
from .asks import RESPONSES_RUNS, anthropic_runs
from .params import check_schema, named, shown

MAX_TOOLS = 128  # OpenAI's own limit
NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")  # OpenAI allows [A-Za-z0-9_-]{1,64}; MCP names add . and :
CHOICES = ("auto", "none", "required")

# What a model that reads text alone is told of an image (or a file) in a tool's result (an
# agent's screenshot or file viewer): the turn goes on, and the history stays valid next turn.
IMAGE_NOTE = "[an image this model cannot see]"


@dataclass
class ToolChoice:
    mode: str = "auto"  # auto | none | required
    # the tools the model may call, when not all (goes into the request's ``tool_names``)
    names: tuple[str, ...] | None = None
    parallel: bool = True  # several calls in one answer


def allowed_choice(mode: Any, picks: list[tuple[str, Any]], tools: list[dict[str, Any]] | None, parallel: bool,
                   mode_param: str, list_param: str) -> ToolChoice:
    """OpenAI's ``allowed_tools``: ``mode`` (auto or required) over the tools named in
    ``picks`` ((param, name) each, read from the wire's own shape), each of which must be in
    ``tools``. All of them allowed is no restriction; none of them (a list of hosted tools this
    server leaves out) is ``none``."""
    if mode is None:
        mode = "auto"
    if mode not in ("auto", "required"):
        raise InvalidRequest(f"`{mode_param}` must be auto or required, got {shown(mode)}", mode_param)
    if not tools and mode == "required":
        raise InvalidRequest(f"`{mode_param}` \"required\" needs `tools`", mode_param)
    wanted = set()
    for param, name in picks:
        if not isinstance(name, str):
            raise InvalidRequest(f"`{param}` must be a tool's name", param)
        wanted.add(_known(name, tools, param))
    names = [t["function"]["name"] for t in tools or () if t["function"]["name"] in wanted]
    if not names:
        if mode == "required":
            raise InvalidRequest(f"`{list_param}` allows no tool this server can call, and the mode is required",
                                 list_param)
        return ToolChoice("none", None, parallel)
    return ToolChoice(mode, None if len(names) == len(tools or ()) else tuple(names), parallel)


def _schema(value: Any, where: str, anthropic: bool) -> dict[str, Any]:
    if value is None:
        return {"type": "object", "properties": {}}
    if not isinstance(value, dict) or value.get("type", "object") != "object":
        raise InvalidRequest(f"{named(where, anthropic)} must be a JSON Schema object with type \"object\"", where)
    return value


def _tool(name: Any, description: Any, parameters: Any, where: str, *, name_at: str, schema_at: str,
          anthropic: bool = False) -> dict[str, Any]:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidRequest(f"{named(name_at, anthropic)} must be a name of 1 to 128 letters, digits, _ . : or -, "
                             f"got {shown(name)}", name_at)
    if description is not None and not isinstance(description, str):
        raise InvalidRequest(f"{named(where + '.description', anthropic)} must be a string", f"{where}.description")
    function = {"name": name, "parameters": _schema(parameters, schema_at, anthropic)}
    check_schema(function["parameters"], schema_at, anthropic)
    if description:
        function["description"] = description
    return {"type": "function", "function": function}


def _checked(tools: list[dict[str, Any]], param: str, anthropic: bool = False) -> list[dict[str, Any]]:
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        name = tool["function"]["name"]
        if name in seen:
            at = f"{param}.{i}" if anthropic else f"{param}[{i}]"
            raise InvalidRequest(f"{named(param, anthropic)} names the tool {shown(name)} twice", at)
        seen.add(name)
    return tools


def _list(value: Any, param: str, anthropic: bool = False) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidRequest(f"{named(param, anthropic)} must be an array of tools", param)
    if len(value) > MAX_TOOLS:
        raise InvalidRequest(f"{named(param, anthropic)} may hold at most {MAX_TOOLS} tools, got {len(value)}", param)
    return value


# --- OpenAI ------------------------------------------------------------------------------------

def openai_tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Chat's function tools. A hosted tool the gateway runs (``asks.RESPONSES_RUNS``, in the
    Responses shape) is passed over here and read by ``asks.responses_asks``; any other type is
    a 400."""
    value = body.get("tools")
    if value is None:
        return None
    tools = []
    for i, t in enumerate(_list(value, "tools")):
        where = f"tools[{i}]"
        if isinstance(t, dict) and t.get("type") in RESPONSES_RUNS:
            continue
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise InvalidRequest(f"`{where}` must be {{\"type\": \"function\", \"function\": {{...}}}}",
                                 f"{where}.type")
        f = t["function"]
        tools.append(_tool(f.get("name"), f.get("description"), f.get("parameters"), f"{where}.function",
                           name_at=f"{where}.function.name", schema_at=f"{where}.function.parameters"))
    return _checked(tools, "tools") or None


def openai_tool_choice(body: dict[str, Any], tools: list[dict[str, Any]] | None) -> ToolChoice:
    choice, parallel = body.get("tool_choice"), body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise InvalidRequest("`parallel_tool_calls` must be true or false", "parallel_tool_calls")
    if choice is None:
        return ToolChoice("auto", None, parallel)
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise InvalidRequest(f"`tool_choice` must be one of {', '.join(CHOICES)} or a named function, "
                                 f"got {shown(choice)}", "tool_choice")
        if choice == "required" and not tools:
            raise InvalidRequest("`tool_choice` \"required\" needs `tools`", "tool_choice")
        return ToolChoice(choice, None, parallel)
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        spec = choice.get("allowed_tools")
        entries = spec.get("tools") if isinstance(spec, dict) else None
        where = "tool_choice.allowed_tools.tools"
        if not isinstance(entries, list) or not entries:
            raise InvalidRequest(f"`{where}` must be a non-empty array of "
                                 "{\"type\": \"function\", \"function\": {\"name\": ...}}", where)
        picks = []
        for i, entry in enumerate(entries):
            f = entry.get("function") if isinstance(entry, dict) and entry.get("type") == "function" else None
            if not isinstance(f, dict):
                raise InvalidRequest(f"`{where}[{i}]` must be {{\"type\": \"function\", \"function\": "
                                     "{\"name\": ...}}", f"{where}[{i}]")
            picks.append((f"{where}[{i}].function.name", f.get("name")))
        assert isinstance(spec, dict)
        return allowed_choice(spec.get("mode"), picks, tools, parallel, "tool_choice.allowed_tools.mode", where)
    function = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise InvalidRequest("`tool_choice` must be a string or "
                             "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")
    return ToolChoice("required", (_known(name, tools, "tool_choice.function.name"),), parallel)


def _known(name: str, tools: list[dict[str, Any]] | None, param: str, anthropic: bool = False) -> str:
    if not any(t["function"]["name"] == name for t in tools or ()):
        raise InvalidRequest(f"{named(param, anthropic)} names {shown(name)}, which is not in `tools`", param)
    return name


def openai_calls(value: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls``, arguments read into objects."""
    if not isinstance(value, list):
        raise InvalidRequest(f"`{where}` must be an array of tool calls", where)
    calls = []
    for j, call in enumerate(value):
        at = f"{where}[{j}]"
        f = call.get("function") if isinstance(call, dict) else None
        if not isinstance(f, dict) or not isinstance(call.get("id"), str) or not isinstance(f.get("name"), str):
            raise InvalidRequest(f"`{at}` must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", "
                                 "\"arguments\"}}}}", at)
        args = f.get("arguments", "{}")
        if isinstance(args, str):  # strict and bounded, a 400 naming the field (base/strictjson)
            args = strictjson.loads(args or "{}", f"{at}.function.arguments")
        if not isinstance(args, dict):
            raise InvalidRequest(f"`{at}.function.arguments` must be a JSON object in a string",
                                 f"{at}.function.arguments")
        calls.append({"id": call["id"], "type": "function", "function": {"name": f["name"], "arguments": args}})
    return calls


class CallLedger:
    """The calls made so far in a conversation, so a tool result can be matched to its call."""

    def __init__(self, anthropic: bool = False) -> None:
        self.names: dict[str, str] = {}
        self.anthropic = anthropic  # how its errors name the param

    def add(self, calls: list[dict[str, Any]]) -> None:
        for call in calls:
            self.names[call["id"]] = call["function"]["name"]

    def name_of(self, call_id: Any, param: str) -> str:
        if not isinstance(call_id, str):
            raise InvalidRequest(f"{named(param, self.anthropic)} must be the id of an earlier tool call", param)
        if call_id not in self.names:
            raise InvalidRequest(f"{named(param, self.anthropic)} {shown(call_id)} matches no tool call made earlier "
                                 "in `messages`", param)
        return self.names[call_id]


# --- Anthropic ---------------------------------------------------------------------------------

def anthropic_tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Anthropic's custom tools. A tool of another ``type`` (Anthropic's own: ``web_search_...``,
    ``bash_...``, ``text_editor_...``, ...) comes without a schema: one the gateway runs (web
    search and fetch, ``mcp_toolset``) is read by ``asks.anthropic_asks``; the others are run by
    Anthropic or known to its models only, and are left out, as on a server that does not offer
    them."""
    value = body.get("tools")
    if value is None:
        return None
    tools = []
    for i, t in enumerate(_list(value, "tools", anthropic=True)):
        where = f"tools.{i}"
        if not isinstance(t, dict):
            raise InvalidRequest(f"{where}: must be an object", where)
        if not isinstance(t.get("type"), str | None):
            raise InvalidRequest(f"{where}.type: must be a string", f"{where}.type")
        if t.get("type") not in (None, "custom"):
            continue
        if "input_schema" not in t:
            raise InvalidRequest(f"{where}.input_schema: Field required", f"{where}.input_schema")
        tools.append(_tool(t.get("name"), t.get("description"), t["input_schema"], where,
                           name_at=f"{where}.name", schema_at=f"{where}.input_schema", anthropic=True))
    return _checked(tools, "tools", anthropic=True) or None


def anthropic_left_out(body: dict[str, Any]) -> list[str]:
    """The types of the tools ``anthropic_tools`` leaves out and the gateway cannot run (not
    ``asks.anthropic_runs``), each once, in order."""
    value = body.get("tools")
    types = [t.get("type") for t in value if isinstance(t, dict)] if isinstance(value, list) else []
    return list(dict.fromkeys(t for t in types if isinstance(t, str) and t != "custom" and not anthropic_runs(t)))


def anthropic_tool_choice(body: dict[str, Any], tools: list[dict[str, Any]] | None,
                          hosted: dict[str, str] | None = None) -> ToolChoice:
    """``tool_choice`` in Anthropic's shape; ``hosted``: the request's hosted tools' names (its
    ``web_search``...) -> the functions the pipeline offers for them, which a choice may name too."""
    hosted = hosted or {}
    choice = body.get("tool_choice")
    if choice is None:
        return ToolChoice("auto")
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise InvalidRequest("tool_choice.type: must be auto, any, tool or none", "tool_choice.type")
    parallel = choice.get("disable_parallel_tool_use", False)
    if not isinstance(parallel, bool):
        raise InvalidRequest("tool_choice.disable_parallel_tool_use: must be true or false",
                             "tool_choice.disable_parallel_tool_use")
    if kind in ("any", "tool") and not tools and not hosted:
        raise InvalidRequest(f"tool_choice.type: {shown(kind)} needs `tools`", "tool_choice.type")
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str):
            raise InvalidRequest("tool_choice.name: Field required", "tool_choice.name")
        if name in hosted:
            return ToolChoice("required", (hosted[name],), not parallel)
        return ToolChoice("required", (_known(name, tools, "tool_choice.name", anthropic=True),), not parallel)
    return ToolChoice("required" if kind == "any" else str(kind), None, not parallel)
