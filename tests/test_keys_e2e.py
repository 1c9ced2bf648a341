"""Keys that scope and count, against the real `gguf-gateway serve` process, through the
official clients (openai, anthropic, ollama) as their users call them:

- each limit (rpm, tpm, max_parallel, budget) in each wire (OpenAI chat, Responses, Anthropic
  Messages, Ollama chat) is the client's own rate-limit error, naming the limit;
- a model outside a key's list is the client's not-found error and missing from its listing;
- a SIGHUP that narrows a key's models takes effect on the next request while a stream in
  flight finishes; a key removed from the keys file is refused within seconds;
- usage survives a restart."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator

import anthropic
import ollama
import openai
import pytest
from helpers import ServerProcess

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

ROOT = "root-key-e2e"
LONG = 6000  # tokens a stream asks for: it stays in flight while the test looks (the client reads slowly)
WIRES = ("chat", "responses", "messages", "ollama")
LIMITS = {"rpm": "rpm: 1", "tpm": "tpm: 5", "max_parallel": "max_parallel: 1", "budget": "budget: 5, budget_period: day"}


def key_of(wire: str, limit: str) -> str:
    return f"{wire}-{limit}-key"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys-e2e")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    tm.endless(d / "loop.gguf")
    tm.thinking(d / "thinker.gguf", "Hmm.", "It is 4.")
    return d


def write(d, extra_keys: str = "", narrow: bool = False) -> str:
    cfg = d / "models.yaml"
    keys = "".join(f"    {w}-{lim}: {{key: {key_of(w, lim)}, {rule}}}\n" for w in WIRES for lim, rule in LIMITS.items())
    scoped = "[plain]" if narrow else "[plain, loop]"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  api_keys_file: {d}/keys.yaml\n"
                   f"  usage_db: {d}/usage.db\n  api_keys:\n    root: {ROOT}\n"
                   f"    scoped: {{key: scoped-key, models: {scoped}}}\n{keys}{extra_keys}"
                   f"models:\n  plain: {d}/plain.gguf\n  thinker: {d}/thinker.gguf\n"
                   f"  loop:\n    path: {d}/loop.gguf\n    parallel: 4\n    n_ctx: 16384\n")
    return str(cfg)


@pytest.fixture(scope="module")
def server(files):
    (files / "keys.yaml").write_text("ci: ci-key\n")
    with ServerProcess("--config", write(files), env={"HOME": str(files)}) as srv:
        yield srv


def call(wire: str, url: str, key: str, model: str = "plain", stream: bool = False) -> Iterator[object]:
    """One request in ``wire`` through its official client; a stream yields its events."""
    msgs = [{"role": "user", "content": "hi"}]
    if wire in ("chat", "responses"):
        with openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0) as c:
            if wire == "chat":
                out = c.chat.completions.create(model=model, messages=msgs, max_tokens=LONG if stream else 3,
                                                stream=stream)
            else:
                out = c.responses.create(model=model, input="hi", max_output_tokens=LONG if stream else 3, stream=stream)
            yield from (out if stream else [out])
    elif wire == "messages":
        with anthropic.Anthropic(base_url=url, api_key=key, max_retries=0) as a:
            out = a.messages.create(model=model, messages=msgs, max_tokens=LONG if stream else 3, stream=stream)
            yield from (out if stream else [out])
    else:
        with ollama.Client(host=url, headers={"Authorization": f"Bearer {key}"}) as o:
            out = o.chat(model=model, messages=msgs, stream=stream, options={"num_predict": LONG if stream else 3})
            yield from (out if stream else [out])


def limited(wire: str, fn: Callable[[], object]) -> str:
    """The message of the client's own rate-limit error that ``fn`` raises."""
    if wire == "messages":
        with pytest.raises(anthropic.RateLimitError) as a:
            fn()
        return str(a.value)
    if wire == "ollama":
        with pytest.raises(ollama.ResponseError) as o:
            fn()
        assert o.value.status_code == 429
        return str(o.value)
    with pytest.raises(openai.RateLimitError) as e:
        fn()
    return str(e.value)


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("limit", list(LIMITS))
def test_each_limit_in_each_wire_is_the_clients_rate_limit_error(server, wire, limit):
    key = key_of(wire, limit)
    if limit == "max_parallel":
        stream = call(wire, server.url, key, "loop", stream=True)
        next(stream)  # one answer in flight
        message = limited(wire, lambda: list(call(wire, server.url, key)))
        stream.close()
    else:
        list(call(wire, server.url, key))  # within the limit; spends more than 5 tokens
        message = limited(wire, lambda: list(call(wire, server.url, key)))
    assert limit in message


@pytest.mark.parametrize("wire", WIRES)
def test_a_model_outside_the_keys_list_is_not_found_and_not_listed(server, wire):
    errors = {"chat": openai.NotFoundError, "responses": openai.NotFoundError, "messages": anthropic.NotFoundError,
              "ollama": ollama.ResponseError}
    with pytest.raises(errors[wire]) as e:
        list(call(wire, server.url, "scoped-key", "thinker"))
    assert getattr(e.value, "status_code", None) == 404
    with openai.OpenAI(base_url=server.url + "/v1", api_key="scoped-key", max_retries=0) as c:
        assert sorted(m.id for m in c.models.list()) == ["loop", "plain"]
    with ollama.Client(host=server.url, headers={"Authorization": "Bearer scoped-key"}) as o:
        assert sorted(m.model for m in o.list().models) == ["loop:latest", "plain:latest"]
    with openai.OpenAI(base_url=server.url + "/v1", api_key=ROOT, max_retries=0) as c:
        assert "thinker" in {m.id for m in c.models.list()}


def test_sighup_narrows_a_key_on_its_next_request_while_its_stream_finishes(server, files):
    stream = call("chat", server.url, "scoped-key", "loop", stream=True)
    first = next(stream)
    write(files, narrow=True)
    os.kill(server.proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            list(call("chat", server.url, "scoped-key", "loop"))
        except openai.NotFoundError:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the narrowed key still reached the model")
    rest = list(stream)  # the stream in flight ends as it would have
    assert first is not None and rest[-1].choices[0].finish_reason == "length"
    assert len(rest) >= LONG // 2
    write(files)
    os.kill(server.proc.pid, signal.SIGHUP)


def test_a_key_removed_from_the_keys_file_is_refused_within_seconds(server, files):
    list(call("chat", server.url, "ci-key"))
    (files / "keys.yaml").write_text("other: other-key\n")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            list(call("chat", server.url, "ci-key"))
        except openai.AuthenticationError:
            break
        time.sleep(0.3)
    else:
        pytest.fail("the revoked key still works")
    list(call("chat", server.url, "other-key"))


def test_usage_survives_a_restart(files):
    with ServerProcess("--config", write(files), env={"HOME": str(files)}) as srv:
        list(call("chat", srv.url, ROOT))
        before = usage(srv)
        assert any(r["key"] == "root" and r["wire"] == "chat" for r in before)
    with ServerProcess("--config", write(files), env={"HOME": str(files)}) as srv:
        assert usage(srv) == before


def usage(srv: ServerProcess) -> list[dict]:
    status, body = srv.get("/usage", headers={"Authorization": f"Bearer {ROOT}"})
    assert status == 200 and body["recording"] is True
    return body["data"]

