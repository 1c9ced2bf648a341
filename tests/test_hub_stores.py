"""The stores pulls write (gateway.hub.ollama, .huggingface, .removal, .pulls), in-process: hostile registry
manifests and hub listings refused before a byte is written, removal by each store's own rule, the names
``server.pull_on_demand`` lets through, and ``Pulls`` sharing, cancelling and resuming a download from the
loopback hub of tests/hubserver.py. The end-to-end tier (tests/test_pull_e2e.py) drives the real server."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import threading
from pathlib import Path

import huggingface_hub
import pytest
from aiohttp import web
from hubserver import Hub

from gateway.hub import huggingface, ollama, removal, transfer
from gateway.hub.names import HFName, OllamaName
from gateway.hub.plan import execute
from gateway.hub.pulls import Pulls, PullState, Stores, on_demand
from gateway.models import discovery
from gateway.models.discovery import Found, Root

MODEL_TYPE = discovery.OLLAMA_MODEL_LAYER
TEMPLATE_TYPE = "application/vnd.ollama.image.template"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
COMMIT = "c" * 40


def hexof(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield
    huggingface_hub.close_session()  # no pooled connection outlives its test's server


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink())


# ---------------------------------------------------------------- hostile registry manifests

def layer(media: object = MODEL_TYPE, digest: object = None, size: object = 10) -> dict:
    return {"mediaType": media, "digest": f"sha256:{'a' * 64}" if digest is None else digest, "size": size}


def manifest(*layers: dict, config: object = "default") -> bytes:
    body: dict = {"schemaVersion": 2, "mediaType": ollama.MANIFEST_ACCEPT,
                  "layers": list(layers) if layers else [layer()]}
    if config == "default":
        body["config"] = layer(CONFIG_TYPE, f"sha256:{'c' * 64}", 100)
    elif config is not None:
        body["config"] = config
    return json.dumps(body).encode()


class Registry:
    """An Ollama registry that answers every manifest with ``body`` and ``status``."""

    def __init__(self, body: bytes, status: int = 200):
        self.body, self.status = body, status
        self.asked: list[str] = []

    async def start(self, aiohttp_server) -> Registry:  # noqa: ANN001
        async def answer(request: web.Request) -> web.Response:
            self.asked.append(request.path)
            return web.Response(body=self.body, status=self.status, content_type=ollama.MANIFEST_ACCEPT)

        app = web.Application()
        app.router.add_get("/v2/{ns}/{model}/manifests/{tag}", answer)
        app.router.add_get("/v2/{ns}/{model}/blobs/{digest}", answer)
        server = await aiohttp_server(app)
        self.name = OllamaName(f"127.0.0.1:{server.port}", "acme", "m", "latest", True)
        return self


DEEP = b"[" * 10_000 + b"]" * 10_000
HEX = "a" * 64

HOSTILE_MANIFESTS = [
    ("over the size bound", manifest(layer(media="x" * (discovery.MAX_MANIFEST_BYTES + 1))), transfer.Corrupt),
    ("over the size bound, as whitespace", b"{" + b" " * discovery.MAX_MANIFEST_BYTES + b"}", transfer.Corrupt),
    ("not JSON", b"<html>registry</html>", transfer.Corrupt),
    ("empty", b"", transfer.Corrupt),
    ("NaN", b'{"layers": [{"mediaType": "a", "digest": "sha256:' + HEX.encode() + b'", "size": NaN}]}',
     transfer.Corrupt),
    ("nested 10,000 deep", DEEP, transfer.Corrupt),
    ("nested 10,000 deep in its layers", b'{"layers": ' + DEEP + b"}", transfer.Corrupt),
    ("a list", b"[]", transfer.Corrupt),
    ("no layers", json.dumps({"schemaVersion": 2}).encode(), transfer.Corrupt),
    ("empty layers", json.dumps({"layers": []}).encode(), transfer.Corrupt),
    ("layers an object", json.dumps({"layers": {"0": layer()}}).encode(), transfer.Corrupt),
    ("a layer not an object", manifest(layer(), "sha256:" + HEX), transfer.Corrupt),
    ("more than MAX_LAYERS layers", manifest(*[layer(TEMPLATE_TYPE, f"sha256:{i:064x}") for i in range(ollama.MAX_LAYERS)],
                                             layer()), transfer.Corrupt),
    ("digest ../../etc", manifest(layer(digest="sha256:../../etc")), transfer.Corrupt),
    ("digest ../ padded to 64", manifest(layer(digest="sha256:" + ("../" * 22)[:64])), transfer.Corrupt),
    ("digest upper-case hex", manifest(layer(digest="sha256:" + "A" * 64)), transfer.Corrupt),
    ("digest short hex", manifest(layer(digest="sha256:" + "a" * 63)), transfer.Corrupt),
    ("digest long hex", manifest(layer(digest="sha256:" + "a" * 65)), transfer.Corrupt),
    ("digest not hex", manifest(layer(digest="sha256:" + "g" * 64)), transfer.Corrupt),
    ("digest another algorithm", manifest(layer(digest="sha512:" + "a" * 64)), transfer.Corrupt),
    ("digest as a file name", manifest(layer(digest="sha256-" + HEX)), transfer.Corrupt),
    ("digest with a newline", manifest(layer(digest=f"sha256:{HEX}\n")), transfer.Corrupt),
    ("digest a number", manifest(layer(digest=5)), transfer.Corrupt),
    ("size negative", manifest(layer(size=-1)), transfer.Corrupt),
    ("size huge", manifest(layer(size=ollama.MAX_BLOB_BYTES + 1)), transfer.Corrupt),
    ("size 10**30", manifest(layer(size=10**30)), transfer.Corrupt),
    ("size a string", manifest(layer(size="10")), transfer.Corrupt),
    ("size a float", manifest(layer(size=1.5)), transfer.Corrupt),
    ("size missing", manifest({"mediaType": MODEL_TYPE, "digest": f"sha256:{HEX}"}), transfer.Corrupt),
    ("media type missing", manifest({"digest": f"sha256:{HEX}", "size": 1}), transfer.Corrupt),
    ("media type with a space", manifest(layer(media="application/x y")), transfer.Corrupt),
    ("media type with a newline", manifest(layer(media="application/x\n")), transfer.Corrupt),
    ("config malformed", manifest(layer(), config=layer(CONFIG_TYPE, "sha256:../../x")), transfer.Corrupt),
    ("config not an object", manifest(layer(), config="sha256:" + HEX), transfer.Corrupt),
    ("no model layer", manifest(layer(TEMPLATE_TYPE)), transfer.NotFound),
    ("only a projector", manifest(layer("application/vnd.ollama.image.projector")), transfer.NotFound),
]


@pytest.mark.parametrize("body, kind", [c[1:] for c in HOSTILE_MANIFESTS], ids=[c[0] for c in HOSTILE_MANIFESTS])
async def test_a_hostile_manifest_is_refused_and_nothing_written(aiohttp_server, tmp_path, body, kind):
    registry = await Registry(body).start(aiohttp_server)
    store = tmp_path / "ollama"
    with pytest.raises(transfer.PullError) as caught:
        await asyncio.to_thread(ollama.plan, registry.name, store, True)
    assert type(caught.value) is kind, caught.value
    assert registry.asked == ["/v2/acme/m/manifests/latest"]  # not one blob asked for
    assert not store.exists()


async def test_a_manifest_whose_size_is_a_boolean_is_refused(aiohttp_server, tmp_path):
    registry = await Registry(manifest(layer(size=True))).start(aiohttp_server)
    with pytest.raises(transfer.Corrupt):
        await asyncio.to_thread(ollama.manifest, registry.name, True)


@pytest.mark.parametrize("status, kind", [
    (404, transfer.NotFound), (401, transfer.NotFound), (403, transfer.NotFound),
    (500, transfer.Unreachable), (302, transfer.Unreachable),
])
async def test_a_registry_error_is_its_kind(aiohttp_server, tmp_path, status, kind):
    registry = await Registry(b'{"errors": [{"code": "X"}]}', status).start(aiohttp_server)
    with pytest.raises(transfer.PullError) as caught:
        await asyncio.to_thread(ollama.plan, registry.name, tmp_path / "ollama", True)
    assert type(caught.value) is kind
    assert not (tmp_path / "ollama").exists()


async def test_a_fair_manifest_plans_each_blob_once_inside_the_store(aiohttp_server, tmp_path):
    shared = layer(TEMPLATE_TYPE, f"sha256:{'b' * 64}", 5)
    registry = await Registry(manifest(layer(), shared, shared)).start(aiohttp_server)
    store = tmp_path / "ollama"
    plan = await asyncio.to_thread(ollama.plan, registry.name, store, True)
    finals = [b.final for b in plan.blobs]
    assert finals == [store / "blobs" / f"sha256-{'c' * 64}", store / "blobs" / f"sha256-{HEX}",
                      store / "blobs" / f"sha256-{'b' * 64}"]
    assert all(b.want.partial.parent == store / "blobs" for b in plan.blobs)
    assert not store.exists()


# ---------------------------------------------------------------- hostile hub listings

class HFServer:
    """A Hugging Face hub of one repo, ``acme/Repo``, answering with what a test sets: ``listing`` (the bytes of
    ``/api/models/acme/Repo/revision/main``), and per file path its bytes and the ``ETag`` its resolve URL
    gives."""

    def __init__(self, listing: bytes, files: dict[str, tuple[bytes, str]] | None = None, status: int = 200):
        self.listing, self.files, self.status = listing, files or {}, status
        self.resolved: list[str] = []

    async def start(self, aiohttp_server, monkeypatch) -> HFServer:  # noqa: ANN001
        async def listing(request: web.Request) -> web.Response:
            return web.Response(body=self.listing, status=self.status, content_type="application/json")

        async def resolve(request: web.Request) -> web.Response:
            path = request.match_info["path"]
            self.resolved.append(f"{request.method} {path}")
            if path not in self.files:
                return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT})
            data, etag = self.files[path]
            headers = {"X-Repo-Commit": COMMIT, "X-Linked-Size": str(len(data))}
            if etag:
                headers["ETag"] = etag
            return web.Response(body=data, headers=headers, content_type="application/octet-stream")

        app = web.Application()
        app.router.add_get("/api/models/acme/Repo/revision/{rev}", listing)
        app.router.add_get("/acme/Repo/resolve/{rev}/{path:.+}", resolve)
        server = await aiohttp_server(app)
        monkeypatch.setenv("HF_ENDPOINT", str(server.make_url("/")))
        return self


def listing(*siblings: dict, sha: object = COMMIT) -> bytes:
    return json.dumps({"id": "acme/Repo", "sha": sha, "siblings": list(siblings)}).encode()


def sibling(path: str, data: bytes, sha: str | None = None, size: int | None = None) -> dict:
    n = len(data) if size is None else size
    return {"rfilename": path, "size": n, "lfs": {"sha256": sha or hexof(data), "size": n, "pointerSize": 130}}


REPO = HFName("acme/Repo", None, None, True)
GOOD = random.Random(3).randbytes(4000)


def hf_plan(cache: Path, name: HFName = REPO):
    transfer.install_client()
    return huggingface.plan(name, cache)


@pytest.mark.parametrize("body, status, kind", [
    (b" " * (huggingface.MAX_LISTING_BYTES + 1), 200, transfer.Corrupt),
    (b"<html>", 200, transfer.Corrupt),
    (DEEP, 200, transfer.Corrupt),
    (b"[]", 200, transfer.Corrupt),
    (json.dumps({"sha": COMMIT}).encode(), 200, transfer.Corrupt),
    (json.dumps({"sha": COMMIT, "siblings": {"a.gguf": {}}}).encode(), 200, transfer.Corrupt),
    (listing(sha="../../../etc"), 200, transfer.Corrupt),
    (listing(sha="C" * 40), 200, transfer.Corrupt),
    (listing(sha=None), 200, transfer.Corrupt),
    (json.dumps({"sha": COMMIT, "siblings": [{}] * (huggingface.MAX_LISTED_FILES + 1)}).encode(), 200, transfer.Corrupt),
    (b"{}", 401, transfer.NotFound),
    (b"{}", 404, transfer.NotFound),
    (b"{}", 403, transfer.Gated),
    (b"{}", 500, transfer.Unreachable),
], ids=["over MAX_LISTING_BYTES", "not JSON", "nested 10,000 deep", "a list", "no siblings", "siblings an object",
        "commit ../../../etc", "commit upper-case", "no commit", "over MAX_LISTED_FILES", "401", "404", "403", "500"])
async def test_a_hostile_listing_is_refused_and_nothing_written(aiohttp_server, monkeypatch, tmp_path, body, status, kind):
    hub = await HFServer(body, status=status).start(aiohttp_server, monkeypatch)
    with pytest.raises(transfer.PullError) as caught:
        await asyncio.to_thread(hf_plan, tmp_path / "hf")
    assert type(caught.value) is kind, caught.value
    assert hub.resolved == []
    assert files_under(tmp_path) == []


ESCAPES = ["../evil-Q4_K_M.gguf", "/abs-Q4_K_M.gguf", "sub/../../up-Q4_K_M.gguf", "./dot-Q4_K_M.gguf",
           "sub//twice-Q4_K_M.gguf", "sub\\..\\back-Q4_K_M.gguf", "..", "../mmproj-F16.gguf", "sub/../mmproj-Q8_0.gguf",
           "nul\x00-Q4_K_M.gguf", "new\nline-Q4_K_M.gguf", ""]


async def test_listed_paths_that_leave_the_snapshot_are_never_fetched_or_written(aiohttp_server, monkeypatch, tmp_path):
    bad = {path: (b"evil", f'"{hexof(b"evil")}"') for path in ESCAPES}
    hub = await HFServer(listing(*[sibling(p, b"evil") for p in ESCAPES], sibling("ok-Q4_K_M.gguf", GOOD)),
                         {**bad, "ok-Q4_K_M.gguf": (GOOD, f'"{hexof(GOOD)}"')}).start(aiohttp_server, monkeypatch)
    cache = tmp_path / "home" / "hf"
    plan = await asyncio.to_thread(hf_plan, cache)
    [blob] = plan.blobs
    paths = await asyncio.to_thread(execute, plan, lambda *a: None, threading.Event())
    repo = cache / "models--acme--Repo"
    assert paths == [repo / "snapshots" / COMMIT / "ok-Q4_K_M.gguf"]
    assert paths[0].read_bytes() == GOOD
    assert hub.resolved == ["HEAD ok-Q4_K_M.gguf", "GET ok-Q4_K_M.gguf"]
    assert all(p.is_relative_to(cache) for p in files_under(tmp_path))
    assert all(os.path.realpath(p).startswith(str(repo)) for p in files_under(repo / "snapshots"))


async def test_a_listing_of_only_escaping_paths_has_no_model(aiohttp_server, monkeypatch, tmp_path):
    await HFServer(listing(*[sibling(p, b"evil") for p in ESCAPES])).start(aiohttp_server, monkeypatch)
    with pytest.raises(transfer.NotFound, match="no GGUF"):
        await asyncio.to_thread(hf_plan, tmp_path / "hf")
    assert files_under(tmp_path) == []


@pytest.mark.parametrize("etag", ['"ab/cd"', '"../../../etc/passwd"', '"/abs"', '".."', '"."', '""', 'W/"a/b"', None],
                         ids=["slash", "traversal", "absolute", "dotdot", "dot", "empty", "weak with a slash", "none"])
async def test_an_etag_that_is_no_file_name_is_refused(aiohttp_server, monkeypatch, tmp_path, etag):
    listed = {"rfilename": "ok-Q4_K_M.gguf", "size": len(GOOD)}  # not in LFS: the etag alone names the blob
    await HFServer(listing(listed), {"ok-Q4_K_M.gguf": (GOOD, etag)}).start(aiohttp_server, monkeypatch)
    with pytest.raises(transfer.Corrupt, match="etag"):
        await asyncio.to_thread(hf_plan, tmp_path / "hf")
    assert files_under(tmp_path) == []


async def test_a_listed_sha256_that_is_not_the_etag_is_corrupt(aiohttp_server, monkeypatch, tmp_path):
    other = hexof(b"something else")
    await HFServer(listing(sibling("ok-Q4_K_M.gguf", GOOD)),
                   {"ok-Q4_K_M.gguf": (GOOD, f'"{other}"')}).start(aiohttp_server, monkeypatch)
    with pytest.raises(transfer.Corrupt, match="not the listed SHA-256"):
        await asyncio.to_thread(hf_plan, tmp_path / "hf")
    assert files_under(tmp_path) == []


async def test_a_listed_size_that_is_not_the_hubs_is_corrupt(aiohttp_server, monkeypatch, tmp_path):
    await HFServer(listing(sibling("ok-Q4_K_M.gguf", GOOD, size=len(GOOD) + 1)),
                   {"ok-Q4_K_M.gguf": (GOOD, f'"{hexof(GOOD)}"')}).start(aiohttp_server, monkeypatch)
    with pytest.raises(transfer.Corrupt, match="bytes"):
        await asyncio.to_thread(hf_plan, tmp_path / "hf")


async def test_bytes_that_are_not_the_listed_sha256_are_never_placed(aiohttp_server, monkeypatch, tmp_path):
    bad = GOOD[:-1] + b"!"
    await HFServer(listing(sibling("ok-Q4_K_M.gguf", GOOD)),
                   {"ok-Q4_K_M.gguf": (bad, f'"{hexof(GOOD)}"')}).start(aiohttp_server, monkeypatch)
    cache = tmp_path / "hf"
    plan = await asyncio.to_thread(hf_plan, cache)
    with pytest.raises(transfer.Corrupt, match="SHA-256"):
        await asyncio.to_thread(execute, plan, lambda *a: None, threading.Event())
    repo = cache / "models--acme--Repo"
    assert not (repo / "snapshots").exists() and not (repo / "refs").exists()
    assert not (repo / "blobs" / hexof(GOOD)).exists() and not (repo / "blobs" / f"{hexof(GOOD)}.incomplete").exists()


# ---------------------------------------------------------------- removing from the Hugging Face cache

def hf_snapshot(cache: Path, commit: str, files: dict[str, str], repo: str = "acme/Repo") -> dict[str, Path]:
    """A snapshot as huggingface_hub writes one: ``snapshots/COMMIT/PATH`` relative links to ``blobs/ETAG``."""
    folder = huggingface.storage(cache, repo)
    links = {}
    for path, etag in files.items():
        blob = folder / "blobs" / etag
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.write_bytes(etag.encode())
        link = folder / "snapshots" / commit / path
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
        links[path] = link
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    (cache / ".locks" / folder.name).mkdir(parents=True, exist_ok=True)
    return links


C1, C2 = "1" * 40, "2" * 40
E1, E2, E3, E4 = ("e1" * 32, "e2" * 32, "e3" * 32, "e4" * 32)


def test_a_blob_two_snapshots_share_stays_until_the_last_goes(tmp_path):
    cache = tmp_path / "hub"
    repo = huggingface.storage(cache, "acme/Repo")
    first = hf_snapshot(cache, C1, {"m-Q4_K_M.gguf": E1})["m-Q4_K_M.gguf"]
    second = hf_snapshot(cache, C2, {"m-Q4_K_M.gguf": E1})["m-Q4_K_M.gguf"]
    assert huggingface.remove([first], cache) == [first]
    assert not first.is_symlink() and (repo / "blobs" / E1).is_file() and second.read_bytes() == E1.encode()
    gone = huggingface.remove([second], cache)
    assert second in gone and repo in gone
    assert not repo.exists() and not (cache / ".locks" / repo.name).exists()
    assert cache.is_dir()


def test_a_projector_goes_with_the_last_model_of_its_folder(tmp_path):
    cache = tmp_path / "hub"
    repo = huggingface.storage(cache, "acme/Repo")
    links = hf_snapshot(cache, C1, {"sub/m-Q4_K_M.gguf": E1, "sub/mmproj-F16.gguf": E2, "other-Q8_0.gguf": E3})
    gone = huggingface.remove([links["sub/m-Q4_K_M.gguf"]], cache)
    assert set(gone) == {links["sub/m-Q4_K_M.gguf"], links["sub/mmproj-F16.gguf"]}
    assert not (repo / "blobs" / E1).exists() and not (repo / "blobs" / E2).exists()
    assert links["other-Q8_0.gguf"].read_bytes() == E3.encode() and (repo / "refs" / "main").is_file()


def test_a_projector_stays_while_another_model_of_its_folder_does(tmp_path):
    cache = tmp_path / "hub"
    repo = huggingface.storage(cache, "acme/Repo")
    links = hf_snapshot(cache, C1, {"a-Q4_K_M.gguf": E1, "b-Q8_0.gguf": E2, "mmproj-F16.gguf": E3})
    assert huggingface.remove([links["a-Q4_K_M.gguf"]], cache) == [links["a-Q4_K_M.gguf"]]
    assert not (repo / "blobs" / E1).exists()
    assert links["b-Q8_0.gguf"].read_bytes() == E2.encode() and links["mmproj-F16.gguf"].read_bytes() == E3.encode()
    # the last model takes the projector, then the repo, with it
    gone = huggingface.remove([links["b-Q8_0.gguf"]], cache)
    assert links["mmproj-F16.gguf"] in gone and repo in gone and not repo.exists()


def test_every_part_of_a_split_model_goes(tmp_path):
    cache = tmp_path / "hub"
    repo = huggingface.storage(cache, "acme/Repo")
    parts = {f"big-Q8_0-{i:05d}-of-00003.gguf": e for i, e in ((1, E1), (2, E2), (3, E3))}
    links = hf_snapshot(cache, C1, {**parts, "small-Q4_K_M.gguf": E4})
    gone = huggingface.remove([links["big-Q8_0-00001-of-00003.gguf"]], cache)
    assert set(gone) == {links[p] for p in parts}
    assert sorted(p.name for p in (repo / "blobs").iterdir()) == [E4]


def test_a_file_outside_the_cache_is_not_removed(tmp_path):
    cache = tmp_path / "hub"
    hf_snapshot(cache, C1, {"m-Q4_K_M.gguf": E1})
    outside = tmp_path / "models" / "m-Q4_K_M.gguf"
    outside.parent.mkdir()
    outside.write_bytes(b"mine")
    for path in (outside, cache / "models--acme--Repo" / "blobs" / E1):
        with pytest.raises(transfer.PullError):
            huggingface.remove([path], cache)
    assert outside.read_bytes() == b"mine" and (cache / "models--acme--Repo" / "blobs" / E1).is_file()


def test_a_cache_reached_through_a_symlink_frees_the_removed_models_blob(tmp_path):
    (tmp_path / "disk").mkdir()
    (tmp_path / "cache").symlink_to(tmp_path / "disk")
    cache = tmp_path / "cache" / "hub"
    repo = huggingface.storage(cache, "acme/Repo")
    links = hf_snapshot(cache, C1, {"a-Q4_K_M.gguf": E1, "b-Q8_0.gguf": E2})
    huggingface.remove([links["a-Q4_K_M.gguf"]], cache)
    assert not links["a-Q4_K_M.gguf"].is_symlink()
    assert not (repo / "blobs" / E1).exists()


# ---------------------------------------------------------------- removing from Ollama's store

def ollama_model(store: Path, name: OllamaName, blobs: dict[str, bytes]) -> Path:
    """A manifest naming ``blobs`` (media type -> bytes), each blob written, as Ollama's store keeps them."""
    layers = []
    for media, data in blobs.items():
        digest = f"sha256:{hexof(data)}"
        (store / "blobs").mkdir(parents=True, exist_ok=True)
        (store / "blobs" / digest.replace(":", "-")).write_bytes(data)
        layers.append({"mediaType": media, "digest": digest, "size": len(data)})
    config = json.dumps({"model_format": "gguf", "for": name.canonical}).encode()
    (store / "blobs" / f"sha256-{hexof(config)}").write_bytes(config)
    target = store / "manifests" / Path(*name.store_parts)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"schemaVersion": 2, "layers": layers,
                                  "config": {"mediaType": CONFIG_TYPE, "digest": f"sha256:{hexof(config)}",
                                             "size": len(config)}}))
    return target


def test_ollama_removal_keeps_a_blob_another_manifest_uses_and_drops_empty_folders(tmp_path):
    store = tmp_path / "ollama"
    mine = OllamaName("127.0.0.1:5000", "acme", "mine", "latest", True)
    theirs = OllamaName("registry.ollama.ai", "library", "theirs", "latest", False)
    ollama_model(store, mine, {MODEL_TYPE: b"model one", TEMPLATE_TYPE: b"{{ .Prompt }}"})
    ollama_model(store, theirs, {MODEL_TYPE: b"model two", TEMPLATE_TYPE: b"{{ .Prompt }}"})
    gone = ollama.remove(mine, store)
    left = {p.name for p in (store / "blobs").iterdir()}
    assert f"sha256-{hexof(b'model one')}" not in left
    assert {f"sha256-{hexof(b'model two')}", f"sha256-{hexof(b'{{ .Prompt }}')}"} <= left
    assert store / "blobs" / f"sha256-{hexof(b'model one')}" in gone
    assert not (store / "manifests" / "127.0.0.1:5000").exists()  # every folder the manifest alone was in
    assert (store / "manifests").is_dir()
    assert (store / "manifests" / Path(*theirs.store_parts)).is_file()
    with pytest.raises(transfer.NotFound):
        ollama.remove(mine, store)


def test_ollama_removal_keeps_a_folder_another_tag_is_in(tmp_path):
    store = tmp_path / "ollama"
    latest = OllamaName("127.0.0.1:5000", "acme", "m", "latest", True)
    small = OllamaName("127.0.0.1:5000", "acme", "m", "small", True)
    ollama_model(store, latest, {MODEL_TYPE: b"big"})
    ollama_model(store, small, {MODEL_TYPE: b"small"})
    ollama.remove(latest, store)
    assert (store / "manifests" / Path(*small.store_parts)).is_file()
    assert (store / "blobs" / f"sha256-{hexof(b'small')}").is_file()
    assert not (store / "blobs" / f"sha256-{hexof(b'big')}").exists()


def test_ollama_removal_builds_no_path_from_a_malformed_digest(tmp_path):
    store = tmp_path / "ollama"
    name = OllamaName("127.0.0.1:5000", "acme", "m", "latest", True)
    target = ollama_model(store, name, {MODEL_TYPE: b"model"})
    (store / "blobs" / "sha256-").mkdir()
    victim = store / "victim"
    victim.write_bytes(b"not a blob")
    data = json.loads(target.read_text())
    data["layers"].append({"mediaType": TEMPLATE_TYPE, "digest": "sha256:/../../victim", "size": 1})
    target.write_text(json.dumps(data))
    assert (store / "blobs" / "sha256-/../../victim").resolve() == victim.resolve()  # what a naive join would reach
    ollama.remove(name, store)
    assert victim.read_bytes() == b"not a blob"


# ---------------------------------------------------------------- removal by name

def test_a_model_in_a_plain_models_folder_is_not_removed(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    path = folder / "plain.gguf"
    path.write_bytes(b"GGUF mine")
    stores = Stores(tmp_path / "hf", tmp_path / "ollama")
    for root in (Root("dir", folder), Root("lmstudio", folder), Root("huggingface", folder)):
        found = Found(path, root, 0, ["plain"])
        with pytest.raises(removal.NotPulled) as caught:
            removal.remove("plain", found, stores)
        assert caught.value.status == 409 and caught.value.code == "not_a_pulled_model"
    assert path.read_bytes() == b"GGUF mine"
    assert not (tmp_path / "hf").exists() and not (tmp_path / "ollama").exists()


def test_a_name_nothing_has_is_not_found(tmp_path):
    with pytest.raises(transfer.NotFound):
        removal.remove("acme/nothing", None, Stores(tmp_path / "hf", tmp_path / "ollama"))


def test_removal_by_name_uses_each_stores_rule(tmp_path):
    store, cache = tmp_path / "ollama", tmp_path / "hf"
    name = OllamaName("127.0.0.1:5000", "acme", "m", "latest", True)
    target = ollama_model(store, name, {MODEL_TYPE: b"model"})
    assert target in removal.remove("127.0.0.1:5000/acme/m", None, Stores(cache, store))
    link = hf_snapshot(cache, C1, {"m-Q4_K_M.gguf": E1})["m-Q4_K_M.gguf"]
    found = Found(link, Root("huggingface", cache), 0, ["hf.co/acme/Repo:Q4_K_M"])
    assert link in removal.remove("hf.co/acme/Repo:Q4_K_M", found, Stores(cache, store))
    assert not huggingface.storage(cache, "acme/Repo").exists()


# ---------------------------------------------------------------- which names pull on demand

@pytest.mark.parametrize("name, prefixes, allowed", [
    ("hf.co/acme/Repo-GGUF:Q4_K_M", ("",), True),
    ("acme/Repo-GGUF", ("",), True),
    ("llama3.2", ("",), True),
    ("127.0.0.1:5000/acme/m:latest", ("",), False),  # a host only the name gives: never (test_pull_bounds.py)
    ("hf.co/acme/Repo-GGUF", (), False),
    ("llama3.2", (), False),
    ("hf.co/acme/Repo-GGUF", ("hf.co/",), True),
    ("HF.CO/acme/Repo-GGUF", ("hf.co/",), True),
    ("  hf.co/acme/Repo-GGUF", ("hf.co/",), False),  # a name with white space is no name
    ("huggingface.co/acme/Repo-GGUF", ("hf.co/",), False),
    ("acme/Repo-GGUF", ("hf.co/",), False),
    ("llama3.2", ("hf.co/",), False),
    ("hf.co/acme/Repo-GGUF", ("hf.co/acme/",), True),
    ("hf.co/other/Repo-GGUF", ("hf.co/acme/",), False),
    ("llama3.2", ("hf.co/", "llama"), True),
    # never an invalid name, whatever the prefixes
    ("hf.co/acme/../etc", ("",), False),
    ("hf.co/acme", ("",), False),
    ("https://hf.co/acme/Repo", ("",), False),
    ("hf.co/acme/Repo:", ("",), False),
    ("", ("",), False),
    ("a b", ("",), False),
    ("hf.co/acme/re--po", ("hf.co/",), False),
    ("hf.co/" + "a" * 600, ("hf.co/",), False),
])
def test_which_names_pull_on_demand(name, prefixes, allowed):
    assert on_demand(name, prefixes) is allowed


# ---------------------------------------------------------------- Pulls: shared, cancelled, resumed

SLOW = random.Random(11).randbytes(1 << 20)


@pytest.fixture(scope="module")
def hub():
    with Hub() as h:
        h.add_hf_repo("acme/Slow-GGUF", {"slow-Q4_K_M.gguf": SLOW})
        yield h


async def test_pulls_share_a_download_cancel_it_keeping_the_partial_and_resume(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    cache, store = tmp_path / "hf", tmp_path / "ollama"
    outcomes: list[tuple[str, str]] = []
    pulls = Pulls(lambda: Stores(cache, store), on_outcome=lambda source, outcome: outcomes.append((source, outcome)))
    partial = huggingface.storage(cache, "acme/Slow-GGUF") / "blobs" / f"{hexof(SLOW)}.incomplete"
    hub.faults.rate = 1 << 20  # a second for the whole file
    hub.log.clear()
    try:
        first = pulls.start("hf.co/acme/Slow-GGUF")
        assert pulls.start("hf.co/acme/Slow-GGUF") is first
        assert pulls.start("huggingface.co/acme/Slow-GGUF") is first  # one model, however it is spelled
        assert pulls.start("acme/Slow-GGUF") is first
        async for now in pulls.watch(first):
            if now.completed >= 100_000:
                break
        assert pulls.cancel("hf.co/acme/Slow-GGUF") is first
        await pulls.wait(first, timeout=10)
        assert first.state is PullState.CANCELLED and isinstance(first.error, transfer.Cancelled)
        assert pulls.cancel("hf.co/acme/Slow-GGUF") is None  # nothing running to cancel
        held = partial.stat().st_size
        assert 100_000 <= held < len(SLOW)
        assert partial.read_bytes() == SLOW[:held]
        assert not (huggingface.storage(cache, "acme/Slow-GGUF") / "snapshots").exists()

        hub.faults.rate = None
        hub.log.clear()
        again = pulls.start("hf.co/acme/Slow-GGUF")
        assert again is not first
        await pulls.wait(again, timeout=20)
        assert again.state is PullState.DONE, again.error
        [get] = [r for r in hub.log if r.server == "cdn" and r.method == "GET"]
        assert get.headers["Range"] == f"bytes={held}-" and get.status == 206
        [path] = again.paths
        assert path.read_bytes() == SLOW and not partial.exists()
        assert outcomes == [("huggingface", "cancelled"), ("huggingface", "done")]
    finally:
        hub.faults.rate = None
        await pulls.close()
