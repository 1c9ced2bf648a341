"""`gguf-gateway keys add / list / revoke` and `gguf-gateway usage`, run in process: the keys file
holds digests only, the keys it makes work in the gateway with their role and models, a revoked
key is refused, and `usage` reads a running gateway's /usage."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import stat
import time

import pytest
import yaml

from gateway import cli
from gateway.app import create_app
from gateway.models.config import default_state_dir, load_config

CHAT = {"model": "plain", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def cfg(write_config, model_dir):
    return write_config(f"server:\n  models_dirs: [{model_dir}]\n  discover_default_stores: false\n")


@pytest.fixture
def run(capsys):
    """``gguf-gateway ARGS...`` in process: (exit code, stdout, stderr)."""
    def call(*argv: str) -> tuple[int, str, str]:
        code = cli.main([str(a) for a in argv])
        got = capsys.readouterr()
        return code, got.out, got.err
    return call


def add(run, cfg, name: str, *more: str) -> str:
    code, out, err = run("keys", "add", name, "--config", cfg, *more)
    assert code == 0, err
    (key,) = out.splitlines()
    assert key.startswith("sk-gg-") and "not be shown again" in err
    return key


def keys_file():
    return default_state_dir() / "keys.yaml"


def test_add_writes_the_digest_only_and_the_first_key_is_an_admin(run, cfg):
    code, out, err = run("keys", "add", "root", "--config", cfg)
    assert code == 0 and "no admin key yet: root is an admin" in err
    root = out.strip()
    assert str(keys_file()) in err and "within seconds" in err
    alice = add(run, cfg, "alice", "--models", "plain*", "--rpm", "5")
    text = keys_file().read_text()
    assert root not in text and alice not in text and text.count("sha256:") == 2
    assert stat.S_IMODE(keys_file().stat().st_mode) == 0o600
    for config in (load_config(cfg), load_config(None)):  # without models.yaml, the state folder's file by itself
        got = {k.name: k for k in config.server.api_keys}
        assert set(got) == {"root", "alice"} and got["root"].role == "admin" and got["root"].secret is None
        assert (got["alice"].role, got["alice"].models, got["alice"].rpm) == ("user", ("plain*",), 5)
    entry = yaml.safe_load(text)["alice"]
    created = dt.datetime.fromisoformat(entry["created"].replace("Z", "+00:00")).timestamp()
    assert abs(created - time.time()) < 60


async def test_the_keys_it_makes_work_with_their_role_and_models(aiohttp_client, run, cfg):
    root = add(run, cfg, "root")
    alice = add(run, cfg, "alice", "--models", "plain*", "--rpm", "5")
    client = await aiohttp_client(create_app(load_config(cfg)))
    ids = [m["id"] for m in (await (await client.get("/v1/models", headers=auth(alice))).json())["data"]]
    assert ids == ["plain"]
    ids = [m["id"] for m in (await (await client.get("/v1/models", headers=auth(root))).json())["data"]]
    assert {"plain", "thinker", "loop"} <= set(ids)
    assert (await client.post("/models/load", headers=auth(alice), json={"model": "plain"})).status == 403
    r = await client.post("/models/load", headers=auth(root), json={"model": "plain"})
    assert r.status not in (401, 403), await r.text()
    assert (await client.get("/v1/models", headers=auth("sk-gg-not-a-key"))).status == 401


def test_list_shows_names_roles_and_limits_never_a_key(run, cfg):
    root = add(run, cfg, "root")
    alice = add(run, cfg, "alice", "--models", "plain*", "thinker", "--rpm", "5", "--budget", "1000",
                "--budget-period", "day", "--expires", "2099-01-01")
    code, out, err = run("keys", "list", "--config", cfg)
    assert code == 0, err
    header, *lines = out.splitlines()
    assert header.split() == ["NAME", "ROLE", "MODELS", "LIMITS", "QUEUE", "SOURCE", "LAST", "USE"]
    assert lines[0].split()[:3] == ["root", "admin", "*"] and lines[0].endswith("never")
    assert lines[1].split()[:3] == ["alice", "user", "plain*,thinker"]
    assert "rpm 5, budget 1000/day, expires 2099-01-01" in lines[1] and str(keys_file()) in lines[1]
    code, out, _ = run("keys", "list", "--json", "--config", cfg)
    rows = {row["name"]: row for row in json.loads(out)}
    assert rows["alice"]["role"] == "user" and rows["alice"]["models"] == ["plain*", "thinker"]
    assert rows["alice"]["limits"] == {"rpm": 5, "budget": 1000, "budget_period": "day",
                                       "expires": "2099-01-01T00:00:00Z", "expired": False}
    assert rows["root"]["last_used"] is None and rows["root"]["limits"] == {}
    digests = [v["key"].removeprefix("sha256:") for v in yaml.safe_load(keys_file().read_text()).values()]
    for text in (run("keys", "list", "--config", cfg)[1], out):
        assert root not in text and alice not in text and "sha256" not in text
        assert not any(d in text for d in digests)


async def test_revoke_removes_the_key_and_a_running_gateway_refuses_it(aiohttp_client, run, cfg):
    root = add(run, cfg, "root")
    alice = add(run, cfg, "alice", "--rpm", "5")
    client = await aiohttp_client(create_app(load_config(cfg)))
    assert (await client.get("/v1/models", headers=auth(alice))).status == 200
    code, _, err = run("keys", "revoke", "root", "--config", cfg)  # the last admin, alice left
    assert code == 1 and "last admin" in err and "root" in keys_file().read_text()
    code, out, err = run("keys", "revoke", "alice", "--config", cfg)
    assert code == 0 and out == f"revoked alice: removed from {keys_file()}\n" and "within seconds" in err
    assert [k.name for k in load_config(cfg).server.api_keys] == ["root"]
    fresh = await aiohttp_client(create_app(load_config(cfg)))
    assert (await fresh.get("/v1/models", headers=auth(alice))).status == 401
    assert (await fresh.get("/v1/models", headers=auth(root))).status == 200
    async def refused() -> bool:
        return (await client.get("/v1/models", headers=auth(alice))).status == 401

    deadline = time.monotonic() + 120  # the running one watches the file (every 2 s); 120 s only to fail
    while not await refused() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert await refused()
    assert run("keys", "revoke", "alice", "--config", cfg)[0] == 1  # not there any more


def test_a_key_given_elsewhere_is_not_revoked_or_added_again(run, write_config, model_dir, monkeypatch):
    cfg = write_config(f"server:\n  models_dirs: [{model_dir}]\n  api_keys:\n    ops: {{key: ops-key, role: admin}}\n")
    monkeypatch.setenv("GGUF_GATEWAY_API_KEYS", "ci=ci-key")
    code, _, err = run("keys", "revoke", "ops", "--config", cfg)
    assert code == 1 and f"{cfg} (server.api_keys)" in err
    code, _, err = run("keys", "revoke", "ci", "--config", cfg)
    assert code == 1 and "$GGUF_GATEWAY_API_KEYS" in err
    code, _, err = run("keys", "revoke", "nobody", "--config", cfg)
    assert code == 1 and "no key named 'nobody'" in err
    code, _, err = run("keys", "add", "ops", "--config", cfg)
    assert code == 1 and "server.api_keys" in err and not keys_file().exists()
    code, _, err = run("keys", "add", "dev", "--config", cfg)  # ops is an admin already
    assert code == 0 and "no admin key yet" not in err
    assert {k.name: k.role for k in load_config(cfg).server.api_keys} == {"ops": "admin", "dev": "user", "ci": "admin"}


def test_a_keys_queue_terms_are_written_read_back_and_listed_where_not_the_defaults(run, cfg):
    """--weight, --priority and --no-load go into the keys file as the gateway reads them
    (``weight``, ``priority``, ``may_load: false``); ``keys list`` shows them where not the defaults."""
    add(run, cfg, "root")
    add(run, cfg, "ci", "--weight", "4", "--priority", "batch", "--no-load")
    add(run, cfg, "editor", "--weight", "0.5", "--priority", "interactive")
    written = yaml.safe_load(keys_file().read_text())
    assert written["ci"]["weight"] == 4 and written["ci"]["priority"] == "batch" and written["ci"]["may_load"] is False
    assert "weight" not in written["root"] and "priority" not in written["root"] and "may_load" not in written["root"]
    got = {k.name: (k.role, k.weight, k.priority, k.may_load) for k in load_config(cfg).server.api_keys}
    assert got == {"root": ("admin", 1.0, "normal", True), "ci": ("user", 4.0, "batch", False),
                   "editor": ("user", 0.5, "interactive", True)}
    code, out, err = run("keys", "list", "--config", cfg)
    assert code == 0, err
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "weight 4, batch, no load" in lines["ci"] and "weight 0.5, interactive" in lines["editor"]
    assert "weight" not in lines["root"] and "interactive" not in lines["root"]
    rows = {row["name"]: row for row in json.loads(run("keys", "list", "--json", "--config", cfg)[1])}
    assert rows["ci"]["queue"] == {"weight": 4.0, "priority": "batch", "may_load": False}
    assert rows["root"]["queue"] == {"weight": 1.0, "priority": "normal", "may_load": True}


def test_a_bad_weight_or_priority_writes_nothing(run, cfg):
    add(run, cfg, "root")
    before = keys_file().read_text()
    for weight in ("0", "1e308", "-1", "nan", "inf"):
        code, out, err = run("keys", "add", "ci", "--weight", weight, "--config", cfg)
        assert code == 2 and out == "" and "--weight" in err, (weight, err)
    with pytest.raises(SystemExit) as refused:  # argparse's own refusal of a choice not offered
        run("keys", "add", "ci", "--priority", "urgent", "--config", cfg)
    assert refused.value.code == 2
    assert keys_file().read_text() == before


def test_a_duplicate_or_a_bad_argument_writes_nothing(run, cfg):
    code, _, err = run("keys", "add", "carol", "--rpm", "0", "--config", cfg)
    assert code == 2 and "--rpm: must be a positive integer" in err and not keys_file().exists()
    code, _, err = run("keys", "add", "carol", "--role", "user", "--config", cfg)  # no admin yet
    assert code == 1 and "--role admin" in err and not keys_file().exists()
    for bad in ("bad name", "x" * 65, "a/b", ""):
        assert run("keys", "add", bad, "--config", cfg)[0] == 2
    assert run("keys", "add", "carol", "--expires", "yesterday", "--config", cfg)[0] == 2
    assert run("keys", "add", "carol", "--expires", "2001-01-01", "--config", cfg)[0] == 2
    assert not keys_file().exists()
    add(run, cfg, "root")
    add(run, cfg, "alice", "--expires", "30d")
    before = keys_file().read_text()
    code, out, err = run("keys", "add", "alice", "--config", cfg)
    assert code == 1 and out == "" and "already in" in err and keys_file().read_text() == before
    expires = yaml.safe_load(before)["alice"]["expires"]
    at = dt.datetime.fromisoformat(expires.replace("Z", "+00:00")).timestamp()
    assert abs(at - (time.time() + 30 * 86400)) < 60
    assert load_config(cfg).server.api_keys[1].expires == at


def test_a_first_key_with_a_scope_or_a_limit_is_never_an_admin_by_omission(run, cfg):
    """No admin yet: a scoped or limited key without --role is refused with one line saying to add
    an admin first, writing nothing; once there is an admin it is added as a user, and --role admin
    still makes a limited key an admin when it says so."""
    for more in (("--models", "coder*", "--rpm", "3"), ("--models", "coder*"), ("--budget", "100"),
                 ("--expires", "30d")):
        code, out, err = run("keys", "add", "laptop", "--config", cfg, *more)
        assert code == 1 and out == "" and not keys_file().exists(), err
        (line,) = err.splitlines()
        assert line.startswith("error: ") and "add an admin first" in line and "--role admin" in line
    add(run, cfg, "root")
    add(run, cfg, "laptop", "--models", "coder*", "--rpm", "3")
    assert yaml.safe_load(keys_file().read_text())["laptop"]["role"] == "user"
    got = {k.name: (k.role, k.models, k.rpm) for k in load_config(cfg).server.api_keys}
    assert got == {"root": ("admin", (), None), "laptop": ("user", ("coder*",), 3)}


def test_a_limited_key_is_an_admin_when_it_says_so(run, cfg):
    code, _, err = run("keys", "add", "ops", "--role", "admin", "--rpm", "3", "--config", cfg)
    assert code == 0 and "no admin key yet" not in err and "(admin)" in err
    assert {k.name: (k.role, k.rpm) for k in load_config(cfg).server.api_keys} == {"ops": ("admin", 3)}


def test_keys_and_no_admin_is_mended_by_adding_an_admin(run, write_config, model_dir):
    cfg = write_config(f"server:\n  models_dirs: [{model_dir}]\n  api_keys:\n    u: {{key: u-key, role: user}}\n")
    with pytest.raises(Exception, match="no key is an admin"):
        load_config(cfg)
    code, out, err = run("keys", "list", "--config", cfg)
    assert code == 0 and out.splitlines()[1].split()[:2] == ["u", "user"] and "no key is an admin" in err
    code, _, err = run("keys", "add", "boss", "--config", cfg)
    assert code == 0 and "no admin key yet: boss is an admin" in err
    assert {k.name: k.role for k in load_config(cfg).server.api_keys} == {"u": "user", "boss": "admin"}


def test_a_keys_file_named_and_not_made_yet_is_made_by_add(run, write_config, tmp_path):
    path = tmp_path / "etc" / "keys.yaml"
    cfg = write_config(f"server:\n  api_keys_file: {path}\n")
    with pytest.raises(Exception, match="cannot read"):
        load_config(cfg)  # the gateway refuses the configuration as it stands; `keys` reads past it
    assert run("keys", "list", "--config", cfg)[0] == 0
    root = add(run, cfg, "root")
    assert root not in path.read_text() and not keys_file().exists()
    (key,) = load_config(cfg).server.api_keys
    assert (key.name, key.role, key.source) == ("root", "admin", str(path))
    code, _, err = run("keys", "add", "elsewhere", "--file", tmp_path / "other.yaml", "--config", cfg)
    assert code == 0 and f"reads its keys file from {path}" in err


async def test_usage_prints_what_a_running_gateway_counted(aiohttp_client, run, cfg):
    root = add(run, cfg, "root")
    add(run, cfg, "alice", "--models", "plain*", "--budget", "1000", "--budget-period", "day")
    client = await aiohttp_client(create_app(load_config(cfg)))
    r = await client.post("/v1/chat/completions", headers=auth(root), json=CHAT)
    assert r.status == 200, await r.text()
    spent = (await r.json())["usage"]
    url = str(client.make_url(""))

    def usage(*more: str) -> tuple[int, str, str]:
        return run("usage", "--url", url, "--api-key", root, "--config", cfg, *more)

    code, out, err = await asyncio.to_thread(usage)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("usage from ") and lines[0].endswith(", by day")
    assert lines[1].split() == ["PERIOD", "KEY", "MODEL", "WIRE", "REQUESTS", "PROMPT", "COMPLETION", "TOTAL"]
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert lines[2].split() == [today, "root", "plain", "chat", "1", str(spent["prompt_tokens"]),
                                str(spent["completion_tokens"]), str(spent["total_tokens"])]
    assert lines[3].split() == ["TOTAL", "1", str(spent["prompt_tokens"]), str(spent["completion_tokens"]),
                                str(spent["total_tokens"])]
    assert len(lines[1]) == len(lines[2]) == len(lines[3])  # numbers right-aligned to the header's end
    assert lines[4].startswith("alice: budget 1000/day, 0 spent, resets ") and "T00:00:00Z" in lines[4]
    assert "warning" not in err

    code, out, err = await asyncio.to_thread(usage, "--json", "--since", "7d", "--key", "alice")
    answer = json.loads(out)
    assert code == 0 and answer["object"] == "usage" and answer["data"] == [] and answer["recording"] is True
    since = dt.datetime.fromisoformat(answer["since"].replace("Z", "+00:00")).timestamp()
    assert abs(since - (time.time() - 7 * 86400)) < 60
    code, out, _ = await asyncio.to_thread(usage, "--key", "alice")
    assert code == 0 and out.startswith("no requests recorded from ")

    code, out, err = run("keys", "list", "--config", cfg)  # /usage flushed the store: root's use is on disk
    root_line = next(line for line in out.splitlines() if line.startswith("root "))
    assert root_line.split()[-1].startswith(today) and root_line.split()[-1].endswith("Z")
    code, _, err = await asyncio.to_thread(run, "usage", "--url", url, "--api-key", "wrong", "--config", cfg)
    assert code == 1 and err.startswith("error: 401")


def test_usage_of_a_gateway_that_is_not_there_is_one_line(run, cfg):
    code, out, err = run("usage", "--url", "http://127.0.0.1:9", "--config", cfg)
    assert code == 1 and out == "" and len(err.splitlines()) == 1 and "cannot reach gguf-gateway" in err
    assert run("usage", "--since", "last tuesday", "--url", "http://127.0.0.1:9")[0] == 2
