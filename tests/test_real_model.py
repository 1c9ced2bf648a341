"""The `real` tier: Gemma 3 270M (Q4_K_M, a 262k vocabulary, sliding-window attention) through
the real server, against llama.cpp's own decode of the same tokens (see ``realmodel.py``)."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest
from helpers import ServerProcess, run_cli
from realmodel import CACHE, Reference, gemma_path

from gateway.models import testmodels as tm

pytestmark = [pytest.mark.real, pytest.mark.slow]

N_CTX, N_BATCH, MAX_TOKENS = 4096, 512, 24
WORDS = ("river city people market bridge winter summer stone house garden road north south light "
         "water music story table window letter morning evening school forest field mountain").split()
SYSTEM_CHAT = [
    {"role": "system", "content": "You answer in one short sentence."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris is the capital of France."},
    {"role": "user", "content": "And of Italy?"},
]


def words(n: int, salt: int = 0) -> str:
    """``n`` words of prose-like filler (about one Gemma token each)."""
    return " ".join(WORDS[(i * 7 + i // 29 + salt) % len(WORDS)] for i in range(n))


@pytest.fixture(scope="module")
def gemma():
    return gemma_path()


@pytest.fixture(scope="module")
def gemma2_template():
    return tm.llama_cpp_source_file("models/templates/google-gemma-2-2b-it.jinja", CACHE / "templates").read_text()


@pytest.fixture(scope="module")
def server(gemma, gemma2_template, tmp_path_factory):
    """One gateway, the same file under five settings (the gateway's defaults otherwise)."""
    d = tmp_path_factory.mktemp("real")
    base = f"    path: {gemma}\n    n_ctx: {N_CTX}\n    n_batch: {N_BATCH}\n"
    (d / "gemma2.jinja").write_text(gemma2_template)
    cfg = d / "models.yaml"
    cfg.write_text(
        "server:\n  discover_default_stores: false\n  max_loaded_models: 5\nmodels:\n"
        f"  gemma:\n{base}    flash_attn: false\n"
        f"  gemma-fa:\n{base}    flash_attn: true\n"
        f"  gemma-swa:\n{base}    flash_attn: false\n    swa_full: false\n"
        f"  gemma-chat:\n{base}    flash_attn: false\n    defaults: {{temperature: 0, max_tokens: {MAX_TOKENS}}}\n"
        f"  gemma2-template:\n{base}    flash_attn: false\n    chat_template: {json.dumps(gemma2_template)}\n")
    with ServerProcess("--config", str(cfg), env={"HOME": str(d)}) as srv:
        srv.config = cfg
        yield srv
    assert srv.proc.returncode == 0


@pytest.fixture(scope="module")
def reference(gemma):
    """llama.cpp's decode with the gateway's settings, flash attention off and on; "swa" as the
    gemma-swa model (a sliding-window cache of the window only)."""
    refs = {fa: Reference(gemma, n_ctx=N_CTX, n_batch=N_BATCH, flash_attn=fa) for fa in (False, True)}
    refs["swa"] = Reference(gemma, n_ctx=N_CTX, n_batch=N_BATCH, flash_attn=False, swa_full=False)
    return refs


def post(server, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(server.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def complete(server, model: str, **body) -> dict:
    status, out = post(server, "/v1/completions", {"model": model, "temperature": 0, "max_tokens": MAX_TOKENS,
                                                   **body})
    assert status == 200, out
    return out


def chat(server, model: str, messages: list[dict], **body) -> dict:
    status, out = post(server, "/v1/chat/completions", {"model": model, "messages": messages, "temperature": 0,
                                                        "max_tokens": MAX_TOKENS, **body})
    assert status == 200, out
    return out


def stream(server, path: str, body: dict) -> tuple[str, str]:
    """(text, finish_reason) of a streamed answer, read as SSE."""
    req = urllib.request.Request(server.url + path, json.dumps({**body, "stream": True}).encode(),
                                 {"Content-Type": "application/json"})
    text, finish = [], None
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:
            if not line.startswith(b"data: {"):
                continue
            choice = json.loads(line[6:])["choices"][0]
            text.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
            finish = choice.get("finish_reason") or finish
    return "".join(text), finish


def gateway_tokens(server, model: str, messages: list[dict]) -> list[int]:
    """The tokens the gateway decodes for a chat request: its template's text, its tokenizer."""
    status, rendered = post(server, "/apply-template", {"model": model, "messages": messages})
    assert status == 200, rendered
    status, out = post(server, "/tokenize", {"model": model, "content": rendered["prompt"], "add_special": True})
    assert status == 200, out
    return out["tokens"]


# --- fidelity: the gateway's greedy answer is llama.cpp's ----------------------------------------

@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa-off", "fa-on"])
def test_greedy_answers_equal_llama_cpps_own_decode(server, reference, flash_attn):
    model, ref = ("gemma-fa" if flash_attn else "gemma"), reference[flash_attn]
    for prompt in ("The capital of France is", "A list of fruits:\n1.", "Once upon a time " + words(2900)):
        out = complete(server, model, prompt=prompt)
        tokens = ref.tokenize(prompt)
        assert out["usage"]["prompt_tokens"] == len(tokens)
        assert out["choices"][0]["text"] == ref.greedy(tokens, MAX_TOKENS), prompt[:40]
    out = chat(server, model, SYSTEM_CHAT)
    tokens = ref.tokenize(ref.chat_prompt(SYSTEM_CHAT))
    assert out["usage"]["prompt_tokens"] == len(tokens)
    assert out["choices"][0]["message"]["content"] == ref.greedy(tokens, MAX_TOKENS)


def test_chat_prompt_is_the_templates_token_for_token(server, reference):
    ref = reference[False]
    long_turns = [{"role": "user", "content": "Tell me about the river."},
                  {"role": "assistant", "content": "It is long and wide.\n\nIt floods in spring."},
                  {"role": "user", "content": "Why?  Say more ;)"}]
    for messages in (SYSTEM_CHAT, long_turns, [{"role": "system", "content": "Be terse."}, *long_turns]):
        # No template in this GGUF: the gateway, like llama.cpp, falls back to ChatML.
        assert gateway_tokens(server, "gemma", messages) == ref.tokenize(ref.chat_prompt(messages))
    status, rendered = post(server, "/apply-template", {"model": "gemma2-template", "messages": long_turns})
    template = rendered["prompt"]
    assert template.startswith("<bos><start_of_turn>user\n") and template.endswith("<start_of_turn>model\n")
    # a real Gemma template, with Gemma's own special tokens (single ids in this vocabulary)
    expected = ref.tokenize(ref.chat_prompt(long_turns, template="gemma"))
    assert gateway_tokens(server, "gemma2-template", long_turns) == expected
    assert expected.count(ref.tokenize("<start_of_turn>")[-1]) == 4
    out = chat(server, "gemma2-template", long_turns)
    assert out["usage"]["prompt_tokens"] == len(expected)
    assert out["choices"][0]["message"]["content"] == ref.greedy(expected, MAX_TOKENS)
    # that template refuses a system message: the caller hears it, in OpenAI's shape
    status, err = post(server, "/v1/chat/completions", {"model": "gemma2-template", "messages": SYSTEM_CHAT})
    assert status == 400 and err["error"]["param"] == "messages" and "System role" in err["error"]["message"]


# --- prefix reuse on a sliding-window model ---------------------------------------------------------

def _turns(first: str, answer: str) -> list[dict]:
    return [{"role": "user", "content": first}, {"role": "assistant", "content": answer},
            {"role": "user", "content": "Go on."}]


def test_second_turn_after_a_long_first_reuses_the_cache_and_answers_as_cold(server, reference):
    """Gemma 3 attends to the last 512 positions in most layers; the first turn is ~1,500 tokens.
    The next turn reuses the cached sequence, and (flash attention off, every position kept)
    answers exactly as a cold read of the whole prompt does."""
    ref = reference[False]
    first = "Read this and remember it. " + words(1500, salt=1)
    one = chat(server, "gemma", [{"role": "user", "content": first}])
    answer = one["choices"][0]["message"]["content"]
    messages = _turns(first, answer)
    two = chat(server, "gemma", messages)
    assert two["usage"]["prompt_tokens_details"]["cached_tokens"] > one["usage"]["prompt_tokens"] > 1500
    tokens = ref.tokenize(ref.chat_prompt(messages))
    assert two["usage"]["prompt_tokens"] == len(tokens)
    assert two["choices"][0]["message"]["content"] == ref.greedy(tokens, MAX_TOKENS)


def test_window_only_cache_reuses_a_continued_conversation(server, reference):
    """With `swa_full: false` the window's cells wrap, so the warm answer is compared with llama.cpp
    reading the prompt the same way: the first turn, then the rest from the cache."""
    ref = reference["swa"]
    first = "Read this and remember it. " + words(1500, salt=2)
    one = chat(server, "gemma-swa", [{"role": "user", "content": first}])
    t1 = ref.tokenize(ref.chat_prompt([{"role": "user", "content": first}]))
    answer = one["choices"][0]["message"]["content"]
    assert answer == ref.greedy(t1, MAX_TOKENS)
    messages = _turns(first, answer)
    two = chat(server, "gemma-swa", messages)
    assert two["usage"]["prompt_tokens_details"]["cached_tokens"] > len(t1)
    assert two["choices"][0]["message"]["content"] == \
        ref.greedy(ref.tokenize(ref.chat_prompt(messages)), MAX_TOKENS, reuse=True)


def test_a_cut_before_the_window_rereads_the_prompt_unless_every_position_is_kept(server, reference):
    """A prompt that leaves the cached one early (an edited message) moves the window back onto
    positions a window-only cache no longer holds: the gateway reads the whole prompt again rather
    than answer from a broken cache. With every position kept, the shared part is reused."""
    opening = "Keep these notes in mind. " + words(700, salt=3) + "\n\n"
    for model, ref, reused in (("gemma-swa", reference["swa"], False), ("gemma", reference[False], True)):
        chat(server, model, [{"role": "user", "content": opening + words(800, salt=4)}])
        edited = [{"role": "user", "content": opening + words(800, salt=5)}]
        out = chat(server, model, edited)
        cached = out["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert (cached > 600) if reused else (cached == 0), (model, out["usage"])
        assert out["choices"][0]["message"]["content"] == ref.greedy(ref.tokenize(ref.chat_prompt(edited)),
                                                                     MAX_TOKENS), model


# --- batching, streaming, the rest of the surface --------------------------------------------------

@pytest.mark.parametrize("model", ["gemma", "gemma-fa"])
def test_four_concurrent_greedy_streams_answer_as_each_alone(server, model):
    prompts = ["The capital of France is", "A list of fruits:\n1.", "The best way to cook rice is",
               "Once upon a time " + words(700)]
    alone = [complete(server, model, prompt=p, max_tokens=40)["choices"][0]["text"] for p in prompts]
    together: list[str | None] = [None] * len(prompts)

    def one(i: int) -> None:
        together[i] = complete(server, model, prompt=prompts[i], max_tokens=40)["choices"][0]["text"]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone


def test_streamed_and_whole_answers_agree(server):
    body = {"model": "gemma", "temperature": 0, "max_tokens": MAX_TOKENS}
    whole = complete(server, "gemma", prompt="The history of the city")["choices"][0]
    assert stream(server, "/v1/completions", {**body, "prompt": "The history of the city"}) == \
        (whole["text"], whole["finish_reason"])
    whole = chat(server, "gemma", SYSTEM_CHAT)["choices"][0]
    assert stream(server, "/v1/chat/completions", {**body, "messages": SYSTEM_CHAT}) == \
        (whole["message"]["content"], whole["finish_reason"])


def test_embeddings_are_refused_for_a_generating_model(server):
    status, err = post(server, "/v1/embeddings", {"model": "gemma", "input": "hello"})
    assert status == 501 and err["error"]["param"] == "model" and err["error"]["code"] == "unsupported_model"


def test_chat_command_shows_the_models_answer(server, reference):
    ref = reference[False]
    expected = ref.greedy(ref.tokenize(ref.chat_prompt([{"role": "user", "content": "Name a color."}])),
                          MAX_TOKENS)
    r = run_cli("chat", "gemma-chat", "--url", server.url, "--color", "never", input_text="Name a color.\n")
    assert r.returncode == 0, r.stderr
    assert expected.strip() and expected.strip() in r.stdout
