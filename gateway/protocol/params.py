"""Generation parameters: names, types and ranges, shared by requests and models.yaml."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..engine.protocol import GenerationRequest


@dataclass(frozen=True)
class Param:
    kind: type  # int or float (an int is accepted where a float is asked)
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # True: the low bound itself is excluded

    def problem(self, value: object) -> str | None:
        """Why ``value`` is not acceptable, or None."""
        ok_type = isinstance(value, (int, float)) if self.kind is float else isinstance(value, int)
        if isinstance(value, bool) or not ok_type:
            return f"must be {'a number' if self.kind is float else 'an integer'}"
        if value != value:  # NaN
            return "must be a number"
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return f"must be {'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None and value > self.high:
            return f"must be <= {self.high:g}"
        return None


# Ranges follow OpenAI where it defines the field, llama.cpp's server otherwise.
SAMPLING: dict[str, Param] = {
    "temperature": Param(float, 0, 2),
    "top_p": Param(float, 0, 1),
    "top_k": Param(int, 0),
    "min_p": Param(float, 0, 1),
    "repeat_penalty": Param(float, 0, low_open=True),
    "presence_penalty": Param(float, -2, 2),
    "frequency_penalty": Param(float, -2, 2),
    "seed": Param(int),
    "max_tokens": Param(int, 1),
}


def read_sampling(body: dict[str, Any], req: GenerationRequest, params: dict[str, Param], *,
                  anthropic: bool = False) -> set[str]:
    """Copy the sampling fields ``body`` sets into ``req``, checked against ``params``; returns
    the names it set (they beat a model's defaults). A bad value is a 400 naming the field."""
    from ..errors import InvalidRequest

    explicit: set[str] = set()
    for name, param in params.items():
        value = body.get(name)
        if value is None or name == "max_tokens":
            continue
        problem = param.problem(value)
        if problem:
            where = f"{name}:" if anthropic else f"`{name}`"
            raise InvalidRequest(f"{where} {problem}, got {value!r}", name)
        setattr(req, name, value)
        explicit.add(name)
    return explicit


@dataclass
class Parsed:
    """A validated request: what to run, and how to answer."""

    model: str
    request: GenerationRequest
    stream: bool = False
    include_usage: bool = False
    explicit: set[str] = field(default_factory=set)  # sampling fields the caller set
    reasoning_format: str = "auto"  # "none": thinking stays in the content, markers and all
    more: list[GenerationRequest] = field(default_factory=list)  # further prompts of a batch, one choice each

    @property
    def requests(self) -> list[GenerationRequest]:
        return [self.request, *self.more]


def apply_defaults(parsed: Parsed, defaults: dict[str, Any]) -> None:
    """A model's models.yaml defaults fill the sampling fields the caller did not set."""
    for req in parsed.requests:
        for name, value in defaults.items():
            if name == "max_tokens":
                if req.max_tokens is None:
                    req.max_tokens = value
            elif name not in parsed.explicit:
                setattr(req, name, value)
