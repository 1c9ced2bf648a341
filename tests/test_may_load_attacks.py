"""A key of ``may_load: false`` from outside, through the real server: it has no way to make the
gateway load a model. Ollama's empty prompt (a load of its own, and a keep_alive) is refused as
any request is; a request that passed while its model was loaded, and then waited at its door
while a swap drained it, is refused rather than loading it again once the door opens; and the
503 names no model outside the key's scope."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from helpers import ServerProcess, run_cli

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

ROOT, USER = {"Authorization": "Bearer root-key"}, {"Authorization": "Bearer u-key"}
CHAT = [{"role": "user", "content": "x"}]


def serve(tmp_path, server: str = "") -> ServerProcess:
    tm.plain(tmp_path / "plain.gguf")
    tm.plain(tmp_path / "secret.gguf", ["S"])
    tm.endless(tmp_path / "loop.gguf")
    (tmp_path / "keys.yaml").write_text("root: root-key\nu: {key: u-key, models: ['plain*', loop], may_load: false}\n")
    (tmp_path / "models.yaml").write_text(
        f"server:\n  discover_default_stores: false\n  api_keys_file: {tmp_path}/keys.yaml\n{server}"
        f"models:\n  plain: {tmp_path}/plain.gguf\n  secret: {tmp_path}/secret.gguf\n"
        f"  loop: {{path: {tmp_path}/loop.gguf, parallel: 1, n_ctx: 65536}}\n")
    return ServerProcess("--config", str(tmp_path / "models.yaml"))


async def loaded(c: aiohttp.ClientSession) -> list[str]:
    return sorted(m["name"] for m in (await (await c.get("/api/ps", headers=ROOT)).json())["models"])


def test_ollamas_empty_prompt_loads_nothing_for_a_key_that_may_not_load(tmp_path):
    async def main(url: str) -> None:
        async with aiohttp.ClientSession(url) as c:
            assert (await c.post("/models/load", headers=ROOT, json={"model": "secret"})).status == 200
            for path, body in (("/api/generate", {"prompt": ""}), ("/api/generate", {}),
                               ("/api/generate", {"prompt": "", "keep_alive": -1}), ("/api/chat", {"messages": []})):
                r = await c.post(path, headers=USER, json={**body, "model": "plain", "stream": False})
                said = await r.json()
                assert r.status == 503 and r.headers["Retry-After"] == "30", (path, body, said)
                assert "may_load: false" in said["error"] and "secret" not in said["error"], said  # Ollama's shape
            assert await loaded(c) == ["secret:latest"]

    with serve(tmp_path) as server:
        asyncio.run(main(server.url))


def test_a_request_waiting_at_a_drained_models_door_does_not_load_it_again(tmp_path):
    """``loop`` is loaded and busy with the user's long answer; an admin's request for ``plain``
    waits ``max_swap_wait`` and closes ``loop``'s door; the user's second request, which passed
    while ``loop`` was loaded, waits at that door. Once ``loop`` is unloaded for ``plain`` the
    door opens: that request is refused, and ``plain`` stays loaded."""
    async def main(url: str) -> None:
        async with aiohttp.ClientSession(url) as c:
            assert (await c.post("/models/load", headers=ROOT, json={"model": "loop"})).status == 200
            long = await c.post("/v1/chat/completions", headers=USER,
                                json={"model": "loop", "stream": True, "max_tokens": 60000, "messages": CHAT})
            await long.content.readline()
            admin = asyncio.ensure_future(c.post("/v1/chat/completions", headers=ROOT,
                                                 json={"model": "plain", "max_tokens": 2, "messages": CHAT}))
            for _ in range(400):  # until loop's door is closed for plain's swap
                rows = (await (await c.get("/admin/queues", headers=ROOT)).json())["queues"]
                if any(r["model"] == "loop" and r["closed"] for r in rows):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"loop's door never closed: {rows}")
            second = asyncio.ensure_future(c.post("/v1/chat/completions", headers=USER,
                                                  json={"model": "loop", "max_tokens": 2, "messages": CHAT}))
            for _ in range(100):  # until it waits at the door
                rows = (await (await c.get("/admin/queues", headers=ROOT)).json())["queues"]
                if any(r["model"] == "loop" and r["waiting"] for r in rows):
                    break
                await asyncio.sleep(0.05)
            long.close()  # its client leaves: loop drains, and is unloaded for plain
            assert (await asyncio.wait_for(admin, 60)).status == 200
            refused = await asyncio.wait_for(second, 60)
            assert refused.status == 503, await refused.text()
            assert (await refused.json())["error"]["code"] == "model_not_loaded"
            await asyncio.sleep(0.5)
            assert await loaded(c) == ["plain:latest"]

    with serve(tmp_path, "  max_loaded_models: 1\n  max_swap_wait: 1\n  swap_hold_seconds: 0\n") as server:
        asyncio.run(main(server.url))


def test_a_keys_file_with_a_huge_value_is_refused_in_one_short_line(tmp_path):
    """A keys file's value of any size is quoted in part: the refusal at start (and the log line of
    a refused reload) stays short, naming the setting and the value's length."""
    (tmp_path / "keys.yaml").write_text(f"root: root-key\nu: {{key: u-key, priority: {'x' * 200_000}}}\n")
    (tmp_path / "models.yaml").write_text(f"server:\n  discover_default_stores: false\n  api_keys_file: {tmp_path}/keys.yaml\n")
    done = run_cli("serve", "--port", "0", "--config", str(tmp_path / "models.yaml"))
    said = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in said, said[-2000:]
    assert "u.priority: must be one of interactive, normal, batch" in said and "(200002 characters)" in said
    assert len(said) < 2000
