"""Speculative decoding on the real models (Gemma 3 270M, SmolLM2 135M Instruct): greedy
answers with speculation, both kinds, alone and in two batched slots, against the same
model's answers without it.

llama.cpp's CPU kernels are not batch-invariant: a token read in a batch of several (a
verification) gets logits that differ in their last digits, and past them, from the same token
read alone (ggml's matrix products take another kernel from two rows up, and one query over a
long cache splits its attention across threads). So a greedy answer can part from the plain
one where the model's two likeliest tokens are all but tied, as llama.cpp's own cached and
uncached reads of one prompt can. The tests hold what a correct verification guarantees on
such kernels: each answer is the plain one up to its first difference, at which the token
speculation kept was among the plain run's likeliest, within ``TIE`` of its first choice. A kept
draft the model did not choose, or logits read from the wrong row or position, part at a
token the model does not rank near its first (the tests check that such mistakes fail them)."""

from __future__ import annotations

import pytest
from helpers import InProcessEngine

pytestmark = pytest.mark.real

N, N_CTX = 80, 2048
# How far apart (in log-probability) the two likeliest tokens may be where a greedy answer with
# speculation parts from the one without: llama.cpp's own logits for a token read alone and in
# a batch differ by up to about a nat on these models.
TIE = 1.0
RANKED = 10  # the plain run's likeliest tokens at each position, read to judge a difference
CODE = '''def lookup(tokens, n, m):
    """Propose what followed the last n tokens where they came before."""
    index = {}
    for i in range(len(tokens) - n):
        index[tuple(tokens[i:i + n])] = i + n
    at = index.get(tuple(tokens[-n:]))
    return [] if at is None else tokens[at:at + m]


def accepted(draft, pick):
    kept = []
    for i, token in enumerate(draft):
        chosen = pick(i)
        kept.append(chosen)
        if chosen != token:
            return kept
    return kept + [pick(len(draft))]
'''
ASKS = ["Repeat this code exactly, renaming `accepted` to `kept`:\n\n" + CODE,
        "What is the capital of France? Answer in three sentences.",
        "Write a short poem about the sea."]
TEMPLATES = {"gemma": "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n",
             "smollm": "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"}
KINDS = {"ngram": {"spec_type": "ngram", "spec_ngram_size_n": 3, "spec_ngram_size_m": 16},
         "draft": {"draft_max": 4}}  # the model as its own draft (``draft`` set below)


@pytest.fixture(scope="module", params=["gemma", "smollm"])
def model(request):
    from realmodel import gemma_path, smollm_path

    path = gemma_path() if request.param == "gemma" else smollm_path()
    prompts = [TEMPLATES[request.param].format(ask) for ask in ASKS]
    plain = InProcessEngine(path, n_ctx=N_CTX)
    answers = {}
    for prompt in prompts:
        text, _ = plain.run(prompt, max_tokens=N, logprobs=RANKED)
        answers[prompt] = (text, plain.logprobs)
    return path, answers


def parts_at_a_tie(want, got) -> tuple[int | None, str]:
    """Where ``got``'s tokens (logprobs entries) first differ from ``want``'s (None: nowhere), and
    why that difference is no tie, if it is none ("" where it is one)."""
    at = next((i for i, (a, b) in enumerate(zip(want, got)) if a["token"] != b["token"]), None)
    if at is None:
        return (None, "") if len(want) == len(got) else (min(len(want), len(got)), "a length")
    ranked = {t["token"]: t["logprob"] for t in want[at]["top_logprobs"]}
    kept, first = got[at]["token"], want[at]["token"]
    if kept not in ranked:
        return at, f"{kept!r} is not among the plain run's {RANKED} likeliest ({ranked})"
    if ranked[first] - ranked[kept] > TIE:
        return at, f"{kept!r} is {ranked[first] - ranked[kept]:.3f} below {first!r}"
    return at, ""


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_answers_part_from_the_plain_ones_only_at_a_tie(model, kind):
    path, answers = model
    load = {**KINDS[kind], **({"draft": path} if kind == "draft" else {})}
    alone = InProcessEngine(path, n_ctx=N_CTX, **load)
    same = drafted = kept = 0
    for prompt, (text, want) in answers.items():
        got, done = alone.run(prompt, max_tokens=N, logprobs=1)
        at, why = parts_at_a_tie(want, alone.logprobs)
        assert not why, f"{kind}: parted at token {at}: {why}\n{text!r}\n{got!r}"
        same += at is None
        drafted, kept = drafted + done.drafted, kept + done.accepted
    assert same >= 1 and kept > 0 and kept <= drafted  # speculation ran, and not every answer parted
    # two slots speculating in the same steps, each against its answer alone
    two = InProcessEngine(path, n_ctx=N_CTX, parallel=2, **load)
    pair = list(answers)[:2]
    outs = two.together(pair, max_tokens=N, logprobs=1)
    for prompt, (got, _), logprobs in zip(pair, outs, two.each_logprobs):
        at, why = parts_at_a_tie(answers[prompt][1], logprobs)
        assert not why, f"{kind}, batched: parted at token {at}: {why}\n{answers[prompt][0]!r}\n{got!r}"
    assert sum(done.accepted for _, done in outs) > 0


@pytest.mark.slow
def test_the_server_speculates_for_the_official_client(tmp_path):
    """The user's path: models.yaml turns n-gram speculation on for one name of Gemma 3 270M,
    the official openai client streams an editing answer from it and the same answer whole from
    the name without it: the streamed answer carries ``usage.speculation`` (Prometheus counts
    the same), and parts from the plain one only at a tie, judged by the plain answer's own
    ``top_logprobs``."""
    import urllib.request

    import openai
    from helpers import ServerProcess
    from realmodel import gemma_path

    cfg = tmp_path / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\nmodels:\n  plain:\n    path: {gemma_path()}\n"
                   f"  spec:\n    path: {gemma_path()}\n    spec_type: ngram\n")
    with ServerProcess("--config", str(cfg), env={"HOME": str(tmp_path)}) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
        ask = [{"role": "user", "content": ASKS[0]}]
        whole = client.chat.completions.create(model="plain", messages=ask, max_tokens=N, temperature=0,
                                               logprobs=True, top_logprobs=RANKED)
        assert whole.choices[0].logprobs is not None and whole.choices[0].logprobs.content is not None
        want = [{"token": t.token, "top_logprobs": [{"token": a.token, "logprob": a.logprob} for a in t.top_logprobs]}
                for t in whole.choices[0].logprobs.content]
        got, usage = [], None
        for chunk in client.chat.completions.create(model="spec", messages=ask, max_tokens=N, temperature=0, stream=True,
                                                    logprobs=True, stream_options={"include_usage": True}):
            if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
                got += [{"token": t.token} for t in chunk.choices[0].logprobs.content]
            usage = chunk.usage or usage
        at, why = parts_at_a_tie(want, got)
        assert not why, f"parted at token {at}: {why}"
        assert usage is not None and usage.model_extra is not None
        told = usage.model_extra["speculation"]
        assert 0 < told["accepted"] <= told["drafted"]
        with urllib.request.urlopen(srv.url + "/metrics", timeout=10) as r:
            metrics = r.read().decode()
        drafted = [line for line in metrics.splitlines()
                   if line.startswith("gguf_gateway_drafted_tokens_total") and 'model="spec"' in line]
        assert drafted and float(drafted[0].rsplit(" ", 1)[1]) == told["drafted"]
