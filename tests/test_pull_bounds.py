"""Pulls are bounded (issue 64): in what they write (a known size and a digest, or nothing), in the
disk they share (every pull's claim together), in time (a trickled manifest, a cancel, a SIGTERM),
in where an on-demand pull may connect (only the configured registries), and in what a failure
keeps and shows (a hostile listing). Through the real app over a loopback hub (tests/hubserver.py)
and `huggingface_hub`'s own client, and the real `serve` process for the shutdown."""

from __future__ import annotations

import asyncio
import json
import random
import select
import signal
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import ServerProcess
from hubserver import Hub

from gateway.app import create_app
from gateway.hub import pulls as hub_pulls
from gateway.hub import space, transfer
from gateway.hub.names import parse
from gateway.hub.pulls import FileProgress, Pull, PullState, on_demand_candidates
from gateway.models import testmodels as tm
from gateway.models.config import load_config

BIG = random.Random(64).randbytes(3 << 19)  # 1.5 MiB: several CHUNKs, so a rate spreads it out
OTHER = random.Random(65).randbytes(3 << 19)
HOSTILE_FILES = 3000  # a listing of this many models, each with a long name of its own


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    tm.plain(path, ["Hi"])
    return path


@pytest.fixture(scope="module")
def hub(tiny):
    with Hub() as h:
        h.add_hf_repo("acme/Blind-GGUF", {"blind-Q4_K_M.gguf": BIG})
        h.add_hf_repo("acme/Git-GGUF", {"tiny-Q4_K_M.gguf": tiny}, regular={"tiny-Q4_K_M.gguf"})
        h.add_hf_repo("acme/One-GGUF", {"one-Q4_K_M.gguf": BIG})
        h.add_hf_repo("acme/Two-GGUF", {"two-Q4_K_M.gguf": OTHER})
        h.add_hf_repo("acme/Hostile-GGUF", {f"m{i:05d}-{'A' * 180}{i:05d}.gguf": b"x" for i in range(HOSTILE_FILES)})
        h.add_ollama_model("acme", "q4", "latest", tiny)
        yield h


@pytest.fixture(autouse=True)
def calm(hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    f = hub.faults
    f.rate, f.undeclared, f.trickle, f.fail_status = None, set(), None, {}
    hub.log.clear()
    yield
    f.rate, f.undeclared, f.trickle = None, set(), None


def app_for(write_config, extra: str = ""):
    return create_app(load_config(write_config(f"server:\n  pull_keep_free_bytes: 0\n{extra}")))


def cdn_gets(hub: Hub) -> list:
    return [r for r in hub.log if r.server == "cdn" and r.method == "GET"]


def hf_cache() -> Path:
    return Path.home() / ".cache" / "huggingface" / "hub"


def stored_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink()) if root.exists() else 0


async def pull_once(client, name: str, **body) -> tuple[int, dict]:
    r = await client.post("/models/pull", json={"model": name, "stream": False, **body})
    return r.status, await r.json()


# ---------------------------------------------------------------- HIGH 6: a size bound and a digest, or nothing

async def test_a_file_the_hub_declares_no_size_or_digest_for_is_refused_before_a_byte(aiohttp_client, write_config,
                                                                                      hub):
    hub.faults.undeclared = {"blind-Q4_K_M.gguf"}
    client = await aiohttp_client(app_for(write_config))
    status, body = await pull_once(client, "acme/Blind-GGUF")
    assert status == 502 and body["error"]["code"] == "download_unverifiable", body
    assert "blind-Q4_K_M.gguf" in body["error"]["message"] and "no size" in body["error"]["message"]
    assert cdn_gets(hub) == []  # not a byte asked for
    assert not [p for p in hf_cache().rglob("*") if p.is_file() and "blobs" in p.parts]
    [row] = (await (await client.get("/models")).json())["pulls"]
    assert row["state"] == "failed" and row["error"]["code"] == "download_unverifiable"


async def test_a_file_kept_in_git_is_checked_by_its_blob_id(aiohttp_client, write_config, hub, tiny):
    client = await aiohttp_client(app_for(write_config))
    status, body = await pull_once(client, "acme/Git-GGUF")
    assert status == 200 and body == {"status": "success", "model": "hf.co/acme/Git-GGUF"}, body
    [blob] = [p for p in hf_cache().rglob("*") if p.is_file() and p.parent.name == "blobs"]
    assert blob.read_bytes() == tiny.read_bytes() and len(blob.name) == 40  # named by its git blob id


def test_a_git_blob_id_that_does_not_match_is_corrupt(hub, tiny, tmp_path):
    """The digest of a file kept in git is checked as an LFS file's SHA-256 is."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url("acme/Git-GGUF", "tiny-Q4_K_M.gguf", endpoint=hub.url)
    meta = get_hf_file_metadata(url, endpoint=hub.url)
    origin = transfer.Origin.of(hub.url, insecure=True)
    good = transfer.Want(meta.location, tmp_path / "good.incomplete", meta.size, None, "tiny", (), origin,
                         meta.etag)
    transfer.fetch(good, lambda held: None, threading.Event())
    assert (tmp_path / "good.incomplete").read_bytes() == tiny.read_bytes()
    bad = transfer.Want(meta.location, tmp_path / "bad.incomplete", meta.size, None, "tiny", (), origin, "0" * 40)
    with pytest.raises(transfer.Corrupt, match="git blob id"):
        transfer.fetch(bad, lambda held: None, threading.Event())
    assert not (tmp_path / "bad.incomplete").exists()


# ---------------------------------------------------------------- MED 7: the disk's free space, claimed across pulls

class Disk:
    """A disk of ``window`` bytes holding what the pulls wrote, less what someone else took."""

    def __init__(self, window: int):
        self.window, self.taken, self.lowest = window, 0, window

    def free(self, folder: Path) -> int:
        free = self.window - stored_bytes(hf_cache()) - self.taken
        self.lowest = min(self.lowest, free)
        return free


async def test_two_pulls_never_both_spend_one_window(aiohttp_client, write_config, hub, monkeypatch):
    disk = Disk(len(BIG) * 3 // 2)  # room for one of the two files, not both
    monkeypatch.setattr(space, "free_bytes", disk.free)
    hub.faults.rate = 1 << 20  # about 1.5 s each: both are under way at once
    client = await aiohttp_client(app_for(write_config))
    results = await asyncio.gather(pull_once(client, "acme/One-GGUF"), pull_once(client, "acme/Two-GGUF"))
    statuses = sorted(status for status, _ in results)
    assert statuses == [200, 507], results
    refused = next(body for status, body in results if status == 507)
    assert refused["error"]["code"] == "insufficient_storage" and "claimed by other pulls" in refused["error"]["message"]
    assert disk.lowest >= 0  # the disk never held more than it has


async def test_a_pull_stops_when_its_disk_fills_under_it(aiohttp_client, write_config, hub, monkeypatch):
    disk = Disk(4 * len(BIG))
    monkeypatch.setattr(space, "free_bytes", disk.free)
    hub.faults.rate = 1 << 19
    client = await aiohttp_client(app_for(write_config, "  pull_keep_free_bytes: 1MiB\n"))
    task = asyncio.ensure_future(pull_once(client, "acme/One-GGUF"))
    while not any(r.bytes_sent for r in cdn_gets(hub)):  # its first bytes are on their way
        await asyncio.sleep(0.02)
    disk.taken = 3 * len(BIG)  # something else fills the disk: the claim no longer fits beside the reserve
    status, body = await asyncio.wait_for(task, 30)
    assert status == 507 and body["error"]["code"] == "insufficient_storage", body
    assert stored_bytes(hf_cache()) < len(BIG)  # it stopped part-way, its partial file kept for a later pull


# ---------------------------------------------------------------- MED 8: every read ends: a cancel, a deadline, shutdown

def manifest_gets(hub: Hub) -> list:
    return [r for r in hub.log if "/manifests/" in r.path and r.method == "GET"]


async def test_a_cancel_ends_a_pull_held_by_a_trickled_manifest(aiohttp_client, write_config, hub):
    hub.faults.trickle = 0.5  # the manifest would take minutes
    client = await aiohttp_client(app_for(write_config))
    name = f"{hub.host}/acme/q4:latest"
    task = asyncio.ensure_future(pull_once(client, name, insecure=True))
    while not any(r.bytes_sent for r in manifest_gets(hub)):
        await asyncio.sleep(0.02)
    r = await client.post("/models/pull/cancel", json={"model": name})
    assert r.status == 200
    status, body = await asyncio.wait_for(task, 10)  # the trickle itself would take minutes
    assert status == 409 and body["error"]["code"] == "pull_cancelled", body
    [get] = manifest_gets(hub)
    assert get.bytes_sent < 100  # the connection was dropped, not read to its end


async def test_a_trickled_manifest_has_an_overall_deadline(aiohttp_client, write_config, hub, monkeypatch):
    monkeypatch.setattr(transfer, "SMALL_DEADLINE", 1.0)
    hub.faults.trickle = 0.2  # a byte well within every read's timeout, the whole far past the deadline
    client = await aiohttp_client(app_for(write_config))
    status, body = await asyncio.wait_for(pull_once(client, f"{hub.host}/acme/q4:latest", insecure=True), 20)
    assert status == 504 and body["error"]["code"] == "hub_timeout", body
    assert "within 1 s" in body["error"]["message"]


@pytest.mark.slow
def test_sigterm_mid_trickle_ends_the_gateway_within_its_bound(tmp_path, hub):
    hub.faults.trickle = 0.5
    home = tmp_path / "home"
    config = tmp_path / "models.yaml"
    config.write_text("server:\n  pull_keep_free_bytes: 0\n  drain_seconds: 1\n  memory_reserve: 0\n")
    env = {"HOME": str(home), "HF_HOME": str(home / "hf"), "OLLAMA_MODELS": str(home / ".ollama" / "models"),
           "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1"}
    name = f"{hub.host}/acme/q4:latest"
    with ServerProcess("--config", str(config), env=env) as srv:
        def pull() -> None:
            req = urllib.request.Request(srv.url + "/models/pull", data=json.dumps(
                {"model": name, "insecure": True}).encode(), headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    r.read()
            except OSError:
                pass
        threading.Thread(target=pull, daemon=True).start()
        deadline = time.monotonic() + 30
        while not any(r.bytes_sent for r in manifest_gets(hub)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert manifest_gets(hub), "the pull never reached the registry"
        started = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        try:
            srv.proc.wait(timeout=drain_and_close_bound())
        except Exception:  # noqa: BLE001 (the failure is the assertion below)
            pass
        took = time.monotonic() - started
        assert srv.proc.poll() is not None, f"still running {took:.0f} s after SIGTERM: {srv.output()[-2000:]}"
        assert srv.proc.returncode == 0


def drain_and_close_bound() -> float:
    """What a SIGTERM may take with a pull in flight: the drain (1 s here), the pulls' own bound, the
    rest of the shutdown; the trickle alone would hold the process for minutes."""
    return 1 + hub_pulls.CLOSE_SECONDS + 10


# ---------------------------------------------------------------- MED 9: on demand, only the configured registries

def listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    return sock


def connections(sock: socket.socket) -> int:
    n = 0
    while select.select([sock], [], [], 0)[0]:
        conn, _ = sock.accept()
        conn.close()
        n += 1
    return n


@pytest.mark.parametrize("hosts", [None, "[hf.co]"])
async def test_an_on_demand_name_never_chooses_the_host(aiohttp_client, write_config, hub, hosts):
    extra = "  pull_on_demand: true\n" + (f"  pull_on_demand_hosts: {hosts}\n" if hosts else "")
    client = await aiohttp_client(app_for(write_config, extra))
    open_port = listener()
    closed = listener()
    closed_port = closed.getsockname()[1]
    closed.close()
    answers = {}
    try:
        for name in (f"127.0.0.1:{open_port.getsockname()[1]}/ns/m:latest", f"127.0.0.1:{closed_port}/ns/m:latest",
                     "hf.co.example.net/ns/m:latest", "gemma.example.net/ns/m:latest", f"{hub.host}/acme/q4:latest"):
            r = await client.post("/v1/chat/completions", json={"model": name, "messages": [{"role": "user",
                                                                                          "content": "?"}]})
            body = await r.json()
            answers[name] = (r.status, body["error"]["code"], body["error"]["message"].replace(name, "NAME"))
        assert connections(open_port) == 0  # the gateway never connected where the name pointed
    finally:
        open_port.close()
    assert len(set(answers.values())) == 1, answers  # open port, closed port, any host: one answer
    status, code, _ = next(iter(answers.values()))
    assert status == 404 and code == "model_not_found"
    assert [r for r in hub.log if "/v2/" in r.path] == []  # the loopback registry was not asked either
    assert (await (await client.get("/models")).json())["pulls"] == []


async def test_a_network_failure_is_told_without_the_sockets_words(aiohttp_client, write_config):
    client = await aiohttp_client(app_for(write_config))
    closed = listener()
    closed_port = closed.getsockname()[1]
    closed.close()
    hangs_up = listener()  # accepts, then closes without a word
    hung_port = hangs_up.getsockname()[1]
    stop = threading.Event()

    def hang_up() -> None:
        while not stop.is_set():
            if select.select([hangs_up], [], [], 0.05)[0]:
                conn, _ = hangs_up.accept()
                conn.close()

    thread = threading.Thread(target=hang_up, daemon=True)
    thread.start()
    try:
        said = {}
        for port in (closed_port, hung_port):
            name = f"127.0.0.1:{port}/ns/m:latest"
            status, body = await pull_once(client, name, insecure=True)
            said[port] = (status, body["error"]["code"], body["error"]["message"].replace(str(port), "PORT"))
    finally:
        stop.set()
        thread.join()
        hangs_up.close()
    assert said[closed_port] == said[hung_port], said
    assert said[closed_port][:2] == (502, "hub_unreachable")
    assert "refused" not in said[closed_port][2].lower() and "errno" not in said[closed_port][2].lower()


@pytest.mark.parametrize(("name", "hosts", "expected"), [
    ("hf.co/acme/Repo-GGUF", ("hf.co", "registry.ollama.ai"), ["hf.co/acme/Repo-GGUF"]),
    ("acme/repo", ("hf.co", "registry.ollama.ai"), ["acme/repo:latest", "hf.co/acme/repo"]),
    ("acme/repo", ("registry.ollama.ai",), ["acme/repo:latest"]),
    ("acme/Repo-GGUF", ("huggingface.co",), ["hf.co/acme/Repo-GGUF"]),
    ("llama3.2", ("hf.co",), []),
    ("127.0.0.1:5000/acme/m:latest", ("hf.co", "registry.ollama.ai"), []),
    ("127.0.0.1:5000/acme/m:latest", ("127.0.0.1:5000",), ["127.0.0.1:5000/acme/m:latest"]),
    ("127.0.0.1:50000/acme/m:latest", ("127.0.0.1:5000",), []),  # a host matched whole, port and all
    ("hf.co.example.net/acme/m:latest", ("hf.co",), []),
    ("registry.ollama.ai.example.net/acme/m:latest", ("registry.ollama.ai",), []),
])
def test_which_registries_an_on_demand_name_may_use(name, hosts, expected):
    assert sorted(c.canonical for c in on_demand_candidates(name, ("",), hosts)) == sorted(expected)
    assert all(c in parse(name) for c in on_demand_candidates(name, ("",), hosts))


# ---------------------------------------------------------------- MED 11: what a failure keeps and shows is bounded

async def test_a_hostile_listing_gives_a_bounded_error_and_a_bounded_models(aiohttp_client, write_config, hub):
    client = await aiohttp_client(app_for(write_config))
    for quant in ("Q9_1", "Q9_2", "Q9_3", "Q9_4", "Q9_5", "Q9_6"):
        status, body = await pull_once(client, f"acme/Hostile-GGUF:{quant}")
        assert status == 404, body
        message = body["error"]["message"]
        assert len(message) <= transfer.MAX_MESSAGE and f"({HOSTILE_FILES} in all)" in message, message[:300]
    r = await client.get("/models")
    raw = await r.read()
    assert len(raw) < 64 << 10, len(raw)  # six failed pulls, each a line or two
    assert len(json.loads(raw)["pulls"]) == 6


def test_a_finished_pull_keeps_a_few_of_its_files_and_their_count():
    async def run() -> tuple[dict, dict]:
        pull = Pull("k", "k", False)
        pull.files = {f"sha256:{i:064x}": FileProgress(f"sha256:{i:064x}", f"part-{i}", 10) for i in range(500)}
        pull.move(PullState.DOWNLOADING)
        running = pull.describe()
        pull.move(PullState.DONE)
        return running, pull.describe()
    running, done = asyncio.run(run())
    assert len(running["files"]) == hub_pulls.MAX_FILES_SHOWN and running["file_count"] == 500
    assert len(done["files"]) == hub_pulls.MAX_FINISHED_FILES and done["file_count"] == 500


def test_an_error_message_is_bounded_however_long_its_text():
    err = transfer.NotFound("x" * 100_000)
    assert len(err.message) == transfer.MAX_MESSAGE
    assert transfer.some([str(i) for i in range(1000)], 3) == "0, 1, 2, ... (1000 in all)"
