"""What a format module provides, in one place: the package's ``TABLE`` holds modules of this
shape, and adding a format is writing one (plus its line in ``TABLE``)."""

from __future__ import annotations

from typing import Any, Protocol

from .gbnf import Grammar, Rules
from .machine import Machine

Messages = list[dict[str, Any]]
Tools = list[dict[str, Any]] | None


class Format(Protocol):
    """A tool-call format's module (the methods are its functions)."""

    @property
    def MARKERS(self) -> tuple[str, ...]:
        """Its markers that are single (special) tokens in some vocabulary."""
        ...

    @property
    def TOKEN(self) -> str | None:
        """The single token that shows the format when the template does not say."""
        ...

    @property
    def Parser(self) -> type[Machine]:
        """Its incremental parser."""
        ...

    def shown_by(self, template: str) -> bool:
        """Whether a chat template's source (one with tools) writes calls in this format."""
        ...

    def example(self, chat_template: str | None) -> str:
        """A call in this syntax, for the system message that describes the tools."""
        ...

    def grammar(self, rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
        """The root rule for calls to ``tools`` (written through ``rules``) and the trigger
        patterns (regular expressions) that open a call, for a lazy grammar."""
        ...

    def history(self, messages: Messages, tools: Tools) -> tuple[Messages, Tools]:
        """The messages and tools as the chat template should get them (the tools None: the
        template is not handed them, the caller describes them in a system message)."""
        ...


def history_as_is(messages: Messages, tools: Tools) -> tuple[Messages, Tools]:
    """The history shape of a format whose templates render calls and results themselves."""
    return messages, tools
