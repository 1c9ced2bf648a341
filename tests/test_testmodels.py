"""The scripted-model generator, checked by running its files in llama.cpp itself."""

import llama_cpp
import pytest
from helpers import REPO

from gateway.models import testmodels as tm
from gateway.models.ggufmeta import read_info

CHAT_PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def generate(path, prompt: str, limit: int = 200, temperature: float = 0.0) -> list[bytes]:
    """Greedy (or sampled) decode until end of generation; one rendered piece per token."""
    llm = llama_cpp.Llama(str(path), n_ctx=512, n_threads=2, verbose=False, seed=1)
    tokens = llm.tokenize(prompt.encode(), add_bos=True, special=True)
    pieces = []
    for tok in llm.generate(tokens, temp=temperature, top_k=0 if temperature else 1):
        if llama_cpp.llama_vocab_is_eog(llm._model.vocab, tok) or len(pieces) >= limit:
            break
        pieces.append(llm.detokenize([tok], special=True))
    llm.close()
    return pieces


def test_plain_answer(tmp_path):
    m = tm.plain(tmp_path / "m.gguf", ["Hello", ",", " world", "!"])
    assert generate(m.path, CHAT_PROMPT) == [b"Hello", b",", b" world", b"!"] == m.pieces["\n"]
    assert m.text() == "Hello, world!" and m.n_tokens() == 4


def test_sampling_at_high_temperature_still_follows_the_script(tmp_path):
    m = tm.plain(tmp_path / "m.gguf", ["one", " two", " three"])
    assert b"".join(generate(m.path, CHAT_PROMPT, temperature=1.5)) == b"one two three"


@pytest.mark.parametrize("split", [False, True])
def test_thinking_markers_as_special_tokens_or_split(tmp_path, split):
    m = tm.thinking(tmp_path / "m.gguf", "Two and two.", "It is 4.", split_markers=split)
    pieces = generate(m.path, CHAT_PROMPT)
    assert b"".join(pieces) == b"<think>Two and two.</think>It is 4."
    if split:
        assert pieces[:3] == [b"<th", b"ink", b">"]
    else:
        assert pieces[0] == b"<think>"
        llm = llama_cpp.Llama(str(m.path), n_ctx=64, verbose=False)
        think = llm.tokenize(b"<think>", add_bos=False, special=True)
        assert len(think) == 1 and llm.detokenize(think, special=False) == b""  # a control token
        llm.close()


def test_utf8_split_over_byte_tokens(tmp_path):
    m = tm.utf8_split(tmp_path / "m.gguf", "5€ naïve 🙂")
    pieces = generate(m.path, "x\n")
    assert b"".join(pieces).decode() == "5€ naïve 🙂"
    assert [b"\xe2", b"\x82", b"\xac"] == pieces[1:4]  # € arrives one byte per token
    assert len(pieces) == m.n_tokens()


def test_endless_loop(tmp_path):
    m = tm.endless(tmp_path / "m.gguf", [" tick", " tock"])
    assert b"".join(generate(m.path, "x\n", limit=7)) == b" tick tock tick tock tick tock tick"


def test_repeated_text_is_spelled_with_fresh_tokens(tmp_path):
    m = tm.write_scripted_model(tmp_path / "m.gguf", ["go", " go", " go", " go", "!", "!"])
    assert b"".join(generate(m.path, "x\n")) == b"go go go go!!"


def test_several_scripts_by_trigger(tmp_path):
    m = tm.write_scripted_model(tmp_path / "m.gguf", [tm.Script(["yes"]), tm.Script(["no", " way"], trigger="?")])
    assert b"".join(generate(m.path, "x\n")) == b"yes"
    assert b"".join(generate(m.path, "really?")) == b"no way"
    assert generate(m.path, "no trigger here") == []


def test_a_repeated_special_token_is_refused(tmp_path):
    with pytest.raises(ValueError, match="only once"):
        tm.write_scripted_model(tmp_path / "m.gguf", [tm.Special("<x>"), "a", tm.Special("<x>")])


def test_header_metadata(tmp_path):
    m = tm.plain(tmp_path / "m.gguf")
    info = read_info(m.path)
    assert (info.architecture, info.quantization, info.name, info.has_chat_template) == ("llama", "F16", "scripted", True)


@pytest.fixture(scope="session")
def vocab_cache():
    return REPO / ".cache" / "vocab"  # kept between runs of one checkout (git ignores it)


def test_random_weight_model_with_a_real_vocabulary(tmp_path, vocab_cache):
    vocab = tm.find_vocab("llama-spm", cache_dir=vocab_cache)
    path = tm.write_random_model(tmp_path / "r.gguf", vocab, n_embd=64, n_layer=1, n_head=2, n_ff=64)
    llm = llama_cpp.Llama(str(path), n_ctx=128, n_threads=2, verbose=False)
    assert llm.n_vocab() == 32000
    assert llm.tokenize(b"Hello world", add_bos=False) == [15043, 3186]  # llama's real SentencePiece ids
    out = llm.create_completion("Hello", max_tokens=5, temperature=0)
    assert out["usage"]["completion_tokens"] >= 1
    llm.close()


def test_command_line_writes_the_scripted_set(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_models", REPO / "scripts" / "gen_models.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    made = gen.write_all(tmp_path)
    assert set(made) == {"plain", "think", "think-split", "utf8", "endless", "demo"}
    assert b"".join(generate(made["demo"], CHAT_PROMPT)).decode().startswith("Hello! This is the gguf-gateway demo")
