"""Fill-in-the-middle prompts: the text before and after the cursor, and other files as
context, laid out in the model's FIM tokens exactly as llama-server lays them out
(``format_prompt_infill`` in llama.cpp's tools/server/server-common.cpp; older trees:
``format_infill`` in tools/server/utils.hpp).

Pure: the vocabulary comes in as a ``FimTokens`` and a tokenizer function, so the layout is
tested without a model (tests/test_infill.py). ``Prompts`` (prompts.py) calls it in the worker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..protocol.bounds import extra_room

# llama-server's separator between extra chunks for a vocabulary without fim_sep, which it
# writes in binary "to avoid confusing the AI": "\n\n--- snippet ---\n\n"
SNIPPET = "\n\n--- snippet ---\n\n"
REPO = "myproject\n"  # llama-server's project name after fim_rep ("TODO: make project name an input")
CURRENT_FILE = "filename\n"  # and its name of the file being edited ("TODO: current filename")


@dataclass(frozen=True, slots=True)
class FimTokens:
    """A vocabulary's fill-in-the-middle tokens (None: it has none). llama.cpp reads them from
    ``tokenizer.ggml.fim_*_token_id`` or, failing that, finds them by their known texts
    (``<|fim_prefix|>``, ``<fim_prefix>``, ``<PRE>``, ``▁<PRE>``, ...: llama-vocab.cpp's load),
    and answers both through ``llama_vocab_fim_pre`` etc."""

    pre: int | None
    suf: int | None
    mid: int | None
    rep: int | None = None
    sep: int | None = None
    pad: int | None = None

    def missing(self) -> list[str]:
        """The tokens infill needs that this vocabulary lacks (llama-server's /infill check)."""
        return [name for name, tok in (("prefix", self.pre), ("suffix", self.suf), ("middle", self.mid))
                if tok is None]


@dataclass(frozen=True, slots=True)
class Extra:
    filename: str
    text: str


def layout(fim: FimTokens, tokenize: Callable[[str], list[int]], prefix: list[int], suffix: list[int],
           prompt: list[int], extra: list[Extra], *, n_batch: int, n_predict: int, n_ctx: int,
           bos: int | None, spm: bool = False) -> list[int]:
    """The prompt's tokens, llama-server's repo-level pattern (https://arxiv.org/pdf/2409.12186):

        [FIM_REP]myproject\\n [FIM_SEP]filename0\\n extra chunk 0 ... [FIM_SEP]filename\\n
        [BOS][FIM_PRE]prefix prompt[FIM_SUF]suffix[FIM_MID]

    ``prefix``, ``suffix`` and ``prompt`` are tokenized already (prefix and suffix without
    reading special tokens in them, ``prompt`` with); ``tokenize`` reads the other texts,
    without special tokens. A vocabulary without fim_sep gets each chunk after SNIPPET instead.
    As llama-server:
    - the prefix keeps its last 3/4 of ``n_batch`` tokens, the suffix its first
      ``n_batch/4 - (2 + len(prompt))``: prefix and suffix fit in one batch, 3:1;
    - the extra context keeps its last ``n_ctx - n_batch - 2 * n_predict`` tokens, and goes
      before the BOS (llama-server puts the BOS in front first, then inserts the extra context
      in front of that);
    - ``n_predict`` is -1 for "until the end": llama-server passes its --n-predict flag (-1 by
      default) here; this gateway passes the request's own limit where it has one;
    - where the whole would not leave the answer room in ``n_ctx`` (see below), less is kept.
    ``spm`` puts the suffix first, as llama-server's --spm-infill does:
    ``[BOS][FIM_SUF]suffix[FIM_PRE]prefix prompt[FIM_MID]``, the same parts kept."""
    extra_tokens: list[int] = []
    if fim.rep is not None:
        extra_tokens += [fim.rep, *tokenize(REPO)]
    for chunk in extra:
        if fim.sep is not None:
            extra_tokens += [fim.sep, *tokenize(chunk.filename + "\n")]
        else:
            extra_tokens += tokenize(SNIPPET)
        extra_tokens += tokenize(chunk.text)
    if fim.sep is not None:
        extra_tokens += [fim.sep, *tokenize(CURRENT_FILE)]

    n_prefix_take = min(len(prefix), 3 * (n_batch // 4))
    n_suffix_take = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra_take = min(extra_room(n_ctx, n_batch, n_predict), len(extra_tokens))
    # Past llama-server: the answer keeps room for at least max(n_predict, 1) tokens (llama-server
    # would shift the context instead, which this gateway does not): the extra context gives way
    # first, then the prefix's oldest tokens.
    fixed = 3 + (bos is not None) + len(prompt) + n_suffix_take
    room = max(0, n_ctx - max(n_predict, 1) - fixed)
    n_prefix_take = min(n_prefix_take, room)
    n_extra_take = min(n_extra_take, room - n_prefix_take)

    assert fim.pre is not None and fim.suf is not None and fim.mid is not None, fim.missing()
    head = [fim.pre, *prefix[len(prefix) - n_prefix_take:], *prompt]
    tail = [fim.suf, *suffix[:n_suffix_take]]
    if spm:
        head, tail = tail, head
    if bos is not None:
        head.insert(0, bos)
    context = extra_tokens[len(extra_tokens) - n_extra_take:]
    return [*context, *head, *tail, fim.mid]


def recent(fim: FimTokens, extra: list[Extra], room: int, budget: int) -> list[Extra]:
    """What ``layout`` needs of ``extra`` to keep the extra context's last ``room`` tokens
    (``extra_room``), the texts it hands the tokenizer for the extra context holding at most
    ``budget`` bytes together: the project's and the current file's lines, each chunk's file
    name line (or the snippet separator) and text. A budget of ``room + bounds.MARGIN`` times the
    vocabulary's longest piece holds more than those tokens stand for, so what is left out lies
    before what the layout keeps and the prompt is the same.

    From the newest chunk back, each chunk's text, then its name, count against the budget; the
    chunk that crosses it keeps its text's end (whole characters, and then no name: what the
    layout writes before the kept text is dropped with it) or, its text whole, its name's end;
    older chunks are left out, and so is every chunk before the last ``room`` (each is a token
    at least: its separator). Pure."""
    sep = fim.sep is not None
    left = budget - (len(REPO) if fim.rep is not None else 0) - (len(CURRENT_FILE) if sep else 0)
    line = 1 if sep else len(SNIPPET)  # a chunk's bytes besides its text and name: the name's "\n"
    out: list[Extra] = []
    for chunk in reversed(extra[max(0, len(extra) - room):] if room > 0 else []):
        if left < line:
            break
        text = tail_bytes(chunk.text, left - line)
        left -= line + len(text.encode("utf-8"))
        cut = len(text) < len(chunk.text)
        name = chunk.filename if not sep else "" if cut else tail_bytes(chunk.filename, left)
        if sep:
            left -= len(name.encode("utf-8"))
            cut = cut or len(name) < len(chunk.filename)
        out.append(Extra(name, text) if cut else chunk)
        if cut:
            break
    return out[::-1]


def tail_bytes(text: str, keep: int) -> str:
    """The end of ``text``, at most ``keep`` bytes of it (whole characters): a prefix far
    longer than what ``layout`` keeps of it need not be tokenized whole. ``text`` itself where
    it holds no more."""
    data = text.encode("utf-8")
    return text if len(data) <= keep else data[len(data) - max(0, keep):].decode("utf-8", "ignore")


def head_bytes(text: str, keep: int) -> str:
    """The start of ``text``, at most ``keep`` bytes of it (whole characters)."""
    data = text.encode("utf-8")
    return text if len(data) <= keep else data[:max(0, keep)].decode("utf-8", "ignore")
