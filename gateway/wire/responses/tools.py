"""The Responses API's tools (``tools``, ``tool_choice``) as Codex sends them, offered to the
model as chat-template functions, and a custom tool's input read back from the call the model
wrote.

A ``namespace`` tool's tools are offered under Codex's flat names (``namespace__name``) and their
calls are named back as ``name`` plus ``namespace`` (``ToolOrigin``); a ``custom`` tool (free
text, such as ``apply_patch``) is offered as a function of one string argument, ``input``; the
hosted tools the gateway can run (web search, ``mcp``) are read into ``ToolSet.hosted``
(``wire.asks``), and the others (``file_search``, ``image_generation``, ...) are left out of the
prompt, and the response says which (``ToolSet.dropped``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ...base import strictjson
from ...base.errors import InvalidRequest
from ...tools.hosted import Ask, Kind, function_name
from .. import asks as wire_asks
from .. import tools as wire_tools
from ..params import shown

CUSTOM_INPUT = "input"  # a custom tool's one argument, as offered to the model: its free text
TOOL_TYPE = re.compile(r"[a-z0-9_]{1,64}")  # a tool type this server may drop (and name in a header)


@dataclass(frozen=True)
class ToolOrigin:
    """A tool the model is offered under another name or shape than the caller gave."""

    name: str  # the caller's own name for it
    namespace: str | None = None  # the namespace tool it came in
    custom: bool = False  # free text in (its one argument, ``input``), a ``custom_tool_call`` out


@dataclass
class ToolSet:
    tools: list[dict[str, Any]]  # function tools in the chat templates' shape, flattened
    origins: dict[str, ToolOrigin]
    dropped: list[str]  # the types of the tools left out, each once, in order
    echo: list[dict[str, Any]]  # the tools as the response repeats them
    hosted: list[Ask] = field(default_factory=list)  # the hosted tools the gateway may run


def flat_name(namespace: str | None, name: str) -> str:
    """The name a namespaced tool is offered under: Codex's own flat form (``ToolName::
    canonical_flat_name``: the namespace's trailing and the name's leading underscores trimmed,
    joined by ``__``), so a model trained on Codex's transcripts calls it as it learned to."""
    if namespace is None:
        return name
    return f"{namespace.rstrip('_')}__{name.lstrip('_')}"


def _custom_parameters(tool: dict[str, Any], where: str) -> tuple[dict[str, Any], str | None]:
    """A custom tool as a function: one string argument, its format (a grammar) told in the
    description, since the answer's grammar only holds the call's JSON."""
    fmt = tool.get("format")
    note = None
    if isinstance(fmt, dict) and fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str):
        note = f"The input follows this {fmt.get('syntax') or 'grammar'} grammar:\n{fmt['definition']}"
    elif fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") in ("text", "grammar")):
        raise InvalidRequest(f"`{where}.format` must be {{\"type\": \"text\"}} or a grammar", f"{where}.format")
    schema = {"type": "object", "properties": {CUSTOM_INPUT: {"type": "string"}}, "required": [CUSTOM_INPUT]}
    return schema, note


def _function(tool: dict[str, Any], where: str, namespace: str | None, out: ToolSet) -> None:
    """One function or custom tool (in ``namespace``, if any) into ``out``."""
    name, kind = tool.get("name"), tool.get("type")
    offered = flat_name(namespace, name) if isinstance(name, str) else name
    description, parameters = tool.get("description"), tool.get("parameters")
    if kind == "custom":
        parameters, note = _custom_parameters(tool, where)
        if note:
            description = f"{description}\n\n{note}" if isinstance(description, str) and description else note
    out.tools.append(wire_tools._tool(offered, description, parameters, where, name_at=f"{where}.name",
                                      schema_at=f"{where}.parameters"))
    if namespace is not None or kind == "custom":
        assert isinstance(offered, str) and isinstance(name, str)
        out.origins[offered] = ToolOrigin(name, namespace, kind == "custom")


def read_tools(value: Any) -> ToolSet:
    """``tools``: function, custom and namespace tools for the model; the hosted tools the
    gateway can run as ``hosted`` (repeated in the response without their ``headers`` and
    ``authorization``); any other (hosted) tool left out and named in ``dropped``. Flattened,
    at most ``MAX_TOOLS``, each name once."""
    out = ToolSet([], {}, [], [])
    if value is None:
        return out
    if not isinstance(value, list) or len(value) > wire_tools.MAX_TOOLS:
        raise InvalidRequest(f"`tools` must be an array of at most {wire_tools.MAX_TOOLS} tools", "tools")
    for i, t in enumerate(value):
        where = f"tools[{i}]"
        kind = t.get("type") if isinstance(t, dict) else None
        if not isinstance(kind, str) or not TOOL_TYPE.fullmatch(kind):
            raise InvalidRequest(f"`{where}` must be a tool object with a `type`, got {shown(kind)}", f"{where}.type")
        assert isinstance(t, dict)
        if kind in ("function", "custom"):
            _function(t, where, None, out)
            f = out.tools[-1]["function"]
            out.echo.append({"type": "function", "name": f["name"], "description": f.get("description"),
                             "parameters": f["parameters"], "strict": t.get("strict")} if kind == "function" else t)
        elif kind == "namespace":
            ns, members = t.get("name"), t.get("tools")
            if not isinstance(ns, str) or not wire_tools.NAME.fullmatch(ns):
                raise InvalidRequest(f"`{where}.name` must be a name of 1 to 128 letters, digits, _ . : or -, got "
                                     f"{shown(ns)}", f"{where}.name")
            if not isinstance(members, list) or len(members) > wire_tools.MAX_TOOLS:
                raise InvalidRequest(f"`{where}.tools` must be an array of at most {wire_tools.MAX_TOOLS} tools",
                                     f"{where}.tools")
            for j, member in enumerate(members):
                at = f"{where}.tools[{j}]"
                if not isinstance(member, dict) or member.get("type") not in ("function", "custom"):
                    raise InvalidRequest(f"`{at}.type` must be function or custom", f"{at}.type")
                _function(member, at, ns, out)
            out.echo.append(t)
        elif kind in wire_asks.RESPONSES_RUNS:
            ask = wire_asks.responses_ask(t, where)
            if ask is None:
                out.dropped += [] if kind in out.dropped else [kind]
            else:
                out.hosted.append(ask)
                out.echo.append({k: v for k, v in t.items() if k not in ("headers", "authorization")})
        elif kind not in out.dropped:
            out.dropped.append(kind)
    wire_asks.unique(out.hosted)
    if len(out.tools) > wire_tools.MAX_TOOLS:
        raise InvalidRequest(f"`tools` may hold at most {wire_tools.MAX_TOOLS} functions, namespaces' included, "
                             f"got {len(out.tools)}", "tools")
    wire_tools._checked(out.tools, "tools")
    return out


def read_tool_choice(body: dict[str, Any], tools: list[dict[str, Any]] | None,
                     hosted: list[Ask] | None = None) -> wire_tools.ToolChoice:
    """``tool_choice`` in the Responses shapes: a mode, a named function or custom tool (in a
    namespace, by its flat name), ``allowed_tools`` (its mode over the functions and custom
    tools it names; hosted tools in it are left out, as from ``tools``), or a hosted tool: web
    search, or an MCP server's tool by ``server_label`` and ``name``, required (where the gateway
    runs it: the pipeline keeps the names it offers), any other ``auto``."""
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        entries, picks = choice.get("tools"), []
        if not isinstance(entries, list) or not entries:
            raise InvalidRequest("`tool_choice.tools` must be a non-empty array of tools", "tool_choice.tools")
        for i, entry in enumerate(entries):
            kind = entry.get("type") if isinstance(entry, dict) else None
            if not isinstance(entry, dict) or not isinstance(kind, str) or not TOOL_TYPE.fullmatch(kind):
                raise InvalidRequest(f"`tool_choice.tools[{i}]` must be a tool, as in `tools`",
                                     f"tool_choice.tools[{i}].type")
            if kind in ("function", "custom"):
                name, namespace = entry.get("name"), entry.get("namespace")
                if isinstance(name, str) and isinstance(namespace, str):
                    name = flat_name(namespace, name)
                picks.append((f"tool_choice.tools[{i}].name", name))
        parallel = body.get("parallel_tool_calls")
        if parallel is not None and not isinstance(parallel, bool):
            raise InvalidRequest("`parallel_tool_calls` must be true or false", "parallel_tool_calls")
        return wire_tools.allowed_choice(choice.get("mode"), picks, tools, parallel is not False,
                                         "tool_choice.mode", "tool_choice.tools")
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind in ("function", "custom"):
            name, namespace = choice.get("name"), choice.get("namespace")
            if isinstance(name, str) and isinstance(namespace, str):
                name = flat_name(namespace, name)
            choice = {"type": "function", "function": {"name": name}}
        elif kind in wire_asks.RESPONSES_SEARCH and any(a.kind is Kind.WEB_SEARCH for a in hosted or ()):
            # a hosted tool the request asks for: that one, where it runs
            return wire_tools.ToolChoice("required", ("web_search",), body.get("parallel_tool_calls") is not False)
        elif (kind == "mcp" and isinstance(choice.get("server_label"), str) and isinstance(choice.get("name"), str)
              and any(a.server == choice["server_label"] for a in hosted or ())):
            return wire_tools.ToolChoice("required", (function_name(choice["server_label"], choice["name"]),),
                                         body.get("parallel_tool_calls") is not False)
        elif isinstance(kind, str) and TOOL_TYPE.fullmatch(kind):
            choice = "auto"
    return wire_tools.openai_tool_choice({"tool_choice": choice,
                                          "parallel_tool_calls": body.get("parallel_tool_calls")}, tools)


def custom_input(arguments: str) -> str:
    """A custom tool's input from the call the model wrote (``{"input": "..."}``); a call that
    broke off gives what there is of it, as text."""
    try:
        args = strictjson.loads(arguments or "{}")
    except ValueError:  # strictjson.JSONRefused too: nested past its bound
        return arguments
    value = args.get(CUSTOM_INPUT) if isinstance(args, dict) else None
    return value if isinstance(value, str) else json.dumps(value if value is not None else args)
