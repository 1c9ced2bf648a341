"""/infill's ``input_extra`` is cut to what its model can keep before the worker tokenizes it
(``wire/fim.extra_budget`` and ``trim_extra``, applied in ``api/openai.infill``): file names count
with the texts, and a chunk of megabytes keeps only its end. The layout keeps only the extra
context's last ``n_ctx - n_batch - 2 * n_predict`` tokens, so the cut changes no prompt; it
spares the worker the time and memory of tokenizing what the layout then dropped (one 4 MB chunk
took seconds and some hundreds of MiB of the worker; ``/tokenize`` refuses the same text at once)."""

from __future__ import annotations

import random
import re
from types import SimpleNamespace

import pytest
from helpers import ServerProcess, request, tiny_random_model
from hostile_upstream import peak_rss

from gateway.protocol import GenerationRequest, bounds
from gateway.wire import fim
from gateway.worker import infill
from gateway.worker.infill import Extra, FimTokens
from gateway.worker.prompts import Prompts

CODE = "def f(x):\n    return x + 1\n"


def test_the_budget_is_what_the_layout_can_keep():
    per = fim.MAX_TOKEN_BYTES
    info = {"n_ctx": 4096, "n_batch": 512}
    assert fim.extra_budget(info, None) == (4096 - 512 + 2 + 8) * per  # n_predict -1: until the end
    assert fim.extra_budget(info, 100) == (4096 - 512 - 200 + 8) * per
    assert fim.extra_budget(info, 4000) == 8 * per  # no room for extra context at all
    assert fim.extra_budget({"upstream": "http://x"}, None) is None  # its own server lays it out
    assert fim.extra_budget({"n_ctx": True, "n_batch": 512}, None) is None


def test_small_extra_context_is_untouched():
    extra = [{"filename": "a.py", "text": "A = 1\n"}, {"filename": "b.py", "text": "B = 2\n"}]
    assert fim.trim_extra(extra, 10_000) == extra


def test_file_names_count_and_the_oldest_chunks_go_first():
    extra = [{"filename": f"{i:04d}" + "f" * 1020, "text": "y = 2\n"} for i in range(1024)]
    kept = fim.trim_extra(extra, 10_000)
    assert kept == extra[-len(kept):] and 1 <= len(kept) <= 10  # names alone fill the budget


def test_the_crossing_chunk_keeps_its_texts_end_in_whole_characters():
    extra = [{"filename": "old.py", "text": "old\n" * 100}, {"filename": "big.py", "text": "aé€" * 1000}]
    kept = fim.trim_extra(extra, 100)
    assert [c["filename"] for c in kept] == ["big.py"]
    text = kept[0]["text"]
    assert ("aé€" * 1000).endswith(text) and 94 <= len(text.encode()) <= 100  # a character is at most 3 bytes here


def char_tokens(text: str) -> list[int]:
    """A vocabulary of one token a character: no token stands for more than 4 bytes."""
    return [ord(c) for c in text]


@pytest.mark.parametrize("seed", range(20))
def test_the_cut_never_changes_the_prompt(seed):
    rng = random.Random(seed)
    fims = FimTokens(pre=1, suf=2, mid=3, rep=4 if seed % 2 else None, sep=5 if seed % 2 else None)
    n_ctx, n_batch = rng.choice([(256, 64), (512, 128), (1024, 512)])
    n_predict = rng.choice([-1, 8, 100])
    extra = [{"filename": rng.choice(["a.py", "é" * rng.randint(1, 300)]),
              "text": rng.choice(["x = 1\n", "€" * rng.randint(0, 4000), CODE * rng.randint(0, 100)])}
             for _ in range(rng.randint(0, 40))]
    budget = fim.extra_budget({"n_ctx": n_ctx, "n_batch": n_batch}, None if n_predict == -1 else n_predict)
    assert budget is not None

    def lay(chunks: list[dict[str, str]]) -> list[int]:
        return infill.layout(fims, char_tokens, char_tokens("def g():\n"), char_tokens("\n"), [],
                             [Extra(c["filename"], c["text"]) for c in chunks], n_batch=n_batch,
                             n_predict=n_predict, n_ctx=n_ctx, bos=None)

    assert lay(fim.trim_extra(extra, budget)) == lay(extra)


# --- the worker's own bound (worker/prompts.Prompts.infill, worker/infill.recent) ------------

WORD = re.compile(r"\s+|\w+|[^\w\s]")
PIECE = 8  # characters of a stand-in token at most


class WordVocab:
    """A stand-in vocabulary whose tokens are words (runs of spaces, of word characters, and
    single other characters) in pieces of at most ``PIECE`` characters cut from each word's end:
    a text's end tokenizes as the whole text's last tokens but for its first word, as a BPE
    vocabulary's words do. ``given`` holds the bytes of each text handed to ``tokenize``."""

    def __init__(self, fims: FimTokens):
        self.fim, self.bos, self.add_bos = fims, -1, False
        self.ids: dict[str, int] = {}
        self.given: list[int] = []

    def tokenize(self, text: str, add_special: bool, parse_special: bool = True) -> list[int]:
        self.given.append(len(text.encode("utf-8")))
        out = []
        for word in WORD.findall(text):
            pieces = [word[max(0, end - PIECE):end] for end in range(len(word), 0, -PIECE)]
            out += [self.ids.setdefault(p, 100 + len(self.ids)) for p in reversed(pieces)]
        return out

    def longest_piece(self) -> int:
        return PIECE  # the texts here are ASCII


def worker(fims: FimTokens, n_ctx: int = 4096, n_batch: int = 512) -> Prompts:
    model = SimpleNamespace(vocab=WordVocab(fims), n_ctx=n_ctx, cp=SimpleNamespace(n_batch=n_batch),
                            params=SimpleNamespace(name="m", spm_infill=False))
    return Prompts(model)  # type: ignore[arg-type]


def whole_layout(prompts: Prompts, req: GenerationRequest) -> list[int]:
    """``req``'s prompt laid out from its whole texts, nothing cut (the vocabulary's own tokens)."""
    vocab, n_batch = prompts.vocab, prompts.model.cp.n_batch

    def plain(text: str) -> list[int]:
        return vocab.tokenize(text, add_special=False, parse_special=False)

    return infill.layout(vocab.fim, plain, plain(req.prompt or ""), plain(req.suffix or ""), plain(req.infill_prompt),
                         [Extra(e["filename"], e["text"]) for e in req.infill_extra], n_batch=n_batch,
                         n_predict=-1 if req.max_tokens is None else req.max_tokens, n_ctx=prompts.n_ctx, bos=None)


def extra_given(prompts: Prompts, req: GenerationRequest) -> tuple[list[int], int]:
    """``req``'s prompt as the worker lays it out, and the bytes of its extra context that the
    vocabulary was handed (all it was handed, less the prefix, suffix and prompt)."""
    vocab = prompts.vocab
    vocab.given.clear()
    tokens = prompts.infill(req).tokens
    own = sum(len(t.encode()) for t in (req.prompt or "", req.suffix or "", req.infill_prompt))
    return tokens, sum(vocab.given) - own


SEPARATED = FimTokens(pre=1, suf=2, mid=3, rep=4, sep=5)  # Qwen2.5-Coder's: a file name line a chunk
SNIPPETS = FimTokens(pre=1, suf=2, mid=3)  # StarCoder's: the snippet separator


@pytest.mark.parametrize("fims", [SEPARATED, SNIPPETS], ids=["sep", "snippet"])
@pytest.mark.parametrize("max_tokens", [None, 64])
def test_the_worker_hands_the_tokenizer_no_more_than_the_layout_can_keep(fims, max_tokens):
    """A 4 MB chunk, and 1,024 chunks under 4 KB names: the vocabulary is handed at most (the
    extra tokens the layout keeps + MARGIN) times its longest piece, and the prompt is the one
    the whole texts give (laid out from a shorter extra context with the same end, still more
    than the layout keeps: tokenizing 4 MB here takes seconds)."""
    prompts = worker(fims)
    n_predict = -1 if max_tokens is None else max_tokens
    bound = (bounds.extra_room(4096, 512, n_predict) + bounds.MARGIN) * PIECE
    assert min(2000 * len(CODE), 20 * 4096) > bound
    base = {"prompt": "def f():\n", "suffix": "\n", "max_tokens": max_tokens}
    old = {"filename": "old.py", "text": "x = 0\n"}
    names = [{"filename": f"{i:04d}" + "f" * 4092, "text": "y = 2\n"} for i in range(1024)]
    for extra, same_end in (([old, {"filename": "big.py", "text": CODE * (4 * 2**20 // len(CODE))}],
                             [{"filename": "big.py", "text": CODE * 2000}]),
                            (names, names[-20:] if fims.sep is not None else names)):  # snippets: no names
        tokens, given = extra_given(prompts, GenerationRequest(**base, infill_extra=extra))
        assert given <= bound
        assert tokens == whole_layout(prompts, GenerationRequest(**base, infill_extra=same_end))


def test_a_normal_request_is_laid_out_whole():
    prompts = worker(SEPARATED)
    extra = [{"filename": "a.py", "text": "A = 1\n"}, {"filename": "b.py", "text": CODE}]
    req = GenerationRequest(prompt="def f():\n", suffix="\n", infill_extra=extra)
    tokens, given = extra_given(prompts, req)
    assert tokens == whole_layout(prompts, req)
    assert given == sum(len(t) for t in ("myproject\n", "a.py\n", "A = 1\n", "b.py\n", CODE, "filename\n"))


@pytest.mark.parametrize("seed", range(20))
def test_recent_never_changes_the_prompt_and_keeps_to_its_budget(seed):
    """``infill.recent`` on random chunks, budgets and names (a character up to 3 bytes, a token
    up to ``PIECE`` characters: up to 24 bytes)."""
    rng = random.Random(seed)
    fims = SEPARATED if seed % 2 else SNIPPETS
    n_ctx, n_batch = rng.choice([(256, 64), (512, 128), (1024, 512)])
    n_predict = rng.choice([-1, 8, 100])
    extra = [Extra(rng.choice(["a.py", "é" * rng.randint(1, 300), ""]),
                   rng.choice(["", "x = 1\n", "€" * rng.randint(0, 4000), CODE * rng.randint(0, 100)]))
             for _ in range(rng.randint(0, 40))]
    vocab = WordVocab(fims)

    def lay(chunks: list[Extra]) -> list[int]:
        return infill.layout(fims, lambda t: vocab.tokenize(t, False), vocab.tokenize("def g():\n", False),
                             vocab.tokenize("\n", False), [], chunks, n_batch=n_batch, n_predict=n_predict,
                             n_ctx=n_ctx, bos=None)

    room = bounds.extra_room(n_ctx, n_batch, n_predict)
    budget = (room + bounds.MARGIN) * 3 * PIECE
    kept = infill.recent(fims, extra, room, budget)
    assert lay(kept) == lay(extra)
    vocab.given.clear()
    lay(kept)
    assert sum(vocab.given) - len("def g():\n") - len("\n") <= budget


def test_recent_cuts_the_crossing_chunk_to_its_texts_end():
    sep = len(infill.REPO) + len(infill.CURRENT_FILE)
    chunks = [Extra("a", "x" * 10), Extra("b", "y" * 10), Extra("c", "z" * 10)]
    assert infill.recent(SEPARATED, chunks, 100, sep + 2 * 12) == chunks[1:]  # "b\n" and its text, "c\n" and its
    assert infill.recent(SEPARATED, chunks, 100, sep + 12 + 5) == [Extra("", "y" * 4), chunks[2]]
    assert infill.recent(SEPARATED, chunks, 100, sep + 12 + 11 + 1) == [Extra("b", "y" * 10), chunks[2]]
    assert infill.recent(SEPARATED, [Extra("name", "t")], 100, sep + 2 + 2) == [Extra("me", "t")]
    assert infill.recent(SEPARATED, chunks, 2, 10**6) == chunks[1:]  # each chunk is a token at least
    assert infill.recent(SEPARATED, chunks, 0, 10**6) == []
    snip = len(infill.SNIPPET)
    assert infill.recent(SNIPPETS, chunks, 100, snip + 10 + snip + 3) == [Extra("b", "y" * 3), chunks[2]]


# --- against the real server ------------------------------------------------------------------

@pytest.mark.slow
def test_a_huge_extra_context_is_cut_before_the_worker_reads_it(tmp_path):
    """On llama.cpp's real StarCoder vocabulary: the answer is the one its chunk's end alone
    gives, and the worker's memory does not grow by what it no longer tokenizes."""
    cfg = tmp_path / "models.yaml"
    cfg.write_text("server:\n  discover_default_stores: false\n  kv_cache_max_bytes: 0\n  prompt_cache_bytes: 0\n"
                   f"models:\n  star:\n    path: {tiny_random_model('starcoder', seed=7)}\n    n_ctx: 4096\n")
    with ServerProcess("--config", str(cfg), env={"HOME": str(tmp_path)}) as srv:
        base = {"model": "star", "input_prefix": "def f():\n", "input_suffix": "\n", "n_predict": 2, "temperature": 0}
        small = [{"filename": "big.py", "text": CODE * 2000}]  # 54 KB: more than the layout keeps of it
        status, want = request(srv.url + "/infill", {**base, "input_extra": small})[:2]
        assert status == 200, want
        pid = srv.get("/health")[1]["workers"]["star"]
        before = peak_rss(pid)
        status, got = request(srv.url + "/infill", {**base, "input_extra": [
            {"filename": "big.py", "text": CODE * (4 * 2**20 // len(CODE))}]})[:2]
        assert status == 200, got
        assert (got["content"], got["tokens_evaluated"]) == (want["content"], want["tokens_evaluated"])
        assert peak_rss(pid) - before < 64 * 2**20  # tokenizing the whole 4 MB took some hundreds of MiB
        names = [{"filename": f"{i:04d}" + "f" * 1020, "text": "y = 2\n"} for i in range(1024)]
        status, whole = request(srv.url + "/infill", {**base, "input_extra": names})[:2]
        status2, last = request(srv.url + "/infill", {**base, "input_extra": names[-500:]})[:2]
        assert status == status2 == 200 and whole["tokens_evaluated"] == last["tokens_evaluated"]
