"""llama.cpp's chat-parsing suite (``tests/test-chat.cpp`` of the llama.cpp that llama-cpp-python
vendors), read from its C++ source and run through the gateway's own answer path.

Reading. test-chat.cpp writes each parse case as a builder chain on a ``peg_tester``::

    auto tst = peg_tester("models/templates/NAME.jinja", detailed_debug);
    tst.test("raw output").tools({ special_function_tool }).enable_thinking(false)
        .expect(message_assist_call).run();

``read_cases`` tokenizes the C++ (string literals with their escapes, raw strings ``R"d(...)d"``,
adjacent literals joined, comments dropped) and evaluates what a chain names: literals and
``+``, brace lists, the file's own ``common_chat_tool`` / ``common_chat_msg`` definitions
(global or local, the nearest visible one before the use), its message helpers
(``simple_assist_msg`` and kin, mirrored in ``_HELPERS``) and its enum constants. A tester's
template is a literal, a loop variable over a list of literals, or a parameter of the function
the chain sits in (then every call of that function gives one). A chain that names something
this reader does not know is not dropped: it comes back as ``Unread`` with the reason.

Running. ``run_case`` drives one case through what a loaded model and a request do: the model's
formats settled from the template and its marker tokens (``Formats.settle``, the settings
``auto``), the prompt rendered by the worker's path (``toolhistory.for_template`` and
``chat_template.render``) for its tail, then ``answer.prepare`` / ``answer.start`` /
``answer.Reader`` over the raw output, fed whole and in 1-3 character pieces. The comparison is
llama.cpp's own (``assert_msg_equals`` with whitespace differences ignored): content and
reasoning stripped, calls by name and arguments as parsed JSON; call ids are not compared (the
gateway makes its own). A partial case (``is_partial``: llama.cpp's message part way through
an answer) is compared with what a stream has given at that point, without the answer's end.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

# -- C++ tokens --------------------------------------------------------------------------------

_ESCAPES = {"n": 10, "t": 9, "r": 13, "0": 0, "\\": 92, '"': 34, "'": 39, "?": 63, "a": 7, "b": 8, "f": 12,
            "v": 11, "e": 27}
_PREFIX = re.compile(r'(u8|u|U|L)?(R)?"')


@dataclass(frozen=True)
class Token:
    kind: str  # str | chr | id | num | op
    value: str
    pos: int  # offset in the source


def read_literal(src: str, i: int) -> tuple[str, int]:
    """The C++ string literal starting at ``src[i]`` (an optional encoding prefix, ``R`` for a raw
    string): its value and the offset after it. ``\\xHH`` escapes are bytes of UTF-8 text."""
    m = _PREFIX.match(src, i)
    if m is None:
        raise ValueError(f"no string literal at {i}")
    j = m.end()
    if m.group(2):  # raw: R"delim( ... )delim"
        paren = src.index("(", j)
        delim = src[j:paren]
        end = src.index(f"){delim}\"", paren + 1)
        return src[paren + 1:end], end + len(delim) + 2
    out = bytearray()
    while True:
        c = src[j]
        if c == '"':
            return out.decode("utf-8", "surrogateescape"), j + 1
        if c == "\n":
            raise ValueError(f"unterminated string literal at {i}")
        if c != "\\":
            out += c.encode("utf-8", "surrogatepass")
            j += 1
            continue
        e = src[j + 1]
        if e == "x":
            h = re.match(r"[0-9A-Fa-f]+", src[j + 2:])
            assert h is not None
            out.append(int(h.group(), 16) & 0xFF)
            j += 2 + h.end()
        elif e in "uU":
            n = 4 if e == "u" else 8
            out += chr(int(src[j + 2:j + 2 + n], 16)).encode("utf-8", "surrogatepass")
            j += 2 + n
        elif e in "01234567":
            o = re.match(r"[0-7]{1,3}", src[j + 1:])
            assert o is not None
            out.append(int(o.group(), 8) & 0xFF)
            j += 1 + o.end()
        elif e == "\n":  # a line continuation
            j += 2
        else:
            out.append(_ESCAPES[e])
            j += 2


def tokenize(src: str) -> list[Token]:
    """C++ tokens: comments and preprocessor lines dropped, literals decoded, adjacent string
    literals joined into one ``str`` token."""
    out: list[Token] = []
    i, n = 0, len(src)
    line_start = True
    while i < n:
        c = src[i]
        if c == "\n":
            line_start = True
            i += 1
            continue
        if c in " \t\r\f\v":
            i += 1
            continue
        if line_start and c == "#":
            while True:  # a directive, with its continuation lines
                end = src.find("\n", i)
                end = n if end < 0 else end
                if src[end - 1] != "\\":
                    break
                i = end + 1
            i = end
            continue
        if src.startswith("//", i):
            end = src.find("\n", i)
            i = n if end < 0 else end
            continue
        if src.startswith("/*", i):  # a comment is a space: a directive may still follow
            i = src.index("*/", i + 2) + 2
            continue
        line_start = False
        if _PREFIX.match(src, i) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            value, i2 = read_literal(src, i)
            if out and out[-1].kind == "str":  # "a" "b" is "ab"
                out[-1] = Token("str", out[-1].value + value, out[-1].pos)
            else:
                out.append(Token("str", value, i))
            i = i2
            continue
        if c == "'":
            j = i + 1
            while src[j] != "'":
                j += 2 if src[j] == "\\" else 1
            out.append(Token("chr", src[i + 1:j], i))
            i = j + 1
            continue
        m = re.compile(r"[A-Za-z_]\w*").match(src, i)
        if m:
            out.append(Token("id", m.group(), i))
            i = m.end()
            continue
        m = re.compile(r"\d[\w.']*").match(src, i)
        if m:
            out.append(Token("num", m.group(), i))
            i = m.end()
            continue
        op = next((o for o in ("::", "->", "==", "!=", "<=", ">=", "&&", "||", "++", "--", "+=")
                   if src.startswith(o, i)), c)
        out.append(Token("op", op, i))
        i += len(op)
    return out


# -- what test-chat.cpp's helpers make ---------------------------------------------------------

Msg = dict[str, Any]  # role, content, reasoning_content, tool_calls: [(name, arguments, id)]


def _msg(content: str = "", reasoning: str = "", calls: list[tuple[str, str, str]] | None = None,
         role: str = "assistant") -> Msg:
    return {"role": role, "content": content, "reasoning_content": reasoning, "tool_calls": list(calls or [])}


def _simple(content: str, reasoning: str = "", name: str = "", arguments: str = "", id: str = "") -> Msg:
    return _msg(content, reasoning, [(name, arguments, id)] if name or id else [])


def _multiple(reasoning: str, content: str, calls: list[list[str]]) -> Msg:
    return _msg(content, reasoning, [(c[0], c[1], "") for c in calls])


# test-chat.cpp's message helpers, by name (a helper not here makes its cases Unread)
_HELPERS: dict[str, Callable[..., Msg]] = {
    "simple_assist_msg": _simple,
    "message_with_tool_calls": lambda name, args: _simple("", "", name, args),
    "message_with_tool_calls_and_reasoning": lambda name, args, reasoning: _simple("", reasoning, name, args),
    "message_with_reasoning_content_and_multiple_tool_calls": _multiple,
    "message_with_content_and_tool_call": lambda content, name, args: _simple(content, "", name, args),
    "message_with_reasoning_and_tool_call": lambda reasoning, name, args: _simple("", reasoning, name, args),
}


class Unreadable(Exception):
    """A form this reader does not know; its message is the reason (one per kind)."""


def _text(v: Any) -> str:
    if v == []:  # {} for an empty string (a call's id)
        return ""
    if not isinstance(v, str):
        raise Unreadable(f"expected a string, got {type(v).__name__}")
    return v


def _call(v: Any) -> tuple[str, str, str]:
    if not isinstance(v, list) or not 2 <= len(v) <= 3:
        raise Unreadable("a tool call that is not {name, arguments, id}")
    return _text(v[0]), _text(v[1]), _text(v[2]) if len(v) > 2 else ""


def _as_msg(v: Any) -> Msg:
    if isinstance(v, dict) and "tool_calls" in v:
        return v
    raise Unreadable("expected a message")


# -- the reader --------------------------------------------------------------------------------

@dataclass
class Case:
    template: str  # the file name under models/templates/
    input: str
    expect: Msg
    line: int
    reasoning_format: str = "NONE"  # llama.cpp's COMMON_REASONING_FORMAT_*
    enable_thinking: bool = True
    tools: list[dict[str, Any]] = field(default_factory=list)  # {name, description, parameters}
    tool_choice: str = "AUTO"
    parallel_tool_calls: bool = False
    is_partial: bool = False
    json_schema: str = ""
    messages: list[Msg] | None = None
    add_generation_prompt: bool = True
    continuation: str = "NONE"  # COMMON_CHAT_CONTINUATION_*

    @property
    def family(self) -> str:
        return self.template.removesuffix(".jinja")

    @property
    def id(self) -> str:
        """``FAMILY#hash`` of what the case is: stable when cases are added or moved."""
        what = json.dumps([self.input, self.expect, self.reasoning_format, self.enable_thinking,
                           [t["name"] for t in self.tools], self.tool_choice, self.is_partial, self.json_schema,
                           self.continuation, self.add_generation_prompt, self.messages], sort_keys=True)
        return f"{self.family}#{hashlib.sha1(what.encode()).hexdigest()[:10]}"

    @property
    def skip(self) -> str | None:
        """Why the case is not run (a kind, not a case), or None."""
        if self.continuation != "NONE" or not self.add_generation_prompt:
            return ("prefill continuation: the answer continues an assistant message the request "
                    "wrote (continue_final_message), which the gateway's wires do not offer")
        return None


@dataclass
class Unread:
    template: str
    line: int
    reason: str


@dataclass
class _Def:
    name: str
    at: int  # token index
    scope: tuple[int, int]  # token range of the block it is visible in
    kind: str  # value | loop | param | struct
    body: tuple[int, int] = (0, 0)  # token range of its expression (value) or list (loop)
    ctype: str = ""  # the declared type's last word (common_chat_tool, common_chat_msg, ...)
    func: str = ""  # param: the function
    index: int = 0  # param: its position


class _Reader:
    def __init__(self, src: str):
        self.src = src
        self.toks = tokenize(src)
        self.match = self._braces()
        self.opening = {close: open_ for open_, close in self.match.items()}
        self.defs: dict[str, list[_Def]] = {}
        self.funcs: dict[str, tuple[int, int]] = {}  # name -> body token range
        self._scan()

    def line(self, i: int) -> int:
        return self.src.count("\n", 0, self.toks[i].pos) + 1

    def _braces(self) -> dict[int, int]:
        match, stack = {}, []
        for i, t in enumerate(self.toks):
            if t.kind == "op" and t.value in "({[":
                stack.append(i)
            elif t.kind == "op" and t.value in ")}]":
                match[stack.pop()] = i
        return match

    def _is(self, i: int, value: str) -> bool:
        return 0 <= i < len(self.toks) and self.toks[i].value == value and self.toks[i].kind in ("op", "id")

    def _scan(self) -> None:
        """Definitions (with the block each is visible in) and functions."""
        toks, n = self.toks, len(self.toks)
        blocks: list[tuple[int, int]] = [(0, n)]
        ends: list[int] = []
        stmt = 0  # where the current statement began
        i = 0
        while i < n:
            while ends and i > ends[-1]:
                ends.pop()
                blocks.pop()
            t = toks[i]
            if t.kind == "op" and t.value == "{" and i > 0 and toks[i - 1].value in (")", "{", ";", "}", "else",
                                                                                   "const", "do", "try"):
                if toks[i - 1].value == ")":  # a function body (at file level) or a control block
                    opening = self.opening[i - 1]
                    if len(blocks) == 1 and toks[opening - 1].kind == "id":
                        self._function(toks[opening - 1].value, opening, i)
                    elif self._is(opening - 1, "for"):
                        self._loop(opening, i)
                blocks.append((i, self.match[i]))
                ends.append(self.match[i])
                stmt = i + 1
                i += 1
                continue
            if t.kind == "op" and t.value in (";", "}"):
                stmt = i + 1
            elif t.kind == "id" and i > stmt and toks[i - 1].kind in ("id", "op") and \
                    toks[i - 1].value not in (".", "->", "::", "(", ",", "return", "=", "+", "{", "!", "<", "&&") and \
                    i + 1 < n and toks[i + 1].value in ("=", "{", ";") and self._is_decl(stmt, i):
                ctype = self._ctype(stmt, i)
                if toks[i + 1].value == ";":
                    self._add(_Def(t.value, i, blocks[-1], "struct", ctype=ctype))
                elif toks[i + 1].value == "=":
                    end = self._stmt_end(i + 2)
                    self._add(_Def(t.value, i, blocks[-1], "value", (i + 2, end), ctype))
                else:
                    self._add(_Def(t.value, i, blocks[-1], "value", (i + 1, self.match[i + 1] + 1), ctype))
            i += 1

    def _is_decl(self, stmt: int, i: int) -> bool:
        words = [t.value for t in self.toks[stmt:i]]
        return bool(words) and words[0] not in ("return", "if", "while", "for", "throw", "case") and \
            all(w in ("::", "<", ">", "&", "*", ",") or re.fullmatch(r"\w+", w) for w in words)

    def _ctype(self, stmt: int, i: int) -> str:
        words = [t.value for t in self.toks[stmt:i] if t.kind == "id" and t.value not in ("const", "static", "std")]
        return " ".join(words)

    def _stmt_end(self, i: int) -> int:
        while self.toks[i].value != ";":
            i = self.match.get(i, i) + 1
        return i

    def _add(self, d: _Def) -> None:
        self.defs.setdefault(d.name, []).append(d)

    def _function(self, name: str, opening: int, body: int) -> None:
        self.funcs[name] = (body, self.match[body])
        params, depth, last = [], 0, None
        for k in range(opening + 1, self.match[opening] + 1):
            t = self.toks[k]
            if t.value in ("(", "<", "{"):
                depth += 1
            elif t.value in (")", ">", "}") and k != self.match[opening]:
                depth -= 1
            elif t.value == "," and depth == 0 or k == self.match[opening]:
                if last is not None:
                    params.append(last)
                last = None
            elif t.kind == "id" and depth == 0:
                last = t.value
        for index, p in enumerate(params):
            self._add(_Def(p, opening, (body, self.match[body]), "param", func=name, index=index))

    def _loop(self, opening: int, body: int) -> None:
        """``for (... NAME : { a, b })``: NAME takes each value of the list."""
        close = self.match[opening]
        colon = next((k for k in range(opening, close) if self._is(k, ":")), None)
        if colon is None or not self._is(colon + 1, "{"):
            return
        name = self.toks[colon - 1].value
        self._add(_Def(name, colon - 1, (body, self.match[body]), "loop", (colon + 1, self.match[colon + 1] + 1)))

    def lookup(self, name: str, at: int) -> _Def | None:
        seen = [d for d in self.defs.get(name, ()) if d.scope[0] <= at <= d.scope[1] and d.at < at]
        return max(seen, key=lambda d: d.at) if seen else None

    # -- expressions: each returns the list of values it may take (a loop or a parameter: several)

    def choices(self, lo: int, hi: int) -> list[Any]:
        """The values of tokens[lo:hi]: one, or one per loop value / call site."""
        parts = self._split(lo, hi, "+")
        out: list[Any] = [None]
        for a, b in parts:
            vals = self._primary(a, b)
            out = [v if o is None else _plus(o, v) for o in out for v in vals]
        return out

    def value(self, lo: int, hi: int) -> Any:
        vals = self.choices(lo, hi)
        if len(vals) != 1:
            raise Unreadable("a loop variable or parameter inside a case's values")
        return vals[0]

    def _split(self, lo: int, hi: int, sep: str) -> list[tuple[int, int]]:
        parts, k, a = [], lo, lo
        while k < hi:
            if self._is(k, sep):
                parts.append((a, k))
                a = k + 1
            k = self.match.get(k, k) + 1
        parts.append((a, hi))
        return [(x, y) for x, y in parts if x < y]

    def _primary(self, lo: int, hi: int) -> list[Any]:
        t = self.toks[lo]
        if t.kind == "str" and hi == lo + 1:
            return [t.value]
        if t.kind == "num" and hi == lo + 1:
            return [int(t.value) if t.value.isdigit() else t.value]
        if t.value == "{" and self.match[lo] == hi - 1:
            return [[self.value(a, b) for a, b in self._split(lo + 1, hi - 1, ",")]]
        if t.value == "(" and self.match[lo] == hi - 1:
            return self.choices(lo + 1, hi - 1)
        if t.kind == "id" and self._is(lo + 1, "::") and t.value == "std":  # std::string(...) and the like
            return self._primary(lo + 2, hi)
        if t.kind == "id" and hi == lo + 1:
            return self._name(t.value, lo)
        if t.kind == "id" and self._is(lo + 1, "(") and self.match[lo + 1] == hi - 1:
            args = [self.value(a, b) for a, b in self._split(lo + 2, hi - 1, ",")]
            if t.value in _HELPERS:
                return [_HELPERS[t.value](*args)]
            if t.value == "string" and len(args) == 1:
                return args
            raise Unreadable(f"an unknown helper {t.value}()")
        raise Unreadable(f"an expression this reader does not know ({' '.join(x.value for x in self.toks[lo:hi])[:40]})")

    def _name(self, name: str, at: int) -> list[Any]:
        if name in ("true", "false"):
            return [name == "true"]
        if re.fullmatch(r"COMMON_[A-Z_]+", name):
            return [name]
        d = self.lookup(name, at)
        if d is None:
            raise Unreadable(f"a name this reader cannot resolve ({name})")
        if d.kind == "loop":
            vals = self.value(*d.body)
            return list(vals)
        if d.kind == "param":
            out: list[Any] = []
            for site in self._calls(d.func):
                args = self._split(site + 2, self.match[site + 1], ",")
                out += self.choices(*args[d.index])
            if not out:
                raise Unreadable(f"a parameter of {d.func}() that no call gives")
            return out
        if d.kind == "struct":
            return [self._struct(d, at)]
        value = self.value(*d.body)
        if d.ctype.split()[-1:] == ["common_chat_tool"] and "vector" not in d.ctype and isinstance(value, list):
            if len(value) != 3:
                raise Unreadable("a common_chat_tool that is not {name, description, parameters}")
            return [{"name": value[0], "description": value[1], "parameters": value[2]}]
        if d.ctype.split()[-1:] == ["common_chat_msg"] and "vector" not in d.ctype and isinstance(value, list):
            role, content, _parts, calls, reasoning = (value + [""] * 5)[:5]
            return [_msg(_text(content), _text(reasoning), [_call(c) for c in calls or []], _text(role))]
        return [value]

    def _struct(self, d: _Def, at: int) -> Msg:
        """``common_chat_msg x;`` then ``x.field = ...;`` statements before ``at``."""
        if not d.ctype.endswith("common_chat_msg"):
            raise Unreadable(f"a declared {d.ctype or 'value'} set field by field")
        msg = _msg(role="")
        k = d.at + 1
        while k < at:
            if self.toks[k].value == d.name and self.toks[k].kind == "id" and self._is(k + 1, ".") \
                    and self._is(k + 3, "="):
                end = self._stmt_end(k + 4)
                field_name = self.toks[k + 2].value
                if field_name in ("role", "content", "reasoning_content"):
                    msg[field_name] = _text(self.value(k + 4, end))
                k = end
            k += 1
        return msg

    def _calls(self, func: str) -> Iterator[int]:
        body = self.funcs.get(func, (0, -1))
        for k, t in enumerate(self.toks):
            if t.kind == "id" and t.value == func and self._is(k + 1, "(") and not body[0] <= k <= body[1] \
                    and not self._is(self.match[k + 1] + 1, "{"):
                yield k

    # -- the cases

    def cases(self) -> tuple[list[Case], list[Unread]]:
        cases: list[Case] = []
        unread: list[Unread] = []
        toks = self.toks
        for k, t in enumerate(toks):
            if not (t.kind == "id" and self._is(k + 1, ".") and self._is(k + 2, "test") and self._is(k + 3, "(")):
                continue
            tester = self.lookup(t.value, k)
            if tester is None or tester.kind != "value" or not self._is(tester.body[0], "peg_tester"):
                continue
            args = self._split(tester.body[0] + 2, self.match[tester.body[0] + 1], ",")
            try:
                templates = [_text(v) for v in self.choices(*args[0])]
            except Unreadable as e:
                unread.append(Unread("?", self.line(k), f"template: {e}"))
                continue
            for path in templates:
                name = path.rsplit("/", 1)[-1]
                try:
                    cases.append(self._chain(name, k))
                except Unreadable as e:
                    unread.append(Unread(name, self.line(k), str(e)))
        return cases, unread

    def _chain(self, template: str, k: int) -> Case:
        close = self.match[k + 3]
        case = Case(template, _text(self.value(k + 4, close)), _msg(), self.line(k))
        i = close + 1
        ran = False
        while self._is(i, "."):
            method = self.toks[i + 1].value
            if not self._is(i + 2, "("):
                raise Unreadable(f"a builder step that is not a call (.{method})")
            end = self.match[i + 2]
            args = [self.value(a, b) for a, b in self._split(i + 3, end, ",")]
            self._apply(case, method, args)
            ran = ran or method == "run"
            i = end + 1
        if not ran:
            raise Unreadable("a chain that does not end in .run()")
        return case

    def _apply(self, case: Case, method: str, args: list[Any]) -> None:
        one = args[0] if args else None

        def enum(v: Any) -> str:  # COMMON_REASONING_FORMAT_AUTO -> AUTO
            return re.sub(r"^COMMON_\w*?_(FORMAT|CHOICE|CONTINUATION)_", "", _text(v))
        match method:
            case "run" | "expect_reconstruction":
                pass
            case "reasoning_format":
                case.reasoning_format = enum(one)
            case "enable_thinking":
                case.enable_thinking = bool(one)
            case "parallel_tool_calls":
                case.parallel_tool_calls = bool(one)
            case "add_generation_prompt":
                case.add_generation_prompt = bool(one)
            case "is_partial":
                case.is_partial = bool(one)
            case "continue_final_message":
                case.continuation = enum(one)
            case "tool_choice":
                case.tool_choice = enum(one)
            case "json_schema":
                case.json_schema = _text(one)
            case "tools":  # the file's tools by name, or written in place as {name, description, parameters}
                one = [{"name": x[0], "description": x[1], "parameters": x[2]}
                       if isinstance(x, list) and len(x) == 3 and all(isinstance(v, str) for v in x) else x
                       for x in one or []]
                if not all(isinstance(x, dict) and "parameters" in x for x in one):
                    raise Unreadable("tools that are not the file's common_chat_tool definitions")
                case.tools = one
            case "messages":
                case.messages = [_as_msg(m) for m in one or []]
            case "expect":
                case.expect = dict(_as_msg(one))
            case "expect_content":
                case.expect["content"] = _text(one)
            case "expect_reasoning":
                case.expect["reasoning_content"] = _text(one)
            case "expect_tool_calls":
                case.expect["tool_calls"] = [_call(c) for c in one or []]
            case _:
                raise Unreadable(f"an unknown builder step .{method}()")


def _plus(a: Any, b: Any) -> Any:
    if isinstance(a, str) and isinstance(b, str):
        return a + b
    raise Unreadable("+ on values that are not strings")


def read_cases(src: str) -> tuple[list[Case], list[Unread]]:
    """Every parse case of test-chat.cpp's source, and the chains it could not read."""
    return _Reader(src).cases()


# -- the gateway's path ------------------------------------------------------------------------

@dataclass
class Seen:
    content: str = ""
    reasoning: str = ""
    calls: list[list[str]] = field(default_factory=list)  # [name, arguments]
    error: str | None = None  # the request failed before the answer (the template did not render)


class _Events:
    """A generation's events as a worker sends them (``GenerationEvents``)."""

    on_idle = None

    def __init__(self, events: list[Any]):
        self.events = list(events)

    async def next(self) -> Any:
        return self.events.pop(0)

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> Any:
        if not self.events:
            raise StopAsyncIteration
        return self.events.pop(0)


def pieces_of(text: str) -> list[str]:
    """``text`` cut into pieces of 1, 2 and 3 characters in turn."""
    out, i, size = [], 0, 1
    while i < len(text):
        out.append(text[i:i + size])
        i += size
        size = size % 3 + 1
    return out


class Gateway:
    """One template as a loaded model: its formats settled once, then each case's request."""

    def __init__(self, template: str):
        from gateway.text.formats import FORMATS, Formats
        from gateway.text.reasoning import MARKER_TOKENS
        from gateway.text.toolformats import MARKER_TOKENS as CALL_MARKERS

        self.template = template
        # the vocabulary is not at hand: a marker the template writes stands for a single token
        special = [m for m in (*MARKER_TOKENS, *CALL_MARKERS) if m in template]
        self.info: dict[str, Any] = {"chat_template": template, "special_tokens": special}
        self.info[FORMATS] = Formats.settle("auto", "auto", self.info)

    def prompt_tail(self, case: Case, req: Any) -> str:
        from gateway.text import chat_template
        from gateway.worker.prompts import PROMPT_TAIL
        from gateway.worker.toolhistory import for_template

        messages = [{"role": "user", "content": "Hey there!"}]
        candidates = for_template(messages, req.tools, req.tool_format, self.template)
        for n, (msgs, tools) in enumerate(candidates):
            try:
                return chat_template.render(self.template, msgs, tools=tools, extra=req.chat_template_kwargs)[-PROMPT_TAIL:]
            except chat_template.TemplateInputError:
                if n + 1 == len(candidates):
                    raise
        raise AssertionError("no candidate")

    def run(self, case: Case, streamed: bool) -> Seen:
        return asyncio.run(self._run(case, streamed))

    async def _run(self, case: Case, streamed: bool) -> Seen:
        from gateway import protocol
        from gateway.text import chat_template
        from gateway.text.toolformats import CallArgs, CallStart, Piece
        from gateway.wire import answer

        tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                   "parameters": json.loads(t["parameters"])}} for t in case.tools]
        req = protocol.GenerationRequest(messages=[{"role": "user", "content": "Hey there!"}],
                                    chat_template_kwargs={"enable_thinking": case.enable_thinking})
        if tools and case.tool_choice != "NONE":  # tool_choice none: the wire leaves the tools out
            req.tools = tools
            req.tool_choice = "required" if case.tool_choice == "REQUIRED" else "auto"
            req.parallel_tool_calls = case.parallel_tool_calls
        answer.prepare(req, "case", self.info, thinking=case.reasoning_format != "NONE")
        try:
            tail = self.prompt_tail(case, req)
        except (chat_template.TemplateBroken, chat_template.TemplateInputError) as e:
            return Seen(error=f"template does not render: {e}")
        # a partial case is a stream part way: no end, and calls as a stream gives them
        stream = streamed or case.is_partial
        texts = pieces_of(case.input) if streamed else [case.input]
        events: list[Any] = [protocol.Start(1, 1, 0, 0, tail)]
        events += [protocol.Text(1, t, n + 1) for n, t in enumerate(texts)]
        if not case.is_partial:
            events.append(protocol.Done(1, "stop", None, 1, len(texts), 0))
        gen = _Events(events)
        _, reader = await answer.start(gen, req, stream)  # type: ignore[arg-type]
        seen = Seen()
        items = [item async for event in gen for item in reader.read(event)]  # type: ignore[attr-defined]
        for item in items:
            if isinstance(item, Piece):
                if item.kind == "thinking":
                    seen.reasoning += item.text
                else:
                    seen.content += item.text
            elif isinstance(item, CallStart):
                seen.calls.append([item.name, ""])
            elif isinstance(item, CallArgs):
                seen.calls[item.index][1] += item.text
        return seen


def _json(text: str) -> str:
    """llama.cpp's ``renormalize_json``: the arguments re-dumped, or "" when they do not parse."""
    try:
        return json.dumps(json.loads(text), sort_keys=True, ensure_ascii=False)
    except ValueError:
        return ""


def differences(case: Case, seen: Seen) -> list[str]:
    """Why ``seen`` is not llama.cpp's expected message, as reason kinds (empty: it is)."""
    if seen.error:
        return ["template does not render"]
    want = case.expect
    out = []
    calls_want = [(n, _json(a)) for n, a, _ in want["tool_calls"]]
    calls_seen = [(n, _json(a)) for n, a in seen.calls]
    content_ok = want["content"].strip() == seen.content.strip()
    reasoning_ok = want["reasoning_content"].strip() == seen.reasoning.strip()
    if calls_want and not calls_seen and seen.reasoning.strip().startswith(want["reasoning_content"].strip()) \
            and len(seen.reasoning.strip()) > len(want["reasoning_content"].strip()):
        out.append("call written while thinking is open taken as thinking")
        reasoning_ok = True
    elif calls_want != calls_seen:
        if calls_want and not calls_seen:
            out.append("call not read (its text stays in the answer)")
        elif calls_seen and not calls_want:
            out.append("a call read where llama.cpp reads none")
        elif len(calls_want) != len(calls_seen):
            out.append("a different number of calls")
        elif [n for n, _ in calls_want] != [n for n, _ in calls_seen]:
            out.append("call names differ")
        else:
            out.append("call arguments differ")
    if not reasoning_ok:
        if want["reasoning_content"].strip() and not seen.reasoning.strip():
            out.append("thinking not split out (stays in content)")
        elif seen.reasoning.strip() and not want["reasoning_content"].strip():
            out.append("thinking split out where llama.cpp keeps it in content")
        else:
            out.append("thinking text differs")
    if not content_ok and not (out and out[0].startswith(("call not read", "call written while"))) and \
            not (out and out[-1].startswith("thinking not split")):
        want_text, seen_text = want["content"].strip(), seen.content.strip()
        if want_text and want_text in seen_text or not want_text and _MARKUP.search(seen_text):
            out.append("markers or wrapping left in content")
        elif seen_text and seen_text in want_text:
            out.append("content lacks text llama.cpp keeps (the prompt's opened marker)")
        else:
            out.append("content differs")
    return out


_MARKUP = re.compile(r"<\|[^>]*\|?>|```|<\w+[:|]")
