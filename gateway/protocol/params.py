"""Generation parameters: names, types and ranges, shared by requests and models.yaml."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..engine.protocol import GenerationRequest

FLOAT_MAX = 3.4028234663852886e38  # a C float, as llama.cpp takes every real parameter
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Param:
    """A numeric field. With no bound of its own a value must still fit the C type llama.cpp
    reads it into (a float, a 32-bit int): JSON numbers have no size limit."""

    kind: type  # int or float (an int is accepted where a float is asked)
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # True: the low bound itself is excluded

    def problem(self, value: object) -> str | None:
        """Why ``value`` is not acceptable, or None."""
        ok_type = isinstance(value, (int, float)) if self.kind is float else isinstance(value, int)
        if isinstance(value, bool) or not ok_type or not isinstance(value, (int, float)):
            return f"must be {'a number' if self.kind is float else 'an integer'}"
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
        limit = FLOAT_MAX if self.kind is float else INT32_MAX
        low = -limit if self.low is None else self.low
        high = limit if self.high is None else self.high
        show = (lambda x: f"{x:g}") if self.kind is float else (lambda x: str(int(x)))
        if value < low or (self.low_open and value == low):
            return f"must be {'>' if self.low_open else '>='} {show(low)}"
        if value > high:
            return f"must be <= {show(high)}"
        return None


def shown(value: object, limit: int = 60) -> str:
    """A caller's value for an error message, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


# Ranges follow OpenAI where it defines the field, llama.cpp's server otherwise.
SAMPLING: dict[str, Param] = {
    "temperature": Param(float, 0, 2),
    "top_p": Param(float, 0, 1),
    "top_k": Param(int, 0),
    "min_p": Param(float, 0, 1),
    "repeat_penalty": Param(float, 0, low_open=True),
    "presence_penalty": Param(float, -2, 2),
    "frequency_penalty": Param(float, -2, 2),
    "seed": Param(int, -(2**63), 2**64 - 1),  # any 64-bit seed (OpenAI's is int64); llama.cpp takes 32 bits
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
            raise InvalidRequest(f"{where} {problem}, got {shown(value)}", name)
        setattr(req, name, value)
        explicit.add(name)
    return explicit


def require_model(body: dict[str, Any], *, anthropic: bool = False) -> str:
    """The request's model name: required on every route that names one."""
    from ..errors import InvalidRequest

    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        where = "model: Field required" if anthropic else "`model` is required"
        raise InvalidRequest(f"{where}: the name of a model on this gateway (see /v1/models)", "model")
    return model


MAX_STOPS = 16
MAX_STOP_CHARS = 4096  # all stop strings together: each is matched against every token's text


def read_stops(value: Any, name: str, *, anthropic: bool = False) -> list[str]:
    """``stop`` (a string or a list of strings) or ``stop_sequences`` (a list), bounded in
    count and in total length; empty strings are dropped."""
    from ..errors import InvalidRequest

    where = f"{name}:" if anthropic else f"`{name}`"
    if value is None:
        return []
    if isinstance(value, str) and not anthropic:
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise InvalidRequest(f"{where} must be {'' if anthropic else 'a string or '}a list of strings", name)
    if len(value) > MAX_STOPS:
        raise InvalidRequest(f"{where} may hold at most {MAX_STOPS} strings, got {len(value)}", name)
    total = sum(len(s) for s in value)
    if total > MAX_STOP_CHARS:
        raise InvalidRequest(f"{where} may hold at most {MAX_STOP_CHARS} characters in all, got {total}", name)
    return [s for s in value if s]


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
