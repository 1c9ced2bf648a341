"""The tool-format package's shape: every registered format module provides the whole
interface ``interface.Format`` declares, and no format module is left out of the table."""

import importlib
import inspect
import pkgutil

import pytest

from gateway.text import toolformats
from gateway.text.toolformats import TABLE
from gateway.text.toolformats.interface import Format
from gateway.text.toolformats.machine import Machine

MEMBERS = {name: member for name, member in vars(Format).items() if not name.startswith("_")}


def test_the_interface_lists_what_the_callers_use():
    assert set(MEMBERS) == {"MARKERS", "TOKEN", "Parser", "shown_by", "example", "grammar", "history"}


class Rules:
    """A stand-in for the worker's converter: rule names only."""

    def args(self, tool, i):
        return f"tool{i}-args"

    def value(self, schema, name):
        return name

    def rule(self, name, body):
        return name


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "p": {"type": "string"}}}}}]


@pytest.mark.parametrize("name", TABLE)
def test_every_registered_format_provides_the_whole_interface(name):
    module = TABLE[name]
    for member, declared in MEMBERS.items():
        assert hasattr(module, member), f"{name} has no {member}"
        if callable(declared) and not isinstance(declared, property):
            want = [p for p in inspect.signature(declared).parameters if p != "self"]
            assert list(inspect.signature(getattr(module, member)).parameters) == want, (name, member)
    assert isinstance(module.MARKERS, tuple) and all(isinstance(m, str) and m for m in module.MARKERS)
    assert module.TOKEN is None or isinstance(module.TOKEN, str)
    assert issubclass(module.Parser, Machine)
    assert module.shown_by("{{ messages }}") is False
    assert isinstance(module.example(None), str) and module.example(None)
    root, triggers = module.grammar(Rules(), TOOLS, required=False, parallel=True)
    assert isinstance(root, str) and root and triggers and all(isinstance(t, str) for t in triggers)
    messages = [{"role": "user", "content": "hi"}]
    assert module.history(messages, None) == (messages, None)


def test_every_format_module_is_in_the_table():
    modules = {info.name for info in pkgutil.iter_modules(toolformats.__path__)}
    formats = {m for m in modules if hasattr(importlib.import_module(f"gateway.text.toolformats.{m}"), "shown_by")}
    assert formats == set(TABLE)


def test_the_http_api_page_has_a_row_for_every_format():
    """docs/http-api.md's table of `tool_format` values is what users set in models.yaml: every
    registered format has its row."""
    from pathlib import Path

    from gateway.text.toolformats import FORMATS

    readme = (Path(__file__).resolve().parents[1] / "docs" / "http-api.md").read_text()
    assert [f for f in FORMATS if f"| `{f}` |" not in readme] == []
