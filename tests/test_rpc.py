"""A model split over machines with llama.cpp's RPC backend (`rpc:` in models.yaml), on loopback:
two `rpc-server`s built from the llama.cpp that llama-cpp-python vendors hold most of Gemma 3
270M's layers, the gateway's own CPU the rest. Its greedy answers equal the whole model's; a
killed rpc-server fails that model with the reason while the others serve; a llama-cpp-python
built without RPC says so at load."""

from __future__ import annotations

import subprocess
import sys
import time

import openai
import pytest
from helpers import REPO, ServerProcess, free_port
from realmodel import gemma_path

sys.path.insert(0, str(REPO / "scripts"))
import rpc_build  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.real]

PROMPTS = ["Write one sentence about the sea.", "List three colours.", "What is 2+2?"]


def _answer(client, model: str, prompt: str) -> str:
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                       temperature=0, max_tokens=24)
    return r.choices[0].message.content


def test_a_build_without_rpc_says_so_at_load(tmp_path, model_dir):
    cfg = tmp_path / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\nmodels:\n  plain: {model_dir}/plain.gguf\n"
                   f"  split:\n    path: {model_dir}/plain.gguf\n    rpc: [127.0.0.1:{free_port()}]\n")
    with ServerProcess("--config", str(cfg)) as srv, \
            openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0) as client:
        with pytest.raises(openai.InternalServerError) as e:
            _answer(client, "split", "hi")
        assert e.value.status_code == 503 and e.value.body["code"] == "model_load_failed"
        assert 'CMAKE_ARGS="-DGGML_RPC=on"' in e.value.body["message"]
        assert _answer(client, "plain", "hi") == "Hello, world!"  # the others serve
        assert srv.get("/health")[1]["worker_failures"] == 0


@pytest.fixture(scope="module")
def rpc_servers():
    server, libs = rpc_build.build()
    ports = [free_port(), free_port()]
    procs = [subprocess.Popen([str(server), "--host", "127.0.0.1", "--port", str(p), "--threads", "1"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
             for p in ports]
    time.sleep(1.0)
    yield libs, ports, procs
    for p in procs:
        p.kill()
        p.wait()


def test_a_split_model_answers_as_the_whole_one_and_a_dead_server_fails_only_it(tmp_path, rpc_servers):
    libs, ports, procs = rpc_servers
    gemma = gemma_path()
    cfg = tmp_path / "models.yaml"
    # 12 of 18 layers on the two rpc-servers, the rest (and the input) on this machine's CPU;
    # one slot and no flash attention: the same arithmetic in both models
    common = "n_ctx: 512\n    parallel: 1\n    flash_attn: false\n    n_gpu_layers: 12"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  max_loaded_models: 0\nmodels:\n"
                   f"  whole:\n    path: {gemma}\n    {common}\n"
                   f"  split:\n    path: {gemma}\n    {common}\n"
                   f"    rpc: [127.0.0.1:{ports[0]}, 127.0.0.1:{ports[1]}]\n")
    with ServerProcess("--config", str(cfg), env={"LLAMA_CPP_LIB_PATH": str(libs)}) as srv, \
            openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120) as client:
        for prompt in PROMPTS:
            assert _answer(client, "split", prompt) == _answer(client, "whole", prompt), prompt
        _, models = srv.get("/models")
        split = next(m for m in models["data"] if m["id"] == "split")
        assert split["rpc"] == [f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"]
        procs[1].kill()
        procs[1].wait()
        # the worker sees the loss mid-answer (it exits: llama.cpp aborts) or at its next load
        seen: list[openai.APIStatusError] = []
        deadline = time.monotonic() + 30
        while not (seen and seen[-1].body["code"] == "model_load_failed") and time.monotonic() < deadline:
            try:
                _answer(client, "split", PROMPTS[0])
            except openai.APIStatusError as e:
                seen.append(e)
        assert seen and seen[-1].status_code == 503, [e.body for e in seen]
        assert f"rpc-server 127.0.0.1:{ports[1]} is not reachable" in seen[-1].body["message"]
        assert all(e.body["code"] in ("worker_crashed", "model_load_failed") for e in seen)
        assert _answer(client, "whole", PROMPTS[1])  # the other model serves on
