"""The bounds a request is held to on both sides of the pipe: the gateway checks a request by
the worker's own numbers, and neither side loads llama.cpp to know them (pure).

- The LoRA adapters: how many a model's table holds (``MAX_ADAPTERS``) and the scales a request
  or an operator may give (``MAX_SCALE``, ``is_scale``). ``worker/adapters.py`` applies them,
  and the wire layer, the admin's ``/lora-adapters`` and models.yaml's checks refuse past them.
- Fill in the middle: the room the extra files have in a prompt (``extra_room``), as
  ``worker/infill.py`` lays the prompt out, and the tokens read past it (``MARGIN``). The gateway
  trims a request's files to what can reach the prompt (``wire/fim.py``'s ``extra_budget``), the
  worker what it tokenizes (``worker/prompts.py``).
"""

from __future__ import annotations

import math
from typing import Any

MAX_ADAPTERS = 64  # a model's table, run-time ones included: each holds memory and a name
# An adapter's scale, as llama.cpp multiplies its product by it: real ones are about 0 to 2 (below 0
# takes a style away). Past 100 the adapter's product drowns the model's own weights, and in
# half-precision activations it runs to infinity: a typo, not a setting.
MAX_SCALE = 100.0

# Tokens read past what the layout keeps of a text cut by bytes: the cut may split a token, and
# the tokens right after it may differ from the whole text's
MARGIN = 8


def is_scale(value: Any) -> bool:
    """Whether a request or an operator gave a scale: a finite number within ``MAX_SCALE``."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value) \
        and abs(value) <= MAX_SCALE


def extra_room(n_ctx: int, n_batch: int, n_predict: int) -> int:
    """The most tokens of a fill-in-the-middle prompt's extra context the layout keeps:
    llama-server's ``n_ctx - n_batch - 2 * n_predict``, never more than the context."""
    return min(max(0, n_ctx - n_batch - 2 * n_predict), n_ctx)
