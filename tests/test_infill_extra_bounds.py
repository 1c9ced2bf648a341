"""/infill's ``input_extra`` is cut to what its model can keep before the worker tokenizes it
(``wire/fim.extra_budget`` and ``trim_extra``, applied in ``api/openai.infill``): file names count
with the texts, and a chunk of megabytes keeps only its end. The layout keeps only the extra
context's last ``n_ctx - n_batch - 2 * n_predict`` tokens, so the cut changes no prompt; it
spares the worker the time and memory of tokenizing what the layout then dropped (one 4 MB chunk
took seconds and some hundreds of MiB of the worker; ``/tokenize`` refuses the same text at once)."""

from __future__ import annotations

import random

import pytest
from helpers import ServerProcess, request, tiny_random_model

from gateway.engine import infill
from gateway.engine.infill import Extra, FimTokens
from gateway.wire import fim

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


# --- against the real server ------------------------------------------------------------------

def rss_peak(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))


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
        before = rss_peak(pid)
        status, got = request(srv.url + "/infill", {**base, "input_extra": [
            {"filename": "big.py", "text": CODE * (4 * 2**20 // len(CODE))}]})[:2]
        assert status == 200, got
        assert (got["content"], got["tokens_evaluated"]) == (want["content"], want["tokens_evaluated"])
        assert rss_peak(pid) - before < 64 * 2**20  # tokenizing the whole 4 MB took some hundreds of MiB
        names = [{"filename": f"{i:04d}" + "f" * 1020, "text": "y = 2\n"} for i in range(1024)]
        status, whole = request(srv.url + "/infill", {**base, "input_extra": names})[:2]
        status2, last = request(srv.url + "/infill", {**base, "input_extra": names[-500:]})[:2]
        assert status == status2 == 200 and whole["tokens_evaluated"] == last["tokens_evaluated"]
