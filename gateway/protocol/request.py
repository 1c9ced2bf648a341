"""The gateway's own request, whatever wire shape it came in (``GenerationRequest``), the
pictures and sounds it carries (``Media``), a prompt read without generating (``PromptRequest``),
and the kinds of request a model may serve. The wire layer makes them; a backend serves them (a
worker receives them inside its ``Generate``, ``Tokenize`` and ``ApplyTemplate`` commands).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

# The kinds of request a model may serve (``WorkerProcess.serves``, ``backend.Backend``).
CHAT, COMPLETIONS, EMBEDDINGS, TOKENIZE, RERANK = "chat", "completions", "embeddings", "tokenize", "rerank"


@dataclass
class Media:
    """A picture or a sound a request carries; the prompt's text holds a marker for each
    (``wire.media.MARKER``), in this order."""

    kind: str  # image | audio
    param: str  # the caller's field it came in (messages[1].content[0]), as a refusal names it
    data: str = ""  # the file's bytes, base64 (PNG, JPEG, GIF, BMP; WAV, MP3, FLAC)
    url: str | None = None  # an http(s) address, fetched by the gateway before the request goes on
    # a tool result's picture: what a model that takes none reads in its place (else such a model refuses it)
    note: str | None = None
    # what its header says it decodes to (``wire.mediasize``): a picture's width and height, a sound's
    # frames and their sample rate; (0, 0): not read
    size: tuple[int, int] = (0, 0)


@dataclass
class GenerationRequest:
    """The gateway's own request, whatever wire shape it came in.

    Exactly one of ``messages`` (rendered with the chat template in the worker),
    ``prompt`` (text) or ``prompt_tokens`` (ids) is set.
    """

    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    prompt_tokens: list[int] | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None  # None: until end of generation or the context is full
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    # the sampling fields the caller or the model's defaults set (the rest are this gateway's
    # defaults, which a request forwarded to another server leaves to that server)
    given: list[str] = field(default_factory=list)
    ignore_eos: bool = False  # llama-server's extension: generate max_tokens whatever the model says
    grammar: str | None = None  # GBNF constraining every sampled token (from the first trigger, if any)
    grammar_triggers: list[str] = field(default_factory=list)  # patterns that switch a lazy grammar on
    response_format: str | None = None  # json_object | json_schema: the worker makes the grammar
    json_schema: dict[str, Any] | None = None  # for json_schema
    format_param: str = "response_format"  # the caller's field it came in (Ollama: format), as refusals name it
    logprobs: int | None = None  # None: none; N: each token's log-probability and its N likeliest alternatives
    tools: list[dict[str, Any]] | None = None  # function tools (wire/tools.py's shape)
    tool_choice: str = "auto"  # auto | required (none: the wire layer leaves tools out)
    tool_names: tuple[str, ...] | None = None  # the tools the model may call, when not all (allowed_tools, a named one)
    parallel_tool_calls: bool = True
    tool_format: str | None = None  # the model's call format (text/toolformats), set once the model is known
    reasoning: str | None = None  # the model's thinking format (reasoning.py), set once the model is known
    thinking_budget: int | None = None  # most tokens of thinking; past it the worker ends the thinking block
    echo: bool = False  # the start event carries the prompt's text
    # fill-in-the-middle (worker/infill.py lays the prompt out from the model's FIM tokens):
    # with ``suffix`` set, ``prompt`` is the text before the cursor and ``suffix`` the text after
    suffix: str | None = None
    infill_extra: list[dict[str, str]] = field(default_factory=list)  # other files: {"filename", "text"}
    infill_prompt: str = ""  # llama-server's /infill ``prompt``: text after the prefix, special tokens read
    suffix_param: str = "suffix"  # the caller's field for the suffix, as a refusal names it
    deadline: float | None = None  # wall-clock time (time.time()) at which the answer ends with "length"
    # whose cached prompts this request may reuse (server.isolate_cache_by_key: the API key's
    # name); a slot holding another scope's cache is read afresh
    cache_scope: str = ""
    media: list[Media] = field(default_factory=list)  # pictures and sounds, in the order of their markers
    # the LoRA adapters it is decoded under (``adapters.Adapters.chosen``): ``adapter``, one the model's
    # name picked (BASE:ADAPTER); ``lora``, llama-server's field as (id, scale) pairs; neither: the defaults
    adapter: str | None = None
    lora: list[tuple[int, float]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PromptRequest:
    """A prompt read without generating (tokenize, apply_template): exactly one of ``messages``,
    ``prompt`` or ``prompt_tokens``, as in a ``GenerationRequest``."""

    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    prompt_tokens: list[int] | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None  # part of the prompt: the template lists them
    tool_format: str | None = None  # how the tools reach the prompt (``plain``: a system message)
    add_special: bool = True  # the tokenizer adds the model's special tokens (BOS) to a prompt text
    param: str | None = None  # the field a refusal names (None: "messages" or "prompt")
    media: list[Media] = field(default_factory=list)  # counted as the tokens they take, not encoded

    @classmethod
    def of(cls, request: dict[str, Any]) -> PromptRequest:
        """The prompt's fields of ``request`` (a ``GenerationRequest``'s dict, or /tokenize's few)."""
        return cls(**{name: request[name] for name in _PROMPT_FIELDS if name in request})


_PROMPT_FIELDS = tuple(f.name for f in fields(PromptRequest))
