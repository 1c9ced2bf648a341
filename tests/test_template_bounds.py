"""A chat template is a stranger's code (issue 50): each way a template once ran forever or filled
the worker's memory is refused at once, in its own render and in a bounded amount of memory,
with a message that says which bound it crossed (``text/templatebounds.py``); llama.cpp's own
templates render exactly as plain Jinja renders them, and a long conversation still renders
through the slowest and the most wasteful of them."""

from __future__ import annotations

import functools
import json
import threading
import time
import tracemalloc

import jinja2
import jinja2.ext
import pytest
from jinja2.sandbox import SandboxedEnvironment

from gateway.text import chat_template, templatebounds, templatesandbox
from gateway.text.chat_template import CHATML, TemplateBroken, TemplateRunaway, render

MSGS = [{"role": "user", "content": "hi"}]
LONG = [{"role": "user", "content": "x" * 20000}]
DAG = "{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}" \
      "{% set ns.b = [ns.b, ns.b] %}{% endfor %}"
DEADLINE = 0.5  # the deadline these tests render under (``quick``)


@pytest.fixture
def quick(monkeypatch):
    """A render's deadline of half a second: a template that only runs long fails sooner."""
    monkeypatch.setattr(templatebounds, "SECONDS", DEADLINE)


RUNAWAYS = [  # (template, messages, what the error says)
    # arithmetic: Jinja's optimizer once folded these at compile time, in one C call holding the GIL
    ("{{ 9**(9**9) }}", MSGS, "integer of more than"),
    ("{% set ns = namespace(x=3) %}{% for i in range(100) %}{% set ns.x = ns.x * ns.x %}{% endfor %}", MSGS,
     "integer of more than"),
    ("{{ 'x' * 10**9 }}", MSGS, "repeated sequence"),
    ("{{ ['x'] * 10**9 }}", MSGS, "repeated sequence"),
    ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", MSGS,
     "concatenation"),
    ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", MSGS,
     "a sum"),
    # formatting: widths and precisions in a spec, repeated fields
    ("{{ '%999999999d' % 1 }}", MSGS, "%-formatted"),
    ("{{ '%*s' % (10**9, 'a') }}", MSGS, "%-formatted"),
    ("{{ '{:>999999999}'.format(1) }}", MSGS, "formatted field"),
    ("{{ '%999999999s'|format('a') }}", MSGS, "%-formatted"),
    # filters and methods that make as much as an argument says
    ("{{ 'a'|center(10**9) }}", MSGS, "center filter"),
    ("{{ 'a'|center(1000000000) }}", MSGS, "center filter"),  # a constant: once folded at compile time
    ("{{ ('x' * 100000)|replace('x', 'y' * 100000) }}", MSGS, "replacements"),
    ("{{ ('\\n' * 100000)|indent(100000) }}", MSGS, "indented"),
    ("{{ ('a' * 1000000)|wordwrap(1) }}", MSGS, "wordwrap takes"),  # textwrap: quadratic, 28 s
    ("{% set l = ['x' * 1000000] * 1000 %}{{ l|join }}", MSGS, "joined|MiB"),
    ("{{ ('x' * 100000).join(['y' * 1000] * 100000) }}", MSGS, "joined|MiB"),
    ("{{ 'x'.ljust(10**9) }}", MSGS, "ljust"),
    ("{{ (1).to_bytes(10**9, 'big') }}", MSGS, "to_bytes"),
    ("{{ ('\\t' * 100000).expandtabs(100000) }}", MSGS, "tabs expanded"),
    ("{{ ('a' * 100000).translate({97: 'x' * 100000}) }}", MSGS, "translated"),
    ("{{ [1]|slice(10**9)|list|length }}", MSGS, "slice filter"),
    ("{{ [1]|batch(10**9, 0)|list|length }}", MSGS, "batch filter"),
    ("{{ ([[1]] * 100000)|sum(start=[]) }}", MSGS, "sum"),
    ("{% set s = '日' * 1000000 %}{{ s|list|length }}", MSGS, "past"),
    # output, and what blocks and lists gather
    ("{% set s = 'x' * 20000 %}{% for a in s %}{% for b in s %}{{ s }}{% endfor %}{% endfor %}", MSGS,
     "its output"),
    ("{% for a in messages[0].content %}{% for b in messages[0].content %}{{ a ~ b }}{% endfor %}{% endfor %}",
     LONG, "its output|ran longer"),
    ("{% set s = 'x' * 1000000 %}{% set b %}{% for i in range(100000) %}{{ s }}{% endfor %}{% endset %}"
     "{{ b|length }}", MSGS, "block's output"),
    ("{% macro m() %}{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}{% endmacro %}{{ m() }}", MSGS,
     "block's output"),
    ("{% set ns = namespace(l=[]) %}{% set s = 'x' * 1000000 %}{% for i in range(100000) %}"
     "{% set _ = ns.l.append(s[1:]) %}{% endfor %}", MSGS, "MiB"),
    ("{% set ns = namespace(l=[]) %}{% set s = 'x' * 500000 %}{% for i in range(1000) %}"
     "{% set _ = ns.l.append(namespace(v=s ~ i)) %}{% endfor %}", MSGS, "MiB"),
    ("{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set _ = ns.l.append(namespace()) %}{% endfor %}"
     "{% set s = 'x' * 500000 %}{% for n in ns.l %}{% set n.v = s ~ loop.index %}{% endfor %}", MSGS, "MiB"),
    ("{% set ns = namespace(l=[]) %}{% set s = 'x' * 500000 %}{% for i in range(1000) %}"
     "{% set _ = ns.l.append((s ~ i)|map('upper')) %}{% endfor %}", MSGS, "MiB"),
    ("{% set s = 'x' * 500000 %}{% macro f(n) %}{% if n > 0 %}{{ (s ~ n) ~ f(n - 1) }}{% endif %}{% endmacro %}"
     "{{ f(150)|length }}", MSGS, "MiB"),
    # a value that unfolds to 2**40 items when printed, compared, hashed, sorted or written as JSON
    (DAG + "{{ ns.a }}", MSGS, "written out"),
    (DAG + "{{ ns.a == ns.b }}", MSGS, "written out"),
    (DAG + "{{ [ns.a, ns.b]|sort }}", MSGS, "written out"),
    (DAG + "{{ ns.a|tojson }}", MSGS, "written out"),
    (DAG + "{{ [ns.a]|map('list')|tojson }}", MSGS, "written out"),
    ("{% set ns = namespace(a=(1,)) %}{% for i in range(40) %}{% set ns.a = (ns.a, ns.a) %}{% endfor %}"
     "{{ {ns.a: 1} }}", MSGS, "written out"),
    ("{% set ns = namespace(a=1) %}{% for i in range(40) %}{% set ns.a = namespace(x=ns.a, y=ns.a) %}{% endfor %}"
     "{{ ns.a }}", MSGS, "written out"),
    ("{% set a = [] %}{% set _ = a.append(a) %}{{ a == a }}", MSGS, "holds itself"),
    # only time: loops and recursion that make nothing
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", MSGS, "ran longer"),
    ("{% for a in messages[0].content %}{% for b in messages[0].content %}{% endfor %}{% endfor %}", LONG,
     "ran longer"),
    ("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}", MSGS,
     "ran longer"),
    ("{% for x in messages recursive %}{% if loop.depth < 40 %}{{ loop(messages * 2) }}{% endif %}{% endfor %}",
     MSGS, "ran longer"),
    ("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% for j in range(100000) %}"
     "{% set _ = ns.l.append(messages) %}{% endfor %}{% endfor %}", MSGS, "ran longer|MiB"),
    # compiling: what Python's compiler (which holds the GIL) is given
    ("x" * (templatesandbox.MAX_CODE_CHARS + 1), MSGS, "compiles to more than"),
]


@pytest.mark.parametrize("tmpl, msgs, says", RUNAWAYS, ids=range(len(RUNAWAYS)))
def test_a_runaway_template_is_stopped_at_once_in_bounded_memory(request, tmpl, msgs, says):
    """Each is stopped by the bound it says, not by the deadline, unless it only runs long (then
    under a short deadline: ``quick``)."""
    if "ran longer" in says:
        request.getfixturevalue("quick")
    chat_template._compiled.cache_clear()
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(TemplateRunaway) as failed:
            render(tmpl, msgs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    took = time.monotonic() - started
    assert any(s in str(failed.value) for s in says.split("|")), failed.value
    assert str(failed.value).startswith("chat template stopped")
    assert took < 4, took  # under tracemalloc, which slows a render several times over
    assert peak < 2 * templatebounds.MEMORY, f"{peak >> 20} MiB"


@pytest.mark.parametrize("use", ["{{ {ns.a: 1} }}", "{{ ns.a in [] }}", "{{ ns.a }}", "{{ ns.a|tojson }}"])
def test_a_value_nested_past_the_bound_is_refused_before_python_walks_it(monkeypatch, use):
    """Hashing a tuple nested past the C stack's depth kills the process (SIGSEGV: CPython's tuple
    hash does not check its depth); printing and comparing fail at Python's recursion limit.
    Shown here under a bound of 100, a nesting a template builds in no time."""
    monkeypatch.setattr(templatebounds, "MAX_DEPTH", 100)
    with pytest.raises(TemplateRunaway, match="nested more than 100 deep"):
        render("{% set ns = namespace(a=(1,)) %}{% for i in range(150) %}{% set ns.a = (ns.a,) %}{% endfor %}"
               + use, MSGS)


@pytest.mark.parametrize("tmpl, says", [
    ("{{ lipsum(10**9) }}", "'lipsum' is undefined"),  # Jinja's lorem ipsum: a Python loop by its count
    ("{{ x|pprint }}", "No filter named 'pprint'"),
    ("{{ strftime_now('%0999999999Y') }}", "no field widths"),  # the C library pads to any width
    ("{% for i in range(10**9) %}{% endfor %}", "Range too big"),  # Jinja's own bound
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
    ("{% if x %}" * 5000 + "{% endif %}" * 5000, "does not compile"),
])
def test_what_a_sandbox_refuses_otherwise_is_a_broken_template(quick, tmpl, says):
    started = time.monotonic()
    with pytest.raises(TemplateBroken, match=says):
        render(tmpl, MSGS)
    assert time.monotonic() - started < 2


def test_a_runaway_stops_its_own_render_only(quick):
    """A template running away on one thread (the worker's prep threads) leaves another thread's
    renders as fast as ever, and the next render of anything starts afresh."""
    hostile = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    failed: list[BaseException] = []

    def run_away() -> None:
        try:
            render(hostile, MSGS)
        except TemplateRunaway as e:
            failed.append(e)

    thread = threading.Thread(target=run_away)
    thread.start()
    slowest = 0.0
    while thread.is_alive():
        started = time.monotonic()
        assert render(CHATML, MSGS) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        slowest = max(slowest, time.monotonic() - started)
    thread.join()
    assert failed and "ran longer" in str(failed[0])
    assert slowest < DEADLINE / 2
    with pytest.raises(TemplateRunaway):  # the same template, once more: stopped again, not remembered
        render(hostile, MSGS)
    assert render(CHATML, MSGS).startswith("<|im_start|>user")


def test_a_template_that_does_not_compile_fails_at_once_the_next_time():
    """The second request is refused from what the first compile left, not compiled again
    (counted by the compile cache, not timed: a busy machine's timing says nothing here)."""
    chat_template._compiled.cache_clear()
    source = "{{ x }}" * 5000 + "{% for %}"
    with pytest.raises(TemplateBroken, match="does not compile"):
        render(source, MSGS)
    assert chat_template._compiled.cache_info().misses == 1
    with pytest.raises(TemplateBroken, match="does not compile"):
        render(source, MSGS)
    assert chat_template._compiled.cache_info()[:2] == (1, 1)  # one hit, and still the one compile


def test_the_bounds_grow_with_the_input():
    small, big = templatebounds.bounds_for(0), templatebounds.bounds_for(1 << 20)
    assert small == templatebounds.Bounds(templatebounds.SECONDS, templatebounds.CHARS, templatebounds.MEMORY)
    assert big.seconds > small.seconds and big.chars > small.chars + (1 << 20) and big.memory > small.memory


# --- the real templates: as before, and a long conversation within the bounds -------------------

@pytest.fixture(scope="module")
def real_templates():
    from realmodel import CACHE

    from gateway.models import testmodels as tm
    sdist = tm._llama_cpp_sdist(CACHE / "templates")
    import tarfile
    with tarfile.open(sdist) as tar:
        names = sorted(m.name.rsplit("/", 1)[1] for m in tar if "/vendor/llama.cpp/models/templates/" in m.name
                       and m.name.endswith(".jinja"))
    return {name: tm.llama_cpp_source_file(f"models/templates/{name}", CACHE / "templates").read_text()
            for name in names}


class _PlainJinja(SandboxedEnvironment):
    """Jinja's own sandbox, unbounded, with what the renderer adds to it (its ``+``)."""

    intercepted_binops = frozenset({"+"})

    def call_binop(self, context, operator, left, right):
        if isinstance(left, str) != isinstance(right, str):
            other = right if isinstance(left, str) else left
            if other is None or isinstance(other, jinja2.Undefined):
                return left if isinstance(left, str) else right
        return self.binop_table[operator](left, right)


def plain_render(source: str, messages: list, tools: list | None, extra: dict, generation: bool) -> str:
    env = _PlainJinja(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.ChainableUndefined,
                      extensions=list(chat_template.EXTENSIONS))
    env.filters["tojson"] = chat_template._tojson
    env.globals.update(raise_exception=chat_template._raise_exception, strftime_now=chat_template._strftime_now)
    if any(m.get("tool_calls") for m in messages) and chat_template.arguments_as_string(source):
        messages = chat_template._with_string_arguments(messages)
    now = chat_template.datetime.now()
    variables = {"datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y"), **extra,
                 "bos_token": "", "eos_token": "", "add_generation_prompt": generation, "messages": messages}
    if tools:
        variables["tools"] = tools
    with templatebounds.bounded(templatebounds.Bounds(seconds=600, chars=1 << 40, memory=1 << 50)):  # tojson's
        return env.from_string(source).render(**chat_template._inputs(variables))


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}, "days": {"type": "integer"}},
                                               "required": ["city"]}}}]
HISTORY = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "Sunny, 21 C."},
    {"role": "assistant", "content": "It is sunny in Paris.", "reasoning_content": "The tool said so."},
    {"role": "user", "content": [{"type": "text", "text": "And in Rome?"}]},
]
REQUESTS = [  # (messages, tools, chat_template_kwargs, add_generation_prompt)
    (MSGS, None, {}, True), (HISTORY, TOOLS, {}, True), (HISTORY, None, {}, False),
    (HISTORY[1:2], None, {"enable_thinking": True}, True), (HISTORY[1:2], None, {"enable_thinking": False}, True),
]


def test_the_real_templates_render_as_plain_jinja_renders_them(real_templates):
    compared = 0
    for name, source in real_templates.items():
        for messages, tools, extra, generation in REQUESTS:
            bounded = functools.partial(render, source, json.loads(json.dumps(messages)), tools=tools, extra=extra,
                                        add_generation_prompt=generation)
            try:
                expected = plain_render(source, json.loads(json.dumps(messages)), tools, extra, generation)
            except Exception:  # a template that refuses the request: it refuses it bounded too
                with pytest.raises((TemplateBroken, chat_template.TemplateInputError)):
                    bounded()
                continue
            assert bounded() == expected, name
            compared += 1
    assert compared >= 3 * len(real_templates)


def long_conversation(turns: int, words: int) -> list[dict]:
    text = " ".join(["lorem", "ipsum", "dolor", "naïve", "日本"] * (words // 5))
    messages = [{"role": "system", "content": text}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"{i}: {text}"})
        messages.append({"role": "assistant", "content": f"{i}: {text}"})
    return [*messages, {"role": "user", "content": "the last question"}]


@pytest.mark.parametrize("name", ["google-gemma-4-31B-it.jinja",  # the slowest of them
                                  "Reka-Edge.jinja"])  # builds its prompt in a namespace, a message at a time
def test_a_long_conversation_renders_within_the_bounds_its_size_sets(real_templates, name):
    messages = long_conversation(150, 1000)  # about 1.5 MB
    out = render(real_templates[name], messages, tools=TOOLS)
    assert "the last question" in out and len(out) > 1_000_000
