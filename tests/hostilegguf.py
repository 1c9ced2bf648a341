"""GGUF headers written byte by byte, hostile ones included: what a stranger's model file may
hold (tests/test_gguf_fuzz.py, tests/test_gguf_hostile_e2e.py).

``header(kv, tensors)`` writes a GGUF v3 header as the format lays it out, checking nothing: a
count, a length or an index may be anything a field of its width holds, and a ``Raw`` value is
written as given. The three files issue 50 reported are ready-made: ``deep_layer_index``
(a tensor of layer 150,000,000), ``huge_block_count`` (40,000,000 layers) and
``unclosed_template`` (tens of KiB of ``{{``).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# gguf's value types (GGUFValueType)
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FIXED = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?", U64: "Q", I64: "q", F64: "d"}
F32_TYPE = 0  # ggml's tensor type F32


@dataclass(frozen=True)
class Raw:
    """Bytes written in place of a value (after its type), as they are."""

    data: bytes


@dataclass(frozen=True)
class Array:
    """An array value: its element type, its items (``count`` may claim more than there are)."""

    etype: int
    items: Sequence[Any] = ()
    count: int | None = None


def string(s: str | bytes | Raw, length: int | None = None) -> bytes:
    """A string as GGUF writes one: its length (``length`` where given, whatever the bytes), then
    its bytes; a ``Raw`` is written as it is."""
    if isinstance(s, Raw):
        return s.data
    data = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(data) if length is None else length) + data


def value(vtype: int, v: Any) -> bytes:
    if isinstance(v, Raw):
        return v.data
    if vtype == STRING:
        return string(v)
    if vtype == ARRAY:
        assert isinstance(v, Array)
        out = struct.pack("<IQ", v.etype, len(v.items) if v.count is None else v.count)
        return out + b"".join(value(v.etype, item) for item in v.items)
    return struct.pack("<" + _FIXED[vtype], v)


@dataclass(frozen=True)
class Tensor:
    name: str | bytes | Raw
    dims: Sequence[int] = (0,)
    ttype: int = F32_TYPE
    offset: int = 0
    n_dims: int | None = None  # as written (default: len(dims))


def header(kv: Sequence[tuple[str | bytes | Raw, int, Any]], tensors: Sequence[Tensor] = (), *, version: int = 3,
           n_kv: int | None = None, n_tensors: int | None = None, pad_to: int = 0) -> bytes:
    """A GGUF file: its header (counts as given, else as listed), then zeros up to ``pad_to``
    bytes (the tensors' data, where they claim any)."""
    out = [b"GGUF", struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                len(kv) if n_kv is None else n_kv)]
    for key, vtype, v in kv:
        out += [string(key), struct.pack("<I", vtype), value(vtype, v)]
    for t in tensors:
        out += [string(t.name), struct.pack("<I", len(t.dims) if t.n_dims is None else t.n_dims)]
        out += [struct.pack("<Q", d) for d in t.dims]
        out += [struct.pack("<IQ", t.ttype, t.offset)]
    data = b"".join(out)
    return data + b"\0" * max(0, pad_to - len(data))


def llama_kv(**numbers: int) -> list[tuple[str, int, Any]]:
    """A llama's header keys: its architecture, and ``numbers`` as ``llama.KEY`` (``__`` for a
    dot: ``attention__head_count``), each a uint32 unless it is out of that range."""
    kv: list[tuple[str, int, Any]] = [("general.architecture", STRING, "llama")]
    for key, n in numbers.items():
        kv.append((f"llama.{key.replace('__', '.')}", U32 if 0 <= n < 2**32 else U64 if n >= 0 else I64, n))
    return kv


def deep_layer_index(path: Path) -> Path:
    """Item 1: 4 KiB holding one tensor of layer 150,000,000, with no elements."""
    path.write_bytes(header(llama_kv(block_count=1, embedding_length=64),
                            [Tensor("blk.150000000.attn_q.weight", (0, 64))], pad_to=4096))
    return path


def huge_block_count(path: Path) -> Path:
    """Item 2: a header that says 40,000,000 layers (one tensor, so discovery lists it)."""
    path.write_bytes(header(llama_kv(block_count=40_000_000, embedding_length=64, context_length=4096),
                            [Tensor("token_embd.weight", (64, 1))], pad_to=4096))
    return path


def unclosed_template(path: Path, size: int = 48 * 1024) -> Path:
    """Item 3: a chat template of ``size`` bytes of unclosed ``{{`` (one tensor)."""
    template = ("{{ tools " * (size // 9 + 1))[:size]
    path.write_bytes(header([*llama_kv(block_count=1, embedding_length=64),
                             ("tokenizer.chat_template", STRING, template)],
                            [Tensor("token_embd.weight", (64, 1))], pad_to=4096 + size))
    return path


def with_data(kv: Sequence[tuple[str | bytes | Raw, int, Any]], tensors: Sequence[tuple[str, Sequence[int]]],
              align: int = 32) -> bytes:
    """A header and its F32 tensors' data (zeros), each at its aligned offset: a file the header
    reader takes, for a test to spoil."""
    infos, offset = [], 0
    for name, dims in tensors:
        infos.append(Tensor(name, dims, F32_TYPE, offset))
        offset += -(-4 * math.prod(dims) // align) * align
    head = header(kv, infos)
    return head + b"\0" * (-(-len(head) // align) * align - len(head) + offset)
