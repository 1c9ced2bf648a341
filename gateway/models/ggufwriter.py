"""Writing tiny GGUF models that llama.cpp really runs: the scripted model (its vocabulary,
weights and header) and the pieces other recipes share (``spm_tokenizer``, ``identity_layer``,
``finish``). ``testmodels.py`` holds the ready-made models built from them.

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

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..text.chat_template import CHATML as CHATML_TEMPLATE

# SentencePiece token types, as llama.cpp reads them from tokenizer.ggml.token_type.
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6
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
        return self.add(f"<0x{byte:02X}>~{self._variant}", BYTE)

    def step_tokens(self, step: Step) -> list[tuple[int, bytes]]:
        if isinstance(step, Special):
            tid = self.index.get(step.text)
            if tid is None:
                tid = self.add(step.text, CONTROL)
            elif tid in self.used or self.types[tid] != CONTROL:
                raise ValueError(f"special token {step.text!r} can appear only once per scripted model")
            return [(tid, step.text.encode())]
        if isinstance(step, bytes):
            return [(self.byte_variant(b), bytes([b])) for b in step]
        if not step:
            raise ValueError("empty script step")
        spelled = step.replace(" ", _SPACE)
        tid = self.index.get(spelled)
        # Single characters stay byte tokens so they never hijack how prompts tokenize.
        if len(step) > 1 and (tid is None or (self.types[tid] == NORMAL and tid not in self.used)):
            if tid is None:
                tid = self.add(spelled, NORMAL)
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
    vocab.add("<unk>", UNKNOWN)
    bos = vocab.add("<s>", CONTROL)
    vocab.add("</s>", CONTROL)
    vocab.add("<|im_start|>", CONTROL)
    eog = vocab.add("<|im_end|>", CONTROL)
    for text in extra_special:
        vocab.add(text, CONTROL)
    for b in range(256):
        vocab.add(f"<0x{b:02X}>", BYTE)

    result = ScriptedModel(Path(path))
    for script in scripts:
        trig_text = script.trigger.replace(" ", _SPACE)
        if trig_text in vocab.index and vocab.types[vocab.index[trig_text]] != BYTE:
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
    spm_tokenizer(w, vocab.texts, vocab.types, bos, eog)
    w.add_chat_template(chat_template)
    if fim_ids:
        for key, text in (("pre", "<|fim_prefix|>"), ("suf", "<|fim_suffix|>"), ("mid", "<|fim_middle|>")):
            w.add_uint32(f"tokenizer.ggml.fim_{key}_token_id", vocab.index[text])
    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", out.astype(np.float16))
    identity_layer(w, n_embd, n_ff, np.float16)
    finish(w)
    return result


def spm_tokenizer(w, texts: list[str], types: list[int], bos: int, eos: int) -> None:
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


def identity_layer(w, n_embd: int, n_ff: int, dtype, qk_norm: bool = False) -> None:
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


def finish(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
