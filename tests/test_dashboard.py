"""The page's routes in-process: its files open to all with a strict policy, its data behind the
keys, the live stream's snapshots, and the /models fields the page shows. The page itself is
driven in a real browser in test_dashboard_browser.py."""

import asyncio
import json

from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config

KEY = {"Authorization": "Bearer k1"}


def app(write_config, model_dir, extra=""):
    return create_app(load_config(write_config(f"server:\n  models_dirs: [{model_dir}]\n  api_keys: [k1]\n{extra}")))


async def test_the_pages_files_are_served_from_the_package_with_a_strict_policy(aiohttp_client, write_config,
                                                                               model_dir):
    client = await aiohttp_client(app(write_config, model_dir))
    for path, kind in (("/", "text/html"), ("/ui/app.js", "text/javascript"), ("/ui/app.css", "text/css")):
        r = await client.get(path)  # no key: the files hold no data
        assert r.status == 200 and r.content_type == kind, path
        csp = r.headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert r.headers["X-Content-Type-Options"] == "nosniff"
    page = await (await client.get("/")).text()
    assert 'src="/ui/app.js"' in page and "http://" not in page and "https://" not in page  # nothing from elsewhere
    for path in ("/ui/other.js", "/ui/../gateway/config.py", "/ui/%2e%2e/pyproject.toml"):  # only the named files
        assert (await client.get(path, headers=KEY)).status == 404, path



async def test_every_module_the_page_imports_is_served_as_a_script(aiohttp_client, write_config, model_dir):
    """The page is ES modules the browser loads itself: each import, followed from app.js, is one of
    the package's files, served without a key as text/javascript (a module served as anything else
    does not run under nosniff); a card imports no other card (lib/panels.js joins them)."""
    import posixpath
    import re

    client = await aiohttp_client(app(write_config, model_dir))
    todo, seen = ["/ui/app.js"], set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        r = await client.get(path)
        assert r.status == 200 and r.content_type == "text/javascript", path
        for target in re.findall(r'^\s*(?:import|} from|export .* from)[^"\n]*"([^"]+)";', await r.text(), re.M):
            url = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
            if path.startswith("/ui/cards/") and url.startswith("/ui/cards/"):
                assert "card(" not in await (await client.get(url)).text(), f"{path} imports the card {url}"
            todo.append(url)
    cards = {"models", "queues", "downloads", "mcp", "live", "usage", "requests", "captures", "playground"}
    assert {f"/ui/cards/{c}.js" for c in cards} | {"/ui/lib/panels.js", "/ui/lib/api.js"} <= seen

async def test_the_pages_data_needs_a_key(aiohttp_client, write_config, model_dir):
    client = await aiohttp_client(app(write_config, model_dir))
    for path in ("/dashboard/live", "/models"):
        r = await client.get(path)
        assert r.status == 401 and (await r.json())["error"]["code"] == "invalid_api_key"
    r = await client.get("/dashboard/live", headers={"Authorization": "Bearer wrong"})
    assert r.status == 401


async def test_the_host_guard_covers_the_page(aiohttp_client, write_config, model_dir):
    client = await aiohttp_client(app(write_config, model_dir))
    r = await client.get("/", headers={"Host": "attacker.example"})
    assert r.status == 403 and (await r.json())["error"]["code"] == "forbidden_host"


async def read_snapshot(response) -> dict:
    event = None
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: ") and event == "snapshot":
            return json.loads(line[6:])
    raise AssertionError("the stream ended without a snapshot")


async def test_the_live_stream_sends_models_series_and_recent_requests(aiohttp_client, write_config, model_dir):
    client = await aiohttp_client(app(write_config, model_dir))
    r = await client.post("/v1/chat/completions", headers=KEY,
                          json={"model": "plain", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status == 200
    assert (await client.post("/v1/chat/completions", headers=KEY, json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]})).status == 404
    await client.post("/models/load", headers=KEY, json={"model": "thinker"})  # the gateway's own: not listed
    async with client.get("/dashboard/live", headers=KEY) as live:
        assert live.status == 200 and live.content_type == "text/event-stream"
        snap = await read_snapshot(live)
    models = {m["id"]: m for m in snap["models"]}
    assert set(models) == {"plain", "thinker", "loop"}
    assert models["plain"]["state"] == "ready" and models["plain"]["kind"] == "chat"
    assert models["plain"]["slots"] == {"busy": 0, "total": 4} and models["plain"]["device"] == "cpu"
    assert models["loop"]["state"] == "unloaded" and models["loop"]["slots"] is None
    recent = snap["recent"]
    assert [e["model"] for e in recent] == ["-", "plain"] and recent[1]["principal"] == "key1"  # the key's name, never the key
    assert recent[0]["status"] == 404 and recent[1]["completion_tokens"] == 4
    (point,) = snap["series"]["points"]
    assert point["models"]["plain"]["requests"] == 1 and point["models"]["plain"]["tokens"] == 4
    assert point["models"]["-"]["errors"] == 1  # a name that resolves to nothing


async def test_models_says_what_the_page_shows(aiohttp_client, write_config, model_dir):
    client = await aiohttp_client(app(write_config, model_dir))
    await client.post("/models/load", headers=KEY, json={"model": "plain"})
    rows = {m["id"]: m for m in (await (await client.get("/models", headers=KEY)).json())["data"]}
    plain = rows["plain"]
    assert plain["state"] == "ready" and plain["progress"] is None and plain["queued"] == 0
    assert plain["slots"] == {"busy": 0, "total": 4} and plain["device"] == "cpu" and plain["memory_bytes"] > 0
    assert plain["source"] == "discovered" and plain["file_size"] > 0 and plain["architecture"] == "llama"
    assert rows["loop"]["state"] == "unloaded" and rows["loop"]["device"] is None


async def test_a_failed_load_names_its_model_in_the_recent_requests(aiohttp_client, write_config, model_dir,
                                                                     tmp_path):
    (tmp_path / "bad.gguf").write_bytes((model_dir / "plain.gguf").read_bytes().replace(b"llama", b"zzzzz"))
    client = await aiohttp_client(app(write_config, model_dir, f"models:\n  bad: {tmp_path / 'bad.gguf'}\n"))
    r = await client.post("/v1/chat/completions", headers=KEY,
                          json={"model": "bad", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status == 503 and (await r.json())["error"]["code"] == "model_load_failed"
    async with client.get("/dashboard/live", headers=KEY) as live:
        snap = await read_snapshot(live)
    assert [(e["model"], e["status"]) for e in snap["recent"]] == [("bad", 503)]
    assert snap["series"]["points"][0]["models"]["bad"]["errors"] == 1


async def test_two_keys_of_one_name_each_see_only_their_own_requests(aiohttp_client, write_config, model_dir,
                                                                     monkeypatch):
    """A key in models.yaml and one in $GGUF_GATEWAY_API_KEYS may carry the same name: the page's
    recent requests go by the key itself (``OWNER``), which the snapshot does not show."""
    monkeypatch.setenv("GGUF_GATEWAY_API_KEYS", "alice=k2")
    config = load_config(write_config(f"server:\n  models_dirs: [{model_dir}]\n  api_keys: {{alice: k1}}\n"))
    assert [k.name for k in config.server.api_keys] == ["alice", "alice"]
    client = await aiohttp_client(create_app(config))
    for key, model in (("k1", "plain"), ("k2", "nope")):
        await client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                          json={"model": model, "messages": [{"role": "user", "content": "hi"}]})
    seen = {}
    for key in ("k1", "k2"):
        async with client.get("/dashboard/live", headers={"Authorization": f"Bearer {key}"}) as live:
            seen[key] = (await read_snapshot(live))["recent"]
    assert [(e["model"], e["principal"]) for e in seen["k1"]] == [("plain", "alice")]
    assert [(e["model"], e["principal"]) for e in seen["k2"]] == [("-", "alice")]
    assert not any("owner" in e or "key-" in json.dumps(e) for e in seen["k1"] + seen["k2"])


async def test_without_keys_the_page_lists_every_request(aiohttp_client, write_config, model_dir):
    client = await aiohttp_client(create_app(load_config(write_config(f"server:\n  models_dirs: [{model_dir}]\n"))))
    await client.post("/v1/chat/completions", json={"model": "plain", "messages": [{"role": "user", "content": "hi"}]})
    async with client.get("/dashboard/live") as live:
        recent = (await read_snapshot(live))["recent"]
    assert [(e["model"], e["principal"]) for e in recent] == [("plain", "anonymous")]


QUEUED = {"root": "k1", "alice": "k2", "bob": "k3"}


async def test_the_queues_an_admin_sees_and_what_a_user_key_sees_of_them(aiohttp_client, write_config, model_dir,
                                                                         tmp_path):
    """A model of one slot, held by an endless generation, with requests of three keys waiting:
    ``/admin/queues`` (an admin's alone) lists each key and priority; a user key's snapshot shows
    only the models it may use, its own rows, and every other key's folded into "other keys"."""
    tm.endless(tmp_path / "other.gguf")
    config = load_config(write_config(f"""
        server:
          models_dirs: [{model_dir}]
          discover_default_stores: false
          api_keys:
            root: {{key: k1, role: admin}}
            alice: {{key: k2, models: [looping]}}
            bob: {{key: k3, models: [looping]}}
        models:
          looping: {{path: {model_dir / 'loop.gguf'}, parallel: 1, n_ctx: 131072}}
          other: {{path: {tmp_path / 'other.gguf'}, parallel: 1, n_ctx: 131072}}
        """))
    client = await aiohttp_client(create_app(config))

    async def generate(key: str, model: str = "looping", **more) -> None:
        body = {"model": model, "messages": [{"role": "user", "content": "go"}], "max_tokens": 100_000, **more}
        async with client.post("/v1/chat/completions", headers=auth(QUEUED[key]), json=body) as r:
            await r.read()

    held = [asyncio.create_task(generate("root")), asyncio.create_task(generate("root", "other"))]
    try:
        await until(client, lambda q: {r["model"]: r["running"] for r in q} == {"looping": 1, "other": 1})
        held += [asyncio.create_task(generate("alice")), asyncio.create_task(generate("root")),
                 *(asyncio.create_task(generate("bob", priority="batch")) for _ in range(2))]
        rows = await until(client, lambda q: [r["waiting"] for r in q if r["model"] == "looping"] == [4])
        looping = next(r for r in rows if r["model"] == "looping")
        assert looping["slots"] == 1 and looping["closed"] is False
        assert [(q["key"], q["priority"], q["waiting"]) for q in looping["queue"]] == [
            ("alice", "normal", 1), ("bob", "batch", 2), ("root", "normal", 1)]
        assert all(0 <= q["longest_wait_s"] < 60 for q in looping["queue"])
        r = await client.get("/admin/queues", headers=auth("k2"))
        assert r.status == 403 and (await r.json())["error"]["code"] == "forbidden"
        async with client.get("/dashboard/live", headers=auth("k2")) as live:
            mine = (await read_snapshot(live))["queues"]
        assert [r["model"] for r in mine] == ["looping"]  # the model alice may not use is not hers to see
        assert [(q["key"], q["priority"], q["waiting"]) for q in mine[0]["queue"]] == [
            ("alice", "normal", 1), ("other keys", "batch", 2), ("other keys", "normal", 1)]
        assert "bob" not in json.dumps(mine) and "root" not in json.dumps(mine)
        async with client.get("/dashboard/live", headers=auth("k1")) as live:
            everyone = (await read_snapshot(live))["queues"]
        assert {r["model"] for r in everyone} == {"looping", "other"}
        assert {q["key"] for r in everyone for q in r["queue"]} == {"alice", "bob", "root"}
    finally:
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)
    await until(client, lambda q: q == [])  # the clients that left leave no ghost in the queue


async def until(client, done, timeout: float = 30.0) -> list[dict]:
    """``/admin/queues``' rows (as the admin sees them) once ``done(rows)`` holds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        r = await client.get("/admin/queues", headers=auth("k1"))
        assert r.status == 200
        rows = (await r.json())["queues"]
        if done(rows):
            return rows
        assert asyncio.get_running_loop().time() < deadline, rows
        await asyncio.sleep(0.05)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
