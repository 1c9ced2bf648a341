"""Tiny GGUF models that llama.cpp really runs, built for tests and the demo.

A *scripted* model is a one-layer llama whose attention and feed-forward weights are
zero, so the residual stream at every position is just the embedding of the current
token. Embeddings are one-hot and the output matrix maps each token's slot to the logit
of its successor, so greedy *and* sampled decoding (the margin is ~50 logits) replay a
fixed script: the next token is a function of the current one.

Consequences a test writer must know:
- A script starts from a *trigger*: the last token of the prompt. The default trigger is
  ``"\\n"``, the last character of the built-in ChatML generation prompt
  (``<|im_start|>assistant\\n``), so every chat request, and every completion prompt that
  ends in a newline, starts the script.
- A token id can have only one successor, so each token appears once per model. Repeated
  ordinary text is handled for you: a piece already taken is spelled with fresh byte
  tokens (``<0xNN>`` variants that llama.cpp decodes to the same byte). A repeated
  *special* token cannot be, and raises ``ValueError``.
- Any token without a script successor is followed by the end-of-generation token.

``Special("<think>")`` makes a control token (rendered only when the engine asks
llama.cpp for special tokens, as real GGUFs mark ``<|channel|>`` and friends); ``bytes``
steps become one byte token per byte, to split UTF-8 characters across tokens.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .chat_template import CHATML as CHATML_TEMPLATE

# SentencePiece token types, as llama.cpp reads them from tokenizer.ggml.token_type.
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6
_SPACE = "\u2581"  # SentencePiece's visible space
_MARGIN = 50.0  # logit gap between the scripted successor and every other token


@dataclass(frozen=True)
class Special:
    """A control token in a script, e.g. ``Special("<think>")``."""

    text: str


Step = str | bytes | Special


@dataclass
class Script:
    """Steps replayed after ``trigger``; ``loop`` cycles forever instead of ending."""

    steps: Sequence[Step]
    trigger: str = "\n"
    loop: bool = False


@dataclass
class ScriptedModel:
    """What was written: the file, and per trigger the exact pieces each token renders."""

    path: Path
    pieces: dict[str, list[bytes]] = field(default_factory=dict)

    def text(self, trigger: str = "\n") -> str:
        return b"".join(self.pieces[trigger]).decode("utf-8")

    def n_tokens(self, trigger: str = "\n") -> int:
        return len(self.pieces[trigger])


class _Vocab:
    def __init__(self) -> None:
        self.texts: list[str] = []
        self.types: list[int] = []
        self.index: dict[str, int] = {}
        self.successor: dict[int, int] = {}
        self.used: set[int] = set()  # tokens already placed in a script (or triggers)
        self._variant = 0

    def add(self, text: str, ttype: int) -> int:
        if text in self.index:
            raise ValueError(f"token {text!r} already in the vocabulary")
        self.index[text] = len(self.texts)
        self.texts.append(text)
        self.types.append(ttype)
        return self.index[text]

    def byte_variant(self, byte: int) -> int:
        # llama.cpp decodes a byte token from text[3:5] alone, so "<0x41>~7" is byte 0x41.
        self._variant += 1
        return self.add(f"<0x{byte:02X}>~{self._variant}", _BYTE)

    def step_tokens(self, step: Step) -> list[tuple[int, bytes]]:
        if isinstance(step, Special):
            tid = self.index.get(step.text)
            if tid is None:
                tid = self.add(step.text, _CONTROL)
            elif tid in self.used or self.types[tid] != _CONTROL:
                raise ValueError(f"special token {step.text!r} can appear only once per scripted model")
            return [(tid, step.text.encode())]
        if isinstance(step, bytes):
            return [(self.byte_variant(b), bytes([b])) for b in step]
        if not step:
            raise ValueError("empty script step")
        spelled = step.replace(" ", _SPACE)
        tid = self.index.get(spelled)
        # Single characters stay byte tokens so they never hijack how prompts tokenize.
        if len(step) > 1 and (tid is None or (self.types[tid] == _NORMAL and tid not in self.used)):
            if tid is None:
                tid = self.add(spelled, _NORMAL)
            return [(tid, step.encode())]
        return [(self.byte_variant(b), bytes([b])) for b in step.encode()]


def write_scripted_model(
    path: str | os.PathLike,
    scripts: Script | Sequence[Step] | Iterable[Script],
    *,
    chat_template: str = CHATML_TEMPLATE,
    name: str = "scripted",
    context_length: int = 4096,
    extra_special: Sequence[str] = (),
    split_max_tensors: int = 0,
    fim_ids: bool = False,
) -> ScriptedModel:
    """Write a scripted GGUF to ``path`` and return what each trigger will produce.

    ``split_max_tensors`` > 0 writes a split model (``NAME-00001-of-0000N.gguf`` ...).
    ``fim_ids`` names the fill-in-the-middle tokens in the header
    (``tokenizer.ggml.fim_{pre,suf,mid}_token_id``: ``<|fim_prefix|>``, ``<|fim_suffix|>``,
    ``<|fim_middle|>``, which ``extra_special`` must hold), as converted FIM models do; without
    it llama.cpp finds such tokens by their text."""
    import gguf

    if isinstance(scripts, Script):
        scripts = [scripts]
    elif isinstance(scripts, (list, tuple)) and (not scripts or not isinstance(scripts[0], Script)):
        scripts = [Script(list(scripts))]
    scripts = list(scripts)

    vocab = _Vocab()
    vocab.add("<unk>", _UNKNOWN)
    bos = vocab.add("<s>", _CONTROL)
    vocab.add("</s>", _CONTROL)
    vocab.add("<|im_start|>", _CONTROL)
    eog = vocab.add("<|im_end|>", _CONTROL)
    for text in extra_special:
        vocab.add(text, _CONTROL)
    for b in range(256):
        vocab.add(f"<0x{b:02X}>", _BYTE)

    result = ScriptedModel(Path(path))
    for script in scripts:
        trig_text = script.trigger.replace(" ", _SPACE)
        if trig_text in vocab.index and vocab.types[vocab.index[trig_text]] != _BYTE:
            prev = vocab.index[trig_text]
        elif len(script.trigger.encode()) == 1:
            prev = vocab.index[f"<0x{script.trigger.encode()[0]:02X}>"]
        else:
            raise ValueError(f"trigger {script.trigger!r} must be one character or an existing token")
        if prev in vocab.used:
            raise ValueError(f"trigger {script.trigger!r} is already used by a script")
        vocab.used.add(prev)
        first = None
        pieces: list[bytes] = []
        for step in script.steps:
            for tid, piece in vocab.step_tokens(step):
                vocab.used.add(tid)
                vocab.successor[prev] = tid
                first = tid if first is None else first
                prev = tid
                pieces.append(piece)
        vocab.successor[prev] = first if (script.loop and first is not None) else eog
        result.pieces[script.trigger] = pieces

    # One-hot slots: slot 0 is shared by every token without a successor (-> end of turn).
    slots = {tid: i + 1 for i, tid in enumerate(sorted(vocab.successor))}
    n_vocab = len(vocab.texts)
    n_embd = max(64, -(-(len(slots) + 1) // 64) * 64)
    n_head, n_ff = n_embd // 64, 32
    embd = np.zeros((n_vocab, n_embd), dtype=np.float32)
    for tid in range(n_vocab):
        embd[tid, slots.get(tid, 0)] = 1.0
    out = np.zeros((n_vocab, n_embd), dtype=np.float32)
    scale = _MARGIN / np.sqrt(n_embd)  # RMSNorm turns a one-hot into sqrt(n_embd) * one-hot
    out[eog, 0] = scale
    for tid, nxt in vocab.successor.items():
        out[nxt, slots[tid]] = scale

    w = gguf.GGUFWriter(str(path), "llama", split_max_tensors=split_max_tensors)
    w.add_name(name)
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(1)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_rope_dimension_count(64)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    _spm_tokenizer(w, vocab.texts, vocab.types, bos, eog)
    w.add_chat_template(chat_template)
    if fim_ids:
        for key, text in (("pre", "<|fim_prefix|>"), ("suf", "<|fim_suffix|>"), ("mid", "<|fim_middle|>")):
            w.add_uint32(f"tokenizer.ggml.fim_{key}_token_id", vocab.index[text])
    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", out.astype(np.float16))
    _identity_layer(w, n_embd, n_ff, np.float16)
    _finish(w)
    return result


def _spm_tokenizer(w, texts: list[str], types: list[int], bos: int, eos: int) -> None:
    """A SentencePiece-style vocabulary with no merges to speak of: text reads as its tokens'
    exact spellings, or byte by byte."""
    w.add_tokenizer_model("llama")
    w.add_token_list(texts)
    w.add_token_scores([0.0] * len(texts))
    w.add_token_types(types)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)


def _identity_layer(w, n_embd: int, n_ff: int, dtype, qk_norm: bool = False) -> None:
    """One layer that adds nothing to the residual stream (zero projections, unit norms): a
    token's state stays its own embedding, so a scripted model's behaviour is set by its
    embeddings and output rows alone."""
    zeros = lambda *shape: np.zeros(shape, dtype=dtype)  # noqa: E731
    w.add_tensor("blk.0.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
    for t in ("q", "k", "v", "output"):
        w.add_tensor(f"blk.0.attn_{t}.weight", zeros(n_embd, n_embd))
    if qk_norm:
        w.add_tensor("blk.0.attn_q_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor("blk.0.attn_k_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("blk.0.ffn_gate.weight", zeros(n_ff, n_embd))
    w.add_tensor("blk.0.ffn_up.weight", zeros(n_ff, n_embd))
    w.add_tensor("blk.0.ffn_down.weight", zeros(n_embd, n_ff))


def reranker(path: str | os.PathLike, scores: dict[str, float]) -> Path:
    """A Qwen3-style reranker (llama.cpp's rank pooling: the last token's state through a
    two-label ``yes`` / ``no`` classifier, then softmax) whose scores are known in advance: a
    document ending in one of ``scores``' characters (ASCII) scores that number (a probability
    in (0, 1)), any other document 0.5. Its vocabulary is bytes alone, so every text is read a
    byte a token, and its one layer adds nothing to a token's own embedding: the score depends
    on the document's last byte alone."""
    import gguf

    texts, types = ["<unk>", "<s>", "</s>"], [_UNKNOWN, _CONTROL, _CONTROL]
    texts += [f"<0x{b:02X}>" for b in range(256)]
    types += [_BYTE] * 256
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
    _spm_tokenizer(w, texts, types, 1, 2)
    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("cls.output.weight", cls)
    _identity_layer(w, n_embd, n_ff, np.float32, qk_norm=True)
    _finish(w)
    return Path(path)


def _finish(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


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
    _finish(w)
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
) -> Path:
    """A random-weight F16 llama using a real vocabulary (default: ~81M parameters with qwen2's 152k)."""
    import gguf

    reader = gguf.GGUFReader(str(vocab_path))
    w = gguf.GGUFWriter(str(path), "llama")
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
    if "tokenizer.chat_template" not in reader.fields:
        w.add_chat_template(CHATML_TEMPLATE)
    rng = np.random.default_rng(seed)
    rand = lambda *shape: (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)).astype(np.float16)  # noqa: E731
    w.add_name(f"random-{Path(vocab_path).stem}")
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tensor("token_embd.weight", rand(n_vocab, n_embd))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", rand(n_vocab, n_embd))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for t in ("q", "k", "v", "output"):
            w.add_tensor(f"blk.{i}.attn_{t}.weight", rand(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", rand(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", rand(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", rand(n_embd, n_ff))
    _finish(w)
    return Path(path)


def data_dir() -> Path:
    """The user's data directory for gguf-gateway ($XDG_DATA_HOME or ~/.local/share)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "gguf-gateway"

