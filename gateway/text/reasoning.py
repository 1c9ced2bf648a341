"""Separate a thinking model's reasoning from its answer, in every marker format in use.

One rule for streamed and whole answers: ``ReasoningSplitter.feed(text)`` takes text in
any cuts (a marker may arrive one character at a time) and returns ``(kind, text)``
segments, kind ``"thinking"`` or ``"content"``; ``flush()`` ends the answer. A partial
marker is held back until it is known, and a marker that moves between thinking and answer
never reaches either side.

Formats, as small state machines (state -> marker -> next state):
- ``think``: ``<think>...</think>`` (Qwen3, DeepSeek-R1, QwQ, ...).
- ``think_mistral``: ``[THINK]...[/THINK]`` (Magistral, Ministral reasoning).
- ``seed``: ``<seed:think>...</seed:think>`` (Seed-OSS).
- ``think_dsml``: ``think`` for DeepSeek V3.2 / V4, whose DSML call block also ends the thinking
  (the block's opener stays in the answer, for the call parser).
- ``cohere``: ``<|START_THINKING|>...<|END_THINKING|>`` (Command R7B, Cohere2 MoE); their answer's
  wrappers (``<|START_RESPONSE|>``, ``<|START_TEXT|>`` and their ends) are dropped, and one of them
  or ``<|START_ACTION|>`` (which stays in the answer) ends the thinking too.
- a model's own pair, named in models.yaml: the format is ``pair_format(open, close)``. Apriel
  1.6's pair opens with words its prompt writes ("Here are my reasoning steps:"), which are the
  thinking's first (``words``: kept in it, as llama.cpp reads them and the template writes a
  turn's reasoning back).
- ``think_leading``: for a model that showed no marker at all: an answer that opens with
  ``<think>`` written as plain text (some fine-tunes do) thinks until ``</think>``; ``<think>``
  anywhere later is content.
- ``channel``: Gemma 4's ``<|channel>NAME\\n...<channel|>``; the channel is thinking while
  NAME is thought/analysis/thinking/reasoning, content for any other name or once
  ``<channel|>`` closes it.
- ``harmony``: gpt-oss's ``<|channel|>analysis<|message|>...<|end|><|start|>assistant
  <|channel|>final<|message|>...``; headers (role, channel, constraints) are dropped,
  message bodies go by channel (``analysis`` is thinking, others content). A built-in tool's call
  (``to=python``, ``to=container.exec``) without ``calls`` is dropped. ``harmony_inline`` (thinking
  not split out, ``unsplit``) keeps an analysis message in the answer as written.
The starting state comes from the end of the prompt: feeding the prompt's tail first means a
chat template that opens ``<think>`` (or a channel) in the prompt starts the answer inside it.
As llama.cpp reads a thinking block (it can only lead the answer, and only its closer ends it):
an opener written while thinking is open is thinking text, and a closer written once the
answer's text began is the answer's (before that it is dropped). With thinking not split out
(``unsplit``), a chat's answer begins with the prompt's text from the opener of the thinking it
left open (``<think>\\n``): the answer continues it.

Tool calls in harmony (``calls=True``, what ``toolformats.ToolCallParser`` asks for): a message
whose header, role part (``<|start|>assistant to=functions.f``) or channel part
(``<|channel|>commentary to=functions.f <|constrain|>json``), names a recipient other than
``assistant`` is a call: the splitter yields ``("recipient", "functions.f")`` when its body
begins, then its body as ``("call", text)`` segments, whatever its channel. The call ends with
the next segment of another kind (or the next recipient), or at the end of the answer. Without
``calls`` such a body goes by its channel, as before.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

THINKING, CONTENT, CALL, RECIPIENT = "thinking", "content", "call", "recipient"
COLLECT, IDLE = "collect", "idle"  # internal states: gather a header; drop text between messages
THOUGHT_CHANNELS = frozenset({"thought", "analysis", "thinking", "reasoning"})
START = "start"  # think_leading: nothing but whitespace written yet
PAIRS = {"think": ("<think>", "</think>"), "think_mistral": ("[THINK]", "[/THINK]"),
         "seed": ("<seed:think>", "</seed:think>"), "cohere": ("<|START_THINKING|>", "<|END_THINKING|>")}
FORMATS = ("think", "think_mistral", "seed", "channel", "harmony", "think_leading", "think_dsml", "cohere",
           "think_kimi", "kimi_k3", "think_ling")

Transition = Callable[["ReasoningSplitter"], str]


def _to(state: str, reset: bool = False) -> Transition:
    def go(s: ReasoningSplitter) -> str:
        if reset:
            s.header = ""
        return state
    return go


def _channel_named(s: ReasoningSplitter) -> str:
    name, s.header = s.header.strip().lower(), ""
    return THINKING if name in THOUGHT_CHANNELS else CONTENT


_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


def _harmony_body(s: ReasoningSplitter) -> str:
    words = s.header.split()
    to = _RECIPIENT.findall(f"{s.role} {s.header}")
    s.header = s.role = ""
    if s.calls and to and to[-1] != "assistant":
        s.recipient = to[-1]
        return CALL
    if to and to[-1] != "assistant" and not to[-1].startswith("functions."):
        return IDLE  # a built-in tool's call (python, container.exec, ...) no request gave: dropped, as llama.cpp does
    return THINKING if words and words[0].lower() == "analysis" else CONTENT


def _harmony_inline_body(s: ReasoningSplitter) -> str:
    """``harmony_inline`` (thinking not split out): an analysis message stays in the answer as
    written, up to its ``<|end|>``, as llama.cpp keeps it; other messages' headers are dropped."""
    header = s.header
    state = _harmony_body(s)
    if state != THINKING:
        return state
    s.said, s.outer, s.rules = f"<|channel|>{header}<|message|>", s.rules, _HARMONY_RAW
    return CONTENT


def _harmony_raw_end(s: ReasoningSplitter) -> str:
    s.said, s.rules = "<|end|>", s.outer
    return CONTENT


def _harmony_start(s: ReasoningSplitter) -> str:
    s.header = s.role = ""
    return COLLECT


def _harmony_channel(s: ReasoningSplitter) -> str:
    """The role part of the header (``assistant to=functions.f``) is kept for the recipient."""
    s.role, s.header = f"{s.role} {s.header}", ""
    return COLLECT


def _harmony_end(s: ReasoningSplitter) -> str:
    s.role = ""
    return IDLE


_HARMONY_ANYWHERE: dict[str, Transition] = {
    "<|channel|>": _harmony_channel, "<|start|>": _harmony_start, "<|message|>": _harmony_body,
    "<|end|>": _harmony_end, "<|return|>": _harmony_end, "<|call|>": _harmony_end,
}

def _said(text: str) -> Transition:
    """Into thinking, ``text`` (the opener itself) its first words."""
    def go(s: ReasoningSplitter) -> str:
        s.said = text
        return THINKING
    return go


def _stray(close: str) -> Transition:
    """A closer while no thinking is open: dropped before the answer's text begins (a thinking
    the prompt closed, closed again), text after, as llama.cpp reads it (its thinking block can
    only lead the answer)."""
    def go(s: ReasoningSplitter) -> str:
        if CONTENT in s._started:
            s.said = close
        return CONTENT
    return go


def _pair(open_: str, close: str, words: bool = False) -> dict[str, dict[str, Transition]]:
    # Once thinking is open only its closer ends it: the opener written again is thinking text,
    # as llama.cpp reads it. ``words``: the opener is the thinking's own first words (Apriel
    # 1.6's), kept in it.
    return {CONTENT: {open_: _said(open_) if words else _to(THINKING), close: _stray(close)},
            THINKING: {close: _to(CONTENT)}}


def _open_leading(s: ReasoningSplitter) -> str:
    s._lead = ""  # whitespace before the answer's <think> is nobody's
    return THINKING


def pair_format(open_: str, close: str, *, words: bool = False) -> str:
    """The format name of a model's own pair of thinking markers (``words``: the opener is the
    thinking's own first words, which stay in it)."""
    return "pair:" + json.dumps([open_, close, *([True] if words else [])])


def closing(fmt: str) -> str:
    """The text that ends a thinking block in ``fmt`` (what the worker writes when a budget runs out)."""
    if fmt == "harmony":
        return "<|end|><|start|>assistant<|channel|>final<|message|>"
    if fmt == "channel":
        return "<channel|>"
    if fmt == "muse":
        return "<|eom|><|start|>assistant to=user<|message|>"
    if fmt.startswith("pair:"):
        return json.loads(fmt[5:])[1]
    return PAIRS.get(fmt, PAIRS["think"])[1]


RULES: dict[str, dict[str, dict[str, Transition]]] = {
    **{name: _pair(*pair) for name, pair in PAIRS.items()},
    "think_leading": {START: {"<think>": _open_leading}, THINKING: {"</think>": _to(CONTENT)}},
    "channel": {
        CONTENT: {"<|channel>": _to(COLLECT, reset=True), "<channel|>": _to(CONTENT)},
        THINKING: {"<|channel>": _to(COLLECT, reset=True), "<channel|>": _to(CONTENT)},
        COLLECT: {"\n": _channel_named, "<channel|>": _to(CONTENT, reset=True), "<|channel>": _to(COLLECT, reset=True)},
    },
    "harmony": {state: _HARMONY_ANYWHERE for state in (CONTENT, THINKING, COLLECT, IDLE, CALL)},
}
_HARMONY_RAW: dict[str, dict[str, Transition]] = {CONTENT: {"<|end|>": _harmony_raw_end}}
RULES["harmony_inline"] = {state: {**_HARMONY_ANYWHERE, "<|message|>": _harmony_inline_body}
                           for state in (CONTENT, THINKING, COLLECT, IDLE, CALL)}


def _muse_body(s: ReasoningSplitter) -> str:
    to = _RECIPIENT.findall(s.header)
    s.header = s.role = ""
    if to and to[-1] == "self":
        return THINKING
    if s.calls and to and to[-1] != "user":
        s.recipient = to[-1]
        return CALL
    return CONTENT


# ``muse``: Muse Glimmer's messages, ``<|start|>assistant to=R<|message|>...<|eom|>`` (or ``<|eot|>``):
# R self is thinking, user (or none) content, another a call (``calls``; else content).
_MUSE: dict[str, Transition] = {"<|start|>": _harmony_start, "<|message|>": _muse_body,
                                "<|eom|>": _harmony_end, "<|eot|>": _harmony_end}
RULES["muse"] = {state: _MUSE for state in (CONTENT, THINKING, COLLECT, IDLE, CALL)}


INLINE = "inline:"  # a format's name after it: its answer read with the thinking not split out (``unsplit``)


def unsplit(fmt: str | None, chat: bool = True) -> str | None:
    """The format that reads an answer whose thinking is not split out (the request's
    reasoning_format none), as llama.cpp reads it:
    - harmony: its message framing is still dropped (``harmony_inline``);
    - a chat's answer in a format whose thinking one marker opens: the text as written, after the
      prompt's own text from the opener of the thinking it left open (``<think>\\n``), which the
      answer continues (``inline:FORMAT``); Command R7B's and Cohere2 MoE's answer wrappers are
      still dropped;
    - else None, the text as written: a completion (``chat`` False) continues its prompt; Ling
      3.0's answer keeps no opener (llama.cpp's parser of it drops its thinking's markers)."""
    if fmt == "harmony":
        return "harmony_inline"
    if chat and fmt and fmt not in ("think_ling", "kimi_k3") and opener(fmt) is not None:
        return INLINE + fmt
    return None


def opener(fmt: str) -> tuple[str, str, bool] | None:
    """The marker that opens ``fmt``'s thinking, the one that closes it, and whether the opener is
    the thinking's own first words; None for a format whose thinking no one marker opens."""
    if fmt.startswith("pair:"):
        open_, close, *words = json.loads(fmt[5:])
        return open_, close, bool(words and words[0])
    pair = PAIRS.get("think" if fmt in ("think_dsml", "think_kimi", "think_ling") else fmt)
    return (*pair, False) if pair else None

# Markers that end thinking where the answer's calls begin (llama.cpp's thinking end tags for these
# families): met while thinking, they stay in the answer's text for the call parser to read.
# ``think_dsml``: DeepSeek V3.2 / V4, whose DSML call block may follow the thinking without </think>.
# ``cohere``: Command R7B and Cohere2 MoE, whose answer is wrapped in <|START_RESPONSE|> or
# <|START_TEXT|> (the wrappers are dropped; either ends thinking) and calls open <|START_ACTION|>.
KEPT = frozenset({"<｜DSML｜function_calls>", "<｜DSML｜tool_calls>", "<|START_ACTION|>"})
_COHERE_WRAPS = ("<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TEXT|>", "<|END_TEXT|>")
RULES["think_dsml"] = {CONTENT: RULES["think"][CONTENT], THINKING: {
    **RULES["think"][THINKING], "<｜DSML｜function_calls>": _to(CONTENT), "<｜DSML｜tool_calls>": _to(CONTENT)}}
RULES["cohere"] = {CONTENT: {**RULES["cohere"][CONTENT], **{m: _to(CONTENT) for m in _COHERE_WRAPS}},
                   THINKING: {**RULES["cohere"][THINKING], "<|START_TEXT|>": _to(CONTENT),
                              "<|START_RESPONSE|>": _to(CONTENT), "<|START_ACTION|>": _to(CONTENT)}}
# ``think_kimi``: Kimi K2-Thinking, whose calls may follow the thinking without </think>.
_KIMI_CALLS = ("<|tool_calls_section_begin|>", "<|tool_call_begin|>")
RULES["think_kimi"] = {CONTENT: RULES["think"][CONTENT],
                       THINKING: {**RULES["think"][THINKING], **{m: _to(CONTENT) for m in _KIMI_CALLS}}}
KEPT = KEPT | frozenset(_KIMI_CALLS)
# ``think_ling``: Ling 3.0, whose call (<tool_call>) may follow the thinking without </think>;
# its turn's end, <|role_end|>, is dropped.
RULES["think_ling"] = {CONTENT: {**RULES["think"][CONTENT], "<|role_end|>": _to(CONTENT)},
                       THINKING: {**RULES["think"][THINKING], "<tool_call>": _to(CONTENT)}}
KEPT = KEPT | {"<tool_call>"}
# ``kimi_k3``: Kimi K3's sections, <|open|>think<|sep|> (opened by the prompt) then
# <|open|>response<|sep|>, which also ends a think section left open; the response's and the
# message's closers are dropped (the tools section is the call parser's).
_K3_THINK, _K3_END_THINK = "<|open|>think<|sep|>", "<|close|>think<|sep|>"
_K3_WRAPS = ("<|open|>response<|sep|>", "<|close|>response<|sep|>", "<|close|>message<|sep|>", "<|end_of_msg|>")
PAIRS["kimi_k3"] = (_K3_THINK, _K3_END_THINK)  # for ``closing``
RULES[INLINE + "cohere"] = {CONTENT: {m: _to(CONTENT) for m in _COHERE_WRAPS}}
RULES["kimi_k3"] = {CONTENT: {**_pair(_K3_THINK, _K3_END_THINK)[CONTENT], _K3_END_THINK: _to(CONTENT),
                              **{m: _to(CONTENT) for m in _K3_WRAPS}},
                    THINKING: {**_pair(_K3_THINK, _K3_END_THINK)[THINKING], _K3_THINK: _to(THINKING),
                               _K3_WRAPS[0]: _to(CONTENT)}}


class ReasoningSplitter:
    def __init__(self, fmt: str, prompt_tail: str = "", calls: bool = False, ends: tuple[str, ...] = ()):
        """``ends``: markers that also end thinking and stay in the answer (a call format's openers:
        a call written while thinking is open ends it, as llama.cpp reads Qwen 3.5's)."""
        inline = fmt.startswith(INLINE) and opener(fmt[len(INLINE):]) is not None
        if fmt.startswith("pair:"):
            self.rules = _pair(*json.loads(fmt[5:]))
        elif inline:
            self.rules = RULES.get(fmt, {})
        elif fmt in RULES:
            self.rules = RULES[fmt]
        else:
            raise ValueError(f"unknown reasoning format {fmt!r}")
        self.kept = KEPT | frozenset(ends)
        if ends:
            self.rules = {**self.rules, THINKING: {**self.rules.get(THINKING, {}), **{m: _to(CONTENT) for m in ends}}}
        self.calls = calls
        self.state = START if fmt == "think_leading" else CONTENT
        self.header = ""
        self._lead = ""  # think_leading: the answer's leading whitespace, until what follows is known
        self.role = ""  # harmony: the header's part before <|channel|>
        self.recipient = ""
        self.said = ""  # text a transition puts in the answer (harmony_inline: an analysis message's markers)
        self.outer = self.rules  # harmony_inline: the rules to go back to after an analysis message
        self._held = ""
        self._ws = ""  # trailing whitespace of thinking text, sent only if more thinking follows
        self._started: set[str] = set()
        # the prompt's text from the opener of the thinking it leaves open ("" when it leaves none)
        self.prompt_opened = ""
        if inline:  # the answer continues that text: it is the answer's first
            self._held = ReasoningSplitter(fmt[len(INLINE):], prompt_tail).prompt_opened
        elif prompt_tail:
            self.feed(prompt_tail)
            self.flush()
            self._ws, self._started = "", set()
            if fmt == "think_leading" and self.state != THINKING:  # the answer's own start decides
                self.state, self._lead = START, ""
            pair = opener(fmt)
            if self.state == THINKING and pair is not None:
                open_, close, words = pair
                after = prompt_tail.rfind(close)
                at = prompt_tail.find(open_, after + len(close) if after >= 0 else 0)
                if at >= 0:  # what the prompt wrote of the thinking is its start (its opener: if words)
                    self.prompt_opened = prompt_tail[at:]
                    self._held = self.prompt_opened[0 if words else len(open_):]

    @property
    def thinking(self) -> bool:
        return self.state == THINKING

    def _emit(self, out: list[tuple[str, str]], text: str, final: bool = False) -> None:
        """Route ``text`` by state. Whitespace that only separates markers from text is
        dropped: at the start of each side, and at the end of a thinking block."""
        if not text and not (final and self._lead):
            return
        if self.state == START:  # whitespace is held: it is content unless <think> follows
            self._lead += text
            if not text.strip() and not final:
                return
            # the answer began with something else: it goes as written, and <think> is content from here
            text, self._lead, self.state = self._lead, "", CONTENT
            self._started.add(CONTENT)
        if self.state == COLLECT:
            self.header += text
            return
        if self.state == CALL:  # a call's body goes as written
            if out and out[-1][0] == CALL:
                out[-1] = (CALL, out[-1][1] + text)
            else:
                out.append((CALL, text))
            return
        if self.state not in (THINKING, CONTENT):
            return
        if self.state == THINKING:
            text = self._ws + text
            self._ws = ""
        if self.state not in self._started:
            text = text.lstrip()
        if self.state == THINKING:
            body = text.rstrip()
            self._ws, text = text[len(body):], body
        if not text:
            return
        self._started.add(self.state)
        if out and out[-1][0] == self.state:
            out[-1] = (self.state, out[-1][1] + text)
        else:
            out.append((self.state, text))

    def feed(self, text: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        buf = self._held + text
        while True:
            markers = self.rules.get(self.state, {})
            hit = None
            for marker in markers:
                i = buf.find(marker)
                if i >= 0 and (hit is None or i < hit[0]):
                    hit = (i, marker)
            if hit is None:
                break
            i, marker = hit
            before = self.state
            self._emit(out, buf[:i])
            if self.state != before:  # text before the marker changed the state: the marker is read anew
                buf = buf[i:]
                continue
            buf = buf[i + len(marker):]
            self.state = markers[marker](self)
            if self.state != THINKING:
                self._ws = ""
            if marker in self.kept and before == THINKING:  # it ends thinking and stays in the answer
                self._emit(out, marker)
            if self.said:
                self._emit(out, self.said)
                self.said = ""
            if self.state == CALL:
                out.append((RECIPIENT, self.recipient))
        keep = 0
        for marker in self.rules.get(self.state, {}):  # a tail that may still become a marker
            for k in range(min(len(marker) - 1, len(buf)), keep, -1):
                if buf.endswith(marker[:k]):
                    keep = k
                    break
        self._held = buf[len(buf) - keep:] if keep else ""
        self._emit(out, buf[: len(buf) - keep])
        return out

    def flush(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        held, self._held = self._held, ""
        self._emit(out, held, final=True)
        return out


# Apriel 1.6's prompt opens its thinking with these words (no marker token), its first; [BEGIN FINAL RESPONSE] ends it
APRIEL_OPEN = "Here are my reasoning steps:\n"


def detect(template: str | None, special_tokens: list[str]) -> str | None:
    """The format a model uses, from its chat template and the markers its vocabulary has
    as single tokens; None when it shows none."""
    seen = set(special_tokens) | {m for m in ("<|channel|>", "<|message|>", "<|channel>", "<think>", "</think>",
                                              "<seed:think>", "[THINK]", "<mm:think>")
                                  if template and m in template}
    if template and "<atem:function_calls>" in template and "<|eom|>" in template:  # Muse Glimmer
        return "muse"
    if template and "open_tag('think'" in template and "<|sep|>" in template:  # Kimi K3
        return "kimi_k3"
    if "<think>" in seen and "<|tool_calls_section_begin|>" in (template or ""):  # Kimi K2-Thinking
        return "think_kimi"
    if "<think>" in seen and "<|role_end|>" in (template or "") and "<tool_call>" in (template or ""):  # Ling 3.0
        return "think_ling"
    if "<mm:think>" in seen:  # MiniMax M3
        return pair_format("<mm:think>", "</mm:think>")
    if {"<|channel|>", "<|message|>"} <= seen:
        return "harmony"
    if "<|channel>" in seen:
        return "channel"
    if "<|START_THINKING|>" in seen or (template and "<|START_THINKING|>" in template):
        return "cohere"
    if template and "dsml_token" in template and "<think>" in seen:
        return "think_dsml"
    if template and "[BEGIN FINAL RESPONSE]" in template and APRIEL_OPEN.strip() in template:  # Apriel 1.6
        return pair_format(APRIEL_OPEN, "[BEGIN FINAL RESPONSE]", words=True)
    if "<seed:think>" in seen:
        return "seed"
    if "[THINK]" in seen:
        return "think_mistral"
    if "<think>" in seen or "</think>" in seen:
        return "think"
    return None


MARKER_TOKENS = ("<think>", "</think>", "<|channel>", "<channel|>", "<|channel|>", "<|message|>", "[THINK]", "[/THINK]",
                 "<seed:think>", "</seed:think>", "<mm:think>", "</mm:think>", "<|open|>", "<|close|>", "<|sep|>",
                 "<|end_of_msg|>", "<|eom|>", "<|start|>",
                 "<|START_THINKING|>", "<|END_THINKING|>", *_COHERE_WRAPS)
