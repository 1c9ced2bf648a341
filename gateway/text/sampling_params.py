"""Sampling parameters: their names, types and ranges. One table read by the request
parsers (``wire/``) and by models.yaml's ``defaults`` (``models/config/``), so neither depends on
the other."""

from __future__ import annotations

import math
from dataclasses import dataclass

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
