"""LoRA adapters at run time (issue 55), against the real `gguf-gateway serve` process and
llama.cpp's own `llama-server` of the vendored version (``scripts/rpc_build.server``), on SmolLM2
135M Instruct with random adapters (``testmodels.random_lora``), greedy:

- the adapter files themselves: each loads in llama.cpp (the scripted model, SmolLM2, Gemma 3),
  one of B = 0 gives exactly the base's logits, a random one changes the greedy answer;
- llama-server's per-request ``lora`` field gives the same text on both servers, scale by scale;
- an adapter at scale 0, or a zero one, gives exactly the base's log-probabilities;
- two streams on one model's two slots under two adapters each answer as alone, both moving;
- a prompt's cache made under one adapter is never read under another, and is under its own;
- ``BASE:ADAPTER`` model names through the official openai client, and the listing;
- adapters loaded and unloaded at run time (vLLM's routes), one made for another model refused
  with llama.cpp's reason, and the default scales set (llama-server's ``POST /lora-adapters``).
"""

from __future__ import annotations

import ctypes
import http.client
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import numpy as np
import openai
import pytest
from helpers import REPO, ServerProcess, free_port, request, tiny_random_model
from realmodel import gemma_path, smollm_path

from gateway.models import ggufmeta
from gateway.models import testmodels as tm

sys.path.insert(0, str(REPO / "scripts"))
import rpc_build  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.real]

N_CTX, THREADS, STD = 1024, 2, 0.08  # STD: SmolLM2 answers otherwise, still in words
PROMPTS = ["The capital of France is", "def fib(n):"]  # the adapter files' own tests
HI = [{"role": "user", "content": "Write one sentence about the sea."}]
# both servers alike: the gateway's slot of N_CTX tokens, its batch, its threads, no repacked weights
# (the gateway's repack: false), no speculation (llama-server's default); flash attention: each's auto.
# (Their answers are equal where both llama.cpps are built for this CPU: llama-cpp-python from its
# sdist, as rpc_build builds llama-server.)
MODEL = f"    path: {{path}}\n    n_ctx: {N_CTX}\n    parallel: 2\n    n_threads: {THREADS}\n    spec_type: none\n"


# --- the adapter files, in llama.cpp itself ------------------------------------------------------

def _decode(ll, model, adapter, prompt: str, n: int) -> tuple[np.ndarray, list[int]]:
    """The first step's logits and the greedy tokens of ``prompt`` under ``adapter`` (at scale 1)."""
    cp = ll.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_threads, cp.n_threads_batch = 256, 256, THREADS, THREADS
    ctx = ll.llama_init_from_model(model, cp)
    assert ctx
    try:
        if adapter is not None:
            handles = (ll.llama_adapter_lora_p_ctypes * 1)(adapter)
            assert ll.llama_set_adapters_lora(ctx, handles, 1, (ctypes.c_float * 1)(1.0)) == 0
        vocab = ll.llama_model_get_vocab(model)
        buf = (ll.llama_token * 256)()
        tokens = list(buf[:ll.llama_tokenize(vocab, prompt.encode(), len(prompt.encode()), buf, 256, True, True)])
        first, out = None, []
        for _ in range(n):
            batch = (ll.llama_token * len(tokens))(*tokens)
            assert ll.llama_decode(ctx, ll.llama_batch_get_one(batch, len(tokens))) == 0
            logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, -1), shape=(ll.llama_vocab_n_tokens(vocab),))
            first = logits.copy() if first is None else first
            tokens = [int(logits.argmax())]
            out += tokens
        return first, out
    finally:
        ll.llama_free(ctx)


@pytest.mark.parametrize("which", ["scripted", "smollm", "gemma"])
def test_random_adapters_load_in_llama_cpp_and_a_zero_one_changes_nothing(tmp_path, which):
    import llama_cpp as ll

    path = {"scripted": lambda: tm.plain(tmp_path / "plain.gguf").path, "smollm": smollm_path,
            "gemma": gemma_path}[which]()
    rand = tm.random_lora(path, tmp_path / "rand.gguf", seed=1, std=STD)
    zero = tm.random_lora(path, tmp_path / "zero.gguf", seed=1, std=STD, zero=True)
    wrong = tm.random_lora(tiny_random_model("qwen2", seed=1), tmp_path / "other.gguf")  # a llama of n_embd 64
    params = ll.llama_model_default_params()
    params.use_extra_bufts = False
    model = ll.llama_model_load_from_file(str(path).encode(), params)
    assert model
    try:
        handles = {k: ll.llama_adapter_lora_init(model, str(p).encode()) for k, p in (("rand", rand), ("zero", zero))}
        assert all(handles.values()), handles
        assert not ll.llama_adapter_lora_init(model, str(wrong).encode())  # other shapes (Gemma: another arch)
        base = _decode(ll, model, None, PROMPTS[0], 8)
        under_zero = _decode(ll, model, handles["zero"], PROMPTS[0], 8)
        under_rand = _decode(ll, model, handles["rand"], PROMPTS[0], 8)
        assert np.array_equal(under_zero[0], base[0]) and under_zero[1] == base[1]
        assert not np.array_equal(under_rand[0], base[0])
        if which != "scripted":  # a scripted model's successors win by margins no small adapter moves
            assert under_rand[1] != base[1]
    finally:
        ll.llama_model_free(model)


def test_the_shapes_follow_the_base_and_the_seed(tmp_path):
    import gguf

    path = smollm_path()
    a = tm.random_lora(path, tmp_path / "a.gguf", seed=3, rank=8, alpha=16, targets=("attn_q", "ffn_down"))
    again = tm.random_lora(path, tmp_path / "again.gguf", seed=3, rank=8, alpha=16, targets=("attn_q", "ffn_down"))
    other = tm.random_lora(path, tmp_path / "other.gguf", seed=4, rank=8, alpha=16, targets=("attn_q", "ffn_down"))
    assert a.read_bytes() == again.read_bytes() != other.read_bytes()
    base = {name: list(dims) for name, dims in ggufmeta.tensor_shapes(path).items()}
    r = gguf.GGUFReader(str(a))
    assert r.fields["general.type"].contents() == "adapter" and r.fields["adapter.type"].contents() == "lora"
    assert r.fields["adapter.lora.alpha"].contents() == 16 and r.fields["general.architecture"].contents() == "llama"
    shapes = {t.name: [int(x) for x in t.shape] for t in r.tensors}
    assert len(shapes) == 2 * 2 * 30  # two targets, two matrices each, SmolLM2's 30 blocks
    for name, (n_in, n_out) in ((n, base[n]) for n in base if n.endswith(("attn_q.weight", "ffn_down.weight"))):
        assert shapes[f"{name}.lora_a"] == [n_in, 8] and shapes[f"{name}.lora_b"] == [8, n_out]


# --- the servers ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def files(tmp_path_factory) -> SimpleNamespace:
    d = tmp_path_factory.mktemp("lora")
    smol = smollm_path()
    return SimpleNamespace(
        dir=d, model=smol,
        a=tm.random_lora(smol, d / "a.gguf", seed=1, std=STD), b=tm.random_lora(smol, d / "b.gguf", seed=2, std=STD),
        zero=tm.random_lora(smol, d / "zero.gguf", seed=3, std=STD, zero=True),
        c=tm.random_lora(smol, d / "c.gguf", seed=4, std=STD),  # loaded at run time
        other=tm.random_lora(tiny_random_model("qwen2", seed=1), d / "other.gguf"))  # another model's


@pytest.fixture(scope="module")
def gateway(files):
    """``smol``: adapters a, b, zero (ids 0, 1, 2) and half (a's file at 0.5, id 3), none applied
    unless asked; ``cache``: the same model with x and y (a's and b's files), for the cache test."""
    model = MODEL.format(path=files.model)
    cfg = files.dir / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\nmodels:\n"
                   f"  smol:\n{model}    loras:\n      a: {files.a}\n      b: {files.b}\n      zero: {files.zero}\n"
                   f"      half: {{path: {files.a}, scale: 0.5}}\n"
                   f"  cache:\n{model}    loras: {{x: {files.a}, y: {files.b}}}\n")
    with ServerProcess("--config", str(cfg), env={"HOME": str(files.dir)}) as srv:
        yield srv


@pytest.fixture(scope="module")
def llama_server(files):
    """The vendored llama-server with a and b as ids 0 and 1 at scale 0: applied only where a
    request's ``lora`` asks (``--lora-init-without-apply`` would not do: it leaves their listed
    scales at 1, which every request without ``lora`` then gets)."""
    port = free_port()
    log = files.dir / "llama-server.log"
    with log.open("w") as out:
        proc = subprocess.Popen([str(rpc_build.server()), "-m", str(files.model), "--host", "127.0.0.1", "--port",
                                 str(port), "-c", str(N_CTX), "--parallel", "1", "-b", "512", "-ub", "512",
                                 "-t", str(THREADS), "-tb", str(THREADS), "--no-repack", "--no-webui",
                                 "--lora-scaled", f"{files.a}:0,{files.b}:0"],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(url + "/health", timeout=5):
                    break
            except (urllib.error.URLError, ConnectionError):  # (503 while it loads)
                time.sleep(0.1)
        else:
            pytest.fail(f"llama-server did not become ready: {log.read_text()[-3000:]}")
        yield url
    finally:
        proc.kill()
        proc.wait()


def complete(url: str, prompt: str, max_tokens: int = 24, **body) -> dict:
    status, got, _ = request(url + "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens,
                                                       "temperature": 0, **body}, timeout=300)
    assert status == 200, got
    return got


def text(url: str, prompt: str, **body) -> str:
    return complete(url, prompt, **body)["choices"][0]["text"]


def steady(url: str, prompt: str, **body) -> str:
    """The answer with the prompt's cache warm under its adapters, as every later ask of it finds
    it: asked twice, the second. (Under an adapter, llama.cpp's logits of a token depend in their
    last bits on the batch it is read in: the F32 adapter's products take llama.cpp's matrix
    kernels, which are not batch-invariant as the base's quantized ones are here. A prompt read
    whole and one whose cached prefix leaves its end to be read alone can answer otherwise, on
    llama-server as here.)"""
    text(url, prompt, **body)
    return text(url, prompt, **body)


def post(url: str, body) -> tuple[int, str]:
    """POST JSON; (status, the answer's text): vLLM's adapter routes answer in plain text."""
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def chat(url: str, **body) -> dict:
    status, got, _ = request(url + "/v1/chat/completions", {"messages": HI, "max_tokens": 8, "temperature": 0,
                                                            **body}, timeout=300)
    assert status == 200, got
    return got


# --- the tests ----------------------------------------------------------------------------------

LORAS = [[{"id": 0, "scale": 0.0}], [{"id": 0, "scale": 0.5}], [{"id": 0, "scale": 1.0}], [{"id": 1, "scale": 1.0}],
         [{"id": 0, "scale": 0.5}, {"id": 1, "scale": 0.5}]]
BOTH = ["Paris is a city where", "def gcd(a, b):"]  # this test's own: no other asks them, each set reads them whole


def test_a_request_lora_answers_as_llama_server_scale_by_scale(gateway, llama_server):
    for prompt in BOTH:
        base = text(gateway.url, prompt, model="smol")
        # llama-server reads every prompt afresh here: it keeps a slot's cache across a change of
        # adapters where a request has no lora, and its cache_ram ignores adapters
        assert text(llama_server, prompt, cache_prompt=False) == base
        answers = []
        for lora in LORAS:
            ours = text(gateway.url, prompt, model="smol", lora=lora)
            assert ours == text(llama_server, prompt, lora=lora, cache_prompt=False), (prompt, lora)
            answers.append(ours)
        assert answers[0] == base  # scale 0: the base
        assert answers[2] != base and answers[3] != base, answers  # a and b at 1 answer otherwise
    mine = gateway.get("/lora-adapters?model=smol")[1]
    with urllib.request.urlopen(llama_server + "/lora-adapters", timeout=10) as r:
        theirs = json.loads(r.read())
    assert [{k: e[k] for k in ("id", "path", "scale")} for e in mine[:2]] == \
           [{k: e[k] for k in ("id", "path", "scale")} for e in theirs]
    assert [e["name"] for e in mine] == ["a", "b", "zero", "half"]


def _logprobs(got: dict) -> list:
    return got["choices"][0]["logprobs"]["content"]


def test_scale_zero_and_a_zero_adapter_give_exactly_the_bases_logprobs(gateway):
    want = {"logprobs": True, "top_logprobs": 5}
    base = _logprobs(chat(gateway.url, model="smol", **want))
    assert len(base) == 8 and all(len(t["top_logprobs"]) == 5 for t in base)
    assert _logprobs(chat(gateway.url, model="smol:zero", **want)) == base
    assert _logprobs(chat(gateway.url, model="smol", lora=[{"id": 2, "scale": 1.0}], **want)) == base
    assert _logprobs(chat(gateway.url, model="smol", lora=[{"id": 0, "scale": 0.0}], **want)) == base
    under_a = _logprobs(chat(gateway.url, model="smol:a", **want))
    assert under_a != base and under_a[0]["top_logprobs"] != base[0]["top_logprobs"]
    assert _logprobs(chat(gateway.url, model="smol", **want)) == base  # the base's again, after a


def _stream(url: str, body: dict, events: list, who: str, lock: threading.Lock) -> str:
    conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=300)
    conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, r.read()
    got = ""
    for line in r:
        if line.startswith(b"data: {"):
            piece = "".join(c.get("text") or "" for c in json.loads(line[6:]).get("choices", ()))
            if piece and not got:
                with lock:
                    events.append(("first", who))
            got += piece
    with lock:
        events.append(("done", who))
    conn.close()
    return got


def test_two_streams_under_two_adapters_answer_as_alone_and_both_move(gateway):
    body = {"prompt": "Once upon a time, in a small village by the sea,", "max_tokens": 48, "ignore_eos": True}
    alone = {who: steady(gateway.url, **body, model=f"smol:{who}") for who in ("a", "b")}
    assert alone["a"] != alone["b"]
    events: list[tuple[str, str]] = []
    lock, start = threading.Lock(), threading.Barrier(2)
    got: dict[str, str] = {}

    def run(who: str) -> None:
        start.wait()
        got[who] = _stream(gateway.url, {**body, "temperature": 0, "model": f"smol:{who}"}, events, who, lock)

    threads = [threading.Thread(target=run, args=(who,)) for who in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == alone
    # neither waited for the other's end: each one's first text came before the other finished
    assert events.index(("first", "a")) < events.index(("done", "b")), events
    assert events.index(("first", "b")) < events.index(("done", "a")), events


def _cached(got: dict) -> int:
    return got["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_a_cache_made_under_one_adapter_is_never_read_under_another(gateway):
    words = "river city people market bridge winter summer stone house garden road north south light".split()
    prompt = "A long note. " + " ".join(words[(i * 7 + i // 5) % len(words)] for i in range(500)) + "\nSummary:"
    # references from the other entry of the same model: read whole, and with all but the last token cached
    b_alone, base_alone = text(gateway.url, prompt, model="smol:b"), text(gateway.url, prompt, model="smol")
    a_fresh = complete(gateway.url, prompt, model="smol:a")
    a_warm = complete(gateway.url, prompt, model="smol:a")
    first = complete(gateway.url, prompt, model="cache:x")
    assert _cached(first) == 0 and first["usage"]["prompt_tokens"] > 400
    assert first["choices"][0]["text"] == a_fresh["choices"][0]["text"]
    under_b = complete(gateway.url, prompt, model="cache:y")
    assert _cached(under_b) == 0  # x's cells are not y's
    assert under_b["choices"][0]["text"] == b_alone != first["choices"][0]["text"]
    again = complete(gateway.url, prompt, model="cache:x")
    assert _cached(again) == _cached(a_warm) > 0
    assert again["choices"][0]["text"] == a_warm["choices"][0]["text"]
    base = complete(gateway.url, prompt, model="cache")
    assert _cached(base) == 0 and base["choices"][0]["text"] == base_alone


def test_adapter_model_names_through_the_openai_client(gateway):
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0, timeout=300) as client:
        listed = {m.id: m for m in client.models.list()}
        assert {"smol", "smol:a", "smol:b", "smol:zero", "smol:half", "cache:x", "cache:y"} <= set(listed)
        assert listed["smol:a"].model_extra["parent"] == "smol" and listed["cache:y"].model_extra["parent"] == "cache"

        def answer(model: str, **extra) -> str:
            r = client.chat.completions.create(model=model, messages=HI, temperature=0, max_tokens=16,
                                               extra_body=extra or None)
            return r.choices[0].message.content

        for model in ("smol:a", "smol:half"):  # each set's cache warm: each answer below reads the same way
            answer(model)
        named = answer("smol:a")
        assert named == answer("smol", lora=[{"id": 0, "scale": 1.0}]) == answer("a")  # a: one model's alone
        assert named != answer("smol")
        assert answer("smol:half") == answer("smol", lora=[{"id": 0, "scale": 0.5}]) != named  # its scale
        with pytest.raises(openai.NotFoundError):
            answer("smol:nothing")


def test_an_adapter_loaded_at_run_time_serves_until_unloaded(gateway, files):
    prompt = "The capital of France is"
    base = text(gateway.url, prompt, model="smol")
    status, said = post(gateway.url + "/v1/load_lora_adapter", {"lora_name": "smol:c", "lora_path": str(files.c)})
    assert status == 200, said
    table = gateway.get("/lora-adapters?model=smol")[1]
    assert [(e["id"], e["name"]) for e in table] == [(0, "a"), (1, "b"), (2, "zero"), (3, "half"), (4, "c")]
    assert table[4]["path"] == str(files.c) and table[4]["scale"] == 0  # named: applied where asked
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0) as client:
        assert "smol:c" in {m.id for m in client.models.list()}
    under_c = steady(gateway.url, prompt, model="smol:c")
    assert under_c == text(gateway.url, prompt, model="smol", lora=[{"id": 4, "scale": 1.0}])
    assert under_c != base
    status, said = post(gateway.url + "/v1/unload_lora_adapter", {"lora_name": "smol:c"})
    assert status == 200, said
    status, body, _ = request(gateway.url + "/v1/completions", {"model": "smol:c", "prompt": "Hi", "max_tokens": 2})
    assert status == 404 and body["error"]["code"] == "model_not_found", body
    assert [e["name"] for e in gateway.get("/lora-adapters?model=smol")[1]] == ["a", "b", "zero", "half"]
    # made for another model: llama.cpp's reason, and the model serves on
    status, said = post(gateway.url + "/v1/load_lora_adapter",
                        {"lora_name": "other", "base_model_name": "smol", "lora_path": str(files.other)})
    assert status == 400 and "has incorrect shape" in json.loads(said)["error"]["message"], said
    assert "other" not in [e["name"] for e in gateway.get("/lora-adapters?model=smol")[1]]
    assert text(gateway.url, prompt, model="smol") == base


def test_the_default_scales_apply_to_requests_that_name_no_adapter(gateway):
    prompt = "def fib(n):"
    base, under_a = text(gateway.url, prompt, model="smol"), steady(gateway.url, prompt, model="smol:a")
    status, body, _ = request(gateway.url + "/lora-adapters?model=smol", [{"id": 0, "scale": 1.0}])
    assert status == 200, body
    try:
        assert [e["scale"] for e in gateway.get("/lora-adapters?model=smol")[1]] == [1.0, 0, 0, 0]
        assert text(gateway.url, prompt, model="smol") == under_a
        # a name adds its adapter to the defaults
        both = steady(gateway.url, prompt, model="smol:b")
        assert both == text(gateway.url, prompt, model="smol", lora=[{"id": 0, "scale": 1.0}, {"id": 1, "scale": 1.0}])
    finally:
        status, body, _ = request(gateway.url + "/lora-adapters?model=smol", [])
        assert status == 200, body
    assert text(gateway.url, prompt, model="smol") == base
