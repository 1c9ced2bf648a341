"""Render a model's chat template into a prompt, in Jinja2's sandbox.

Templates come from model files, which may be hostile: they render only in a
``SandboxedEnvironment`` (no attribute starting with ``_``, no Python internals). What a template
sees is as llama.cpp's own Jinja engine gives it, since templates are written and tested against
it (llama.cpp's common/chat.cpp and its Jinja engine in common/jinja):
- ``tools`` is undefined when the request has none (not ``None``): a loop over it is empty;
- an undefined name reads as empty: its attributes are undefined too, and it or ``none`` added
  to a string is the string alone (FireFunction's ``functions``);
- ``datetime`` and ``date_string``, today's date, as llama.cpp passes them to every template;
- ``tojson`` writes a sequence a filter made (``map``) as a list, and an undefined as ``null``;
- a list or dict the template made may change by its own methods (Kimi K2's
  ``namespace(ids=[])`` and ``ids.append``, ``ids.pop(0)``), as llama.cpp allows; the inputs
  (``messages``, ``tools``, the caller's variables) reach it as read-only copies, so a render
  never changes the caller's data nor the next render's.

``raise_exception`` in a template (e.g. "roles must alternate") is the caller's mistake and
becomes ``TemplateInputError``; anything else that goes wrong is the template's fault and becomes
``TemplateBroken``: a template that crosses a bound of ``templatebounds`` (too long a run, too
long a value or output, too much memory) ``TemplateRunaway``, at once and for that render only.
The bounds grow with the size of the render's inputs (``templatebounds.bounds_for``).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import jinja2
import jinja2.defaults
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import modifies_known_mutable

from . import templatebounds
from .templatebounds import Runaway
from .templatesandbox import BoundedSandbox

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# Names a caller's chat_template_kwargs may not use: what render() sets, what a template reads
# as the request's own (tools), Jinja's globals and ours, and render()'s own parameter.
RESERVED = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token", "tools", "tool_choice",
                      "documents", "raise_exception", "strftime_now", "self"}) \
    | frozenset(jinja2.defaults.DEFAULT_NAMESPACE)


class TemplateInputError(Exception):
    """The template refused these messages."""


class TemplateBroken(Exception):
    """The template itself failed (syntax, sandbox violation, a bug)."""


class TemplateRunaway(TemplateBroken):
    """The template crossed a bound (``templatebounds``): it ran too long or made too much."""


def _raise_exception(message: str) -> None:
    raise TemplateInputError(message)


class _Input(dict):
    """A dict of the inputs: the sandbox refuses its changing methods (``_inputs``)."""


class _InputList(list):
    """A list of the inputs: the sandbox refuses its changing methods (``_inputs``)."""


class _Sandbox(BoundedSandbox):
    """Jinja's sandbox within bounds (``templatebounds``), with llama.cpp's undefined
    (``ChainableUndefined``: empty when shown or iterated, its attributes and items undefined
    too), its ``+`` (``none`` or an undefined added to a string is the string; any other use of
    an undefined still fails), and the changing methods allowed on the lists and dicts the
    template made itself (exactly ``list`` and ``dict``: the inputs are ``_Input`` and
    ``_InputList``)."""

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "+" and isinstance(left, str) != isinstance(right, str):
            other = right if isinstance(left, str) else left
            if other is None or isinstance(other, jinja2.Undefined):
                return left if isinstance(left, str) else right
        return super().call_binop(context, operator, left, right)

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        """What a forbidden attribute reads as: it fails at its first use, printing included (an
        undefined of ours would chain on silently)."""
        return jinja2.StrictUndefined(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe.",
                                      name=attribute, obj=obj, exc=jinja2.exceptions.SecurityError)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if not super().is_safe_attribute(obj, attr, value):
            return False
        return type(obj) in (list, dict) or not modifies_known_mutable(obj, attr)


def _json_default(value: Any) -> Any:
    """What ``json`` cannot write itself: an undefined (null) and a filter's lazy sequence (a
    list, walked before json writes it: ``templatebounds``)."""
    if isinstance(value, jinja2.Undefined):
        return None
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes, dict)):
        items = list(value)
        templatebounds.current().unfolded(items)
        return items
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, **_: Any) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, default=_json_default)


def _inputs(value: Any) -> Any:
    """``value`` with its lists and dicts copied as ``_InputList`` and ``_Input`` (tuples kept as
    tuples), which a template reads as lists and dicts but cannot change."""
    if isinstance(value, dict):
        return _Input({k: _inputs(v) for k, v in value.items()})
    if isinstance(value, list):
        return _InputList(_inputs(v) for v in value)
    if isinstance(value, tuple):
        return tuple(_inputs(v) for v in value)
    return value


class _Generation(jinja2.ext.Extension):
    """Hugging Face's ``{% generation %}...{% endgeneration %}``, which marks the assistant's
    part of a conversation for transformers' training masks: rendered as its body, as
    transformers renders it for a prompt (LFM2.5, Poolside Laguna)."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


# ``{% break %}`` and ``{% continue %}`` (Command R7B, Cohere2MoE, Kimi K3, Reka Edge) are
# Jinja's loop controls, which Hugging Face's template environment turns on too.
EXTENSIONS = ("jinja2.ext.loopcontrols", _Generation)


_WIDTH = re.compile(r"%[-_0^#]*\d")


def _strftime_now(fmt: str) -> str:
    """Today's date as ``fmt`` says; without the C library's field widths (``%099999999Y``)."""
    if _WIDTH.search(fmt):
        raise ValueError(f"strftime_now() takes no field widths: {fmt[:40]!r}")
    return datetime.now().strftime(fmt)


def compile_template(source: str) -> jinja2.Template:
    """``source`` compiled in the sandbox, within ``templatebounds.bounded`` (compiling ticks
    too). A template that does not compile is remembered so, and fails each request at once; one
    stopped while compiling is tried again (its time depends on the machine's load)."""
    compiled = _compiled(source)
    if isinstance(compiled, TemplateBroken):
        raise type(compiled)(str(compiled)) from None
    return compiled


@functools.lru_cache(maxsize=16)
def _compiled(source: str) -> jinja2.Template | TemplateBroken:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.ChainableUndefined,
                   extensions=list(EXTENSIONS), filters={"tojson": _tojson},
                   globals_={"raise_exception": _raise_exception, "strftime_now": _strftime_now})
    try:
        return env.from_string(source)
    except Runaway as e:
        raise TemplateRunaway(f"chat template stopped compiling: {e}") from None
    except jinja2.TemplateError as e:
        return TemplateBroken(f"chat template does not compile: {e}")
    except Exception as e:  # Python's compiler on what Jinja made of it: too deep, too many blocks
        return TemplateBroken(f"chat template does not compile: {type(e).__name__}: {e}")


_PROBE: list[dict[str, Any]] = [  # one call, its arguments an object
    {"role": "user", "content": "probe"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_probe", "type": "function",
         "function": {"name": "probe_tool", "arguments": {"probe_arg": "probe-value"}}}]},
    {"role": "tool", "tool_call_id": "call_probe", "name": "probe_tool", "content": "ok"},
]


@functools.lru_cache(maxsize=16)
def arguments_as_string(source: str) -> bool:
    """Whether a template reads a call's ``arguments`` as a JSON string rather than an object.
    Most (Qwen, Llama, Mistral, Hermes) write the object with ``tojson``; some add it to a
    string, which fails for an object, and some print it, which would show Python's
    ``{'k': 'v'}``. Found once per template by rendering a probe call both ways, as llama.cpp's
    minja does."""
    def shows_json(messages: list[dict[str, Any]]) -> bool:
        try:
            out = _render(source, messages, {})
        except TemplateRunaway:
            raise  # once is enough
        except (TemplateInputError, TemplateBroken):
            return False
        return "probe-value" in out and "'probe_arg'" not in out
    return not shows_json(_PROBE) and shows_json(_with_string_arguments(_PROBE))


def _with_string_arguments(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = {**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.dumps(
                c["function"]["arguments"], ensure_ascii=False)}} for c in m["tool_calls"]]}
        out.append(m)
    return out


def render(
    source: str,
    messages: list[dict[str, Any]],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
    extra: dict[str, Any] | None = None,
) -> str:
    """``messages`` (and ``tools``, both in Hugging Face's convention: see wire/tools.py)
    through the template. A call's arguments are objects in ``messages``; a template that reads
    them as strings gets strings."""
    if any(m.get("tool_calls") for m in messages) and arguments_as_string(source):
        messages = _with_string_arguments(messages)
    variables = {**(extra or {}), "bos_token": bos_token, "eos_token": eos_token,
                 "add_generation_prompt": add_generation_prompt}
    if tools:  # none: ``tools`` stays undefined, as llama.cpp leaves it
        variables["tools"] = tools
    return _render(source, messages, variables)


def _render(source: str, messages: list[dict[str, Any]], variables: dict[str, Any]) -> str:
    """``variables`` and ``messages`` through the template; unset names are render()'s defaults
    and llama.cpp's date names (which ``variables`` may set), ``tools`` is left unset. Compiled
    and rendered within the bounds its inputs' size sets (``templatebounds``)."""
    now = datetime.now()
    variables = _inputs({"datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y"),
                         "bos_token": "", "eos_token": "", "add_generation_prompt": True, **variables,
                         "messages": messages})
    known: dict[int, tuple[int, int]] = {}  # the inputs' sizes: they cannot change
    size, _ = templatebounds.measure(variables, known)
    try:
        with templatebounds.bounded(templatebounds.bounds_for(size), known) as guard:
            template = compile_template(source)
            return guard.output(template.root_render_func(template.new_context(variables)))
    except (TemplateInputError, TemplateBroken):
        raise
    except Runaway as e:
        raise TemplateRunaway(f"chat template stopped: {e}") from None
    except jinja2.exceptions.SecurityError as e:
        raise TemplateBroken(f"chat template tried something the sandbox forbids: {e}") from None
    except Exception as e:  # a template bug: TypeError, UndefinedError, RecursionError, ...
        raise TemplateBroken(f"chat template failed: {type(e).__name__}: {e}") from None
