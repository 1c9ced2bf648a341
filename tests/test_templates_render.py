"""Every chat template llama.cpp ships renders through the gateway's real path (issue 37).

The templates are every ``models/templates/*.jinja`` of the llama.cpp that llama-cpp-python
vendors (read from its source distribution, so a new llama.cpp brings its new templates). Each
renders as a loaded model's worker renders a request: an OpenAI chat body read by the wire
(`wire/openai.parse_chat`), the formats its model would settle (`text/formats.Formats`, as
`tests/llamachat.py` settles them), `answer.prepare`, then `worker/prompts.Prompts.render`
(`toolhistory.for_template` and `chat_template.render`, the system-message fallback included).
The request carries tools and a history with an assistant's call, its result and a final user
turn; a template with a thinking switch renders with it on and off. A failure names the template
and the error the caller would get, or what of the request the prompt left out. Below, what
the renderer gives every template (`text/chat_template.py`'s docstring), by small templates.
"""

from __future__ import annotations

import re
import tarfile
from types import SimpleNamespace

import pytest
from realmodel import CACHE

from gateway.models import testmodels as tm
from gateway.text import chat_template
from gateway.text.formats import FORMATS, Formats
from gateway.text.reasoning import MARKER_TOKENS
from gateway.text.toolformats import MARKER_TOKENS as CALL_MARKERS
from gateway.wire import answer
from gateway.wire.openai import parse_chat
from gateway.worker.prompts import Prompts
from gateway.worker.refusals import Refused

FLOOR = 70  # templates in llama-cpp-python 0.3.36's sdist
SWITCHES = ("enable_thinking", "thinking")  # chat_template_kwargs that turn a template's thinking on and off

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
]

HISTORY = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in the French capital?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                           "arguments": '{"city": "Paris", "days": 2}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C."},
    {"role": "assistant", "content": "It is sunny in Paris, 21 C."},
    {"role": "user", "content": "And in Rome?"},
]


def template_names() -> list[str]:
    """The templates' file names, from the sdist's listing."""
    sdist = tm._llama_cpp_sdist(CACHE)
    with tarfile.open(sdist, mode="r:gz") as tar:
        names = [m.name.rsplit("/", 1)[-1] for m in tar if re.search(r"/vendor/llama\.cpp/models/templates/[^/]+\.jinja$", m.name)]
    return sorted(names)


NAMES = template_names()


def test_all_templates_found():
    assert len(NAMES) >= FLOOR, f"found {len(NAMES)} templates"


class _Vocab:
    """A vocabulary with no BOS or EOS token: the template's own text is the whole prompt."""

    bos = eos = -1

    def piece(self, token: int) -> bytes:
        raise AssertionError("no token to show")


def prompts_for(template: str) -> tuple[Prompts, dict]:
    """The worker's prompt reader over ``template``, and the info its load would settle."""
    model = SimpleNamespace(vocab=_Vocab(), n_ctx=4096, template=template, params=SimpleNamespace(name="m"))
    special = [m for m in (*MARKER_TOKENS, *CALL_MARKERS) if m in template]
    info: dict = {"chat_template": template, "special_tokens": special}
    info[FORMATS] = Formats.settle("auto", "auto", info)
    return Prompts(model), info  # type: ignore[arg-type]


def switches(template: str) -> list[dict[str, bool]]:
    """The chat_template_kwargs to render with: none, and each switch the template reads on and off."""
    out: list[dict[str, bool]] = [{}]
    for name in SWITCHES:
        if re.search(rf"(?<![\w.'\"]){name}\b", template):
            out += [{name: True}, {name: False}]
    return out


@pytest.mark.parametrize("name", NAMES)
def test_template_renders_tools_history_and_thinking(name):
    template = tm.llama_cpp_source_file(f"models/templates/{name}", CACHE / "templates").read_text()
    prompts, info = prompts_for(template)
    failures = []
    for kwargs in switches(template):
        body = {"model": "m", "messages": HISTORY, "tools": TOOLS, "chat_template_kwargs": kwargs}
        req = parse_chat(body).request
        answer.prepare(req, "m", info)
        try:
            text = prompts.render(req)
        except Refused as e:
            failures.append(f"{kwargs or 'no switch'}: {e.status} {e.message}")
            continue
        # the tools (``search`` is named nowhere else), the call's arguments, its result, the
        # assistant's answer and the final user turn all reach the prompt
        for needle in ("search", "Paris", "Sunny, 21 C.", "It is sunny", "And in Rome?"):
            if needle not in text:
                failures.append(f"{kwargs or 'no switch'}: {needle!r} not in the prompt")
    assert not failures, f"{name} does not render:\n" + "\n".join(failures)


# What the renderer gives every template, as llama.cpp's engine does (chat_template's docstring).

def test_tools_undefined_without_tools():
    source = "{% for t in tools %}[{{ t.function.name }}]{% endfor %}{{ tools is defined }}"
    assert chat_template.render(source, []) == "False"
    assert chat_template.render(source, [], tools=TOOLS) == "[get_weather][search]True"


def test_unset_names_read_as_empty():
    source = "{{ 'a' + functions + 'b' }}|{{ none_given + 'c' }}|{{ nothing.deeper.still }}|{{ {'k': nothing} | tojson }}"
    assert chat_template.render(source, [], extra={"none_given": None}) == 'ab|c||{"k": null}'
    with pytest.raises(chat_template.TemplateBroken):  # any other use of an undefined still fails
        chat_template.render("{{ nothing + 1 }}", [])


def test_tojson_of_a_filters_sequence():
    source = "{{ tools | map(attribute='function') | map(attribute='name') | tojson }}"
    assert chat_template.render(source, [], tools=TOOLS) == '["get_weather", "search"]'


def test_lists_and_dicts_the_template_made_change():
    source = ("{% set q = namespace(ids=[]) %}{% set _ = q.ids.append('a') %}{% set _ = q.ids.append('b') %}"
              "{{ q.ids.pop(0) }}{{ q.ids }}{% set d = dict(messages[0]) %}{% set _ = d.update({'content': 'x'}) %}"
              "{{ d.content }}{% set l = messages + [] %}{% set _ = l.append(1) %}{{ l | length }}")
    messages = [{"role": "user", "content": "hi"}]
    assert chat_template.render(source, messages) == "a['b']x2"
    assert messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("source", [
    "{% set _ = messages.append({'role': 'x'}) %}",
    "{% set _ = messages[0].update({'content': 'changed'}) %}",
    "{% set _ = tools.pop() %}",
    "{% set _ = messages[0].tool_calls[0].function.arguments.clear() %}",
])
def test_the_inputs_stay_read_only(source):
    messages = [{"role": "user", "content": "hi", "tool_calls": [{"function": {"arguments": {"a": 1}}}]}]
    with pytest.raises(chat_template.TemplateBroken, match="sandbox forbids"):
        chat_template.render(source, messages, tools=[{"type": "function"}])
    assert messages[0]["content"] == "hi" and messages[0]["tool_calls"][0]["function"]["arguments"] == {"a": 1}


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__ }}",
    "{{ [].append.__self__ }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ raise_exception.__globals__ }}",
    "{% set l = [] %}{{ l.__setitem__ }}",
    "{{ messages.__class__.__subclasses__() }}",
])
def test_python_internals_stay_out_of_reach(source):
    with pytest.raises(chat_template.TemplateBroken, match="sandbox forbids"):
        chat_template.render(source, [{"role": "user", "content": "hi"}])
