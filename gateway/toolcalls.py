"""Tool calls in a model's answer: which syntax a model writes them in, and one incremental parser
for every syntax in use.

Formats (``FORMATS``), and the real templates that detect as each (tests/test_toolcalls.py):
- ``hermes``: ``<tool_call>{"name": N, "arguments": {...}}</tool_call>``, several per answer
  (Hermes 2 Pro / 3, Qwen 2.5, Qwen 3, QwQ, MiMo-VL, Granite 4, Bielik, Reka Edge).
- ``qwen3_coder``: ``<tool_call>\\n<function=N>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``
  (Qwen3-Coder, Qwen 3.5, Nemotron 3 Nano, StepFun 3.5). The arguments object is built here,
  each value typed by the tool's JSON schema as llama.cpp does: a string-only parameter stays
  text (and streams as it is written), any other is read as JSON when it parses as one of the
  schema's types, and is a string otherwise. Qwen3-Coder sometimes leaves out ``<tool_call>``,
  so a bare ``<function=N>`` opens a call too when N is one of the request's tools. Inside
  ``<tool_call>`` both this format and hermes read either syntax (JSON object or ``<function=``).
- ``llama3``: Llama 3.1-3.3's ``{"name": N, "parameters": {...}}`` (``"arguments"`` is read too),
  with or without a leading ``<|python_tag|>``. Without the tag a call is read only at the start
  of the answer or right after another call (separated by spaces or ``;``), as llama.cpp does,
  so an answer that merely contains JSON stays content. It ends with the JSON (``<|eom_id|>`` /
  ``<|eot_id|>`` end the answer and are dropped).
- ``mistral``: ``[TOOL_CALLS]`` followed by a JSON array of calls (Mistral Nemo) or by
  ``N[ARGS]{...}`` (Small 3.2 with ``N[CALL_ID]id[ARGS]{...}``, Devstral, Ministral), each call
  with its own ``[TOOL_CALLS]`` or chained right after the previous one. A model's call id is
  dropped: every call gets the gateway's own.
- ``harmony``: gpt-oss's ``<|channel|>commentary to=functions.N <|constrain|>json<|message|>{...}<|call|>``,
  the recipient also accepted in the role header (``<|start|>assistant to=functions.N<|channel|>...``)
  and on the analysis channel. See "harmony" below.
- ``deepseek``: DeepSeek V3 / R1 and the R1 distills write
  ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N\\n```json\\n{...}\\n```<｜tool▁call▁end｜>``
  (more calls, then ``<｜tool▁calls▁end｜>``), V3.1 ``<｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``;
  the two are told apart by what follows ``<｜tool▁sep｜>``.
- ``plain``: the fallback for a template that has no tool syntax of its own: the gateway
  describes the tools in a system message (``plain_system_prompt``) and does not hand them to
  the template; the model is asked for hermes' syntax and parsed with hermes' parser.

``detect(chat_template, special_tokens)`` returns one of these, or None when the template shows
no tool support at all (no ``tools`` and no ``tool_calls`` in its Jinja code): whether such a
model gets ``plain`` or a 400 is the caller's choice. A template that handles tools in a syntax
not listed (GLM, Kimi, Granite 3, Command R, Functionary, ...) detects as ``plain`` unless its
vocabulary has one of the markers above as a single token. ``describes_tools(chat_template)``
says whether the template itself lists the tools: DeepSeek's templates render calls but never
the tools, so the caller adds ``plain_system_prompt(tools, fmt)`` for them.

``ToolCallParser(fmt, tools, stream=True)``: ``feed(text)`` takes the answer's content in any
cuts (a marker may arrive one character at a time, a call be cut anywhere; a marker written as
one control token or as several ordinary ones is the same text) and returns items; ``flush()``
ends the answer and returns the rest. Items, in order:
- ``("content", text)``: free text. Markers never reach it; a partial marker is held back until
  it is known and released as text if it turns out not to be one. Text before, between and
  after calls is content; whitespace that only separates a call from the text around it is
  dropped (before the call's opening marker and after its end).
- ``CallStart(index, id, name)``: once the name is known and is one of ``tools``, and (for
  JSON formats) its arguments have begun as an object. ``index`` counts the answer's calls
  from 0, ``id`` is ``call_`` and 24 random letters and digits, unique in the parser.
- ``CallArgs(index, text)``: the arguments, in pieces as they are generated; the pieces of one
  call join into one JSON object (raw control characters inside strings are escaped on the way).
- ``CallEnd(index, error=None)``.

Failures. A call is emitted only once its name is known and valid, so a call whose name is not
one of the tools, whose syntax is broken before its arguments begin, or whose text ends before
its arguments begin is never emitted: its raw text (markers included) goes out as content and
``failed`` gets a reason. What happens to a call that fails after its start went out depends on
``stream``:
- ``stream=True`` (streamed answers): pieces leave as soon as they are known. If the arguments
  then turn out broken (the answer ends inside them, or they do not parse as one JSON object)
  the call still ends, with ``CallEnd(index, error=REASON)``, and ``failed`` records it; the
  caller should tell the client the call is unusable (or drop it when it buffers).
- ``stream=False`` (whole answers): each call is held until it ends and is emitted only once
  its arguments parsed as a JSON object; otherwise its raw text is content. So a whole answer
  never carries a broken call.
A call whose arguments are complete is accepted even when its closing marker never came (the
answer ended): gpt-oss's ``<|call|>`` and Llama's ``<|eom_id|>`` are end-of-generation tokens
the worker does not render, and models drop closers at the end.

harmony. gpt-oss's calls travel as messages whose header names a recipient, so message
framing belongs to ``reasoning.ReasoningSplitter``: with ``calls=True`` it yields
``("recipient", NAME)`` when such a message's body begins and ``("call", text)`` for the body;
the body ends at the next segment of another kind, or at the end. ``ToolCallParser("harmony")``
runs that splitter itself on the raw answer (pass the prompt's tail, ``<|start|>assistant``, as
``prompt_tail``): analysis messages come out as ``("thinking", text)`` items, final and preamble
messages as content, and a failed call's body (the header is gone) as content. A call ends with
its JSON object; anything after it in the same message is dropped.

``AnswerParser(tool_format, tools, reasoning=..., prompt_tail=..., stream=...)`` is what a
caller uses: the raw answer in, ``("thinking", text)`` / ``("content", text)`` / call items out,
for every pair of formats (for harmony the tool parser owns the splitting; otherwise thinking is
split first and only content reaches the tool parser).
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .reasoning import CALL, CONTENT, RECIPIENT, THINKING, ReasoningSplitter

FORMATS = ("hermes", "qwen3_coder", "llama3", "mistral", "harmony", "deepseek", "plain")

TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
PYTHON_TAG, EOM, EOT = "<|python_tag|>", "<|eom_id|>", "<|eot_id|>"
TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
# spellings of the block opener that DeepSeek models are known to write (llama.cpp accepts them too)
DS_CALLS_BEGIN_VARIANTS = (DS_CALLS_BEGIN, "<｜tool_calls_begin｜>", "<｜tool calls begin｜>",
                           "<｜tool\\_calls\\_begin｜>", "<｜tool▁calls｜>")
DS_CALLS_END, DS_CALL_BEGIN, DS_CALL_END, DS_SEP = ("<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                                                    "<｜tool▁call▁end｜>", "<｜tool▁sep｜>")

# Markers that are single (special) tokens in some vocabulary: the worker must render them as text.
MARKER_TOKENS = (TOOL_CALL, TOOL_CALL_END, PYTHON_TAG, EOM, TOOL_CALLS, ARGS, CALL_ID, DS_CALLS_BEGIN,
                 DS_CALLS_END, DS_CALL_BEGIN, DS_CALL_END, DS_SEP, "<|constrain|>", "<|call|>")


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class CallArgs:
    index: int
    text: str


@dataclass(frozen=True)
class CallEnd:
    index: int
    error: str | None = None  # set only for a streamed call whose arguments turned out broken


Item = tuple[str, str] | CallStart | CallArgs | CallEnd

# --- detection -------------------------------------------------------------------------------

_JINJA_CODE = re.compile(r"\{[{%](.*?)[%}]\}", re.S)
_ARGUMENTS_KEY = re.compile(r'\\?"arguments\\?"')


def _code(template: str) -> str:
    return "\n".join(_JINJA_CODE.findall(template))


def describes_tools(chat_template: str | None) -> bool:
    """Whether the template itself renders the request's ``tools`` (reads the variable)."""
    return bool(chat_template) and re.search(r"\btools\b", _code(chat_template or "")) is not None


def detect(chat_template: str | None, special_tokens: Sequence[str] = ()) -> str | None:
    """The tool-call format of a model, from its chat template's source and the markers its
    vocabulary has as single tokens; None when the template shows no tool support."""
    src = chat_template or ""
    code = _code(src)
    if not (re.search(r"\btools\b", code) or "tool_calls" in code):
        return None
    if "<|channel|>" in src:
        return "harmony"
    if "dsml_token" not in src and ("tool▁calls▁begin" in src or "tool▁call▁begin" in src):
        return "deepseek"
    if TOOL_CALLS in src:
        return "mistral"
    if TOOL_CALL in src and FUNCTION in src and PARAMETER in src:
        return "qwen3_coder"
    if (TOOL_CALL in src and _ARGUMENTS_KEY.search(src)
            and not any(m in src for m in ("<arg_key>", "<invoke name=", "<tool_calls>"))):
        return "hermes"
    if "<|start_header_id|>ipython<|end_header_id|>" in src and FUNCTION not in src:
        return "llama3"
    tokens = set(special_tokens)
    for fmt, token in (("harmony", "<|channel|>"), ("deepseek", DS_CALLS_BEGIN), ("mistral", TOOL_CALLS),
                       ("llama3", PYTHON_TAG), ("hermes", TOOL_CALL)):
        if token in tokens:
            return fmt
    return "plain"


_EXAMPLES = {
    "plain": '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>',
    "qwen3_coder": ("<tool_call>\n<function=example_function_name>\n<parameter=example_parameter>\nvalue\n"
                    "</parameter>\n</function>\n</tool_call>"),
    "llama3": '{"name": <function-name>, "parameters": <args-json-object>}',
    "mistral": '[TOOL_CALLS][{"name": <function-name>, "arguments": <args-json-object>}]',
    "harmony": ("<|start|>assistant<|channel|>commentary to=functions.<function-name> <|constrain|>json"
                "<|message|><args-json-object><|call|>"),
    "deepseek": (f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}<function-name>{DS_SEP}<args-json-object>{DS_CALL_END}"
                 f"{DS_CALLS_END}"),
    "deepseek_r1": (f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}function{DS_SEP}<function-name>\n```json\n"
                    f"<args-json-object>\n```{DS_CALL_END}{DS_CALLS_END}"),
}


def plain_system_prompt(tools: Sequence[dict[str, Any]], fmt: str = "plain", chat_template: str | None = None) -> str:
    """A system message that describes ``tools`` and the syntax of ``fmt`` to call them in, for a
    template that does not render the tools itself (``plain``, or ``describes_tools`` False).
    For ``deepseek`` the template tells R1's fenced shape from V3.1's."""
    example = _EXAMPLES["plain" if fmt == "hermes" else fmt]
    if fmt == "deepseek" and chat_template and "```json" in chat_template:
        example = _EXAMPLES["deepseek_r1"]
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{listed}\n"
            "</tools>\n\nTo call a function, write the call in exactly this format, with arguments that follow "
            f"the function's JSON schema:\n{example}\nWrite a call only for a function listed above.")


# --- helpers ---------------------------------------------------------------------------------

_ALNUM = string.ascii_letters + string.digits
_WS = " \t\r\n"
_NAME_LIMIT = 256  # a tool or parameter name longer than this is not one
_HEAD_LIMIT = 2048  # a JSON call's text before its arguments longer than this is not read as a head
_MORE, _DONE, _CUT = "more", "done", "cut"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _loads(text: str) -> Any:
    return json.loads(text, parse_constant=_reject_constant)


def _is_object(text: str) -> bool:
    try:
        return isinstance(_loads(text), dict)
    except ValueError:
        return False


def _find(buf: str, markers: Sequence[str], start: int = 0) -> tuple[int, str] | None:
    """The earliest full marker in ``buf`` (the longest one when two begin at once)."""
    best: tuple[int, str] | None = None
    for m in markers:
        i = buf.find(m, start)
        if i >= 0 and (best is None or i < best[0] or (i == best[0] and len(m) > len(best[1]))):
            best = (i, m)
    return best


def _partial(buf: str, markers: Sequence[str]) -> int:
    """Length of the longest tail of ``buf`` that may still grow into a marker."""
    keep = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(buf)), keep, -1):
            if buf.endswith(m[:k]):
                keep = k
                break
    return keep


def _escape(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


_SPACE, _STR = object(), object()  # head pattern tokens: optional whitespace, a JSON string (the name)


def _match_seq(buf: str, tokens: Sequence[object]) -> tuple[str, int] | str | None:
    pos, name = 0, None
    for tok in tokens:
        if tok is _SPACE:
            while pos < len(buf) and buf[pos] in _WS:
                pos += 1
            if pos == len(buf):
                return _MORE
        elif tok is _STR:
            if pos == len(buf):
                return _MORE
            if buf[pos] != '"':
                return None
            j = pos + 1
            while j < len(buf) and buf[j] != '"':
                j += 2 if buf[j] == "\\" else 1
            if j >= len(buf):
                return _MORE
            try:
                value = _loads(buf[pos:j + 1])
            except ValueError:
                return None
            name, pos = value, j + 1
        else:
            assert isinstance(tok, str)
            avail = buf[pos:pos + len(tok)]
            if not tok.startswith(avail):
                return None
            if len(avail) < len(tok):
                return _MORE
            pos += len(tok)
    assert isinstance(name, str)
    return name, pos


def _match_head(buf: str, arg_keys: Sequence[str]) -> tuple[str, int] | str | None:
    """``{"name": "N", "<arg key>":`` (``"type": "function",`` may come first) at the start of
    ``buf``: (N, its length), ``_MORE`` while ``buf`` ends before that is decided, or None."""
    more = False
    for typed in (False, True):
        for key in arg_keys:
            head: list[object] = ["{", _SPACE]
            if typed:
                head += ['"type"', _SPACE, ":", _SPACE, '"function"', _SPACE, ",", _SPACE]
            head += ['"name"', _SPACE, ":", _SPACE, _STR, _SPACE, ",", _SPACE, f'"{key}"', _SPACE, ":"]
            r = _match_seq(buf, head)
            if isinstance(r, tuple):
                return r
            more = more or r == _MORE
    return _MORE if more else None


def _schema_types(schema: Any) -> set[str] | None:
    """The JSON types a parameter's schema allows; None when it does not say."""
    if not isinstance(schema, dict):
        return None
    t = schema.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)} or None
    types: set[str] = set()
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            sub_types = _schema_types(sub)
            if sub_types is None:
                return None
            types |= sub_types
    values = schema.get("enum", [schema["const"]] if "const" in schema else [])
    for v in values if isinstance(values, list) else []:
        types.add(_json_type(v))
    return types or None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _typed(raw: str, types: set[str] | None) -> str:
    """The JSON text of an XML-style parameter value: JSON when it parses as a type the schema
    allows (any JSON when the schema does not say), a string otherwise."""
    if types != {"string"}:
        try:
            value = _loads(raw.strip())
        except ValueError:
            pass
        else:
            kind = _json_type(value)
            allowed = types is None or kind in types or (kind == "integer" and "number" in types)
            if allowed or (types is not None and "string" not in types):
                return json.dumps(value, ensure_ascii=False)
    return json.dumps(raw, ensure_ascii=False)


def _tool_params(tools: Sequence[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out[fn["name"]] = params if isinstance(params, dict) else {}
    return out


class _Call:
    """One call being read: its raw text (for a failure), what it emitted, and the JSON scan."""

    def __init__(self, raw: str = ""):
        self.raw = raw
        self.name: str | None = None
        self.error: str | None = None
        self.index = -1
        self.started = False  # CallStart made (held or released)
        self.released = False  # some item reached the caller
        self.items: list[Item] = []
        self.args: list[str] = []
        # JSON scan of the call's text
        self.depth = 0
        self.in_str = self.esc = False
        self.text = ""
        self.phase = ""
        self.value_at = 0
        # XML-style calls
        self.params = 0
        self.prefix = ""
        self.types: set[str] | None = None
        self.value = ""
        self.value_begun = self.held_nl = self.bare = False

    def step(self, c: str) -> None:
        if self.in_str:
            if self.esc:
                self.esc = False
            elif c == "\\":
                self.esc = True
            elif c == '"':
                self.in_str = False
        elif c == '"':
            self.in_str = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1


# parser states
TEXT, BLOCK, OBJ, ARGS_ONLY, JUNK = "text", "block", "obj", "args", "junk"
Q_NAME, Q_FUNC, Q_PNAME, Q_VALUE = "q_name", "q_func", "q_pname", "q_value"
L_START, L_TAG = "l_start", "l_tag"
M_START, M_NAME, M_ID, M_AFTER, M_ARRAY = "m_start", "m_name", "m_id", "m_after", "m_array"
D_BLOCK, D_HEAD, D_SEP, D_NAME, D_FENCE, D_TAIL = "d_block", "d_head", "d_sep", "d_name", "d_fence", "d_tail"
# JSON-object call phases
HEAD, VALUE, STREAM, STRING, TAIL, SLOW, SKIP = "head", "value", "stream", "string", "tail", "slow", "skip"

_OPENERS = {
    "hermes": (TOOL_CALL,), "plain": (TOOL_CALL,), "qwen3_coder": (TOOL_CALL, FUNCTION),
    "llama3": (PYTHON_TAG,), "mistral": (TOOL_CALLS,), "deepseek": (*DS_CALLS_BEGIN_VARIANTS, DS_CALL_BEGIN),
    "harmony": (),
}
# where the rest of a malformed Qwen3-Coder function ends (True: the marker is part of it)
_FUNCTION_ENDS = ((FUNCTION_END, True), (TOOL_CALL_END, False), (TOOL_CALL, False))
_STRAYS = {  # closing or inner markers met outside a call: dropped
    "hermes": (TOOL_CALL_END,), "plain": (TOOL_CALL_END,), "qwen3_coder": (TOOL_CALL_END,),
    "llama3": (EOM, EOT), "mistral": (ARGS, CALL_ID), "deepseek": (DS_CALLS_END, DS_CALL_END, DS_SEP),
    "harmony": (),
}


class ToolCallParser:
    """Incremental tool-call parser for one answer; see the module docstring for the items."""

    def __init__(self, fmt: str, tools: Sequence[dict[str, Any]] | None = None, *, stream: bool = True,
                 prompt_tail: str = ""):
        if fmt not in FORMATS:
            raise ValueError(f"unknown tool-call format {fmt!r}")
        self.fmt = fmt
        self.stream = stream
        self.params = _tool_params(tools)
        self.failed: list[str] = []  # why each failed call failed, with the start of its text
        self.splitter = ReasoningSplitter("harmony", prompt_tail, calls=True) if fmt == "harmony" else None
        self._openers = _OPENERS[fmt] + _STRAYS[fmt]
        self._out: list[Item] = []
        self._buf = ""
        self._state = L_START if fmt == "llama3" else TEXT
        self._ws = ""  # trailing whitespace of content, sent once more content follows
        self._drop_ws = False  # right after a call: leading whitespace is not content
        self._group = ""  # text of an open block that belongs to no call yet
        self._block_calls = 0
        self._raw = ""  # failed calls' text, sent as content once what follows is known
        self._call: _Call | None = None
        self._next_index = 0
        self._ids: set[str] = set()
        # per-call context: markers that cut a JSON scan, where to go after the call
        self._closers: tuple[str, ...] = ()
        self._junk_until: tuple[tuple[str, bool], ...] = ()
        self._after = TEXT
        self._strict = False
        self._end_at_json = True
        self._arg_keys: tuple[str, ...] = ("arguments", "parameters")
        self._steps = {
            TEXT: self._s_text, BLOCK: self._s_block, OBJ: self._s_obj, ARGS_ONLY: self._s_args_only,
            JUNK: self._s_junk, Q_NAME: self._s_q_name, Q_FUNC: self._s_q_func, Q_PNAME: self._s_q_pname,
            Q_VALUE: self._s_q_value, L_START: self._s_l_start, L_TAG: self._s_l_tag, M_START: self._s_m_start,
            M_NAME: self._s_m_name, M_ID: self._s_m_id, M_AFTER: self._s_m_after, M_ARRAY: self._s_m_array,
            D_BLOCK: self._s_d_block, D_HEAD: self._s_d_head, D_SEP: self._s_d_sep, D_NAME: self._s_d_name,
            D_FENCE: self._s_d_fence, D_TAIL: self._s_d_tail,
        }

    @property
    def _current(self) -> _Call:
        """The call being read: the states that read one are entered only with one open."""
        assert self._call is not None
        return self._call

    # --- public ----------------------------------------------------------------------------

    @property
    def thinking(self) -> bool:
        return self.splitter is not None and self.splitter.thinking

    def feed(self, text: str) -> list[Item]:
        if self.splitter is not None:
            for kind, t in self.splitter.feed(text):
                self._segment(kind, t)
        else:
            self._buf += text
            self._run(final=False)
        return self._take_out()

    def flush(self) -> list[Item]:
        if self.splitter is not None:
            for kind, t in self.splitter.flush():
                self._segment(kind, t)
        self._end_input()
        self._flush_raw()
        if self._ws and not self._drop_ws:
            self._emit((CONTENT, self._ws))
        self._ws = ""
        return self._take_out()

    # --- output ----------------------------------------------------------------------------

    def _take_out(self) -> list[Item]:
        out, self._out = self._out, []
        return out

    def _emit(self, item: Item) -> None:
        if isinstance(item, tuple) and self._out and isinstance(self._out[-1], tuple) and self._out[-1][0] == item[0]:
            self._out[-1] = (item[0], self._out[-1][1] + item[1])
        else:
            self._out.append(item)

    def _flush_raw(self) -> None:
        if self._raw:
            self._emit((CONTENT, self._ws + self._raw))
            self._raw = self._ws = ""
            self._drop_ws = False

    def _content(self, text: str) -> None:
        if not text:
            return
        if self._drop_ws:
            text = text.lstrip()
            if not text:
                return
            self._drop_ws = False
        self._flush_raw()
        text = self._ws + text
        body = text.rstrip()
        self._ws = text[len(body):]
        if body:
            self._emit((CONTENT, body))

    def _new_id(self) -> str:
        while True:
            cid = "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))
            if cid not in self._ids:
                self._ids.add(cid)
                return cid

    def _release(self, call: _Call) -> None:
        self._flush_raw()
        for item in call.items:
            if isinstance(item, CallStart):
                self._next_index += 1
            last = self._out[-1] if self._out else None
            if isinstance(item, CallArgs) and isinstance(last, CallArgs) and last.index == item.index:
                self._out[-1] = CallArgs(item.index, last.text + item.text)
            else:
                self._out.append(item)
        call.items = []
        call.released = True

    def _begin(self, call: _Call) -> None:
        """The call's CallStart: its name is known and valid."""
        assert call.name is not None and call.error is None
        call.index = self._next_index
        call.started = True
        call.items.append(CallStart(call.index, self._new_id(), call.name))
        if self.stream:
            self._release(call)

    def _args(self, call: _Call, text: str) -> None:
        if not call.started or not text:
            return
        call.args.append(text)
        call.items.append(CallArgs(call.index, text))
        if self.stream:
            self._release(call)

    def _name(self, call: _Call, name: str) -> None:
        call.name = name
        if name not in self.params:
            call.error = f"unknown tool {name!r}"

    def _end_call(self, error: str | None = None) -> None:
        call, self._call = self._call, None
        assert call is not None
        self._block_calls += 1
        error = call.error or error
        if error is None and not call.started:
            error = "no arguments object"
        if error is None and not _is_object("".join(call.args)):
            error = "the arguments are not one JSON object"
        if error is None:
            call.items.append(CallEnd(call.index))
            self._release(call)
            self._drop_ws = True
            return
        self.failed.append(f"{error}: {call.raw[:200]!r}")
        if call.released:
            call.items.append(CallEnd(call.index, error))
            self._release(call)
            self._drop_ws = True
        else:
            self._raw += call.raw

    # --- the machine -----------------------------------------------------------------------

    def _run(self, final: bool) -> None:
        stuck = 0
        while self._buf:
            before = (len(self._buf), self._state, id(self._call))
            if not self._steps[self._state](final):
                break
            stuck = stuck + 1 if (len(self._buf), self._state, id(self._call)) == before else 0
            if stuck > 3:
                raise RuntimeError(f"tool-call parser stuck in {self._state}")
        if final and self._buf:
            raise RuntimeError(f"tool-call parser left text in {self._state}")

    def _end_input(self) -> None:
        """The end of the answer (or of a harmony call's body): settle whatever is open."""
        self._run(final=True)
        if self._call is not None:
            call = self._call
            complete = (self._state == OBJ and call.phase == TAIL) or self._state == D_TAIL
            self._end_call(None if complete else "the answer ended inside the call")
        elif self._state in (BLOCK, M_START, M_ARRAY, D_BLOCK, L_TAG) and self._group and not self._block_calls:
            self.failed.append(f"the answer ended inside the call: {self._group[:200]!r}")
            self._raw += self._group
        elif self._state in (L_START, M_AFTER):
            self._content(self._group)
        self._group = ""
        self._state = L_START if self.fmt == "llama3" else TEXT

    def _take(self, n: int) -> str:
        s, self._buf = self._buf[:n], self._buf[n:]
        if self._call is not None:
            self._call.raw += s
        else:
            self._group += s
        return s

    def _skip_ws(self, extra: str = "") -> int:
        n = len(self._buf) - len(self._buf.lstrip(_WS + extra))
        self._take(n)
        return n

    def _open(self, state: str) -> None:
        """A block opened by the marker just consumed into ``_group``."""
        self._group = self._ws + self._group
        self._ws = ""
        self._block_calls = 0
        self._state = state

    def _close_block(self) -> None:
        if not self._block_calls:
            self.failed.append(f"no call in the block: {self._group[:200]!r}")
            self._raw += self._group
        elif self._raw:
            self._raw += self._group
        self._group = ""
        self._state = TEXT

    def _new_call(self) -> _Call:
        self._call = _Call(self._group)
        self._group = ""
        return self._call

    def _lead(self, markers: Sequence[str], final: bool) -> str | None:
        """The marker ``_buf`` begins with; "" while it may still become one; None if not."""
        for m in markers:
            if self._buf.startswith(m):
                return m
        if not final and any(m.startswith(self._buf) for m in markers):
            return ""
        return None

    def _until(self, markers: Sequence[str], final: bool) -> tuple[str, str | None]:
        """Text before the first marker (or all that cannot begin one), and that marker."""
        hit = _find(self._buf, markers)
        if hit:
            return self._buf[:hit[0]], hit[1]
        return self._buf[:len(self._buf) - (0 if final else _partial(self._buf, markers))], None

    def _read_name(self, ends: Sequence[str], final: bool, bad: str) -> tuple[str, str] | str:
        """A name ended by one of ``ends``: (name, end); ``_MORE`` while it may still come;
        "bad" when the text cannot be a name (too long, a character in ``bad``, or no end at all)."""
        text, end = self._until(ends, final)
        if len(text) > _NAME_LIMIT or any(c in bad for c in text):
            return "bad"
        if end is None:
            return "bad" if final else _MORE
        return text, end

    def _junk(self, until: tuple[tuple[str, bool], ...], error: str) -> None:
        """The call is broken: keep its text up to one of ``until`` (consumed when flagged)."""
        assert self._call is not None
        self._call.error = self._call.error or error
        self._junk_until = until
        self._state = JUNK

    # TEXT: free text, looking for an opening marker
    def _s_text(self, final: bool) -> bool:
        text, marker = self._until(self._openers, final)
        self._content(text)
        self._buf = self._buf[len(text):]
        if marker is None:
            return bool(text)
        self._buf = self._buf[len(marker):]
        if marker in _STRAYS[self.fmt]:
            return True
        self._group = marker
        if marker == TOOL_CALL:
            self._open(BLOCK)
        elif marker == FUNCTION:  # qwen3_coder's bare <function=NAME>
            self._open(Q_NAME)
            self._new_call().bare = True
        elif marker == PYTHON_TAG:
            self._open(L_TAG)
        elif marker == TOOL_CALLS:
            self._open(M_START)
        elif marker == DS_CALL_BEGIN:
            self._open(D_HEAD)
            self._new_call()
        else:
            self._open(D_BLOCK)
        return True

    # hermes / qwen3_coder / plain: inside <tool_call>
    def _s_block(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        if self._buf[0] == "{":
            self._new_call()
            self._json_call((TOOL_CALL_END, TOOL_CALL), after=BLOCK)
            return True
        m = self._lead((TOOL_CALL_END, FUNCTION, TOOL_CALL), final)
        if m == "":
            return False
        if m == TOOL_CALL_END:
            self._take(len(m))
            self._close_block()
            return True
        if m == TOOL_CALL:  # a new block while this one is open: this one is over
            self._close_block()
            return True
        self._new_call()
        if m == FUNCTION:
            self._take(len(m))
            self._state = Q_NAME
        else:
            self._junk(((TOOL_CALL_END, True), (TOOL_CALL, False)), "not a tool call")
            self._after = TEXT
        return True

    def _json_call(self, closers: tuple[str, ...], after: str, strict: bool = False) -> None:
        """Read a call written as a JSON object, from the ``{`` at the start of ``_buf``."""
        assert self._call is not None
        self._call.phase = HEAD
        self._closers, self._after, self._strict = closers, after, strict
        self._state = OBJ

    def _scan(self, stop: int, emit: bool, final: bool) -> tuple[str, int]:
        """Consume the call's JSON until its depth comes back to ``stop`` (``_DONE``), a closer
        marker outside strings (``_CUT``), or the end of ``_buf`` (``_MORE``); and how much."""
        call = self._current
        buf, closers = self._buf, self._closers
        heads = {m[0] for m in closers}
        out: list[str] = []
        i, status = 0, _MORE
        while i < len(buf):
            c = buf[i]
            if not call.in_str and c in heads:
                if any(buf.startswith(m, i) for m in closers):
                    status = _CUT
                    break
                if not final and any(m.startswith(buf[i:]) for m in closers):
                    break
            was_in_str = call.in_str
            call.step(c)
            if emit:
                out.append(_escape(c) if was_in_str and c < " " else c)
            i += 1
            if c in '}]"' and not call.in_str and call.depth == stop:
                status = _DONE
                break
        taken = self._take(i)
        call.text += taken
        if out:
            self._args(call, "".join(out))
        return status, i

    def _s_obj(self, final: bool) -> bool:
        call = self._current
        if call.phase == HEAD:
            r = _match_head(self._buf, self._arg_keys)
            if r == _MORE and not final and len(self._buf) < _HEAD_LIMIT:
                return False
            if isinstance(r, tuple):
                name, end = r
                for c in self._buf[:end]:
                    call.step(c)
                call.text += self._take(end)
                self._name(call, name)
                call.phase = VALUE
            elif self._strict:  # not a call after all: text
                self._call = None
                self._content(call.raw)
                self._state = TEXT
            else:
                call.phase = SLOW
            return True
        if call.phase == VALUE:
            if self._skip_ws():
                return True
            c = self._buf[0]
            if call.error:
                call.phase = SKIP
            elif c == "{":
                self._begin(call)
                call.phase = STREAM
            elif c == '"':
                call.value_at = len(call.text)
                call.phase = STRING
            else:
                call.error = "the arguments are not an object"
                call.phase = SKIP
            return True
        stop = 1 if call.phase in (STREAM, STRING) else 0
        status, n = self._scan(stop, emit=call.phase == STREAM, final=final)
        if status == _DONE:
            if call.phase == STRING:
                self._string_args(call, call.text[call.value_at:])
                call.phase = TAIL
            elif call.phase == STREAM:
                call.phase = TAIL
            else:
                if call.phase == SLOW:
                    self._whole_object(call)
                self._end_call()
                self._state = self._after
            return True
        if status == _CUT:
            self._end_call(None if call.phase == TAIL else "the call was cut off")
            self._state = self._after
            return True
        return n > 0

    def _string_args(self, call: _Call, text: str) -> None:
        """Arguments written as a JSON string holding the object."""
        try:
            args = _loads(_loads(text))
        except (ValueError, TypeError):
            args = None
        if not isinstance(args, dict):
            call.error = "the arguments are not an object"
            return
        self._begin(call)
        self._args(call, json.dumps(args, ensure_ascii=False))

    def _whole_object(self, call: _Call) -> None:
        """A call object whose keys came in another order: read once it is complete."""
        try:
            obj = _loads(call.text)
        except ValueError:
            call.error = "the call is not JSON"
            return
        if isinstance(obj, dict) and isinstance(obj.get("function"), dict):
            obj = obj["function"]
        name = obj.get("name") if isinstance(obj, dict) else None
        if not isinstance(name, str):
            call.error = "the call has no name"
            return
        self._name(call, name)
        if call.error:
            return
        args = next((obj[k] for k in self._arg_keys if k in obj), None)
        if isinstance(args, str):
            try:
                args = _loads(args)
            except ValueError:
                args = None
        if not isinstance(args, dict):
            call.error = "the arguments are not an object"
            return
        self._begin(call)
        self._args(call, json.dumps(args, ensure_ascii=False))

    # mistral N[ARGS]{...}, deepseek and harmony: the arguments object alone
    def _args_only(self, closers: tuple[str, ...], after: str, end_at_json: bool = True) -> None:
        self._closers, self._after, self._end_at_json = closers, after, end_at_json
        self._state = ARGS_ONLY

    def _s_args_only(self, final: bool) -> bool:
        call = self._current
        if not call.phase:
            if self._skip_ws():
                return True
            if self._buf[0] != "{":
                self._junk(tuple((m, False) for m in self._closers), "the arguments are not an object")
                return True
            if not call.error:
                self._begin(call)
            call.phase = STREAM
        status, n = self._scan(0, emit=call.started, final=final)
        if status == _DONE:
            if self._end_at_json:
                self._end_call()
                self._state = self._after
            else:
                call.phase = TAIL
                self._state = D_TAIL
            return True
        if status == _CUT:
            self._end_call("the call was cut off")
            self._state = self._after
            return True
        return n > 0

    def _s_junk(self, final: bool) -> bool:
        text, marker = self._until([m for m, _ in self._junk_until], final)
        self._take(len(text))
        if marker is None:
            return bool(text)
        if dict(self._junk_until)[marker]:
            self._take(len(marker))
        self._end_call()
        self._state = self._after
        return True

    # qwen3_coder: <function=NAME> <parameter=P>VALUE</parameter> </function>
    def _s_q_name(self, final: bool) -> bool:
        call = self._current
        r = self._read_name((">",), final, bad="\n<{}\"")
        if r == _MORE:
            return False
        if r == "bad" or (call.bare and isinstance(r, tuple) and r[0].strip() not in self.params):
            if call.bare:  # not a call: the text stays text
                self._call = None
                if isinstance(r, tuple):
                    self._content(call.raw + self._buf[:len(r[0]) + 1])
                    self._buf = self._buf[len(r[0]) + 1:]
                else:
                    self._content(call.raw)
                self._state = TEXT
                return True
            self._junk(_FUNCTION_ENDS, "a malformed function name")
            self._after = BLOCK
            return True
        assert isinstance(r, tuple)
        self._take(len(r[0]) + 1)
        self._name(call, r[0].strip())
        if not call.error:
            self._begin(call)
        self._state = Q_FUNC
        return True

    def _end_function(self) -> None:
        call = self._current
        self._args(call, "}" if call.params else "{}")
        bare = call.bare
        self._end_call()
        self._state = TEXT if bare else BLOCK

    def _s_q_func(self, final: bool) -> bool:
        junk, marker = self._until((PARAMETER, FUNCTION_END, TOOL_CALL_END, FUNCTION, TOOL_CALL), final)
        self._take(len(junk))  # text between parameters carries nothing
        if marker is None:
            return bool(junk)
        if marker == PARAMETER:
            self._take(len(marker))
            self._state = Q_PNAME
            return True
        if marker == FUNCTION_END:
            self._take(len(marker))
        self._end_function()  # a missing </function> is forgiven when the call goes on to something else
        return True

    def _s_q_pname(self, final: bool) -> bool:
        call = self._current
        r = self._read_name((">",), final, bad="\n<")
        if r == _MORE:
            return False
        if r == "bad":
            self._junk(_FUNCTION_ENDS, "a malformed parameter")
            self._after = TEXT if call.bare else BLOCK
            return True
        assert isinstance(r, tuple)
        self._take(len(r[0]) + 1)
        name = r[0].strip()
        schema = self.params.get(call.name or "", {}).get("properties")
        call.types = _schema_types(schema.get(name)) if isinstance(schema, dict) else None
        call.prefix = ("{" if not call.params else ", ") + json.dumps(name, ensure_ascii=False) + ": "
        call.value, call.value_begun, call.held_nl = "", False, False
        if call.types == {"string"}:
            self._args(call, call.prefix + '"')
        self._state = Q_VALUE
        return True

    def _s_q_value(self, final: bool) -> bool:
        call = self._current
        if not call.value_begun:
            call.value_begun = True
            if self._buf.startswith("\n"):
                self._take(1)
            return True
        text, marker = self._until((PARAMETER_END, PARAMETER, FUNCTION_END, TOOL_CALL_END), final)
        n = len(self._take(len(text)))
        if call.types == {"string"}:
            text = ("\n" if call.held_nl else "") + text
            call.held_nl = text.endswith("\n")
            self._args(call, _escape(text[:-1] if call.held_nl else text))
        else:
            call.value += text
        if marker is None:
            return n > 0
        if call.types == {"string"}:
            self._args(call, '"')
        else:
            value = call.value[:-1] if call.value.endswith("\n") else call.value
            self._args(call, call.prefix + _typed(value, call.types))
        call.params += 1
        if marker == PARAMETER_END:
            self._take(len(marker))
        self._state = Q_FUNC
        return True

    # llama3: JSON calls at the start of the answer or right after another call
    def _s_l_start(self, final: bool) -> bool:
        if self._skip_ws(";" if self._drop_ws else ""):
            return True
        m = self._lead((PYTHON_TAG,), final)
        if m == "":
            return False
        if m:
            self._take(len(m))
            self._open(L_TAG)
            return True
        if self._buf[0] == "{":
            self._new_call()
            self._json_call((EOM, EOT, PYTHON_TAG), after=L_START, strict=True)
            return True
        self._content(self._group)
        self._group = ""
        self._state = TEXT
        return True

    def _s_l_tag(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        self._new_call()
        if self._buf[0] == "{":
            self._json_call((EOM, EOT, PYTHON_TAG), after=L_START)
        else:  # a built-in tool's call (python, brave_search, ...): not one of the request's tools
            self._junk(((EOM, True), (EOT, True), (PYTHON_TAG, False)), "not a JSON call")
            self._after = L_START
        return True

    # mistral: [TOOL_CALLS] then [{...}, ...] or NAME[CALL_ID]ID[ARGS]{...}
    def _s_m_start(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        m = self._lead((TOOL_CALLS, ARGS, CALL_ID), final)
        if m == "":
            return False
        if m == TOOL_CALLS:
            self._take(len(m))
            return True
        if self._buf[0] == "[" and not m:
            self._take(1)
            self._state = M_ARRAY
            return True
        self._new_call()
        self._state = M_NAME
        return True

    def _s_m_name(self, final: bool) -> bool:
        call = self._current
        r = self._read_name((ARGS, CALL_ID), final, bad="\n{}[]\"<>")
        if r == _MORE:
            return False
        if r == "bad":
            self._junk(((TOOL_CALLS, False),), "a malformed call")
            self._after = TEXT
            return True
        assert isinstance(r, tuple)
        self._take(len(r[0]) + len(r[1]))
        self._name(call, r[0].strip())
        if r[1] == CALL_ID:
            self._state = M_ID
        else:
            self._args_only((TOOL_CALLS,), after=M_AFTER)
        return True

    def _s_m_id(self, final: bool) -> bool:
        r = self._read_name((ARGS,), final, bad="\n{}[]\"<>")
        if r == _MORE:
            return False
        if r == "bad":
            self._junk(((TOOL_CALLS, False),), "a malformed call id")
            self._after = TEXT
            return True
        assert isinstance(r, tuple)
        self._take(len(r[0]) + len(r[1]))
        self._args_only((TOOL_CALLS,), after=M_AFTER)
        return True

    def _s_m_after(self, final: bool) -> bool:
        """After a call: another one chained (``N[ARGS]...`` or ``[TOOL_CALLS]``), or text."""
        if self._skip_ws():
            return True
        name = re.match(r"[^\s\[\]{}\"<>]*", self._buf)
        assert name is not None
        n = name.end()
        if n > _NAME_LIMIT:
            m = None
        else:
            rest = self._buf[n:]
            m = next((k for k in (ARGS, CALL_ID, TOOL_CALLS) if rest.startswith(k)), None)
            if m is None and not final and any(k.startswith(rest) for k in (ARGS, CALL_ID, TOOL_CALLS)):
                return False
        if m in (ARGS, CALL_ID) and n:
            self._group = ""
            self._new_call()
            self._state = M_NAME
        else:
            self._group = ""
            self._state = TEXT
        return True

    def _s_m_array(self, final: bool) -> bool:
        if self._skip_ws(","):
            return True
        if self._buf[0] == "{":
            self._new_call()
            self._json_call((TOOL_CALLS,), after=M_ARRAY)
            return True
        if self._buf[0] == "]":
            self._take(1)
        self._close_block()
        return True

    # deepseek
    def _s_d_block(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        m = self._lead((DS_CALL_BEGIN, DS_CALLS_END), final)
        if m == "":
            return False
        if m == DS_CALL_BEGIN:
            self._take(len(m))
            self._new_call()
            self._state = D_HEAD
        else:
            if m:
                self._take(len(m))
            self._close_block()
        return True

    _D_JUNK = ((DS_CALL_END, True), (DS_CALLS_END, False), (DS_CALL_BEGIN, False))

    def _s_d_head(self, final: bool) -> bool:
        r = self._read_name((DS_SEP,), final, bad="{}<>\"")
        if r == _MORE:
            return False
        if r == "bad":
            self._junk(self._D_JUNK, "a malformed call")
            self._after = D_BLOCK
            return True
        assert isinstance(r, tuple)
        self._take(len(r[0]) + len(r[1]))
        assert self._call is not None
        self._call.value = r[0]
        self._state = D_SEP
        return True

    def _s_d_sep(self, final: bool) -> bool:
        call = self._current
        if self._buf.lstrip(_WS).startswith("{"):  # V3.1: NAME<｜tool▁sep｜>{...}
            self._name(call, call.value.strip())
            self._args_only((DS_CALL_END, DS_CALLS_END, DS_CALL_BEGIN), after=D_BLOCK, end_at_json=False)
            return True
        if not self._buf.strip(_WS) and not final:
            return False
        self._state = D_NAME  # R1: TYPE<｜tool▁sep｜>NAME\n```json\n{...}\n```
        return True

    def _s_d_name(self, final: bool) -> bool:
        call = self._current
        r = self._read_name(("\n", "`", "{"), final, bad="<>\"")
        if r == _MORE:
            return False
        if r == "bad":
            self._junk(self._D_JUNK, "a malformed call")
            self._after = D_BLOCK
            return True
        assert isinstance(r, tuple)
        self._take(len(r[0]))
        self._name(call, r[0].strip())
        self._state = D_FENCE
        return True

    def _s_d_fence(self, final: bool) -> bool:
        fence = re.match(r"\s*(?:```(?:json)?)?\s*", self._buf)
        assert fence is not None
        rest = self._buf[fence.end():]
        if rest.startswith("{"):
            self._take(fence.end())
            self._args_only((DS_CALL_END, DS_CALLS_END, DS_CALL_BEGIN), after=D_BLOCK, end_at_json=False)
            return True
        if not final and (not rest or "```json".startswith(rest) or "json".startswith(rest)):
            return False
        self._junk(self._D_JUNK, "the arguments are not an object")
        self._after = D_BLOCK
        return True

    def _s_d_tail(self, final: bool) -> bool:
        """After the arguments: an optional closing fence, then <｜tool▁call▁end｜>."""
        text, marker = self._until((DS_CALL_END, DS_CALLS_END, DS_CALL_BEGIN), final)
        self._take(len(text))
        if marker is None:
            return bool(text)
        if marker == DS_CALL_END:
            self._take(len(marker))
        self._end_call()
        self._state = D_BLOCK
        return True

    # harmony: the splitter's segments
    def _segment(self, kind: str, text: str) -> None:
        if kind == CALL:
            if self._call is not None or self._buf:
                self._buf += text
                self._run(final=False)
            return
        self._end_input()
        if kind == RECIPIENT:
            call = _Call()
            self._call = call
            self._name(call, text.removeprefix("functions."))
            self._args_only((), after=TEXT)
            return
        self._flush_raw()
        self._emit((kind, text))


class AnswerParser:
    """The raw answer in, thinking, content and call items out: ``ReasoningSplitter`` (for
    ``reasoning``, a reasoning format or None) and ``ToolCallParser`` (for ``tool_format``, or
    None for an answer without tools) composed. For harmony the tool parser does the splitting
    itself, whatever ``reasoning`` says. ``prompt_tail``: the end of the rendered prompt."""

    def __init__(self, tool_format: str | None, tools: Sequence[dict[str, Any]] | None = None, *,
                 reasoning: str | None = None, prompt_tail: str = "", stream: bool = True):
        harmony = tool_format == "harmony"
        self.stream = stream
        self.tools = ToolCallParser(tool_format, tools, stream=stream, prompt_tail=prompt_tail) if tool_format else None
        self.splitter = None if harmony or not reasoning else ReasoningSplitter(reasoning, prompt_tail)

    @property
    def thinking(self) -> bool:
        """Inside thinking now (for counting reasoning tokens)."""
        if self.splitter is not None:
            return self.splitter.thinking
        return self.tools is not None and self.tools.thinking

    @property
    def failed(self) -> list[str]:
        return self.tools.failed if self.tools is not None else []

    def _route(self, segments: list[tuple[str, str]], out: list[Item]) -> None:
        for kind, text in segments:
            if kind == THINKING or self.tools is None:
                out.append((kind, text))
            else:
                out += self.tools.feed(text)

    def feed(self, text: str) -> list[Item]:
        if self.splitter is None:
            return self.tools.feed(text) if self.tools is not None else [(CONTENT, text)] if text else []
        out: list[Item] = []
        self._route(self.splitter.feed(text), out)
        return out

    def flush(self) -> list[Item]:
        out: list[Item] = []
        if self.splitter is not None:
            self._route(self.splitter.flush(), out)
        if self.tools is not None:
            out += self.tools.flush()
        return out
