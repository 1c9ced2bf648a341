"""Read what a GGUF file is from its header, without loading it into llama.cpp.

The format's types and sizes come from llama.cpp's own ``gguf`` package; the walk over
the header is done here with one ``mmap``, because ``gguf.GGUFReader`` builds a numpy view
per array element: it took 8 s on a model with a 152k-entry vocabulary, while this walk
skips the vocabulary in about 0.1 s. The walk also checks what makes llama.cpp abort
rather than fail politely (a truncated header or tensor data, absurd counts), so a bad
file is refused with a reason before any worker is spawned for it.

A model file is untrusted input (people download them from strangers): every count, length,
index and number in its header decides how much this process reads, loops over or holds, here
and in what reads ``GGUFInfo`` (the memory estimate, the template scans, the listings), and
some of that runs on the event loop. So this walk is the one reader, and it bounds each where
it is read (the ``MAX_*`` constants, ``SHAPE_BOUNDS``): past a bound the file is refused with
the reason (``ModelFileError``); the walk's work and memory stay linear in the header's size
whatever its numbers say, and a ``GGUFInfo`` holds a bounded few of them. Each bound lies far
beyond any real model's and, where llama.cpp has a limit of its own, beyond llama.cpp's, which
it raises as models grow (``LLAMA_MAX_EXPERTS`` has, several times): the gateway refuses what
would cost it, and leaves to llama.cpp what it can load. Strings the gateway does not read are
skipped, never copied.
"""

from __future__ import annotations

import math
import mmap
import os
import re
import stat
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import tensorplaces
from .tensorplaces import Weights

SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)

# What one header may hold. Real models have tens of keys and at most a few thousand tensors;
# each key and tensor is a step of the walk and an entry it keeps.
MAX_KV = 1 << 16
MAX_TENSORS = 1 << 16
MAX_DIMS = 8  # a tensor's dimensions (ggml's GGML_MAX_DIMS is 4)
MAX_KEY_BYTES = 256  # a key's length: real ones are under 64 bytes
MAX_TENSOR_NAME_BYTES = 256  # ggml's GGML_MAX_NAME is 64 (llama.cpp refuses a longer name)
MAX_DIM = 2**63 - 1  # a dimension, and a tensor's elements: ggml's int64_t
# The items of an array of strings (the vocabulary, the merges), each a step of the walk: the
# largest vocabularies have 262,144 tokens (Gemma 3). Arrays of numbers are skipped whole.
MAX_STRING_ARRAY = 1 << 21
# general.architecture, .name, .size_label, .type: shown, and the architecture becomes a
# model's name (discovery's fallback); real ones are tens of bytes.
MAX_NAME_BYTES = 256
# A chat template (tokenizer.chat_template, and the named ones beside it). llama.cpp takes any
# length; the longest real templates, a default system prompt written in, are tens of KiB. The
# gateway scans a template on the event loop (the tool and thinking formats: ``gguf-gateway
# models``, Ollama's /api/show, each load), returns it whole (/api/show, /props) and compiles
# it in the worker: 1 MiB keeps each of those in milliseconds, with room of a few dozen times
# the longest template there is.
MAX_TEMPLATE_BYTES = 1 << 20
# Layers and experts: eight times llama.cpp's LLAMA_MAX_LAYERS and LLAMA_MAX_EXPERTS (512 each
# as this is written). The estimate places each layer in a Python loop, and a tensor's layer
# index sizes ``GGUFInfo.layer_bytes``.
MAX_LAYERS = 4096
MAX_EXPERTS = 4096
U32_MAX = 2**32 - 1
# A LoRA adapter's tensors, which ``GGUFInfo.tensors`` keeps (pairing and the estimate read them):
# one over every matrix of a 128-layer model has about 2,600.
MAX_ADAPTER_TENSORS = 1 << 14

# The architecture's numbers the gateway reads (``GGUFInfo.shape``: its keys less the
# architecture's prefix; the memory estimate computes with them): each must be a whole number
# from 0 to its bound, as llama.cpp too reads them (it refuses a float or a string there), or,
# where llama.cpp reads one per layer, an array of at most ``MAX_LAYERS`` items. The header's
# other numbers the gateway neither keeps nor reads.
_WIDTH = 1 << 20  # the widest models' embeddings: 16,384 to 18,432
_FF = 1 << 22  # the widest feed-forward: 53,248 (Llama 3.1 405B)
_HEADS = 1 << 16  # the most heads: 128; the longest head: 576 (DeepSeek's keys)
SHAPE_BOUNDS = {
    "block_count": MAX_LAYERS,
    "context_length": U32_MAX,  # llama.cpp's n_ctx_train is a uint32_t (the longest real one: 10 Mi)
    "embedding_length": _WIDTH,
    "feed_forward_length": _FF,
    "attention.head_count": _HEADS,
    "attention.head_count_kv": _HEADS,
    "attention.key_length": _HEADS,
    "attention.value_length": _HEADS,
    "attention.sliding_window": U32_MAX,
    "attention.sliding_window_pattern": MAX_LAYERS,
    "expert_count": MAX_EXPERTS,
    "expert_used_count": MAX_EXPERTS,
    "vocab_size": MAX_STRING_ARRAY,
    # a projector's (architecture "clip"): its encoders', and the pictures it takes (real ones
    # are at most a few thousand pixels a side)
    **{f"{enc}.{key}": bound for enc in ("vision", "audio") for key, bound in (
        ("block_count", MAX_LAYERS), ("embedding_length", _WIDTH), ("feed_forward_length", _FF),
        ("attention.head_count", _HEADS))},
    "vision.image_size": 1 << 16,
    "vision.patch_size": 1 << 16,
}


class ModelFileError(Exception):
    """The file is missing, is not GGUF, or its header cannot be read."""


RANK_POOLING = 4  # enum llama_pooling_type: NONE, MEAN, CLS, LAST, RANK


class ArrayLength(int):
    """An array's place in the metadata: its length (its items are not kept), and the type of
    its items (``gguf.GGUFValueType``)."""

    etype: int = -1


class StringLength(int):
    """A string's place in the metadata where it is not read: its length in bytes."""


# A tensor as its header gives it: name, dimensions in ggml's order (``ne[0]``, a row's length,
# first) and its data's bytes.
Tensor = tuple[str, tuple[int, ...], int]


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
    # the architecture's numbers the gateway reads (``SHAPE_BOUNDS``: block_count,
    # attention.head_count_kv, ...), without the prefix, each within its bound; a per-layer
    # array is left out
    shape: dict[str, int | float] = field(default_factory=dict)
    adapter_type: str | None = None  # an adapter's adapter.type: "lora" (llama.cpp loads no other by name)
    tensors: tuple[Tensor, ...] = ()  # an adapter's (at most MAX_ADAPTER_TENSORS); none kept for other files


def split_parts(path: Path) -> list[Path]:
    """All files of a split model (``-00001-of-00003.gguf``), or just ``[path]``; raises
    ``ModelFileError`` naming the first part missing (looked for in order, so a file named
    ``-00001-of-99999`` alone in a folder costs one look, not a name for each of the others)."""
    m = SPLIT_RE.match(path.name)
    if not m:
        return [path]
    count, parts = int(m.group("count")), [path]
    for i in range(2, count + 1):
        part = path.with_name(f"{m.group('stem')}-{i:05d}-of-{count:05d}.gguf")
        if not part.exists():
            raise ModelFileError(f"{path}: split model is missing {part.name} (one of {count} parts)")
        parts.append(part)
    return parts


def quantization_name(file_type: int | None) -> str | None:
    if file_type is None:
        return None
    import gguf

    try:
        name = gguf.LlamaFileType(file_type).name
    except ValueError:
        return f"type {file_type}"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


# The strings the gateway reads, each with its bound; every other string is skipped, and a chat
# template by any name (tokenizer.chat_template.tool_use, ...) is bounded as the template is.
_READ_STRINGS = {"general.architecture": MAX_NAME_BYTES, "general.name": MAX_NAME_BYTES,
                 "general.size_label": MAX_NAME_BYTES, "general.type": MAX_NAME_BYTES,
                 "adapter.type": MAX_NAME_BYTES, "tokenizer.chat_template": MAX_TEMPLATE_BYTES}
_TEMPLATES = "tokenizer.chat_template"


def _shown(name: bytes) -> str:
    """A tensor's name in a reason: its start, quoted (escapes a terminal would act on escaped)."""
    return repr(name[:64].decode("utf-8", "replace"))


def _said(key: str) -> str:
    """A key in a reason: as it is where it is printable, else quoted with its escapes."""
    return key if key.isprintable() else repr(key)


def _beyond(what: str, n: int, bound: int) -> str:
    return f"{what} is {n:,}: more than any real model has (at most {bound:,})"


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

    def skip(self, n: int, what: str) -> None:
        if n > len(self.buf) - self.pos:
            raise self.fail(f"truncated GGUF header ({what} runs past the end of the file)")
        self.pos += n

    def string(self, bound: int, what: str) -> bytes:
        """A string of at most ``bound`` bytes (``what`` it is, for the reason), copied out."""
        n = self.take("Q")
        if n > bound:
            raise self.fail(_beyond(f"{what}'s length in bytes", n, bound))
        self.skip(n, "a string")
        return self.buf[self.pos - n:self.pos]

    def skip_strings(self, count: int) -> None:
        """Past ``count`` strings, copying none (the vocabulary: one tight loop)."""
        buf, pos, end, length = self.buf, self.pos, len(self.buf), struct.Struct("<Q").unpack_from
        for _ in range(count):
            if pos + 8 > end:
                raise self.fail("truncated GGUF header (an array of strings runs past the end of the file)")
            pos += 8 + length(buf, pos)[0]
            if pos > end:
                raise self.fail("truncated GGUF header (a string runs past the end of the file)")
        self.pos = pos

    def value(self, key: str, vtype: int) -> Any:
        """``key``'s value: a number as it is, a string the gateway reads (``_READ_STRINGS``) as
        text, any other string as its ``StringLength``, an array as its ``ArrayLength``."""
        T = self.T
        if vtype in self.fixed:
            return self.take(self.fixed[vtype])
        if vtype == T.STRING:
            bound = _READ_STRINGS.get(key, MAX_TEMPLATE_BYTES if key.startswith(_TEMPLATES) else None)
            n = self.take("Q")
            if bound is not None and n > bound:
                raise self.fail(_beyond(f"{_said(key)}'s length in bytes", n, bound))
            self.skip(n, f"the string {_said(key)}")
            if key not in _READ_STRINGS:
                return StringLength(n)
            return self.buf[self.pos - n:self.pos].decode("utf-8", "replace")
        if vtype == T.ARRAY:
            etype, count = self.take("I"), self.take("Q")
            if etype in self.fixed:
                self.skip(struct.calcsize("<" + self.fixed[etype]) * count, f"the array {_said(key)}")
            elif etype == T.STRING:
                if count > MAX_STRING_ARRAY:
                    raise self.fail(_beyond(f"{_said(key)}'s count of strings", count, MAX_STRING_ARRAY))
                if count * 8 > len(self.buf) - self.pos:
                    raise self.fail(f"truncated or corrupt GGUF header: an array of {count} strings "
                                    "cannot fit in the rest of the file")
                self.skip_strings(count)
            else:  # an array of arrays: llama.cpp refuses it too
                raise self.fail(f"{_said(key)}: unsupported array element type {etype}")
            length = ArrayLength(count)
            length.etype = etype
            return length
        raise self.fail(f"{_said(key)}: unknown metadata value type {vtype}")


# an architecture's name is a word: llama.cpp names its own (LLM_ARCH_NAMES) in lowercase
# letters, digits, "-" and "_", and loads no other
_ARCHITECTURE = re.compile(r"[\w.-]+", re.ASCII)


def _walk(path: Path, tensors: list[Tensor] | None = None) -> tuple[dict[str, Any], int, Weights]:
    """Header metadata (numbers, the strings read, arrays and other strings as their lengths),
    checked against the file size and the bounds above; the tensors' count and data bytes, and
    each ``Tensor`` appended to ``tensors`` where given."""
    import gguf

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a pipe would block the open, a device never end
            raise ModelFileError(f"{path}: not a regular file")
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
            if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
                raise ModelFileError(f"{path}: absurd counts in the GGUF header ({n_tensors} tensors, {n_kv} keys; "
                                     f"at most {MAX_TENSORS} and {MAX_KV})")
            meta: dict[str, Any] = {}
            align_type = None
            for _ in range(n_kv):
                key = w.string(MAX_KEY_BYTES, "a key").decode("utf-8", "replace")
                vtype = w.take("I")
                meta[key] = w.value(key, vtype)
                if key == "general.alignment":
                    align_type = vtype
            # llama.cpp reads the alignment as a uint32 (asserting the type: a process abort) and
            # refuses one that is not a power of two
            align = meta.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)
            if align_type is not None and (align_type != w.T.UINT32 or not align or align & (align - 1)):
                raise ModelFileError(f"{path}: general.alignment must be a power of two, as a uint32")
            # Tensor infos: the data they describe must lie inside the file.
            end, weights = 0, Weights()
            for _ in range(n_tensors):
                name = w.string(MAX_TENSOR_NAME_BYTES, "a tensor's name")
                n_dims = w.take("I")
                if n_dims > MAX_DIMS:
                    raise ModelFileError(f"{path}: tensor {_shown(name)} has {n_dims} dimensions")
                dims = [w.take("Q") for _ in range(n_dims)]
                elements = math.prod(dims)
                if any(d > MAX_DIM for d in dims) or elements > MAX_DIM:
                    raise ModelFileError(f"{path}: tensor {_shown(name)} has absurd dimensions {dims}")
                ttype, offset = w.take("I"), w.take("Q")
                try:
                    block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ttype)]
                except (ValueError, KeyError):
                    raise ModelFileError(f"{path}: tensor {_shown(name)} has unknown type {ttype}") from None
                if (dims[0] if dims else 1) % block:  # llama.cpp refuses it too
                    raise ModelFileError(f"{path}: tensor {_shown(name)} has rows of {dims[0] if dims else 1} "
                                         f"elements, not a multiple of its type's block of {block}")
                layer = tensorplaces.layer(name)
                if layer is not None and layer >= MAX_LAYERS:
                    raise ModelFileError(f"{path}: tensor {_shown(name)} is in layer {layer:,}: more layers than "
                                         f"any real model has (at most {MAX_LAYERS:,})")
                nbytes = elements // block * type_size
                end = max(end, offset + nbytes)
                weights.add(name, layer, nbytes)
                if tensors is not None:
                    tensors.append((name.decode("utf-8", "replace"), tuple(dims), nbytes))
            data_start = -(-w.pos // align) * align
            if n_tensors and data_start + end > size:
                raise ModelFileError(f"{path}: truncated tensor data (the header needs {data_start + end} bytes, "
                                     f"the file has {size})")
    return meta, n_tensors, weights


def shape_problem(numbers: Mapping[str, Any], prefix: str = "") -> str | None:
    """Why an architecture's numbers (its keys less ``prefix``, as the header gives them, or
    ``GGUFInfo.shape``) cannot be a real model's, or None: a ``SHAPE_BOUNDS`` name that is not a
    whole number within its bound (nor a per-layer array of at most ``MAX_LAYERS`` items), or
    more experts used than there are (llama.cpp asserts that: a process abort). Pure, and as
    quick however many numbers there are."""
    for key, bound in SHAPE_BOUNDS.items():
        if key not in numbers:
            continue
        v, name = numbers[key], _said(prefix + key)
        if isinstance(v, ArrayLength):
            if v > MAX_LAYERS:
                return _beyond(f"{name}'s count of items (one per layer)", v, MAX_LAYERS)
        elif isinstance(v, (StringLength, str)):
            return f"{name} is text, not a count"
        elif type(v) is not int:
            return f"{name} is a {type(v).__name__} ({v!r}), not a count"
        elif v < 0:
            return f"{name} is negative ({v})"
        elif v > bound:
            return _beyond(name, v, bound)
    experts, used = numbers.get("expert_count"), numbers.get("expert_used_count")
    if type(experts) is int and type(used) is int and used > experts:
        return f"{_said(prefix)}expert_used_count ({used}) is more than the expert_count ({experts})"
    return None


ENCODER_ARCHS = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "t5encoder",
                           "modern-bert", "neo-bert", "eurobert"})


def read_info(path: str | Path) -> GGUFInfo:
    """Header metadata of ``path``; raises ``ModelFileError`` with a reason a person can act on."""
    import gguf

    path = Path(path)
    tensors: list[Tensor] = []
    meta, n_tensors, weights = _walk(path, tensors)
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelFileError(f"{path}: no general.architecture in the GGUF header")
    if not _ARCHITECTURE.fullmatch(arch):  # it becomes a model's name: no escapes, no spaces
        raise ModelFileError(f"{path}: general.architecture {arch!r} is no architecture's name")
    numbers = {k[len(arch) + 1:]: v for k, v in meta.items() if k.startswith(f"{arch}.")}
    if (problem := shape_problem(numbers, prefix=f"{arch}.")) is not None:
        raise ModelFileError(f"{path}: {problem}")
    parts = split_parts(path)
    for part in parts[1:]:  # a split model's other files hold the rest of its tensors
        weights.merge(_walk(part)[2])

    def num(key: str) -> int | None:  # a number, not a bool nor a length
        v = meta.get(key)
        return v if type(v) is int else None

    def text(key: str) -> str | None:
        v = meta.get(key)
        return v if isinstance(v, str) else None

    adapter = meta.get("general.type") == "adapter"
    if adapter and n_tensors > MAX_ADAPTER_TENSORS:
        why = _beyond("a LoRA adapter's count of tensors", n_tensors, MAX_ADAPTER_TENSORS)
        raise ModelFileError(f"{path}: {why}")
    tokens = meta.get("tokenizer.ggml.tokens")
    return GGUFInfo(
        path=path,
        file_size=sum(p.stat().st_size for p in parts),
        architecture=arch,
        name=text("general.name"),
        size_label=text("general.size_label"),
        quantization=quantization_name(num("general.file_type")),
        context_length=num(f"{arch}.context_length"),
        embedding_length=num(f"{arch}.embedding_length"),
        has_chat_template=text("tokenizer.chat_template") is not None,
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
        n_vocab=int(tokens) if isinstance(tokens, ArrayLength) and tokens.etype == gguf.GGUFValueType.STRING else 0,
        fim=all(type(meta.get(f"tokenizer.ggml.fim_{k}_token_id")) is int for k in ("pre", "suf", "mid")),
        shape={k: v for k, v in numbers.items() if k in SHAPE_BOUNDS and type(v) is int},
        adapter_type=text("adapter.type"),
        tensors=tuple(tensors) if adapter else (),
    )


def tensor_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's dimensions (ggml's order) by name, in every file of a split model: the header
    walked again (bounded as ``read_info``'s walk), for what pairs an adapter with its model."""
    tensors: list[Tensor] = []
    for part in split_parts(Path(path)):
        _walk(part, tensors)
    return {name: dims for name, dims, _ in tensors}
