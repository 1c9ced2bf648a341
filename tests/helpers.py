"""Helpers for tests that run the real `gguf-gateway` process."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


# Debian's chromium, headless, for the page's tests and its screenshots: nothing downloads a browser
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def chromium() -> str | None:
    """The system Chromium: ``$GGUF_GATEWAY_CHROMIUM``, else ``chromium`` on PATH."""
    for candidate in (os.environ.get("GGUF_GATEWAY_CHROMIUM"), "chromium", "chromium-browser"):
        if candidate and (found := shutil.which(candidate)):
            return found
    return None


@contextlib.contextmanager
def headless_chromium():
    """Debian's Chromium driven by Playwright, for a module's ``browser`` fixture; the test is
    skipped, saying why, where Playwright or a Chromium is missing (nothing downloads one)."""
    import pytest

    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (the test extra has it)")
    binary = chromium()
    if binary is None:
        pytest.skip("no Chromium installed (Debian/Ubuntu: apt-get install chromium); "
                    "./scripts/test installs it where it may")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=binary, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def gateway_command() -> list[str]:
    script = Path(sys.executable).parent / "gguf-gateway"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gateway"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url: str, body=None, *, raw: bytes | None = None, headers: dict | None = None,
            timeout: float = 60) -> tuple[int, dict, dict]:
    """POST a JSON body (or ``raw`` bytes): (status, answer's JSON, headers), whatever the status."""
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
            input_text: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*gateway_command(), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout, input=input_text,
                          stdin=subprocess.DEVNULL if input_text is None else None)


class ServerProcess:
    """`gguf-gateway serve` on a free loopback port, as a user would start it."""

    def __init__(self, *args: str, env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Output goes to a file, not a pipe: a pipe nobody reads fills up (64 KiB of log lines)
        # and then blocks the server's writes to its log.
        self.log = tempfile.TemporaryFile(mode="w+", encoding="utf-8")
        self.proc = subprocess.Popen(
            [*gateway_command(), "serve", "--port", str(self.port), *args],
            env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
            stdout=self.log, stderr=subprocess.STDOUT, text=True,
        )

    def output(self) -> str:
        if self.log.closed:
            return self._final
        self.log.seek(0)
        return self.log.read()

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.output()}")
            try:
                self.get("/health")
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        raise TimeoutError("server did not answer /health")

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> tuple[int, str]:
        """Send ``sig`` and return (exit code, stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if not self.log.closed:
            self._final = self.output()
            self.log.close()
        return self.proc.returncode, self._final

    def __enter__(self) -> ServerProcess:
        try:
            self.wait_ready()
        except BaseException:
            self.stop(signal.SIGKILL)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


_QUIET_LOG = None  # llama.cpp keeps the log callback's address: it must live as long as the process


@contextlib.contextmanager
def vocab_only(vocab: str):
    """llama.cpp's real ``vocab`` vocabulary (a vocab-only GGUF) loaded in this process, for
    grammar tests, with llama.cpp's log quiet (a grammar's debug lines cut UTF-8, which the
    binding's logger cannot print). Yields the ``llama_vocab`` handle."""
    import ctypes

    import llama_cpp as L

    from gateway.models import testmodels as tm

    global _QUIET_LOG
    if _QUIET_LOG is None:
        _QUIET_LOG = L.llama_log_callback(lambda level, text, user_data: None)
    L.llama_log_set(_QUIET_LOG, ctypes.c_void_p(0))
    L.llama_backend_init()
    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(str(tm.find_vocab(vocab, cache_dir=REPO / ".cache" / "vocab")).encode(),
                                         params)
    assert model
    try:
        yield L.llama_model_get_vocab(model)
    finally:
        L.llama_model_free(model)


def tiny_random_model(vocab: str, seed: int, sliding_window: int = 0) -> Path:
    """A one-layer random-weight llama with llama.cpp's real ``vocab`` vocabulary, written once
    into the repository's cache and kept between runs; with ``sliding_window``, a Gemma 3 of one
    layer attending to that many positions and one that attends to nothing (``write_random_model``)."""
    from gateway.models import testmodels as tm

    swa = f"-swa{sliding_window}" if sliding_window else ""
    path = REPO / ".cache" / "models" / f"random-{vocab}{swa}-tiny.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        vocab_file = tm.find_vocab(vocab, cache_dir=REPO / ".cache" / "vocab")
        tm.write_random_model(path.with_suffix(".part"), vocab_file, n_embd=64, n_layer=2 if sliding_window else 1,
                              n_head=2, n_ff=64, seed=seed, sliding_window=sliding_window)
        path.with_suffix(".part").replace(path)
    return path


WEATHER: dict[str, Any] = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = ["<tool_call>", "\n", '{"name":', ' "get_weather",', ' "arguments":', ' {"city":', ' "Paris"}}', "\n",
        "</tool_call>"]


def agent_model(path: Path, final: list[str] = ["It", " is", " 18", " C", "."], call: list[str] = CALL,  # noqa: B006
                context_length: int = 4096) -> Path:
    """A scripted model under Qwen 2.5's real chat template that makes ``call`` (by default
    get_weather(city="Paris"); its first and last pieces are the special tokens), and answers
    ``final`` once the tool's result is in: one line is added at the template's end, so after a
    tool result the prompt ends in "!" instead of a newline, and a scripted model's next token
    depends only on the prompt's last token."""
    from gateway.models import testmodels as tm

    qwen = tm.llama_cpp_source_file("models/templates/Qwen-Qwen2.5-7B-Instruct.jinja", REPO / ".cache" / "templates")
    template = qwen.read_text() + "{%- if messages[-1]['role'] == 'tool' %}!{% endif %}"
    tm.write_scripted_model(path, [tm.Script([tm.Special(call[0]), *call[1:-1], tm.Special(call[-1])]),
                                   tm.Script(final, trigger="!")], chat_template=template, context_length=context_length)
    return path


def vocab_scripted_model(path: Path, vocab: str, chat_template: str, scripts: list[tuple[str, list[str]]]) -> Path:
    """A scripted model (ggufwriter's: one layer that adds nothing, one-hot embeddings, each token's
    successor fixed by the output matrix) over llama.cpp's real ``vocab`` vocabulary, under
    ``chat_template``. Each script is (prompt, steps): the model writes ``steps`` after the last
    token of ``prompt`` (as the real tokenizer reads it; the rendered prompt a request will end
    with), then the vocabulary's end of generation. Each step is tokenized by the real tokenizer,
    so a marker the vocabulary has as a control token is that token. A token can have one
    successor only, so one already taken is spelled again from other tokens of the same bytes
    (a control token's text from ordinary ones); a step that cannot be is a ValueError. That
    bounds what a byte-level vocabulary (Qwen 2's) can script: it spells a character such as
    ">" that no neighbour merges with in one way only, so it can be written once."""
    import ctypes

    import gguf
    import llama_cpp as L
    import numpy as np

    from gateway.models import testmodels as tm
    from gateway.models.ggufwriter import finish, identity_layer

    vocab_file = tm.find_vocab(vocab, cache_dir=REPO / ".cache" / "vocab")
    with vocab_only(vocab) as v:
        n_vocab = L.llama_vocab_n_tokens(v)
        buf = ctypes.create_string_buffer(512)
        pieces: list[bytes] = []
        ordinary: dict[bytes, list[int]] = {}  # bytes -> the ordinary tokens that render them
        for tid in range(n_vocab):
            n = L.llama_token_to_piece(v, tid, buf, len(buf), 0, True)
            pieces.append(buf.raw[:max(n, 0)])
            if n > 0 and not L.llama_vocab_get_attr(v, tid) & L.LLAMA_TOKEN_ATTR_CONTROL:
                ordinary.setdefault(pieces[tid], []).append(tid)

        def tokenize(text: str) -> list[int]:
            data = text.encode()
            ids = (L.llama_token * (len(data) + 8))()
            n = L.llama_tokenize(v, data, len(data), ids, len(ids), False, True)
            assert n >= 0
            return list(ids[:n])

        end = L.llama_vocab_eos(v) if L.llama_vocab_eos(v) >= 0 else L.llama_vocab_eot(v)
        longest = max(len(p) for p in ordinary)
        used: set[int] = set()

        def respell(data: bytes) -> tuple[int, ...] | None:
            """``data`` in fresh ordinary tokens, longest first (a search back from a dead end
            that does not retry a place it failed from: fast, and enough for a script)."""
            dead: set[int] = set()

            def search(at: int, taken: tuple[int, ...]) -> tuple[int, ...] | None:
                if at == len(data):
                    return taken
                if at not in dead:
                    for size in range(min(len(data) - at, longest), 0, -1):
                        for tid in ordinary.get(data[at:at + size], ()):
                            if tid not in used and tid not in taken and (found := search(at + size, (*taken, tid))):
                                return found
                    dead.add(at)
                return None

            return search(0, ())

        successor: dict[int, int] = {}
        triggers = [tokenize(prompt)[-1] for prompt, _ in scripts]
        if len(set(triggers)) < len(triggers):
            raise ValueError(f"two prompts end in the same token: {[pieces[t] for t in triggers]}")
        used.update(triggers)
        for prev, (_, steps) in zip(triggers, scripts, strict=True):
            written = b""
            for step in steps:
                # control tokens the tokenizer read stay, unless taken; a run of other tokens is
                # spelled again as a whole where one of its tokens is taken
                runs: list[list[int]] = [[]]
                for tid in tokenize(step):
                    if L.llama_vocab_get_attr(v, tid) & L.LLAMA_TOKEN_ATTR_CONTROL and tid not in used:
                        runs += [[tid], []]
                    else:
                        runs[-1].append(tid)
                for run in runs:
                    fresh = len(set(run)) == len(run) and not used & set(run)
                    spelled = tuple(run) if fresh else respell(b"".join(pieces[t] for t in run))
                    if spelled is None:
                        raise ValueError(f"no fresh tokens left to spell {step!r}")
                    for t in spelled:
                        used.add(t)
                        successor[prev], prev = t, t
                        written += pieces[t]
            successor[prev] = end
            if written != "".join(steps).encode():
                raise ValueError(f"the script reads back as {written!r}")

    reader = gguf.GGUFReader(str(vocab_file))
    w = gguf.GGUFWriter(str(path), "llama")
    for key, fld in reader.fields.items():
        if key.startswith("tokenizer.") and key != "tokenizer.chat_template":
            if fld.types[0] == gguf.GGUFValueType.ARRAY:
                w.add_key_value(key, fld.contents(), fld.types[0], sub_type=fld.types[-1])
            else:
                w.add_key_value(key, fld.contents(), fld.types[0])
    w.add_chat_template(chat_template)
    # one-hot slots as ggufwriter's: slot 0 is every token without a successor (-> the end)
    slots = {tid: i + 1 for i, tid in enumerate(sorted(successor))}
    n_embd = max(64, -(-(len(slots) + 1) // 64) * 64)
    embd = np.zeros((n_vocab, n_embd), dtype=np.float16)
    embd[:, 0] = 1.0
    out = np.zeros((n_vocab, n_embd), dtype=np.float16)
    scale = 50.0 / np.sqrt(n_embd)  # RMSNorm makes a one-hot sqrt(n_embd) high
    out[end, 0] = scale
    for tid, slot in slots.items():
        embd[tid, 0], embd[tid, slot] = 0.0, 1.0
        out[successor[tid], slot] = scale
    w.add_name(f"scripted-{vocab}")
    w.add_context_length(16384)
    w.add_embedding_length(n_embd)
    w.add_block_count(1)
    w.add_feed_forward_length(32)
    w.add_head_count(n_embd // 64)
    w.add_head_count_kv(n_embd // 64)
    w.add_rope_dimension_count(64)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", out)
    identity_layer(w, n_embd, 32, np.float16)
    finish(w)
    return path


class InProcessEngine:
    """A worker's model and decoder in this process (real llama.cpp), for the engine tests:
    ``run`` answers one prompt greedily and returns its text and done event; ``load`` is
    ``protocol.LoadParams``' fields (one slot, 1,024 tokens, no prompt cache unless given)."""

    def __init__(self, path, **load):
        from gateway import protocol
        from gateway.worker.decoding import Decoder
        from gateway.worker.model import Model
        from gateway.worker.outbox import Outbox
        from gateway.worker.sampling import Sampling

        settings = {"parallel": 1, "n_ctx": 1024, "prompt_cache_bytes": 0, **load}
        self.model = Model(protocol.LoadParams(name="m", path=str(path), **settings))
        self.out = Outbox(-1)  # never flushed: the test reads the queued frames
        self.decoder = Decoder(self.model, Sampling(self.model), self.out)
        self.rid = 0
        self.logprobs: list[dict[str, Any]] = []  # the last answer's (``each_logprobs``: each of ``together``'s)
        self.each_logprobs: list[list[dict[str, Any]]] = []
        self.last_done: Any = None

    def tokens(self, text: str) -> list[int]:
        return self.model.vocab.tokenize(text, add_special=True)

    def run(self, text: str | list[int], max_tokens: int = 10, logprobs: int | None = None, **fields: Any) -> tuple[str, Any]:
        """One prompt, greedy unless ``fields`` (a ``GenerationRequest``'s) say otherwise."""
        (answer,) = self.together([text], max_tokens, logprobs, **fields)
        return answer

    def together(self, texts: list[str | list[int]] | list[str], max_tokens: int = 10, logprobs: int | None = None,
                 **fields: Any) -> list[tuple[str, Any]]:
        """Prompts (texts, or their tokens) admitted together (one slot each) and decoded in the
        same steps: each one's text and done event, in order."""
        from gateway import protocol

        seqs = []
        for text in texts:
            self.rid += 1
            tokens = self.tokens(text) if isinstance(text, str) else text
            req = protocol.GenerationRequest(**{"prompt": text if isinstance(text, str) else "",
                                                "max_tokens": max_tokens, "temperature": 0, "logprobs": logprobs, **fields})
            seqs.append((self.rid, self.decoder.admit(self.rid, req, tokens, "")))
        while any(seq.slot.seq is seq for _, seq in seqs):
            self.decoder.step()
        events = [protocol.decode_event(f[4:]) for f in self.out.frames]
        self.out.frames.clear()
        out, self.each_logprobs = [], []
        for rid, _ in seqs:
            got = [e for e in events if isinstance(e, protocol.Text) and e.id == rid]
            (done,) = [e for e in events if isinstance(e, protocol.Done) and e.id == rid]
            self.last_done, self.logprobs = done, [p for e in got for p in e.logprobs or []]
            self.each_logprobs.append(self.logprobs)
            out.append(("".join(e.text for e in got), done))
        return out

    def first_token(self, text: str | list[int]) -> list[tuple[str, float]]:
        """The first answer token's five likeliest, with their log-probabilities."""
        self.run(text, max_tokens=1, logprobs=5)
        return [(t["token"], t["logprob"]) for t in self.logprobs[0]["top_logprobs"]]


def bench_conversation(name: str, words: int = 1500, middle: bool = False):
    """A conversation of ``bench.py --conversations`` (``scripts/convbench.Conversation``): the
    engine tests replay its turns."""
    import sys

    if str(REPO / "scripts") not in sys.path:
        sys.path.insert(0, str(REPO / "scripts"))
    from convbench import Conversation

    return Conversation(words, name, middle)


def noise_picture(seed: int, fmt: str = "PNG", size: tuple[int, int] = (48, 40)) -> bytes:
    """A picture of random pixels (``fmt``: one of Pillow's), different for each seed."""
    import io

    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def tone_wav(hz: float, seconds: float = 1.0, rate: int = 16000) -> bytes:
    """A WAV of a sine: 16-bit mono."""
    import io
    import wave

    import numpy as np

    t = np.arange(int(seconds * rate)) / rate
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.sin(2 * np.pi * hz * t) * 12000).astype("<i2").tobytes())
    return out.getvalue()


def tiny_projector(n_embd: int = 64, audio: bool = False) -> Path:
    """A random-weight projector (``testprojector``) for ``tiny_random_model``'s embedding
    size, written once into the repository's cache."""
    from gateway.models import testprojector

    path = REPO / ".cache" / "models" / f"mmproj-random-{n_embd}{'-audio' if audio else ''}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        testprojector.write_random_projector(path.with_suffix(".part"), n_embd, audio=audio)
        path.with_suffix(".part").replace(path)
    return path


class Console:
    """A browser page's console errors and uncaught exceptions (the page tests'). Chromium itself
    logs each HTTP error status as "Failed to load resource"; ``allow`` names the statuses a test
    expects."""

    def __init__(self, page, allow: tuple[int, ...] = ()):
        self.errors: list[str] = []
        self.allow = allow
        page.on("console", self._console)
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))

    def _console(self, msg) -> None:
        if msg.type not in ("error", "warning"):
            return
        status = re.search(r"Failed to load resource: the server responded with a status of (\d+)", msg.text)
        if status and int(status.group(1)) in self.allow:
            return
        self.errors.append(f"{msg.type}: {msg.text}")
