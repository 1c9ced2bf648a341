"""A hosted tool's earlier work, met in a request's history, as the model's own conversation: an
assistant's call (``web_search`` with ``{query}``, ``web_fetch`` with ``{url}``, an MCP tool as
``<server>_<tool>``, ``tools.hosted.function_name``) then a tool message holding its result as
text, as a function's call and result would be. What a client carries back (Claude Code sends
every earlier block again) so reads as it was written, whoever ran the tool.

- **Anthropic**'s assistant blocks: ``server_tool_use`` and ``mcp_tool_use`` (the calls), then
  ``web_search_tool_result`` (the results as a short list of titles and URLs: a result's
  ``encrypted_content`` is its server's own and is not read), ``web_fetch_tool_result`` (the
  document's text) and ``mcp_tool_result`` (its text).
- **Responses**' items: ``web_search_call`` (its query, and the sources it lists: the item keeps
  no results) and ``mcp_call`` (its arguments, then its output or error); ``approvals`` reads
  the ``mcp_approval_response`` items, each filled from the ``mcp_approval_request`` it answers.

Every field is checked, a 400 naming it otherwise; a result's list is bounded in count (the
text itself is the body's, which its reader bounds). A result's text is what a web page or an MCP
server said, carried back by the client: it is defanged as it was when the model first read it
(``tools/resulttext.defang``), so a page cannot speak the model's markers on a later turn.
"""

from __future__ import annotations

from typing import Any

from ..base import strictjson
from ..base.errors import InvalidRequest
from ..tools.hosted import Approval, function_name
from ..tools.resulttext import defang
from .params import shown

MAX_RESULTS = 50  # search results listed in one tool message
MAX_APPROVALS = 128  # mcp_approval_response items in one request
UNREAD = "[content this model cannot read]"
ANTHROPIC_USES = ("server_tool_use", "mcp_tool_use")
ANTHROPIC_RESULTS = ("web_search_tool_result", "web_fetch_tool_result", "mcp_tool_result")
SERVER_TOOLS = ("web_search", "web_fetch")  # server_tool_use names this server reads back


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _text(value: Any, param: str, anthropic: bool = True) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"{param}: must be a string" if anthropic else f"`{param}` must be a string", param)
    return value


def search_list(results: list[tuple[str, str]]) -> str:
    """Search results, as the model reads them: numbered, a title and its URL each."""
    if not results:
        return "No results."
    return "\n".join(f"{n}. {title}\n   {url}" for n, (title, url) in enumerate(results[:MAX_RESULTS], 1))


# --- Anthropic ---------------------------------------------------------------------------------

def anthropic_use(block: dict[str, Any], at: str) -> dict[str, Any]:
    """A ``server_tool_use`` (web search or fetch) or ``mcp_tool_use`` block as a call."""
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise InvalidRequest(f"{at}: a {block['type']} block needs a string `id` and `name`", at)
    if not isinstance(arguments, dict):
        raise InvalidRequest(f"{at}.input: must be an object", f"{at}.input")
    if block["type"] == "mcp_tool_use":
        server = _text(block.get("server_name"), f"{at}.server_name")
        return _call(call_id, function_name(server, name), arguments)
    if name not in SERVER_TOOLS:
        raise InvalidRequest(f"{at}.name: the server tool {shown(name)} is not supported here by this server",
                             f"{at}.name")
    return _call(call_id, name, arguments)


def anthropic_result(block: dict[str, Any], at: str) -> str:
    """A hosted tool's result block as the text of its tool message (defanged)."""
    return defang(_anthropic_result(block, at))


def _anthropic_result(block: dict[str, Any], at: str) -> str:
    kind, content = block["type"], block.get("content")
    if kind == "mcp_tool_result":
        text = _mcp_content(content, f"{at}.content")
        is_error = block.get("is_error", False)
        if not isinstance(is_error, bool):
            raise InvalidRequest(f"{at}.is_error: must be true or false", f"{at}.is_error")
        return f"Error: {text}" if is_error else text
    if isinstance(content, dict) and isinstance(content.get("error_code"), str):  # the tool's own failure
        return f"Error: {content['error_code']}"
    if kind == "web_search_tool_result":
        if not isinstance(content, list):
            raise InvalidRequest(f"{at}.content: must be a list of web_search_result blocks or an error",
                                 f"{at}.content")
        results = []
        for j, r in enumerate(content[:MAX_RESULTS]):
            where = f"{at}.content.{j}"
            if not isinstance(r, dict):
                raise InvalidRequest(f"{where}: must be a web_search_result block", where)
            results.append((_text(r.get("title"), f"{where}.title"), _text(r.get("url"), f"{where}.url")))
        return search_list(results)
    if not isinstance(content, dict) or content.get("type") != "web_fetch_result":
        raise InvalidRequest(f"{at}.content: must be a web_fetch_result block or an error", f"{at}.content")
    url = _text(content.get("url"), f"{at}.content.url")
    document = content.get("content")
    if not isinstance(document, dict):
        raise InvalidRequest(f"{at}.content.content: must be a document block", f"{at}.content.content")
    source = document.get("source")
    title = document.get("title")
    data = source.get("data") if isinstance(source, dict) and source.get("type") == "text" else None
    head = f"{title}\n{url}" if isinstance(title, str) and title else url
    return f"{head}\n\n{data if isinstance(data, str) else UNREAD}"


def _mcp_content(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}: must be a string or a list of text blocks", where)
    parts = []
    for block in content:
        text = block.get("text") if isinstance(block, dict) and block.get("type") == "text" else None
        parts.append(text if isinstance(text, str) else UNREAD)
    return "".join(parts)


# --- Responses ---------------------------------------------------------------------------------

def responses_call(item: dict[str, Any], where: str) -> tuple[dict[str, Any], str] | None:
    """A ``web_search_call`` or ``mcp_call`` item as a call and its result's text; None where
    it holds nothing the model did (a search with no query, a call with no outcome yet)."""
    call_id = item.get("id")
    if not isinstance(call_id, str):
        raise InvalidRequest(f"`{where}.id` must be a string", f"{where}.id")
    if item["type"] == "mcp_call":
        server = _text(item.get("server_label"), f"{where}.server_label", False)
        name = _text(item.get("name"), f"{where}.name", False)
        arguments = strictjson.loads(_text(item.get("arguments", "{}"), f"{where}.arguments", False) or "{}",
                                     f"{where}.arguments")
        if not isinstance(arguments, dict):
            raise InvalidRequest(f"`{where}.arguments` must be a JSON object in a string", f"{where}.arguments")
        output, error = item.get("output"), item.get("error")
        if output is None and error is None:
            return None
        if output is not None:
            text = _text(output, f"{where}.output", False)
        else:
            message = error.get("message") if isinstance(error, dict) else error
            text = f"Error: {message if isinstance(message, str) else 'the call failed'}"
        return _call(call_id, function_name(server, name), arguments), defang(text)
    action = item.get("action")
    if not isinstance(action, dict):
        return None
    if action.get("type") == "open_page" and isinstance(action.get("url"), str):
        return _call(call_id, "web_fetch", {"url": action["url"]}), "The page was read; its text is not kept."
    queries = action.get("queries")
    query = action.get("query") or (queries[0] if isinstance(queries, list) and queries else None)
    if action.get("type") != "search" or not isinstance(query, str):
        return None
    sources = action.get("sources")
    urls = [s["url"] for s in sources if isinstance(s, dict) and isinstance(s.get("url"), str)] \
        if isinstance(sources, list) else []
    return _call(call_id, "web_search", {"query": query}), defang(search_list([(url, url) for url in urls]))


def approvals(items: Any, earlier: Any = None) -> list[Approval]:
    """The ``mcp_approval_response`` items of ``items`` (a Responses ``input``), each filled from
    the ``mcp_approval_request`` it answers, met in ``items`` or ``earlier`` (the previous
    response's ``output``). One whose call ran already (an ``mcp_call`` item naming it as its
    ``approval_request_id``: a client that sends its whole history again) is left out, so its
    call does not run again."""
    if not isinstance(items, list):
        return []
    seen = [*(earlier if isinstance(earlier, list) else ()), *items]
    requests = {r["id"]: r for r in seen
                if isinstance(r, dict) and r.get("type") == "mcp_approval_request" and isinstance(r.get("id"), str)}
    ran = {r.get("approval_request_id") for r in seen if isinstance(r, dict) and r.get("type") == "mcp_call"}
    out: list[Approval] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or item.get("type") != "mcp_approval_response":
            continue
        where = f"input[{i}]"
        if len(out) == MAX_APPROVALS:
            raise InvalidRequest(f"`input` may hold at most {MAX_APPROVALS} mcp_approval_response items", where)
        request_id, approve, reason = item.get("approval_request_id"), item.get("approve"), item.get("reason")
        if not isinstance(request_id, str):
            raise InvalidRequest(f"`{where}.approval_request_id` must be a string", f"{where}.approval_request_id")
        if not isinstance(approve, bool):
            raise InvalidRequest(f"`{where}.approve` must be true or false", f"{where}.approve")
        if reason is not None and not isinstance(reason, str):
            raise InvalidRequest(f"`{where}.reason` must be a string", f"{where}.reason")
        if request_id in ran:
            continue
        request = requests.get(request_id, {})
        fields = [request.get(k) if isinstance(request.get(k), str) else None
                  for k in ("server_label", "name", "arguments")]
        out.append(Approval(request_id, approve, reason, *fields))
    return out
