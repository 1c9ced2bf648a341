"""One file from a hub onto disk (gateway.hub.transfer), in-process: the redirect policy as a table,
``fetch`` against the loopback CDN of tests/hubserver.py and its faults (resume, a server that ignores
Range, a dropped connection, corruption, wrong sizes, cancel), a redirect the policy refuses through
``ollama.plan`` and ``plan.execute``, the free-space check, and what a pull's caller is told
(``api.pulls.Narration``). The end-to-end tier (tests/test_pull_e2e.py) drives the real server."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import random
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import huggingface_hub
import pytest
from aiohttp import web
from hubserver import Hub

from gateway.api.pulls import Narration
from gateway.hub import huggingface, ollama, space, transfer
from gateway.hub.names import HFName, OllamaName
from gateway.hub.plan import execute
from gateway.hub.pulls import FileProgress, Pull, PullState

PATH = "blob-Q4_K_M.gguf"
PAYLOAD = random.Random(7).randbytes(transfer.CHUNK + transfer.CHUNK // 2)  # 1.5 MiB: one whole CHUNK and a half
SIZE = len(PAYLOAD)
SHA = hashlib.sha256(PAYLOAD).hexdigest()


@pytest.fixture(scope="module")
def hub():
    with Hub() as h:
        h.add_hf_repo("acme/Blob-GGUF", {PATH: PAYLOAD})
        yield h


@pytest.fixture(autouse=True)
def calm(hub, monkeypatch):
    """Every fault off and the log empty; the shared client closed after, so no socket outlives a test."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    f = hub.faults
    f.drop_after, f.drop_times, f.corrupt, f.rate = None, 1, set(), None
    f.redirect_blobs, f.fail_status, f.wrong_size, f.ignore_range = True, {}, set(), False
    hub.log.clear()
    yield
    huggingface_hub.close_session()


def cdn_gets(hub: Hub) -> list:
    return [r for r in hub.log if r.server == "cdn" and r.method == "GET"]


def want(hub: Hub, partial: Path, *, size: int | None = SIZE, sha: str | None = SHA, key: str = SHA) -> transfer.Want:
    """The CDN's file, as a pull from the hub (``insecure``: it is http on loopback) asks for it."""
    return transfer.Want(hub.cdn_link(key, PATH), partial, size, sha, "blob",
                         origin=transfer.Origin.of(hub.url, insecure=True))


def fetch(w: transfer.Want, cancelled: threading.Event | None = None) -> list[int]:
    """``transfer.fetch`` as a pull's thread calls it; the progress it reported."""
    seen: list[int] = []
    transfer.fetch(w, seen.append, cancelled or threading.Event())
    return seen


# ---------------------------------------------------------------- the redirect policy

PUBLIC = transfer.Origin("huggingface.co", insecure=False, private=False)
REGISTRY = transfer.Origin("registry.example", insecure=True, private=False)  # a public registry named over http
LAN = transfer.Origin("10.0.0.2", insecure=True, private=True)  # a registry on the LAN, over http
ADDRESSES = {
    "cdn.example": ["93.184.216.34"],
    "loop.example": ["127.0.0.1"],
    "ten.example": ["10.0.0.5"],
    "metadata.example": ["169.254.169.254"],
    "v6loop.example": ["::1"],
    "mapped.example": ["::ffff:10.0.0.1"],
    "mixed.example": ["93.184.216.34", "10.0.0.5"],  # one private address among public ones is enough
    "10.0.0.3": ["10.0.0.3"],
    "169.254.169.254": ["169.254.169.254"],
}


def fake_resolve(host: str) -> list[str]:
    return ADDRESSES.get(host, ["93.184.216.34"])


@pytest.mark.parametrize("url, origin, refused", [
    # https anywhere public
    ("https://cdn-lfs.hf.co/repos/ab/cd/x?Signature=s", PUBLIC, None),
    ("https://huggingface.co/acme/repo/resolve/main/x.gguf", PUBLIC, None),
    ("https://cdn.example:8443/x", PUBLIC, None),
    ("https://HuggingFace.CO/x", PUBLIC, None),  # host names compare case-insensitively
    # plain http: to the origin's own host only, and only when insecure (another port is the same host)
    ("http://registry.example/v2/ns/m/blobs/sha256:00", REGISTRY, None),
    ("http://registry.example:5001/v2/ns/m/blobs/sha256:00", REGISTRY, None),
    ("http://REGISTRY.example/x", REGISTRY, None),
    ("http://cdn.example/x", REGISTRY, "plain http"),
    ("http://registry.example.evil.test/x", REGISTRY, "plain http"),
    ("http://huggingface.co/x", PUBLIC, "plain http"),  # not insecure: no http at all, not even to itself
    ("http://cdn.example/x", PUBLIC, "plain http"),
    ("http://10.0.0.3/x", LAN, "plain http"),  # a private origin still gets http to itself only
    # schemes other than http(s)
    ("ftp://cdn.example/x", PUBLIC, "ftp URL"),
    ("file://cdn.example/etc/passwd", PUBLIC, "file URL"),
    ("gopher://cdn.example/x", REGISTRY, "gopher URL"),
    ("//cdn.example/x", PUBLIC, "relative URL"),
    # into loopback, private or link-local ranges: refused from a public origin ...
    ("https://loop.example/x", PUBLIC, "loopback or private"),
    ("https://ten.example/x", PUBLIC, "loopback or private"),
    ("https://metadata.example/latest/meta-data", PUBLIC, "loopback or private"),
    ("https://169.254.169.254/latest/meta-data", PUBLIC, "loopback or private"),
    ("https://v6loop.example/x", PUBLIC, "loopback or private"),
    ("https://mapped.example/x", PUBLIC, "loopback or private"),
    ("https://mixed.example/x", PUBLIC, "loopback or private"),
    ("https://ten.example/x", REGISTRY, "loopback or private"),
    # ... allowed from a private one (a registry on this machine or the LAN)
    ("https://loop.example/x", LAN, None),
    ("https://ten.example/x", LAN, None),
    ("https://10.0.0.3/x", LAN, None),
    ("https://metadata.example/x", LAN, None),
    ("https://v6loop.example/x", LAN, None),
    ("https://mapped.example/x", LAN, None),
    # no host
    ("https:///x", PUBLIC, "names no host"),
    ("http:///x", REGISTRY, "names no host"),
    ("file:///etc/passwd", PUBLIC, "names no host"),
    ("/relative/path", PUBLIC, "names no host"),
    ("", PUBLIC, "names no host"),
])
def test_the_redirect_policy(url, origin, refused):
    why = transfer.problem(url, origin, fake_resolve)
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why


def test_the_origin_itself_is_never_resolved_again():
    def resolve(host: str) -> list[str]:
        raise AssertionError(f"resolved {host}")
    assert transfer.problem("https://huggingface.co/x", PUBLIC, resolve) is None


def test_address_literals_are_judged_by_the_real_resolver():
    for url in ("https://127.0.0.1/x", "https://[::1]/x", "https://10.1.2.3/x", "https://169.254.169.254/x",
                "https://[::ffff:192.168.0.1]/x", "https://0.0.0.0/x"):
        assert "loopback or private" in (transfer.problem(url, PUBLIC) or ""), url


@pytest.mark.parametrize("url, insecure, addresses, expected", [
    ("https://HuggingFace.co", False, ["18.1.2.3"], transfer.Origin("huggingface.co", False, False)),
    ("http://127.0.0.1:8080", True, ["127.0.0.1"], transfer.Origin("127.0.0.1", True, True)),
    ("http://registry.lan:5000", True, ["192.168.1.20"], transfer.Origin("registry.lan", True, True)),
    ("https://mixed.example", False, ["18.1.2.3", "10.0.0.1"], transfer.Origin("mixed.example", False, True)),
])
def test_an_origin_is_private_when_any_address_is(url, insecure, addresses, expected):
    assert transfer.Origin.of(url, insecure=insecure, resolve=lambda host: addresses) == expected


# ---------------------------------------------------------------- fetch against the CDN

def test_a_whole_file_is_fetched_and_checked(hub, tmp_path):
    partial = tmp_path / "blob.incomplete"
    seen = fetch(want(hub, partial))
    assert partial.read_bytes() == PAYLOAD
    assert seen[0] == 0 and seen[-1] == SIZE
    [get] = cdn_gets(hub)
    assert "Range" not in get.headers and get.status == 200


def test_a_partial_file_is_resumed_with_a_range(hub, tmp_path):
    partial = tmp_path / "blob.incomplete"
    partial.write_bytes(PAYLOAD[:300_000])
    seen = fetch(want(hub, partial))
    assert partial.read_bytes() == PAYLOAD
    assert seen[0] == 300_000 and seen[-1] == SIZE
    [get] = cdn_gets(hub)
    assert get.headers["Range"] == "bytes=300000-" and get.status == 206
    assert get.bytes_sent == SIZE - 300_000


def test_the_kept_bytes_are_hashed_too(hub, tmp_path):
    """A partial file whose kept bytes are not the file's: the resume completes it, the digest refuses it."""
    partial = tmp_path / "blob.incomplete"
    partial.write_bytes(b"\0" * 300_000)
    with pytest.raises(transfer.Corrupt, match="SHA-256"):
        fetch(want(hub, partial))
    assert not partial.exists()


def test_a_server_that_ignores_range_still_gives_the_right_bytes(hub, tmp_path):
    hub.faults.ignore_range = True
    partial = tmp_path / "blob.incomplete"
    partial.write_bytes(b"\0" * 300_000)  # wrong bytes even: the whole file replaces them
    seen = fetch(want(hub, partial))
    assert partial.read_bytes() == PAYLOAD
    assert seen[:2] == [300_000, 0] and seen[-1] == SIZE
    [get] = cdn_gets(hub)
    assert get.headers["Range"] == "bytes=300000-" and get.status == 200


def test_a_dropped_connection_resumes_from_what_was_written(hub, tmp_path):
    hub.faults.drop_after = 700_000
    partial = tmp_path / "blob.incomplete"
    fetch(want(hub, partial))
    assert partial.read_bytes() == PAYLOAD
    first, second = cdn_gets(hub)
    assert first.dropped and "Range" not in first.headers
    assert second.headers["Range"] == "bytes=700000-" and second.status == 206 and not second.dropped


def test_a_connection_that_drops_again_and_again_goes_on_while_bytes_come(hub, tmp_path, monkeypatch):
    monkeypatch.setattr(transfer.time, "sleep", lambda seconds: None)  # no back-off: the count of tries is the point
    hub.faults.drop_times = 10
    hub.faults.drop_after = 400_000
    partial = tmp_path / "blob.incomplete"
    fetch(want(hub, partial))
    assert partial.read_bytes() == PAYLOAD
    gets = cdn_gets(hub)
    assert [g.headers.get("Range") for g in gets] == [None, "bytes=400000-", "bytes=800000-", "bytes=1200000-"]
    assert [g.dropped for g in gets] == [True, True, True, False]


def test_a_connection_that_brings_nothing_gives_up_after_the_retries(hub, tmp_path, monkeypatch):
    monkeypatch.setattr(transfer.time, "sleep", lambda seconds: None)
    hub.faults.drop_times = 100
    hub.faults.drop_after = 0
    partial = tmp_path / "blob.incomplete"
    partial.write_bytes(PAYLOAD[:1000])
    with pytest.raises(transfer.Unreachable):
        fetch(want(hub, partial))
    assert len(cdn_gets(hub)) == transfer.RETRIES + 1
    assert partial.read_bytes() == PAYLOAD[:1000]  # kept for the next pull


def test_a_corrupted_byte_is_refused_and_the_partial_deleted(hub, tmp_path):
    hub.faults.corrupt = {PATH}
    partial = tmp_path / "blob.incomplete"
    with pytest.raises(transfer.Corrupt, match="SHA-256") as caught:
        fetch(want(hub, partial))
    assert caught.value.status == 502 and caught.value.code == "download_corrupt"
    assert not partial.exists()


@pytest.mark.parametrize(("size", "sha"), [(SIZE, None), (None, SHA), (None, None)])
def test_without_a_size_or_a_digest_nothing_is_fetched(hub, tmp_path, size, sha):
    partial = tmp_path / "blob.incomplete"
    with pytest.raises(transfer.Unverifiable, match="no size" if size is None else "no digest") as caught:
        fetch(want(hub, partial, size=size, sha=sha))
    assert caught.value.status == 502 and caught.value.code == "download_unverifiable"
    assert cdn_gets(hub) == [] and not partial.exists()


def test_a_declared_size_larger_than_the_file_is_corrupt(hub, tmp_path):
    partial = tmp_path / "blob.incomplete"
    with pytest.raises(transfer.Corrupt):
        fetch(want(hub, partial, size=SIZE + 1))
    assert not partial.exists()


def test_more_bytes_than_declared_are_corrupt(hub, tmp_path):
    partial = tmp_path / "blob.incomplete"
    with pytest.raises(transfer.Corrupt, match="more than the declared"):
        fetch(want(hub, partial, size=SIZE - 1))
    assert not partial.exists()


def test_a_partial_file_already_longer_than_declared_is_corrupt(hub, tmp_path):
    partial = tmp_path / "blob.incomplete"
    partial.write_bytes(PAYLOAD + b"extra")
    with pytest.raises(transfer.Corrupt):
        fetch(want(hub, partial))
    assert not partial.exists()


def test_a_complete_partial_file_is_verified_without_refetching(hub, tmp_path):
    partial = tmp_path / "blob.incomplete"
    partial.write_bytes(PAYLOAD)
    fetch(want(hub, partial))
    assert partial.read_bytes() == PAYLOAD
    assert [g.status for g in cdn_gets(hub)] == [416]


def test_a_cancel_stops_the_transfer_and_keeps_the_partial(hub, tmp_path):
    partial = tmp_path / "blob.incomplete"
    cancelled = threading.Event()
    held_at_cancel: list[int] = []

    def progress(held: int) -> None:
        if held and not cancelled.is_set():
            held_at_cancel.append(held)
            cancelled.set()

    with pytest.raises(transfer.Cancelled) as caught:
        transfer.fetch(want(hub, partial), progress, cancelled)
    assert caught.value.status == 409 and caught.value.code == "pull_cancelled"
    [held] = held_at_cancel
    assert 0 < held < SIZE
    assert partial.read_bytes() == PAYLOAD[:held]  # every byte told is on disk
    # the next fetch resumes from it
    hub.log.clear()
    fetch(want(hub, partial))
    assert partial.read_bytes() == PAYLOAD
    [get] = cdn_gets(hub)
    assert get.headers["Range"] == f"bytes={held}-"


def test_a_cancel_before_the_first_byte_asks_nothing(hub, tmp_path):
    partial = tmp_path / "blob.incomplete"
    partial.write_bytes(PAYLOAD[:1000])
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(transfer.Cancelled):
        fetch(want(hub, partial), cancelled)
    assert partial.read_bytes() == PAYLOAD[:1000]
    assert cdn_gets(hub) == []


def test_a_missing_file_is_not_found_and_a_server_error_unreachable(hub, tmp_path):
    partial = tmp_path / "blob.incomplete"
    with pytest.raises(transfer.NotFound) as caught:
        fetch(want(hub, partial, key="0" * 64))
    assert caught.value.status == 404
    hub.faults.fail_status = {SHA: 503}
    partial.write_bytes(PAYLOAD[:1000])
    with pytest.raises(transfer.Unreachable, match="503"):
        fetch(want(hub, partial))
    assert partial.read_bytes() == PAYLOAD[:1000]  # kept: the next pull resumes


# ---------------------------------------------------------------- redirects the policy refuses

class LocalhostCdn(Hub):
    """The fixture's hub and registry, sending blob bytes to its CDN as ``http://localhost:PORT``: the same
    machine under another host name, which a pull from ``127.0.0.1`` over plain http may not follow."""

    @property
    def cdn_url(self) -> str:
        return f"http://localhost:{self._port(1)}"


def pull_ollama(h: Hub, store: Path) -> list[Path]:
    """``ollama.plan`` and ``plan.execute`` of ``acme/tiny`` from ``h``'s registry, as a pull's thread runs them."""
    transfer.install_client()
    name = OllamaName(h.host, "acme", "tiny", "latest", True)
    return execute(ollama.plan(name, store, insecure=True), lambda *a: None, threading.Event())


def refused(call: Callable[[], object]) -> tuple[str, int, str]:
    """What ``call()``'s ``Refused`` says (message, status, code). The refused redirect's connection is left
    open by ``transfer`` (test_a_refused_redirect_closes_its_connection) and closed by the collector here, its
    ResourceWarning ignored, so that it does not fail whichever test runs when it is collected."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            call()
        except transfer.Refused as exc:
            told = (str(exc), exc.status, exc.code)
        else:
            raise AssertionError("not refused")
        gc.collect()
    return told


def test_a_blob_redirect_to_the_registrys_own_host_is_followed(hub, tmp_path):
    hub.add_ollama_model("acme", "tiny", "latest", PAYLOAD[:5000], template="{{ .Prompt }}")
    store = tmp_path / "ollama"
    [model] = pull_ollama(hub, store)
    assert model.read_bytes() == PAYLOAD[:5000]
    assert (store / "manifests" / hub.host / "acme" / "tiny" / "latest").is_file()
    blob_gets = [r for r in hub.log if r.server == "hub" and "/blobs/" in r.path]
    assert blob_gets and all(r.status == 307 for r in blob_gets)
    assert len(cdn_gets(hub)) == len(blob_gets)  # each redirect followed to the CDN on 127.0.0.1


def test_a_blob_redirect_to_another_host_over_http_is_refused(tmp_path):
    with LocalhostCdn() as other:
        other.add_ollama_model("acme", "tiny", "latest", PAYLOAD[:5000], template="{{ .Prompt }}")
        store = tmp_path / "ollama"
        message, status, code = refused(lambda: pull_ollama(other, store))
        assert "plain http to localhost" in message and status == 502 and code == "redirect_refused"
        assert any(r.status == 307 for r in other.log if "/blobs/" in r.path)
        assert [r for r in other.log if r.server == "cdn"] == []  # never asked
    assert not (store / "manifests").exists()
    assert not [p for p in store.rglob("*") if p.is_file() and p.stat().st_size]


def test_a_refused_redirect_closes_its_connection(tmp_path):
    with LocalhostCdn() as other:
        other.add_ollama_model("acme", "tiny", "latest", PAYLOAD[:5000])
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always", ResourceWarning)
            try:
                pull_ollama(other, tmp_path / "ollama")
            except transfer.Refused:
                pass
            gc.collect()
    assert [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)] == []


def test_a_hub_lfs_redirect_to_another_host_over_http_is_refused(tmp_path, monkeypatch):
    with LocalhostCdn() as other:
        other.add_hf_repo("acme/Blob-GGUF", {PATH: PAYLOAD[:5000]})
        monkeypatch.setenv("HF_ENDPOINT", other.url)
        cache = tmp_path / "hf"
        transfer.install_client()
        plan = huggingface.plan(HFName("acme/Blob-GGUF", None, None, True), cache)
        assert plan.blobs[0].want.url.startswith("http://localhost:")
        with pytest.raises(transfer.Refused, match="plain http to localhost"):
            execute(plan, lambda *a: None, threading.Event())
        assert [r for r in other.log if r.server == "cdn"] == []
    assert not (cache / "models--acme--Blob-GGUF" / "snapshots").exists()


def test_a_key_sent_to_the_hub_is_not_sent_on_to_its_cdn(hub, tmp_path):
    url = f"{hub.url}/acme/Blob-GGUF/resolve/main/{PATH}"  # 302 to the CDN, another port: another origin
    partial = tmp_path / "blob.incomplete"
    fetch(transfer.Want(url, partial, SIZE, SHA, "blob", (("Authorization", "Bearer hf_secret"),),
                        transfer.Origin.of(hub.url, insecure=True)))
    assert partial.read_bytes() == PAYLOAD
    [resolve] = [r for r in hub.log if r.server == "hub"]
    assert resolve.status == 302 and resolve.headers["Authorization"] == "Bearer hf_secret"
    [get] = cdn_gets(hub)
    assert "Authorization" not in get.headers


def test_the_hub_token_is_not_sent_to_the_cdn_the_hub_names(hub, tmp_path, monkeypatch):
    """huggingface.plan's Want goes straight to the CDN location the hub's HEAD answered: the hub's headers
    (HF_TOKEN's Authorization) stay with the hub, as huggingface_hub keeps them."""
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token_for_the_hub_only")
    transfer.install_client()
    plan = huggingface.plan(HFName("acme/Blob-GGUF", None, None, True), tmp_path / "hf")
    execute(plan, lambda *a: None, threading.Event())
    assert [r.headers.get("Authorization") for r in hub.log if r.server == "hub"][0] is not None  # the hub got it
    [get] = cdn_gets(hub)
    assert "Authorization" not in get.headers


class Hops:
    """A server of redirects: ``/hop/N`` to ``/hop/N-1``, ``/hop/0`` one byte, ``/away?to=URL`` to URL."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def start(self, aiohttp_server):  # noqa: ANN001, ANN201
        async def hop(request: web.Request) -> web.StreamResponse:
            self.paths.append(request.path)
            n = int(request.match_info["n"])
            if n == 0:
                return web.Response(body=b"x")
            return web.Response(status=307, headers={"Location": f"/hop/{n - 1}"})

        async def away(request: web.Request) -> web.StreamResponse:
            self.paths.append(request.path)
            return web.Response(status=302, headers={"Location": request.query["to"]})

        app = web.Application()
        app.router.add_get("/hop/{n}", hop)
        app.router.add_get("/away", away)
        self.server = await aiohttp_server(app)
        return self

    def want(self, path: str, partial: Path) -> transfer.Want:
        url = str(self.server.make_url(path))
        return transfer.Want(url, partial, 1, hashlib.sha256(b"x").hexdigest(), "x",
                             origin=transfer.Origin.of(url, insecure=True))


async def test_redirects_up_to_the_bound_are_followed(aiohttp_server, tmp_path):
    hops = await Hops().start(aiohttp_server)
    partial = tmp_path / "x.incomplete"
    await asyncio.to_thread(fetch, hops.want(f"/hop/{transfer.MAX_REDIRECTS}", partial))
    assert partial.read_bytes() == b"x"
    assert len(hops.paths) == transfer.MAX_REDIRECTS + 1


async def test_more_redirects_than_the_bound_are_not_followed(aiohttp_server, tmp_path):
    hops = await Hops().start(aiohttp_server)
    partial = tmp_path / "x.incomplete"
    with pytest.raises(transfer.PullError):
        await asyncio.to_thread(fetch, hops.want(f"/hop/{transfer.MAX_REDIRECTS + 1}", partial))
    assert "/hop/0" not in hops.paths
    assert partial.read_bytes() == b""


async def test_more_redirects_than_the_bound_are_refused(aiohttp_server, tmp_path):
    hops = await Hops().start(aiohttp_server)
    with pytest.raises(transfer.Refused):
        await asyncio.to_thread(fetch, hops.want(f"/hop/{transfer.MAX_REDIRECTS + 1}", tmp_path / "x.incomplete"))


async def test_a_redirect_to_another_host_or_scheme_is_refused(aiohttp_server, tmp_path):
    hops = await Hops().start(aiohttp_server)
    port = hops.server.port
    for to, why in ((f"http://localhost:{port}/hop/0", "plain http to localhost"),
                    (f"ftp://127.0.0.1:{port}/hop/0", "ftp URL")):
        w = hops.want(f"/away?to={to}", tmp_path / "x.incomplete")
        message, _, _ = await asyncio.to_thread(refused, lambda w=w: fetch(w))
        assert why in message
    assert "/hop/0" not in hops.paths


async def test_a_redirect_to_a_file_url_is_refused(aiohttp_server, tmp_path):
    hops = await Hops().start(aiohttp_server)
    with pytest.raises(transfer.Refused, match="file URL"):
        await asyncio.to_thread(fetch, hops.want("/away?to=file:///etc/passwd", tmp_path / "x.incomplete"))


# ---------------------------------------------------------------- free space

def test_too_little_space_is_refused_naming_the_folder(tmp_path, monkeypatch):
    folder = tmp_path / "not" / "made" / "yet"
    monkeypatch.setattr(space, "free_bytes", lambda f: 100 << 20)
    with space.SPACE.claim(folder, 60 << 20, 40 << 20, "acme/m"):  # exactly what is free: allowed
        pass
    with space.SPACE.claim(folder, 0, 0, "acme/m"):
        pass
    with pytest.raises(transfer.NoSpace) as caught:
        space.SPACE.claim(folder, (60 << 20) + 1, 40 << 20, "acme/m")
    err = caught.value
    assert err.status == 507 and err.code == "insufficient_storage"
    assert str(folder) in str(err) and "acme/m" in str(err) and "pull_keep_free_bytes" in str(err)
    with pytest.raises(transfer.NoSpace) as caught:
        space.SPACE.claim(folder, (100 << 20) + 1, 0, "acme/m")
    assert "pull_keep_free_bytes" not in str(caught.value)


def test_free_space_is_measured_on_the_nearest_existing_folder(tmp_path):
    folder = tmp_path / "a" / "b"
    free = space.free_bytes(folder)
    assert free > 0
    with pytest.raises(transfer.NoSpace, match=str(folder)):
        space.SPACE.claim(folder, free + (1 << 40), 0, "acme/m")
    assert not (tmp_path / "a").exists()  # measuring made nothing


# ---------------------------------------------------------------- what a pull's caller is told

A = "sha256:" + "a" * 64
B = "sha256:" + "b" * 64


def pull_of(*files: tuple[str, int]) -> Pull:
    p = Pull("hf.co/acme/m", "acme/M", False)
    p.name = "hf.co/acme/M"
    p.files = {d: FileProgress(d, f"acme/M {d[7:19]}", total) for d, total in files}
    return p


def line(digest: str, total: int, completed: int) -> dict:
    return {"status": f"pulling {digest[7:19]}", "digest": digest, "total": total, "completed": completed}


def test_narration_tells_each_growth_once_and_a_files_last_line_before_a_later_step():
    p = pull_of((A, 100), (B, 50))
    told = Narration(own=False)
    assert told.next(p) == [{"status": "pulling manifest"}]
    assert told.next(p) == []  # a step is told once
    p.move(PullState.DOWNLOADING)
    p.step, p.current = "pulling", A
    assert told.next(p) == [line(A, 100, 0)]  # the file begun, though no byte yet
    assert told.next(p) == []
    p.files[A].completed = 60
    assert told.next(p) == [line(A, 100, 60)]
    assert told.next(p) == []
    # A's last bytes and the step after them, before the caller woke: both told, in order
    p.files[A].completed = 100
    p.at("verifying sha256 digest")
    assert told.next(p) == [line(A, 100, 100), {"status": "verifying sha256 digest"}]
    assert told.next(p) == []
    p.step, p.current = "pulling", B
    assert told.next(p) == [line(B, 50, 0)]
    # B's last bytes, its verification and the manifest, all before the caller woke
    p.files[B].completed = 50
    p.at("verifying sha256 digest")
    p.at("writing manifest")
    assert told.next(p) == [line(B, 50, 50), {"status": "writing manifest"}]
    assert told.next(p) == []
    p.at("success")
    p.move(PullState.DONE)
    assert told.next(p) == [{"status": "success"}]


def test_narration_of_a_caller_who_joins_late_tells_where_it_stands():
    p = pull_of((A, 100), (B, 50))
    p.move(PullState.DOWNLOADING)
    p.files[A].completed, p.files[B].completed, p.current, p.step = 100, 20, B, "pulling"
    assert Narration(own=False).next(p) == [{"status": "pulling manifest"}, line(A, 100, 100), line(B, 50, 20)]


def holds(got: list[dict], expected: list[dict]) -> bool:
    """Each line has (at least) the fields expected of it: the gateway's own shape may add more."""
    return len(got) == len(expected) and all(e.items() <= g.items() for g, e in zip(got, expected))


def test_narration_in_the_gateways_own_shape():
    p = pull_of((A, 100))
    told = Narration(own=True)
    assert holds(told.next(p), [{"status": "pulling manifest"}])
    p.move(PullState.DOWNLOADING)
    p.current, p.step = A, "pulling"
    p.files[A].completed = 10
    [got] = told.next(p)
    assert got == {**line(A, 100, 10), "model": "hf.co/acme/M", "bytes_per_second": 0, "eta_seconds": None}
    p.files[A].completed = 100
    p.at("writing manifest")
    assert holds(told.next(p), [{**line(A, 100, 100), "model": "hf.co/acme/M"}, {"status": "writing manifest"}])
    p.at("success")
    p.move(PullState.DONE)
    assert told.next(p) == [{"status": "success", "model": "hf.co/acme/M"}]


@pytest.mark.parametrize("state, error, expected", [
    (PullState.FAILED, transfer.Corrupt("acme/M: SHA-256 is not the declared"), "acme/M: SHA-256 is not the declared"),
    (PullState.CANCELLED, transfer.Cancelled("acme/M: cancelled"), "acme/M: cancelled"),
    (PullState.FAILED, None, "failed"),
])
def test_narration_ends_with_the_error(state, error, expected):
    p = pull_of((A, 100))
    told = Narration(own=False)
    told.next(p)
    p.move(PullState.DOWNLOADING)
    p.current, p.step = A, "pulling"
    p.files[A].completed = 30
    told.next(p)
    p.files[A].completed = 40
    p.error, p.step = error, "error"
    p.move(state)
    assert told.next(p) == [line(A, 100, 40), {"error": expected}]


def test_narration_of_a_pull_that_failed_while_planning():
    p = pull_of()
    p.error, p.step = transfer.NotFound("no model 'acme/M'"), "error"
    p.move(PullState.FAILED)
    assert holds(Narration(own=True).next(p), [{"status": "pulling manifest"}, {"error": "no model 'acme/M'"}])
