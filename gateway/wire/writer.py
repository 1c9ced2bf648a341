"""The one interface an answer is written through, whatever its wire: ``Writer``.

Each wire (OpenAI chat and completions, Anthropic Messages, Responses, Ollama, llama-server's
infill) has one writer, which owns both forms of its answer: a streamed answer is the frames
its methods return, sent as they come; a whole answer is the same calls with nobody listening,
then ``body()``. So the fold of a whole answer is never written apart from its stream.

``api/pipeline`` drives it, in this order:
- ``leased(model)`` once the model is held (a wire that names the model it got, not the one
  asked, keeps it);
- ``open(begun)`` as the answer's first generation starts (and, in OpenAI's batch of prompts,
  as each further choice starts);
- ``feed(item)`` for each piece of thinking or content, call, call arguments;
- ``listed(server, tools, error)`` after ``open``, before the first ``feed``, once for each MCP
  server whose tools the request offers (Responses' ``mcp_list_tools`` item; a writer given it
  before ``open`` keeps it till then);
- ``hosted(call)`` then ``hosted_result(result)`` for a tool the gateway runs itself in the
  middle of an answer (web search, an MCP server's tool), and ``go_on(finish, begun)`` where a
  further generation continues the same answer after it: its tokens are added, nothing closes;
- ``approval(call, request_id)`` in place of ``hosted`` for an MCP call that waits for the
  caller's approval (Responses' ``mcp_approval_request``); the answer then closes as usual;
- ``close(finish)`` as the answer (or a batch's choice) ends, ``end()`` after the last;
- ``fail(err)`` where the answer breaks after its stream began (a failure before that is a
  plain error response), before ``open`` too where a load's progress opened the stream.

What the hosted tools' calls carry (the types are ``tools/hosted``'s):
- ``Hosted.kind`` is ``web_search``, ``web_fetch`` or ``mcp``; ``arguments`` JSON text
  (``{"query"}``, ``{"url"}``, an MCP tool's own); ``name`` the tool's own name (an MCP tool's
  without its server's prefix, ``web_search`` or ``web_fetch`` otherwise); ``id`` the model's call
  id, which each writer spells in its wire's way (``srvtoolu_``, ``ws_``, ...), the same for the
  call and its result; ``approval_request_id`` the approval an MCP call ran on, where it did.
- ``HostedResult.output``: for ``web_search`` a list of ``SearchResult``, for ``web_fetch`` a
  ``Page``, for ``mcp`` a ``CallOutcome`` (``is_error``: a failure the tool reported, told as
  one). ``error``: why it gave nothing (``output`` None), with ``outcome`` the ``ToolError``'s
  (``timeout``, ``refused``, ``too_large``, ``error``) or ``max_uses`` where a request's
  ``max_uses`` refused the call; each writer turns it into its wire's error code.
- Text written after a result may cite it: search results and pages become the wire's citations
  (``tools/citations.find``), counted in the text that follows them only.

A ``Frame`` is one message of the stream: its JSON (or a bare string, OpenAI's ``[DONE]``) and
its SSE event name, None for a plain ``data:`` frame. Where ``stream`` is False a writer may
return no frames at all: only ``body()`` is read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..base.errors import ApiError
from ..protocol import Start
from ..tools.hosted import Page, SearchResult, ToolInfo
from .answer import Finish, Item

Frame = tuple[dict[str, Any] | str, str | None]


@dataclass
class Hosted:
    """A tool the gateway runs itself, called by the model in the middle of an answer:
    ``kind`` is ``web_search``, ``web_fetch`` or ``mcp``, ``server`` the MCP server's label
    where it is one, ``arguments`` JSON text (see the module's docstring)."""

    id: str
    kind: str
    name: str
    arguments: str
    server: str | None = None
    approval_request_id: str | None = None


@dataclass
class HostedResult:
    """What a hosted tool gave back (``output``: a list of ``SearchResult``, a ``Page``, a
    ``CallOutcome``), or why it could not (``error``, and ``outcome`` its kind)."""

    id: str
    kind: str
    output: Any = None
    error: str | None = None
    outcome: str | None = None

    @property
    def failed(self) -> bool:
        """Whether the call failed: an error, or an MCP tool's own ``is_error``."""
        return self.error is not None or bool(getattr(self.output, "is_error", False))

    def sources(self) -> list[SearchResult | Page]:
        """What text after it may cite: its search results, or its page."""
        if self.error is not None:
            return []
        if isinstance(self.output, Page):
            return [self.output]
        if isinstance(self.output, list):
            return [r for r in self.output if isinstance(r, SearchResult)]
        return []


@dataclass
class Usage:
    """An answer's tokens over every generation that made it (``go_on`` adds one)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0

    def add(self, finish: Finish) -> None:
        self.prompt_tokens += finish.prompt_tokens
        self.cached_tokens += finish.cached_tokens
        self.completion_tokens += finish.completion_tokens
        self.reasoning_tokens += finish.reasoning_tokens

    def total(self, finish: Finish) -> Finish:
        """``finish`` (the last generation's) counting the generations before it too."""
        return Finish(finish.reason, finish.stop, self.prompt_tokens + finish.prompt_tokens,
                      self.completion_tokens + finish.completion_tokens,
                      self.reasoning_tokens + finish.reasoning_tokens, self.cached_tokens + finish.cached_tokens,
                      finish.drafted, finish.accepted)


class Writer:
    """One answer in one wire's shape (see the module's docstring for the order of calls).

    ``stream``: whether frames are wanted. ``lines``: a stream of JSON lines (Ollama's), not
    server-sent events. ``done``: the last data frame every stream ends with, where the wire
    has one. ``progress``: whether a load's progress may open the stream (as SSE comments)."""

    lines = False
    done: str | None = None
    progress = True

    def __init__(self, model: str, stream: bool):
        self.model = model
        self.stream = stream
        self.usage = Usage()  # the generations before the last, where ``go_on`` continued the answer
        self.id = ""  # the answer's id, in the log

    def leased(self, model: str) -> None:
        """The model the request got (an alias, a tag, a glob resolved): the answer names it."""
        self.model = model

    def open(self, begun: Start) -> list[Frame]:
        return []

    def feed(self, item: Item) -> list[Frame]:
        raise NotImplementedError

    def hosted(self, call: Hosted) -> list[Frame]:
        """A hosted tool's call; a wire with no form for one tells nothing of it (its result
        still reaches the model, and the answer that follows tells what came of it)."""
        return []

    def hosted_result(self, result: HostedResult) -> list[Frame]:
        return []

    def listed(self, server: str, tools: list[ToolInfo], error: str | None = None) -> list[Frame]:
        """The tools an MCP server offered the answer (``error``: why it could not list them); a
        wire with no form for it tells nothing."""
        return []

    def approval(self, call: Hosted, request_id: str) -> list[Frame]:
        """An MCP call that waits for the caller's approval, asked under ``request_id`` (the id
        the caller's answer names); a wire with no form for it tells nothing."""
        return []

    def go_on(self, finish: Finish, begun: Start) -> list[Frame]:
        """The generation ``finish`` ended after a hosted tool's call and a further one
        (``begun``) continues the same answer: its tokens are kept for the answer's usage."""
        self.usage.add(finish)
        return []

    def close(self, finish: Finish) -> list[Frame]:
        raise NotImplementedError

    def end(self) -> list[Frame]:
        return []

    def fail(self, err: ApiError) -> list[Frame]:
        raise NotImplementedError

    def body(self) -> dict[str, Any]:
        raise NotImplementedError
