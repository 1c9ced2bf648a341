"""Fill-in-the-middle: the prompt's layout without a model (worker/infill.py, llama-server's
format_prompt_infill), the wire parsers (wire/fim.py, suffix on the other routes), and the
worker's own side on scripted models."""

import pytest

from gateway.base.errors import InvalidRequest
from gateway.wire import fim, ollama
from gateway.wire import openai as oai
from gateway.wire.answer import Finish
from gateway.worker import infill
from gateway.worker.infill import Extra, FimTokens

PRE, SUF, MID, REP, SEP, BOS = 1, 2, 3, 4, 5, 9
PSM = FimTokens(PRE, SUF, MID)  # a vocabulary with no repo-level tokens (starcoder's)
REPO_LEVEL = FimTokens(PRE, SUF, MID, rep=REP, sep=SEP)  # Qwen2.5-Coder's


def tok(text: str) -> list[int]:
    """A stand-in tokenizer: one token per character."""
    return [1000 + ord(c) for c in text]


def lay(fim_tokens=PSM, prefix="def f(", suffix=")\n", prompt="", extra=(), n_batch=2048, n_predict=-1,
        n_ctx=4096, bos=None, spm=False):
    return infill.layout(fim_tokens, tok, tok(prefix), tok(suffix), tok(prompt), list(extra), n_batch=n_batch,
                         n_predict=n_predict, n_ctx=n_ctx, bos=bos, spm=spm)


def test_prefix_suffix_middle_order():
    assert lay() == [PRE, *tok("def f("), SUF, *tok(")\n"), MID]


def test_bos_goes_before_the_prefix_token_and_the_prompt_after_the_prefix():
    assert lay(bos=BOS, prompt="x") == [BOS, PRE, *tok("def f("), *tok("x"), SUF, *tok(")\n"), MID]


def test_suffix_first_as_llama_servers_spm_infill():
    """models.yaml's ``spm_infill``: the same parts, the suffix's first, after the extra context
    and the BOS."""
    assert lay(bos=BOS, prompt="x", spm=True) == [BOS, SUF, *tok(")\n"), PRE, *tok("def f("), *tok("x"), MID]
    got = lay(REPO_LEVEL, extra=[Extra("a.py", "A")], spm=True)
    assert got[-len(tok(")\n")) - len(tok("def f(")) - 3:] == [SUF, *tok(")\n"), PRE, *tok("def f("), MID]
    assert got[0] == REP


def test_extra_files_with_repo_level_tokens():
    got = lay(REPO_LEVEL, extra=[Extra("a.py", "A=1\n"), Extra("b.py", "B")], bos=BOS)
    assert got == [REP, *tok("myproject\n"), SEP, *tok("a.py\n"), *tok("A=1\n"), SEP, *tok("b.py\n"), *tok("B"),
                   SEP, *tok("filename\n"),  # llama-server's name of the file being edited
                   BOS, PRE, *tok("def f("), SUF, *tok(")\n"), MID]  # extra context before the BOS, as there


def test_extra_files_without_a_separator_token_are_snippets():
    got = lay(extra=[Extra("a.py", "A")])
    assert got == [*tok("\n\n--- snippet ---\n\n"), *tok("A"), PRE, *tok("def f("), SUF, *tok(")\n"), MID]


def test_prefix_keeps_its_end_and_suffix_its_start_three_to_one_of_a_batch():
    got = lay(prefix="p" * 100 + "END", suffix="START" + "s" * 100, prompt="xy", n_batch=64, n_ctx=4096)
    n_prefix, n_suffix = 3 * (64 // 4), 64 // 4 - (2 + 2)
    assert got == [PRE, *tok(("p" * 100 + "END")[-n_prefix:]), *tok("xy"), SUF, *tok(("START" + "s" * 100)[:n_suffix]),
                   MID]


def test_extra_context_keeps_its_end_within_the_context_less_the_batch_and_twice_the_prediction():
    got = lay(REPO_LEVEL, prefix="", suffix="", extra=[Extra("f", "x" * 500)], n_batch=64, n_predict=10, n_ctx=200)
    n_extra = 200 - 64 - 2 * 10
    full = [REP, *tok("myproject\n"), SEP, *tok("f\n"), *tok("x" * 500), SEP, *tok("filename\n")]
    assert got == [*full[-n_extra:], PRE, SUF, MID]


def test_the_answer_keeps_room_in_a_small_context():
    """llama-server would shift the context; here the prefix's oldest tokens give way."""
    got = lay(prefix="p" * 1000, suffix="", n_batch=2048, n_predict=16, n_ctx=100)
    assert len(got) == 100 - 16
    assert got[:1] == [PRE] and got[-2:] == [SUF, MID]


def test_missing_tokens_are_named():
    assert FimTokens(None, 2, None).missing() == ["prefix", "middle"]
    assert REPO_LEVEL.missing() == []


def test_byte_cuts_keep_whole_characters():
    assert infill.tail_bytes("aé€", 3) == "€" and infill.head_bytes("aé€", 3) == "aé"
    assert infill.tail_bytes("short", 100) == "short"
    assert infill.tail_bytes("abc", 0) == "" and infill.head_bytes("abc", 0) == ""
    chunks = [Extra("a", "x" * 10), Extra("b", "y" * 10), Extra("c", "z" * 10)]
    # the snippet separators and the texts of the last two, the second cut
    assert infill.recent(PSM, chunks, 100, 2 * len(infill.SNIPPET) + 15) == [Extra("b", "y" * 5), chunks[2]]


# --- wire ----------------------------------------------------------------------------------

def test_infill_request():
    p = fim.parse_infill({"input_prefix": "a", "input_suffix": "b", "prompt": "c", "n_predict": 8,
                          "input_extra": [{"filename": "x.py", "text": "X"}, {"text": "Y"}], "temperature": 0,
                          "stream": True, "stop": ["\n\n"]})
    r = p.request
    assert (p.model, r.prompt, r.suffix, r.infill_prompt, r.max_tokens, r.temperature, p.stream, r.stop) == (
        "", "a", "b", "c", 8, 0, True, ["\n\n"])
    assert r.infill_extra == [{"filename": "x.py", "text": "X"}, {"filename": "tmp", "text": "Y"}]
    assert r.suffix_param == "input_suffix"
    assert fim.parse_infill({"input_prefix": "", "input_suffix": "", "n_predict": -1}).request.max_tokens is None


@pytest.mark.parametrize("body, param", [
    ({"input_suffix": "b"}, "input_prefix"),
    ({"input_prefix": "a"}, "input_suffix"),
    ({"input_prefix": 1, "input_suffix": "b"}, "input_prefix"),
    ({"input_prefix": "a", "input_suffix": ["b"]}, "input_suffix"),
    ({"input_prefix": "a", "input_suffix": "b", "prompt": 3}, "prompt"),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": {"text": "x"}}, "input_extra"),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": "x"}, "input_extra"),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": ["x"]}, "input_extra[0]"),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "f"}]}, "input_extra[0].text"),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": "t", "filename": 7}]},
     "input_extra[0].filename"),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": "t"}] * (fim.MAX_EXTRA + 1)},
     "input_extra"),
    ({"input_prefix": "a", "input_suffix": "b", "n_predict": "8"}, "n_predict"),
    ({"input_prefix": "a", "input_suffix": "b", "n_predict": -5}, "n_predict"),
    ({"input_prefix": "a", "input_suffix": "b", "n_predict": 0}, "n_predict"),
    ({"input_prefix": "a", "input_suffix": "b", "max_tokens": True}, "max_tokens"),
    ({"input_prefix": "a", "input_suffix": "b", "temperature": "hot"}, "temperature"),
    ({"input_prefix": "a", "input_suffix": "b", "stream": "yes"}, "stream"),
    ({"input_prefix": "a", "input_suffix": "b", "stop": 5}, "stop"),
    ({"input_prefix": "a", "input_suffix": "b", "model": 5}, "model"),
])
def test_infill_refusals_name_the_field(body, param):
    with pytest.raises(InvalidRequest) as e:
        fim.parse_infill(body)
    assert e.value.param == param


def test_mistral_fim_request():
    p = fim.parse_fim({"model": "m", "prompt": "def f(", "suffix": "):", "max_tokens": 5, "random_seed": 3,
                       "stop": "\n"})
    assert (p.request.prompt, p.request.suffix, p.request.max_tokens, p.request.seed, p.request.stop) == (
        "def f(", "):", 5, 3, ["\n"])
    assert fim.parse_fim({"model": "m", "prompt": "x"}).request.suffix == ""  # still laid out as FIM
    with pytest.raises(InvalidRequest) as e:
        fim.parse_fim({"model": "m", "prompt": "x", "suffix": 1})
    assert e.value.param == "suffix"


def test_suffix_on_openai_completions():
    p = oai.parse_completion({"model": "m", "prompt": "a", "suffix": "b"})
    assert (p.request.prompt, p.request.suffix) == ("a", "b")
    assert oai.parse_completion({"model": "m", "prompt": "a", "suffix": ""}).request.suffix is None
    for body in ({"model": "m", "prompt": "a", "suffix": "b", "echo": True},
                 {"model": "m", "prompt": [1, 2], "suffix": "b"}, {"model": "m", "prompt": "a", "suffix": 3}):
        with pytest.raises(InvalidRequest) as e:
            oai.parse_completion(body)
        assert e.value.param == "suffix"


def test_suffix_on_ollama_generate():
    p = ollama.parse_generate({"model": "m", "prompt": "a", "suffix": "b", "system": "ignored"})
    assert (p.request.prompt, p.request.suffix, p.request.messages) == ("a", "b", None)
    assert ollama.parse_generate({"model": "m", "prompt": "a", "suffix": ""}).request.messages is not None
    assert ".Suffix" in ollama.show_template("{{ chat }}", True)
    assert ollama.show_template("{{ chat }}", False) == "{{ chat }}"


def test_llama_server_answer_shape():
    finish = Finish("stop", None, prompt_tokens=10, completion_tokens=4, reasoning_tokens=0, cached_tokens=2)
    timing = fim.timings(finish, 1.0, 1.5, 2.1)
    assert timing["prompt_n"] == 8 and timing["predicted_n"] == 4 and timing["prompt_ms"] == pytest.approx(500)
    assert timing["predicted_per_token_ms"] == pytest.approx(200)
    body = fim.final("m", "x\ny", finish, timing, fim.parse_infill({"input_prefix": "", "input_suffix": ""}).request)
    assert body["stop"] is True and body["stop_type"] == "eos" and body["has_new_line"] is True
    assert (body["tokens_predicted"], body["tokens_evaluated"], body["tokens_cached"]) == (4, 10, 2)
    assert fim.stop_type(Finish("stop", "\n", 1, 1, 0)) == "word"
    assert fim.stop_type(Finish("length", None, 1, 1, 0)) == "limit"


def test_response_fields_as_llama_vim_asks_for_them():
    body = {"content": "x", "timings": {"prompt_n": 3, "predicted_ms": 1.5}, "stop": True}
    assert fim.pick(["content", "timings/prompt_n", "timings/nope", "nope"], body) == {
        "content": "x", "timings/prompt_n": 3}
    assert fim.pick([], body) is body
    p = fim.parse_infill({"input_prefix": "", "input_suffix": "", "response_fields": ["content"]})
    assert p.response_fields == ["content"]
    for bad in ("content", [1], ["x"] * (fim.MAX_FIELDS + 1)):
        with pytest.raises(InvalidRequest) as e:
            fim.parse_infill({"input_prefix": "", "input_suffix": "", "response_fields": bad})
        assert e.value.param == "response_fields"


# --- the worker itself ---------------------------------------------------------------------

async def _generate(path, req):
    from gateway import protocol
    from gateway.backends.local import start_local
    from gateway.models.config import ModelSpec, ServerConfig

    backend = await start_local(ModelSpec("m", path), ServerConfig(), on_exit=lambda b, e: None,
                                on_busy=lambda: None, on_progress=lambda f: None)
    try:
        events = []
        async with backend.generate(req) as gen:
            async for event in gen:
                events.append(event)
                if isinstance(event, protocol.Done | protocol.Error):
                    break
        return backend.info, events
    finally:
        await backend.stop()


@pytest.mark.slow
async def test_the_worker_refuses_a_suffix_on_a_vocabulary_without_fim_tokens(tmp_path):
    """The gateway refuses first (``fim.require_fim``); a request that reaches the worker anyway
    (a replica set's other member) is refused there too, naming the caller's field."""
    from gateway.models import testmodels as tm
    from gateway.protocol import Error, GenerationRequest

    tm.plain(tmp_path / "p.gguf")
    info, events = await _generate(tmp_path / "p.gguf", GenerationRequest(prompt="a", suffix="b",
                                                                         suffix_param="input_suffix"))
    assert info["fim"] is False
    assert isinstance(events[-1], Error) and events[-1].status == 400 and events[-1].param == "input_suffix"


@pytest.mark.slow
async def test_the_worker_lays_out_fim_by_the_tokens_texts(tmp_path):
    from gateway.models import testmodels as tm
    from gateway.protocol import Done, GenerationRequest, Start

    tm.write_scripted_model(tmp_path / "c.gguf", tm.Script([" ok"], trigger="<|fim_middle|>"),
                            extra_special=("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"))
    info, events = await _generate(tmp_path / "c.gguf", GenerationRequest(prompt="ab", suffix="cd", max_tokens=4))
    assert info["fim"] is True
    start, done = events[0], events[-1]
    assert isinstance(start, Start) and isinstance(done, Done) and done.completion_tokens == 1
    assert start.prompt_tokens == 8  # <s> <PRE> a b <SUF> c d <MID>: a byte token per character
