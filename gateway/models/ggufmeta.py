"""Read what a GGUF file is from its header, without loading it into llama.cpp.

The format's types and sizes come from llama.cpp's own ``gguf`` package; the walk over
the header is done here with one ``mmap``, because ``gguf.GGUFReader`` builds a numpy view
per array element: it took 8 s on a model with a 152k-entry vocabulary, while this walk
skips the vocabulary in about 0.1 s. The walk also checks what makes llama.cpp abort
rather than fail politely (a truncated header or tensor data, absurd counts), so a bad
file is refused with a reason before any worker is spawned for it.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)

_MAX_KV = 1 << 20
_MAX_TENSORS = 1 << 20
_MAX_DIMS = 8


class ModelFileError(Exception):
    """The file is missing, is not GGUF, or its header cannot be read."""


RANK_POOLING = 4  # enum llama_pooling_type: NONE, MEAN, CLS, LAST, RANK


class ArrayLength(int):
    """An array's place in the metadata: its length (its items are not kept)."""


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    file_size: int  # bytes, all split parts together
    architecture: str | None
    name: str | None
    size_label: str | None
    quantization: str | None
    context_length: int | None
    embedding_length: int | None
    has_chat_template: bool
    split_count: int = 1
    pooling: bool = False  # an embedding model (has a pooling type, or an encoder-only architecture)
    reranker: bool = False  # llama.cpp's rank pooling: scores a query and a document (a cross-encoder)
    n_tensors: int = 0
    kind: str | None = None  # general.type: "model", "adapter", "mmproj", ... (often absent)
    chat_template: str | None = None  # tokenizer.chat_template
    media: tuple[str, ...] = ()  # a projector's: what it encodes ("image", "audio"), from clip.has_*_encoder
    weight_bytes: int = 0  # the tensors' data, in all the files of a split model
    # the same bytes by where llama.cpp places them (``memory.layer_devices``): each repeating
    # layer's (``blk.N.*``), the input layer's (token embeddings: always on the CPU), the rest
    # (output head and norms: placed with the output layer)
    layer_bytes: tuple[int, ...] = ()
    input_bytes: int = 0
    output_bytes: int = 0
    tied_output: bool = False  # no output.weight: the output head reuses the token embeddings
    n_vocab: int = 0
    # the vocabulary names its fill-in-the-middle tokens (tokenizer.ggml.fim_{pre,suf,mid}_token_id;
    # llama.cpp also finds them by their text once loaded, which a header alone does not tell)
    fim: bool = False
    # the architecture's numbers (block_count, attention.head_count_kv, ...), without the prefix;
    # a per-layer array appears as its length
    shape: dict[str, int | float] = field(default_factory=dict)


def split_parts(path: Path) -> list[Path]:
    """All files of a split model (``-00001-of-00003.gguf``), or just ``[path]``."""
    m = SPLIT_RE.match(path.name)
    if not m:
        return [path]
    count = int(m.group("count"))
    return [path.with_name(f"{m.group('stem')}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def quantization_name(file_type: int | None) -> str | None:
    if file_type is None:
        return None
    import gguf

    try:
        name = gguf.LlamaFileType(file_type).name
    except ValueError:
        return f"type {file_type}"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


class _Walker:
    """Reads little-endian GGUF values from a memory map, refusing anything out of bounds."""

    def __init__(self, buf: mmap.mmap, path: Path):
        import gguf

        self.buf, self.path, self.pos = buf, path, 0
        self.T = gguf.GGUFValueType
        self.fixed: dict[int, str] = {self.T.UINT8: "B", self.T.INT8: "b", self.T.UINT16: "H", self.T.INT16: "h",
                      self.T.UINT32: "I", self.T.INT32: "i", self.T.FLOAT32: "f", self.T.BOOL: "?",
                      self.T.UINT64: "Q", self.T.INT64: "q", self.T.FLOAT64: "d"}

    def fail(self, why: str) -> ModelFileError:
        return ModelFileError(f"{self.path}: {why}")

    def take(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.buf):
            raise self.fail("truncated GGUF header")
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> bytes:
        n = self.take("Q")
        if self.pos + n > len(self.buf):
            raise self.fail("truncated GGUF header (a string runs past the end of the file)")
        self.pos += n
        return self.buf[self.pos - n:self.pos]

    def value(self, vtype: int, keep: bool) -> Any:
        T = self.T
        if vtype in self.fixed:
            return self.take(self.fixed[vtype])
        if vtype == T.STRING:
            raw = self.string()
            return raw.decode("utf-8", "replace") if keep else None
        if vtype == T.ARRAY:
            etype, count = self.take("I"), self.take("Q")
            if etype in self.fixed:
                size = struct.calcsize("<" + self.fixed[etype]) * count
                if self.pos + size > len(self.buf):
                    raise self.fail("truncated GGUF header (an array runs past the end of the file)")
                self.pos += size
            elif etype == T.STRING:
                if count * 8 > len(self.buf) - self.pos:
                    raise self.fail(f"truncated or corrupt GGUF header: an array of {count} strings "
                                    "cannot fit in the rest of the file")
                for _ in range(count):
                    self.string()
            else:
                raise self.fail(f"unsupported array element type {etype}")
            return ArrayLength(count)
        raise self.fail(f"unknown metadata value type {vtype}")


@dataclass
class _Weights:
    """Tensor data bytes by place (``GGUFInfo.layer_bytes`` and its neighbours)."""

    layers: dict[int, int] = field(default_factory=dict)
    input: int = 0
    output: int = 0
    has_output_head: bool = False

    @property
    def total(self) -> int:
        return sum(self.layers.values()) + self.input + self.output

    def add(self, name: bytes, nbytes: int) -> None:
        if m := _LAYER_TENSOR.match(name):
            self.layers[int(m.group(1))] = self.layers.get(int(m.group(1)), 0) + nbytes
        elif name.split(b".")[0] in _INPUT_TENSORS:
            self.input += nbytes
        else:
            self.output += nbytes
            self.has_output_head |= name == b"output.weight"

    def merge(self, other: _Weights) -> None:
        for layer, n in other.layers.items():
            self.layers[layer] = self.layers.get(layer, 0) + n
        self.input += other.input
        self.output += other.output
        self.has_output_head |= other.has_output_head


_LAYER_TENSOR = re.compile(rb"blk\.(\d+)\.")
# llama.cpp's input layer (LLM_TENSOR_LAYER_INPUT): kept on the CPU whatever n_gpu_layers says
_INPUT_TENSORS = frozenset({b"token_embd", b"token_embd_norm", b"token_types", b"position_embd",
                            b"per_layer_token_embd"})


def _walk(path: Path) -> tuple[dict[str, Any], int, _Weights]:  # (metadata, tensor count, tensor data bytes)
    """Header metadata (scalars and strings; arrays as their lengths), checked against the file size."""
    import gguf

    try:
        f = open(path, "rb")
    except OSError as e:
        raise ModelFileError(f"cannot open {path}: {e.strerror or e}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            head = f.read(4)
            what = "truncated GGUF header" if head == b"GGUF" else "not a GGUF file"
            raise ModelFileError(f"{path}: {what} (only {size} bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if buf[:4] != b"GGUF":
                raise ModelFileError(f"{path}: not a GGUF file (magic {bytes(buf[:4])!r})")
            w = _Walker(buf, path)
            w.pos = 4
            version = w.take("I")
            if version not in (2, 3):
                if version & 0xFFFF == 0 and version:
                    raise ModelFileError(f"{path}: big-endian GGUF files are not supported")
                raise ModelFileError(f"{path}: unsupported GGUF version {version}")
            n_tensors, n_kv = w.take("Q"), w.take("Q")
            if n_tensors > _MAX_TENSORS or n_kv > _MAX_KV:
                raise ModelFileError(f"{path}: absurd counts in the GGUF header ({n_tensors} tensors, {n_kv} keys)")
            meta: dict[str, Any] = {}
            for _ in range(n_kv):
                key = w.string().decode("utf-8", "replace")
                meta[key] = w.value(w.take("I"), keep=not key.startswith("tokenizer.ggml."))
            # Tensor infos: the data they describe must lie inside the file.
            end, weights = 0, _Weights()
            for _ in range(n_tensors):
                name = w.string()
                n_dims = w.take("I")
                if n_dims > _MAX_DIMS:
                    raise ModelFileError(f"{path}: tensor {name[:64]!r} has {n_dims} dimensions")
                elements = 1
                for _ in range(n_dims):
                    elements *= w.take("Q")
                ttype, offset = w.take("I"), w.take("Q")
                try:
                    block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ttype)]
                except (ValueError, KeyError):
                    raise ModelFileError(f"{path}: tensor {name[:64]!r} has unknown type {ttype}") from None
                nbytes = elements // block * type_size
                end = max(end, offset + nbytes)
                weights.add(name, nbytes)
            align = meta.get("general.alignment") or gguf.GGUF_DEFAULT_ALIGNMENT
            data_start = -(-w.pos // align) * align
            if n_tensors and data_start + end > size:
                raise ModelFileError(f"{path}: truncated tensor data (the header needs {data_start + end} bytes, "
                                     f"the file has {size})")
    return meta, n_tensors, weights


ENCODER_ARCHS = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "t5encoder",
                           "modern-bert", "neo-bert", "eurobert"})


def read_info(path: str | Path) -> GGUFInfo:
    """Header metadata of ``path``; raises ``ModelFileError`` with a reason a person can act on."""
    path = Path(path)
    meta, n_tensors, weights = _walk(path)
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelFileError(f"{path}: no general.architecture in the GGUF header")
    parts = split_parts(path)
    missing = [p.name for p in parts if not p.exists()]
    if missing:
        raise ModelFileError(f"{path}: split model is missing {', '.join(missing)}")
    for part in parts[1:]:  # a split model's other files hold the rest of its tensors
        weights.merge(_walk(part)[2])

    def num(key: str) -> int | None:
        v = meta.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    def text(key: str) -> str | None:
        v = meta.get(key)
        return v if isinstance(v, str) else None

    return GGUFInfo(
        path=path,
        file_size=sum(p.stat().st_size for p in parts),
        architecture=arch,
        name=text("general.name"),
        size_label=text("general.size_label"),
        quantization=quantization_name(num("general.file_type")),
        context_length=num(f"{arch}.context_length"),
        embedding_length=num(f"{arch}.embedding_length"),
        has_chat_template="tokenizer.chat_template" in meta,
        split_count=len(parts),
        pooling=arch in ENCODER_ARCHS or num(f"{arch}.pooling_type") not in (None, 0),
        reranker=num(f"{arch}.pooling_type") == RANK_POOLING,
        n_tensors=n_tensors,
        kind=text("general.type"),
        chat_template=text("tokenizer.chat_template"),
        media=tuple(kind for kind, key in (("image", "vision"), ("audio", "audio"))
                    if meta.get(f"clip.has_{key}_encoder") is True),
        weight_bytes=weights.total,
        layer_bytes=tuple(weights.layers.get(i, 0) for i in range(max(weights.layers, default=-1) + 1)),
        input_bytes=weights.input,
        output_bytes=weights.output,
        tied_output=not weights.has_output_head,
        n_vocab=num("tokenizer.ggml.tokens") or 0,
        fim=all(type(meta.get(f"tokenizer.ggml.fim_{k}_token_id")) is int for k in ("pre", "suf", "mid")),
        shape={k[len(arch) + 1:]: v for k, v in meta.items() if k.startswith(f"{arch}.")
               and isinstance(v, (int, float)) and not isinstance(v, (bool, ArrayLength))},
    )
