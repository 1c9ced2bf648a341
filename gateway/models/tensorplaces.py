"""Where llama.cpp places a model's tensor, told by its name alone (pure): in a repeating layer
(``blk.N.*``: layer N), in the input layer (``INPUT_TENSORS``: the token embeddings and their
kin, kept on the CPU whatever ``n_gpu_layers`` says: llama.cpp's ``LLM_TENSOR_LAYER_INPUT``), or
else in the output layer (the head, the final norm), placed as the output layer is.

The header's reader sums a model's tensor bytes by place (``Weights``, ``ggufmeta``), and the
memory estimate places a LoRA adapter's tensors where the tensor each one adapts lies: llama.cpp
allocates them in that tensor's buffer type (``llama_adapter_lora_init``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

LAYER_TENSOR = re.compile(rb"blk\.(\d+)\.")
INPUT_TENSORS = frozenset({b"token_embd", b"token_embd_norm", b"token_types", b"position_embd",
                           b"per_layer_token_embd"})


def layer(name: bytes) -> int | None:
    """The repeating layer a tensor belongs to, or None (the input or the output layer's)."""
    m = LAYER_TENSOR.match(name)
    return int(m.group(1)) if m else None


def is_input(name: bytes) -> bool:
    """Whether a tensor that is in no repeating layer is the input layer's (else the output's)."""
    return name.split(b".")[0] in INPUT_TENSORS


@dataclass
class Weights:
    """Tensor data bytes by place (``GGUFInfo.layer_bytes`` and its neighbours)."""

    layers: dict[int, int] = field(default_factory=dict)
    input: int = 0
    output: int = 0
    has_output_head: bool = False

    @property
    def total(self) -> int:
        return sum(self.layers.values()) + self.input + self.output

    def add(self, name: bytes, layer: int | None, nbytes: int) -> None:
        if layer is not None:
            self.layers[layer] = self.layers.get(layer, 0) + nbytes
        elif is_input(name):
            self.input += nbytes
        else:
            self.output += nbytes
            self.has_output_head |= name == b"output.weight"

    def merge(self, other: Weights) -> None:
        for layer, n in other.layers.items():
            self.layers[layer] = self.layers.get(layer, 0) + n
        self.input += other.input
        self.output += other.output
        self.has_output_head |= other.has_output_head
