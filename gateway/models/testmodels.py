"""Tiny GGUF models that llama.cpp really runs, ready-made for tests, the demo and the
benchmarks: scripted chat models (``plain``, ``thinking``, ``utf8_split``, ``endless``,
``demo``), a reranker whose scores are known in advance, LoRA adapters (one that ends a scripted
model's answers; random ones for any model: ``random_lora``), random-weight models over a real
vocabulary (``write_random_model``: a llama, a Qwen3, a Gemma 3 or a BERT encoder, in any size,
with a pooling of its own for the embedding shapes people serve), and llama.cpp's own source
files (vocabularies, chat templates).

The scripted models are ``ggufwriter.write_scripted_model``'s; its docstring says what a test
writer must know of them (triggers, one successor per token). Its names (``Script``,
``Special``, ``Step``, ``ScriptedModel``, ``write_scripted_model``) are importable from here too.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..text.chat_template import CHATML as CHATML_TEMPLATE
from .ggufwriter import (  # noqa: F401 (Script, ScriptedModel, Special, Step, write_scripted_model: re-exported)
    BYTE,
    CONTROL,
    UNKNOWN,
    Script,
    ScriptedModel,
    Special,
    Step,
    finish,
    identity_layer,
    spm_tokenizer,
    write_scripted_model,
)


def reranker(path: str | os.PathLike, scores: dict[str, float]) -> Path:
    """A Qwen3-style reranker (llama.cpp's rank pooling: the last token's state through a
    two-label ``yes`` / ``no`` classifier, then softmax) whose scores are known in advance: a
    document ending in one of ``scores``' characters (ASCII) scores that number (a probability
    in (0, 1)), any other document 0.5. Its vocabulary is bytes alone, so every text is read a
    byte a token, and its one layer adds nothing to a token's own embedding: the score depends
    on the document's last byte alone."""
    import gguf

    texts, types = ["<unk>", "<s>", "</s>"], [UNKNOWN, CONTROL, CONTROL]
    texts += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    slot: dict[int, float] = {}  # token -> the score its slot stands for
    for char, score in scores.items():
        if len(char) != 1 or not char.isascii():
            raise ValueError(f"scores are keyed by one ASCII character, got {char!r}")
        if not 0 < score < 1:
            raise ValueError(f"a score is a probability in (0, 1), got {score} for {char!r}")
        slot[3 + ord(char)] = score
    n_embd, n_ff = 64, 32
    if len(slot) >= n_embd:
        raise ValueError(f"at most {n_embd - 1} characters")
    embd = np.zeros((len(texts), n_embd), dtype=np.float32)
    cls = np.zeros((2, n_embd), dtype=np.float32)  # rows: yes, no
    for i, tid in enumerate(sorted(slot), start=1):
        embd[tid, i] = 1.0
        # RMSNorm makes the one-hot sqrt(n_embd) high; softmax([x, 0])[0] = sigmoid(x)
        cls[0, i] = math.log(slot[tid] / (1 - slot[tid])) / math.sqrt(n_embd)
    for tid in range(len(texts)):
        if tid not in slot:
            embd[tid, 0] = 1.0
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_name("scripted reranker")
    w.add_context_length(512)
    w.add_embedding_length(n_embd)
    w.add_block_count(1)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_rope_dimension_count(n_embd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_pooling_type(gguf.PoolingType.RANK)
    w.add_classifier_output_labels(["yes", "no"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    spm_tokenizer(w, texts, types, 1, 2)
    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("cls.output.weight", cls)
    identity_layer(w, n_embd, n_ff, np.float32, qk_norm=True)
    finish(w)
    return Path(path)


# --- ready-made scripts ---------------------------------------------------------------

DEMO_ANSWER = [
    "Hello", "!", " This", " is", " the", " gguf", "-", "gateway", " demo", " model", ":",
    " a", " tiny", " scripted", " GGUF", " that", " always", " answers", " like", " this",
    ".", " Add", " your", " models", " to", " models", ".yaml", " or", " ~/", "models", ".",
]


def lora_adapter(model: str | os.PathLike, path: str | os.PathLike, favour: str = "<|im_end|>",
                 strength: float = 100.0) -> Path:
    """A LoRA adapter (llama.cpp's GGUF form: ``general.type: adapter``, ``lora_a``/``lora_b``
    pairs) for a scripted ``model`` that raises the token ``favour`` above every other at each
    step: with it at scale 1 the model ends its answer at once; at scale 0 it answers as without."""
    import gguf

    reader = gguf.GGUFReader(str(model))
    tokens = [bytes(reader.fields["tokenizer.ggml.tokens"].parts[i]).decode()
              for i in reader.fields["tokenizer.ggml.tokens"].data]
    n_embd = int(reader.fields["llama.embedding_length"].parts[-1][0])
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", 1.0)
    a = np.ones((1, n_embd), dtype=np.float32)  # rank 1: the sum of the normed hidden state (one slot's value)
    b = np.zeros((len(tokens), 1), dtype=np.float32)
    b[tokens.index(favour), 0] = strength
    w.add_tensor("output.weight.lora_a", a)
    w.add_tensor("output.weight.lora_b", b)
    finish(w)
    return Path(path)


LORA_TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def random_lora(model: str | os.PathLike, path: str | os.PathLike, *, seed: int = 0, rank: int = 4,
                std: float = 0.02, alpha: float | None = None, targets: Sequence[str] = LORA_TARGETS,
                zero: bool = False) -> Path:
    """A LoRA adapter of random weights for any GGUF ``model`` (llama.cpp's GGUF form:
    ``general.type: adapter``, ``adapter.type: lora``, ``adapter.lora.alpha``, the base's
    architecture): for each ``blk.N.<target>.weight`` the base has, a ``lora_a`` / ``lora_b`` pair
    of rank ``rank`` drawn from a normal of deviation ``std`` seeded by ``seed`` (F32).

    llama.cpp's shapes (ggml's order, numpy's reversed): a base weight of ne [n_in, n_out] gets A
    of ne [n_in, rank] and B of ne [rank, n_out]; its output gains scale x alpha / rank x B(A x).
    ``alpha`` defaults to ``rank``, so an adapter's scale is the factor itself. With ``zero``, B is
    zero (A stays random): the adapter loads and runs but changes nothing, so the model's logits
    under it are exactly the base's."""
    import re

    import gguf

    from . import ggufmeta  # the header alone (gguf's reader parses a 262k-token vocabulary for seconds)

    base = Path(model)
    arch = ggufmeta.read_info(base).architecture  # (read_info refuses a file without one)
    assert arch is not None
    found: list[tuple[int, int, str, tuple[int, int]]] = []  # (block, target's place, name, ne)
    for name, dims in ggufmeta.tensor_shapes(base).items():
        m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", name)
        if m and m.group(2) in targets and len(dims) == 2:
            found.append((int(m.group(1)), list(targets).index(m.group(2)), name, (int(dims[0]), int(dims[1]))))
    if not found:
        raise ValueError(f"{model}: no blk.N.{{{','.join(targets)}}}.weight to adapt")
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(rank if alpha is None else alpha))
    for _, _, name, (n_in, n_out) in sorted(found):
        a = (rng.standard_normal((rank, n_in), dtype=np.float32) * np.float32(std)).astype(np.float32)
        b = (rng.standard_normal((n_out, rank), dtype=np.float32) * np.float32(std)).astype(np.float32)
        if zero:
            b = np.zeros_like(b)
        w.add_tensor(f"{name}.lora_a", a)  # ne [n_in, rank]
        w.add_tensor(f"{name}.lora_b", b)  # ne [rank, n_out]
    finish(w)
    return Path(path)


def plain(path: str | os.PathLike, answer: Sequence[Step] = ("Hello", ",", " world", "!"), **kw) -> ScriptedModel:
    """A plain answer."""
    return write_scripted_model(path, Script(list(answer)), **kw)


def thinking(path: str | os.PathLike, reasoning: str = "Let me think.", answer: str = "The answer is 4.",
             *, split_markers: bool = False, **kw) -> ScriptedModel:
    """``<think>reasoning</think>answer``; markers as special tokens, or split over ordinary ones."""
    open_: list[Step]
    close: list[Step]
    if split_markers:
        open_, close = ["<th", "ink", ">"], ["</", "think", ">"]
    else:
        open_, close = [Special("<think>")], [Special("</think>")]
    steps = [*open_, *_words(reasoning), *close, *_words(answer)]
    return write_scripted_model(path, Script(steps), **kw)


def utf8_split(path: str | os.PathLike, text: str = "Price: 5€, naïve 日本 🙂", **kw) -> ScriptedModel:
    """Every non-ASCII character split over its byte tokens."""
    steps: list[Step] = []
    for word in _words(text):
        steps.append(word if word.isascii() else word.encode())
    return write_scripted_model(path, Script(steps), **kw)


def endless(path: str | os.PathLike, cycle: Sequence[Step] = (" tick", " tock"), **kw) -> ScriptedModel:
    """Never ends by itself: for max_tokens, cancellation and load tests."""
    return write_scripted_model(path, Script(list(cycle), loop=True), **kw)


def demo(path: str | os.PathLike) -> ScriptedModel:
    return write_scripted_model(path, Script(DEMO_ANSWER), name="gguf-gateway demo")


def _words(text: str) -> list[str]:
    """Split text into word pieces, each with its leading space, as tokenizers do."""
    out: list[str] = []
    for i, w in enumerate(text.split(" ")):
        piece = w if i == 0 else " " + w
        if piece:
            out.append(piece)
    return out


# --- random-weight benchmark model ------------------------------------------------------

def find_vocab(name: str = "qwen2", cache_dir: str | os.PathLike | None = None) -> Path:
    """Path to llama.cpp's vocab-only ``ggml-vocab-NAME.gguf`` (see ``llama_cpp_source_file``)."""
    return llama_cpp_source_file(f"models/ggml-vocab-{name}.gguf",
                                 Path(cache_dir) if cache_dir else data_dir() / "vocab")


def llama_cpp_source_file(member: str, cache: Path) -> Path:
    """A file of the llama.cpp that llama-cpp-python vendors, by its path under ``llama.cpp/``
    (``models/templates/google-gemma-2-2b-it.jinja``), copied into ``cache`` once.

    These files (real tokenizers as vocab-only GGUFs, real chat templates) ship in
    llama-cpp-python's source distribution, not its wheels: the matching sdist is fetched
    once with pip and kept beside ``cache`` (tests read dozens of files from it), and each
    file is extracted from it when first asked for.
    """
    target = cache / Path(member).name
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    sdist = _llama_cpp_sdist(cache.parent)
    with tarfile.open(sdist, mode="r|gz") as tar:  # streamed: stop at the one member
        found = next((m for m in tar if m.name.endswith(f"/vendor/llama.cpp/{member}")), None)
        if found is None:
            raise FileNotFoundError(f"no {member} in {sdist.name}")
        src = tar.extractfile(found)
        assert src is not None
        partial = target.with_suffix(".part")
        with open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst)
        partial.replace(target)
    return target


def _llama_cpp_sdist(where: Path) -> Path:
    """The installed llama-cpp-python's sdist in ``where``, downloaded by pip the first time
    (pip's own cache keeps it across checkouts)."""
    from importlib import metadata

    version = metadata.version("llama-cpp-python")
    kept = where / f"llama_cpp_python-{version}.tar.gz"
    if kept.exists():
        return kept
    where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "-q", "-d", tmp, f"llama-cpp-python=={version}"],
            check=True,
        )
        partial = kept.with_suffix(".part")
        shutil.copyfile(next(Path(tmp).glob("llama_cpp_python-*.tar.gz")), partial)
        partial.replace(kept)
    return kept


POOLINGS = {"mean": 1, "cls": 2, "last": 3}  # gguf's PoolingType (llama.cpp's enum llama_pooling_type)


def write_random_model(
    path: str | os.PathLike,
    vocab_path: str | os.PathLike,
    *,
    n_embd: int = 256,
    n_layer: int = 3,
    n_head: int = 4,
    n_ff: int = 1024,
    context_length: int = 4096,
    seed: int = 0,
    sliding_window: int = 0,
    reranker: bool = False,
    arch: str | None = None,
    n_head_kv: int | None = None,
    head_dim: int | None = None,
    pooling: str | None = None,
    output_head: bool = True,
) -> Path:
    """A random-weight F16 llama using a real vocabulary (default: ~81M parameters with qwen2's 152k).
    With ``reranker``, a Qwen3-style reranker instead (rank pooling through a two-label classifier),
    for measuring reranking at a real model's size.
    With ``sliding_window``, a Gemma 3 instead whose layers alternate: a sliding-window one
    attending to that many positions, then a full-attention one whose keys and values are zero
    (it attends to nothing), so that what a one-window-layer model caches of a token depends on
    the token and its position alone (cells moved or missing show in its answers at once).

    ``arch`` names the family outright: ``llama`` (the default), ``qwen3`` (with its norms of q
    and k; what ``reranker`` implies), ``gemma3`` (what ``sliding_window`` implies) or ``bert``:
    an encoder as llama.cpp's ``bert`` reads it (learned positions for ``context_length`` tokens,
    token types, layer norms with biases, a GELU feed-forward, attention both ways), over a
    WordPiece vocabulary (``find_vocab("bert-bge")``). ``n_head_kv`` (grouped-query attention)
    and ``head_dim`` (heads wider than ``n_embd / n_head``, as Qwen3's) shape a decoder's
    attention. ``pooling`` (``mean``, ``cls`` or ``last``) is the model's own, the one an
    embedding context uses unless told otherwise. Without ``output_head`` the file has no
    ``output.weight``: a decoder's head is then its token embeddings (llama.cpp ties them); a
    BERT never has one. The shapes people embed with: bge-small is ``arch="bert", n_embd=384,
    n_layer=12, n_head=12, n_ff=1536, context_length=512, pooling="mean"``; Qwen3-Embedding-0.6B
    is ``arch="qwen3", n_embd=1024, n_layer=28, n_head=16, n_head_kv=8, head_dim=128, n_ff=3072,
    pooling="last", output_head=False``."""
    import gguf

    arch = arch or ("gemma3" if sliding_window else "qwen3" if reranker else "llama")
    if arch not in ("llama", "qwen3", "gemma3", "bert"):
        raise ValueError(f"no random {arch!r}: llama, qwen3, gemma3 or bert")
    if pooling is not None and pooling not in POOLINGS:
        raise ValueError(f"pooling is one of {', '.join(POOLINGS)}, got {pooling!r}")
    if pooling and reranker:
        raise ValueError("a reranker's pooling is rank pooling")
    reader = gguf.GGUFReader(str(vocab_path))
    w = gguf.GGUFWriter(str(path), arch)
    n_vocab = 0
    for key, fld in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = fld.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = fld.types[-1]
            vals = fld.contents()
            w.add_key_value(key, vals, vtype, sub_type=sub)
            if key == "tokenizer.ggml.tokens":
                n_vocab = len(vals)
        else:
            w.add_key_value(key, fld.contents(), vtype)
    if "tokenizer.chat_template" not in reader.fields and arch != "bert":  # (an encoder does not chat)
        w.add_chat_template(CHATML_TEMPLATE)
    rng = np.random.default_rng(seed)
    rand = lambda *shape: (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)).astype(np.float16)  # noqa: E731
    w.add_name(f"random-{Path(vocab_path).stem}")
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    if arch == "bert":
        types = reader.fields.get("tokenizer.ggml.token_type_count")
        if types is None:
            w.add_token_type_count(2)  # llama.cpp refuses a BERT without it
        if pooling:
            w.add_pooling_type(gguf.PoolingType(POOLINGS[pooling]))
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        _bert_body(w, rand, n_vocab, int(types.contents()) if types else 2, n_embd, n_layer, n_ff, context_length)
        finish(w)
        return Path(path)
    n_head_kv = n_head_kv or n_head
    head_dim = head_dim or n_embd // n_head
    w.add_head_count_kv(n_head_kv)
    if head_dim != n_embd // n_head:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    if sliding_window:
        w.add_sliding_window(sliding_window)
        w.add_uint32("gemma3.attention.sliding_window_pattern", 2)  # llama.cpp: layer i slides where i % 2 < 1
    if reranker:
        w.add_pooling_type(gguf.PoolingType.RANK)
        w.add_classifier_output_labels(["yes", "no"])
    elif pooling:
        w.add_pooling_type(gguf.PoolingType(POOLINGS[pooling]))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tensor("token_embd.weight", rand(n_vocab, n_embd))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    if reranker:
        w.add_tensor("cls.output.weight", rand(2, n_embd))
    elif output_head:
        w.add_tensor("output.weight", rand(n_vocab, n_embd))
    q, kv = n_head * head_dim, n_head_kv * head_dim  # (numpy's shapes: [out, in])
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for t, shape in (("q", (q, n_embd)), ("k", (kv, n_embd)), ("v", (kv, n_embd)), ("output", (n_embd, q))):
            blank = sliding_window and i % 2 and t in ("k", "v")
            weight = np.zeros(shape, np.float16) if blank else rand(*shape)
            w.add_tensor(f"blk.{i}.attn_{t}.weight", weight)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", rand(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", rand(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", rand(n_embd, n_ff))
        if arch == "qwen3":  # Qwen3's norms of q and k
            for name in ("attn_q_norm", "attn_k_norm"):
                w.add_tensor(f"blk.{i}.{name}.weight", np.ones(head_dim, dtype=np.float32))
        if sliding_window:  # Gemma 3's norms after attention and the feed-forward, and of q and k
            for name, n in (("post_attention_norm", n_embd), ("post_ffw_norm", n_embd),
                            ("attn_q_norm", head_dim), ("attn_k_norm", head_dim)):
                w.add_tensor(f"blk.{i}.{name}.weight", np.ones(n, dtype=np.float32))
    finish(w)
    return Path(path)


def _bert_body(w, rand, n_vocab: int, n_types: int, n_embd: int, n_layer: int, n_ff: int,
               context_length: int) -> None:
    """A BERT's header keys past the common ones and its tensors, as llama.cpp's ``bert``
    (src/models/bert.cpp) loads them: token, token-type and position embeddings and their
    layer norm, then per layer q, k, v and the attention's output with biases, a layer norm,
    a GELU up and down with biases, a layer norm. Norms are ones and biases zeros; ``n_types``
    (the vocabulary's ``tokenizer.ggml.token_type_count``) sizes the token types."""
    ones = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731
    zeros = lambda n: np.zeros(n, dtype=np.float32)  # noqa: E731
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_tensor("token_embd.weight", rand(n_vocab, n_embd))
    # F32, as llama.cpp's convert_hf_to_gguf.py keeps them (ggml adds no F16 row to an F32 one)
    w.add_tensor("token_types.weight", rand(n_types, n_embd).astype(np.float32))
    w.add_tensor("position_embd.weight", rand(context_length, n_embd).astype(np.float32))
    w.add_tensor("token_embd_norm.weight", ones(n_embd))
    w.add_tensor("token_embd_norm.bias", zeros(n_embd))
    for i in range(n_layer):
        for t in ("q", "k", "v", "output"):
            w.add_tensor(f"blk.{i}.attn_{t}.weight", rand(n_embd, n_embd))
            w.add_tensor(f"blk.{i}.attn_{t}.bias", zeros(n_embd))
        w.add_tensor(f"blk.{i}.attn_output_norm.weight", ones(n_embd))
        w.add_tensor(f"blk.{i}.attn_output_norm.bias", zeros(n_embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", rand(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up.bias", zeros(n_ff))
        w.add_tensor(f"blk.{i}.ffn_down.weight", rand(n_embd, n_ff))
        w.add_tensor(f"blk.{i}.ffn_down.bias", zeros(n_embd))
        w.add_tensor(f"blk.{i}.layer_output_norm.weight", ones(n_embd))
        w.add_tensor(f"blk.{i}.layer_output_norm.bias", zeros(n_embd))


def data_dir() -> Path:
    """The user's data directory for gguf-gateway ($XDG_DATA_HOME or ~/.local/share)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "gguf-gateway"

