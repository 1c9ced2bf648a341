"""Fill-in-the-middle and /props against the real `gguf-gateway serve` process: a scripted model
whose vocabulary has FIM tokens (found by their texts, as llama.cpp does), one without, and a
random-weight model on llama.cpp's real StarCoder vocabulary; through /infill, Mistral's
/v1/fim/completions, the openai SDK's completions with ``suffix`` and the ollama SDK's generate
with ``suffix``."""

import json
import urllib.error
import urllib.request

import ollama
import openai
import pytest
from helpers import ServerProcess, request, tiny_random_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openapi import validate

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

FIM_SPECIAL = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
MIDDLE = [" return", " a", " +", " b"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("fim")
    tm.write_scripted_model(d / "coder.gguf", tm.Script(MIDDLE, trigger="<|fim_middle|>"), extra_special=FIM_SPECIAL)
    tm.write_scripted_model(d / "repo.gguf", tm.Script(MIDDLE, trigger="<|fim_middle|>"),
                            extra_special=(*FIM_SPECIAL, "<|repo_name|>", "<|file_sep|>"), fim_ids=True)
    tm.plain(d / "plain.gguf")
    (d / "star.gguf").symlink_to(tiny_random_model("starcoder", seed=7))
    (d / "qwen.gguf").symlink_to(tiny_random_model("qwen2", seed=1))  # llama.cpp's Qwen2 vocab file has no FIM tokens
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  models_dirs: [{d}]\n")
    with ServerProcess("--config", str(cfg), env={"HOME": str(d)}) as srv:
        yield srv


def post(server, path, body):
    return request(server.url + path, body)[:2]


def sse_events(server, path, body) -> list:
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        lines = r.read().decode().splitlines()
    return [line[len("data: "):] for line in lines if line.startswith("data: ")]


INFILL = {"model": "coder", "input_prefix": "def add(a, b):\n", "input_suffix": "\n\nprint(add(1, 2))\n"}


def test_infill_whole(server):
    status, body = post(server, "/infill", INFILL)
    assert status == 200, body
    assert body["content"] == "".join(MIDDLE)
    assert body["stop"] is True and body["stop_type"] == "eos" and body["model"] == "coder"
    assert body["tokens_predicted"] == len(MIDDLE) and body["tokens_evaluated"] > 0
    assert {"prompt_n", "prompt_ms", "predicted_n", "predicted_per_second"} <= set(body["timings"])


def test_infill_streamed_as_llama_server_streams_completion(server):
    events = sse_events(server, "/infill", {**INFILL, "stream": True, "input_extra": [{"filename": "u.py",
                                                                                       "text": "X = 1\n"}]})
    assert "[DONE]" not in events  # llama-server's /completion stream has none
    chunks = [json.loads(e) for e in events]
    assert "".join(c["content"] for c in chunks) == "".join(MIDDLE)
    assert [c["stop"] for c in chunks][-1] is True and not any(c["stop"] for c in chunks[:-1])
    assert chunks[-1]["tokens_predicted"] == len(MIDDLE)


def test_infill_as_llama_vim_sends_it(server):
    """llama.vim's request (its fields as its infill call sends them) and its flat response_fields."""
    status, body = post(server, "/infill", {
        "input_prefix": "def add(a, b):\n", "input_suffix": "\n", "input_extra": [], "prompt": "    ",
        "n_predict": 128, "stop": [], "n_indent": 4, "top_k": 40, "top_p": 0.90, "samplers": ["top_k", "top_p", "infill"],
        "stream": False, "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1000, "model": "coder",
        "response_fields": ["content", "timings/prompt_n", "timings/predicted_n", "tokens_cached", "truncated"]})
    assert status == 200, body
    assert set(body) == {"content", "timings/prompt_n", "timings/predicted_n", "tokens_cached", "truncated"}


def test_infill_n_predict_and_stop(server):
    status, body = post(server, "/infill", {**INFILL, "n_predict": 2})
    assert (status, body["content"], body["stop_type"]) == (200, " return a", "limit")
    status, body = post(server, "/infill", {**INFILL, "stop": [" +"]})
    assert (status, body["content"], body["stop_type"], body["stopping_word"]) == (200, " return a", "word", " +")


def test_infill_without_model_needs_one_when_several_are_served(server):
    assert post(server, "/infill", INFILL)[0] == 200  # coder running: it says it can fill (its header cannot)
    status, body = post(server, "/infill", {k: v for k, v in INFILL.items() if k != "model"})
    assert status == 400 and body["error"]["param"] == "model"
    # several of them can fill in the middle (repo's header says so): the error names those,
    # not the ones that cannot
    assert all(n in body["error"]["message"] for n in ("coder", "repo"))
    assert "plain" not in body["error"]["message"] and "qwen" not in body["error"]["message"]


def test_mistral_fim_route(server):
    status, body = post(server, "/v1/fim/completions", {"model": "coder", "prompt": "def add(a, b):\n",
                                                         "suffix": "\n", "max_tokens": 64})
    assert status == 200, body
    # Mistral's answer is a chat completion's shape, and Continue reads it so
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"] == "".join(MIDDLE)
    validate(body, "CreateChatCompletionResponse")
    assert body["choices"][0]["finish_reason"] == "stop" and body["usage"]["completion_tokens"] == len(MIDDLE)


def test_mistral_fim_route_streamed_as_continue_reads_it(server):
    """Continue's openai provider: ``for chunk of streamSse(resp): yield chunk.choices[0].delta.content``,
    so every chunk has a choice with a string content, the last one carrying the usage."""
    events = sse_events(server, "/v1/fim/completions", {"model": "coder", "prompt": "def add(a, b):\n",
                                                        "suffix": "\n", "max_tokens": 64, "stream": True,
                                                        "stop": ["\n\n"], "temperature": 0.2, "top_p": 0.9,
                                                        "frequency_penalty": 0, "presence_penalty": 0})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    for chunk in chunks:
        validate(chunk, "CreateChatCompletionStreamResponse")
    assert all(isinstance(c["choices"][0]["delta"]["content"], str) for c in chunks)
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == "".join(MIDDLE)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == len(MIDDLE)


def test_openai_sdk_completions_with_suffix(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        r = client.completions.create(model="coder", prompt="def add(a, b):\n", suffix="\n", max_tokens=32)
        assert r.choices[0].text == "".join(MIDDLE)
        validate(r.model_dump(exclude_unset=True), "CreateCompletionResponse")
        text = "".join(c.choices[0].text for c in client.completions.create(
            model="coder", prompt="def add(a, b):\n", suffix="\n", max_tokens=32, stream=True) if c.choices)
        assert text == "".join(MIDDLE)
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="plain", prompt="x", suffix="y")
        assert e.value.body["param"] == "suffix" and "fill in the middle" in e.value.body["message"]


def test_ollama_sdk_generate_with_suffix_and_show(server):
    with ollama.Client(host=server.url) as client:
        r = client.generate(model="coder", prompt="def add(a, b):\n", suffix="\n", stream=False)
        assert r.response == "".join(MIDDLE) and r.done
        streamed = "".join(part.response for part in client.generate(model="coder", prompt="def add(a, b):\n",
                                                                     suffix="\n", stream=True))
        assert streamed == "".join(MIDDLE)
        # Continue's ollama provider: raw, with its options and keep_alive
        r = client.generate(model="coder", prompt="def add(a, b):\n", suffix="\n", raw=True, stream=False,
                            options={"temperature": 0.01, "num_predict": 64, "stop": ["\n\n"]}, keep_alive=1800)
        assert r.response == "".join(MIDDLE)
        shown = client.show("coder")  # loaded now: its vocabulary's FIM tokens are known
        assert ".Suffix" in shown.template and "insert" in shown.capabilities
        with pytest.raises(ollama.ResponseError) as e:
            client.generate(model="plain", prompt="x", suffix="y", stream=False)
        assert e.value.status_code == 400 and "fill in the middle" in e.value.error


def test_a_real_vocabulary_without_fim_tokens_names_the_field(server):
    status, body = post(server, "/infill", {**INFILL, "model": "qwen"})
    assert status == 400 and body["error"]["param"] == "input_suffix" and "qwen" in body["error"]["message"]


def test_a_model_without_fim_tokens_names_the_field(server):
    status, body = post(server, "/infill", {**INFILL, "model": "plain"})
    assert status == 400 and body["error"]["param"] == "input_suffix"
    status, body = post(server, "/v1/fim/completions", {"model": "plain", "prompt": "a", "suffix": "b"})
    assert status == 400 and body["error"]["param"] == "suffix"


def test_real_vocabulary_with_fim_tokens(server):
    """StarCoder's vocabulary: <fim_prefix>, <fim_suffix>, <fim_middle> (no BOS, no repo tokens):
    the prompt is those three and the code's own tokens, and the code's special-looking text stays
    text."""
    def evaluated(prefix: str, suffix: str) -> int:
        status, body = post(server, "/infill", {"model": "star", "input_prefix": prefix, "input_suffix": suffix,
                                                "n_predict": 3, "temperature": 0})
        assert status == 200 and body["tokens_predicted"] <= 3, body
        return body["tokens_evaluated"]

    def tokens(text: str) -> int:
        return len(post(server, "/tokenize", {"model": "star", "content": text})[1]["tokens"])

    prefix, suffix = "def f(x):\n    return ", "\n\nprint(f(2))\n"
    assert evaluated(prefix, suffix) == tokens(prefix) + tokens(suffix) + 3  # <fim_prefix> <fim_suffix> <fim_middle>
    # "<fim_prefix>" written in the code is one special token to /tokenize, plain text to infill
    assert evaluated(prefix, "<fim_prefix>") > tokens(prefix) + tokens("<fim_prefix>") + 3
    status, body = post(server, "/infill", {"model": "star", "input_prefix": prefix, "input_suffix": "\n",
                                            "n_predict": 3, "input_extra": [{"filename": "a.py", "text": "A = 1\n"}]})
    assert status == 200, body


def test_repo_level_layout_with_extra_files(server):
    """A vocabulary with <|repo_name|> and <|file_sep|> (Qwen2.5-Coder's): each extra file after
    <|file_sep|> and its name, then the current file's; every piece tokenized on its own."""
    def tokens(text: str) -> int:
        return len(post(server, "/tokenize", {"model": "repo", "content": text})[1]["tokens"])

    prefix, suffix = "def add(a, b):\n", "\n\nprint(add(1, 2))\n"
    extra = [{"filename": "util.py", "text": "X = 1\n"}, {"filename": "b.py", "text": "Y = 2\n"}]
    status, body = post(server, "/infill", {"model": "repo", "input_prefix": prefix, "input_suffix": suffix,
                                            "input_extra": extra})
    assert status == 200 and body["content"] == "".join(MIDDLE), body
    want = (1 + tokens("myproject\n")  # <|repo_name|>myproject
            + sum(1 + tokens(e["filename"] + "\n") + tokens(e["text"]) for e in extra)  # <|file_sep|>name text
            + 1 + tokens("filename\n")  # <|file_sep|> of the file being edited
            + 1 + 1 + tokens(prefix) + 1 + tokens(suffix) + 1)  # <s> <PRE> prefix <SUF> suffix <MID>
    assert body["tokens_evaluated"] == want


def test_props(server):
    assert post(server, "/infill", {**INFILL, "n_predict": 2})[0] == 200  # loaded: what its worker reported
    status, body = server.get("/props?model=coder")
    assert status == 200, body
    assert body["default_generation_settings"]["n_ctx"] > 0 and body["total_slots"] >= 1
    assert body["model_path"].endswith("coder.gguf") and body["modalities"] == {"vision": False, "video": False,
                                                                                 "audio": False}
    assert body["chat_template"] and body["build_info"] and body["infill"] is True
    assert "temperature" in body["default_generation_settings"]["params"]
    status, body = server.get("/props")  # several models: llama-server's router answer
    assert status == 200 and body["role"] == "router"


@pytest.mark.parametrize("query", ["?model=nope", "?model=" + "x" * 300, "?model=%00", "?model=%FF%FE"])
def test_props_of_an_unknown_model_is_a_404_in_openais_shape(server, query):
    status, body = server.get("/props" + query)
    assert status == 404 and body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model"


def test_props_of_a_model_that_is_not_loaded_answers_without_loading_it(server):
    """A GET loads nothing (a page on any site can make a browser send one): a model that is not
    loaded answers from its spec and GGUF header, sleeping, as llama-server's /props answers
    while it sleeps (tests/test_reads_change_nothing.py: every GET route, from another site)."""
    assert request(server.url + "/models/unload", {"model": "star"})[0] == 200
    status, body = server.get("/props?model=star")
    assert status == 200 and body["model_alias"] == "star" and body["is_sleeping"] is True
    assert body["default_generation_settings"]["n_ctx"] > 0 and body["model_path"].endswith("star.gguf")
    assert next(m for m in server.get("/models")[1]["data"] if m["id"] == "star")["state"] == "unloaded"
    status, body = post(server, "/infill", {**INFILL, "model": "star", "n_predict": 2})  # loaded by a POST
    assert status == 200, body
    status, body = server.get("/props?model=star")
    assert status == 200 and body["is_sleeping"] is False and body["infill"] is True
    assert body["bos_token"] == "<|endoftext|>" or body["bos_token"]


@pytest.mark.parametrize("raw", [b"[]", b'"x"', b"{", b'{"input_prefix": "a", "input_suffix": "b", "model": []}',
                                 b'{"model": "coder", "input_prefix": "a", "input_suffix": "b", "input_extra": 5}',
                                 b'{"model": "coder", "input_prefix": "a", "input_suffix": "b", "input_extra": [[1]]}'])
def test_hostile_infill_is_a_400(server, raw):
    status, body, _ = request(server.url + "/infill", raw=raw)
    assert status == 400, body


def test_infill_with_a_huge_input_extra(server):
    extra = [{"filename": f"f{i}.py", "text": "x = 1\n" * 50} for i in range(1000)]
    status, body = post(server, "/infill", {**INFILL, "input_extra": extra, "n_predict": 4})
    assert status == 200, body
    status, body = post(server, "/infill", {**INFILL, "input_extra": extra * 2})
    assert status == 400 and body["error"]["param"] == "input_extra"


# --- fuzzed: one field of a valid request spoiled, never a 500 ------------------------------

HOSTILE = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                    st.text(max_size=20), st.sampled_from(["\ud800", "x" * 100_000, "<fim_middle>", "<|im_end|>"]),
                    st.lists(st.one_of(st.text(max_size=5), st.integers(), st.dictionaries(
                        st.sampled_from(["text", "filename", "x"]), st.one_of(st.text(max_size=5), st.integers()),
                        max_size=3)), max_size=4),
                    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))
VALID = {"/infill": {**INFILL, "n_predict": 2, "input_extra": [{"filename": "a", "text": "b"}]},
         "/v1/fim/completions": {"model": "coder", "prompt": "a", "suffix": "b", "max_tokens": 2},
         "/v1/completions": {"model": "coder", "prompt": "a", "suffix": "b", "max_tokens": 2}}
FIELDS = {"/infill": ["model", "input_prefix", "input_suffix", "input_extra", "prompt", "n_predict", "max_tokens",
                      "stream", "stop", "temperature", "seed", "ignore_eos"],
          "/v1/fim/completions": ["model", "prompt", "suffix", "max_tokens", "stream", "stop", "temperature",
                                  "random_seed", "top_p"],
          "/v1/completions": ["prompt", "suffix", "echo", "stream"]}


@pytest.mark.parametrize("path", list(VALID))
def test_fuzzed_fim_requests_never_500(server, path):
    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.sampled_from(FIELDS[path]), HOSTILE)
    def check(key, value):
        body = {**VALID[path], key: value}
        if isinstance(value, str) and "\ud800" in value:
            raw = json.dumps(body).encode()  # a lone surrogate, escaped: the body reader refuses it
        else:
            raw = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
        req = urllib.request.Request(server.url + path, data=raw, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                status, answer = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, answer = e.code, e.read()
        assert status in (200, 400, 404), (status, answer[:500])
        if status != 200:
            assert isinstance(json.loads(answer)["error"]["message"], str)

    check()


def test_huge_prefix_and_suffix_are_cut_not_refused(server):
    """A file far longer than the context: the prefix keeps its end and the suffix its start,
    as llama-server keeps them, and neither is tokenized whole."""
    status, body = post(server, "/infill", {**INFILL, "input_prefix": "x = 1\n" * 200_000,
                                            "input_suffix": "y = 2\n" * 200_000})
    assert status == 200 and body["content"] == "".join(MIDDLE), body
    assert body["tokens_evaluated"] < 4096
    status, body = post(server, "/infill", {**INFILL, "prompt": "z" * 2_000_000})  # never cut: refused
    assert status == 400 and body["error"]["param"] == "prompt"


@pytest.fixture(scope="module")
def solo(tmp_path_factory):
    """A gateway serving one coder model, as llama.vim and llama.vscode expect (no `model` sent)."""
    d = tmp_path_factory.mktemp("solo")
    tm.write_scripted_model(d / "coder.gguf", tm.Script(MIDDLE, trigger="<|fim_middle|>"), extra_special=FIM_SPECIAL)
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\nmodels:\n  coder:\n    path: {d}/coder.gguf\n"
                   "    n_ctx: 1024\n    defaults:\n      temperature: 0.2\n")
    with ServerProcess("--config", str(cfg), env={"HOME": str(d)}) as srv:
        yield srv


def test_one_model_answers_without_a_model_name(solo):
    status, body = post(solo, "/infill", {"input_prefix": "def add(a, b):\n", "input_suffix": "\n"})
    assert status == 200 and body["content"] == "".join(MIDDLE) and body["model"] == "coder", body
    status, body = solo.get("/props")
    assert status == 200 and body["model_alias"] == "coder", body
    assert body["default_generation_settings"]["n_ctx"] == 1024
    assert body["default_generation_settings"]["params"]["temperature"] == 0.2  # the model's models.yaml default


def test_show_tells_a_fim_model_from_its_header_before_it_loads(server):
    """Continue's Ollama provider reads /api/show at start-up and sends a suffix only where the
    template has .Suffix: a model whose header names its FIM tokens says so before any load."""
    assert post(server, "/models/unload", {"model": "repo"})[0] == 200  # an earlier test may have loaded it
    status, shown = post(server, "/api/show", {"model": "repo"})
    assert status == 200 and ".Suffix" in shown["template"] and "insert" in shown["capabilities"], shown
    status, shown = post(server, "/api/show", {"model": "plain"})
    assert status == 200 and ".Suffix" not in shown["template"] and "insert" not in shown["capabilities"]
