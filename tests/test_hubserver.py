"""The loopback hub of tests/hubserver.py is faithful: the real ``huggingface_hub`` client downloads from it, lists
it and caches what it gets as it would from huggingface.co, and raw HTTP sees the registry's and the CDN's protocol
(redirects, Range, errors) and each fault doing exactly what it says. Small byte payloads only, so this stays quick.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import threading
import time
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import huggingface_hub
import pytest
from hubserver import Hub, corrupt_offset, git_blob_sha1
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url, scan_cache_dir, snapshot_download
from huggingface_hub.errors import RemoteEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

GGUF = b"GGUF\x03\x00\x00\x00" + bytes(range(256)) * 12  # 3080 bytes, LFS by name
BIG = bytes((i * 7) % 251 for i in range(3000))  # over 1 KiB: LFS by size
CONFIG = b'{"architectures": ["Tiny"]}\n'  # small: a regular git file
REPO = "acme/tiny-GGUF"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch(method: str, url: str, headers: dict[str, str] | None = None) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One request, redirects not followed: (status, headers, body)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.netloc, timeout=10)
    try:
        conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers or {})
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


def follow(method: str, url: str, headers: dict[str, str] | None = None) -> tuple[int, http.client.HTTPMessage, bytes]:
    """Like Go's client for Ollama's HEAD: follows redirects, relative ones included."""
    for _ in range(5):
        status, head, body = fetch(method, url, headers)
        if status not in (301, 302, 307, 308):
            return status, head, body
        url = urljoin(url, head["Location"])
    raise AssertionError("redirect loop")


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    with Hub() as h:
        yield h
    huggingface_hub.close_session()  # its pooled connections were to this hub's ports


@pytest.fixture
def repo(hub) -> str:
    return hub.add_hf_repo(REPO, {"model.gguf": GGUF, "weights/big.bin": BIG, "config.json": CONFIG})


# -- Hugging Face, through huggingface_hub --------------------------------------------------------------------


def test_hf_hub_download_lfs_and_regular_files_into_the_cache(hub, repo, tmp_path):
    cache = tmp_path / "cache"
    for name, data in (("model.gguf", GGUF), ("config.json", CONFIG), ("weights/big.bin", BIG)):
        path = hf_hub_download(REPO, name, cache_dir=cache, endpoint=hub.url, token=False)
        assert Path(path).read_bytes() == data
        assert f"snapshots/{repo}/{name}" in Path(path).as_posix()

    info = scan_cache_dir(cache)
    (cached,) = info.repos
    assert cached.repo_id == REPO and cached.repo_type == "model"
    (revision,) = cached.revisions
    assert revision.commit_hash == repo and revision.refs == frozenset({"main"})
    blobs = {f.file_name: f.blob_path.name for f in revision.files}
    assert blobs == {"model.gguf": sha256(GGUF), "big.bin": sha256(BIG), "config.json": git_blob_sha1(CONFIG)}

    # LFS bytes came from the CDN, the regular file from the hub's resolve cache, and never an Xet header
    gets = [(r.server, r.path.rsplit("/", 1)[-1]) for r in hub.log if r.method == "GET"]
    assert ("cdn", sha256(GGUF)) in gets and ("cdn", sha256(BIG)) in gets and ("hub", "config.json") in gets
    assert not [r for r in hub.log if r.server == "cdn" and "authorization" in r.headers]


def test_snapshot_download_lists_the_tree_and_fetches_every_file(hub, repo, tmp_path):
    folder = Path(snapshot_download(REPO, cache_dir=tmp_path / "cache", endpoint=hub.url, token=False))
    assert folder.name == repo
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        "config.json", "model.gguf", "weights/big.bin"]
    assert (folder / "weights" / "big.bin").read_bytes() == BIG


def test_model_info_lists_siblings_with_lfs_metadata(hub, repo):
    api = HfApi(endpoint=hub.url, token=False)
    info = api.model_info(REPO, files_metadata=True)
    assert info.id == REPO and info.sha == repo and info.author == "acme" and "gguf" in info.tags
    siblings = {s.rfilename: s for s in info.siblings}
    assert set(siblings) == {"model.gguf", "weights/big.bin", "config.json"}
    gguf = siblings["model.gguf"]
    assert gguf.size == len(GGUF) and gguf.lfs.sha256 == sha256(GGUF) and gguf.lfs.size == len(GGUF)
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256(GGUF)}\nsize {len(GGUF)}\n".encode()
    assert gguf.lfs.pointer_size == len(pointer) and gguf.blob_id == git_blob_sha1(pointer)
    assert siblings["config.json"].lfs is None and siblings["config.json"].blob_id == git_blob_sha1(CONFIG)

    plain = api.model_info(REPO)  # without blobs=true only the names come
    assert {s.rfilename for s in plain.siblings} == set(siblings) and plain.siblings[0].size is None
    assert api.model_info(REPO, revision=repo).sha == repo
    assert sorted(api.list_repo_files(REPO)) == ["config.json", "model.gguf", "weights/big.bin"]
    top = {e.path: type(e).__name__ for e in api.list_repo_tree(REPO)}
    assert top == {"weights": "RepoFolder", "model.gguf": "RepoFile", "config.json": "RepoFile"}

    with pytest.raises(RepositoryNotFoundError):
        api.model_info("acme/missing")
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="f" * 40)


def test_file_metadata_matches_the_hub(hub, repo, tmp_path):
    lfs = get_hf_file_metadata(hf_hub_url(REPO, "model.gguf", endpoint=hub.url), token=False, endpoint=hub.url)
    assert (lfs.commit_hash, lfs.etag, lfs.size) == (repo, sha256(GGUF), len(GGUF))
    assert lfs.location.startswith(hub.cdn_url + "/repos/") and lfs.xet_file_data is None

    small = get_hf_file_metadata(hf_hub_url(REPO, "config.json", endpoint=hub.url), token=False, endpoint=hub.url)
    assert (small.commit_hash, small.etag, small.size) == (repo, git_blob_sha1(CONFIG), len(CONFIG))
    assert small.location.startswith(f"{hub.url}/api/resolve-cache/models/{REPO}/{repo}/config.json?")

    status, head, _ = fetch("HEAD", hf_hub_url(REPO, "model.gguf", endpoint=hub.url))
    assert status == 302 and head["X-Linked-Size"] == str(len(GGUF)) and head["X-Linked-Etag"] == f'"{sha256(GGUF)}"'
    assert not [k for k in head if k.lower().startswith("x-xet")]

    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download(REPO, "absent.gguf", cache_dir=tmp_path, endpoint=hub.url, token=False)
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("acme/missing", "model.gguf", cache_dir=tmp_path, endpoint=hub.url, token=False)
    status, head, _ = fetch("HEAD", f"{hub.url}/acme/missing/resolve/main/x", {"Authorization": "Bearer hf_x"})
    assert status == 404 and head["X-Error-Code"] == "RepoNotFound"


def test_a_second_commit_moves_main_and_keeps_the_first(hub, repo, tmp_path):
    second = hub.add_hf_repo(REPO, {"model.gguf": GGUF[::-1]})
    assert second != repo
    assert Path(hf_hub_download(REPO, "model.gguf", cache_dir=tmp_path, endpoint=hub.url, token=False)).read_bytes() \
        == GGUF[::-1]
    old = hf_hub_download(REPO, "model.gguf", revision=repo, cache_dir=tmp_path, endpoint=hub.url, token=False)
    assert Path(old).read_bytes() == GGUF


def test_files_given_as_paths_stream_from_disk(hub, tmp_path):
    path = tmp_path / "disk.gguf"
    path.write_bytes(BIG * 3)
    hub.add_hf_repo("acme/disk", {"disk.gguf": path})
    got = hf_hub_download("acme/disk", "disk.gguf", cache_dir=tmp_path / "c", endpoint=hub.url, token=False)
    assert Path(got).read_bytes() == BIG * 3


# -- the CDN: Range, signatures -------------------------------------------------------------------------------


def cdn_location(hub: Hub, name: str = "model.gguf") -> str:
    status, head, _ = fetch("GET", hf_hub_url(REPO, name, endpoint=hub.url))
    assert status == 302
    return head["Location"]


def test_range_requests_on_the_cdn(hub, repo):
    url = cdn_location(hub)
    status, head, body = fetch("GET", url, {"Range": "bytes=100-"})
    assert status == 206 and body == GGUF[100:]
    assert head["Content-Range"] == f"bytes 100-{len(GGUF) - 1}/{len(GGUF)}"
    assert head["Content-Length"] == str(len(GGUF) - 100) and head["Accept-Ranges"] == "bytes"
    assert 'filename="model.gguf"' in head["Content-Disposition"]

    assert fetch("GET", url, {"Range": "bytes=10-19"})[2] == GGUF[10:20]
    assert fetch("GET", url, {"Range": "bytes=-5"})[2] == GGUF[-5:]
    status, head, body = fetch("GET", url)
    assert status == 200 and body == GGUF and head["Accept-Ranges"] == "bytes"
    status, head, _ = fetch("GET", url, {"Range": f"bytes={len(GGUF)}-"})
    assert status == 416 and head["Content-Range"] == f"bytes */{len(GGUF)}"
    status, head, body = fetch("HEAD", url)
    assert status == 200 and head["Content-Length"] == str(len(GGUF)) and body == b""

    hub.faults.ignore_range = True
    status, _, body = fetch("GET", url, {"Range": "bytes=100-"})
    assert status == 200 and body == GGUF
    ranged = [r for r in hub.log if r.server == "cdn" and r.headers.get("Range") == "bytes=100-"]
    assert [r.status for r in ranged] == [206, 200]


def test_cdn_urls_are_signed(hub, repo):
    url = cdn_location(hub)
    assert fetch("GET", url.split("?")[0])[0] == 403
    assert fetch("GET", url.replace("Signature=", "Signature=0"))[0] == 403
    assert fetch("GET", hub.cdn_link(sha256(GGUF)))[2] == GGUF


# -- faults ---------------------------------------------------------------------------------------------------


def test_drop_after_closes_mid_body(hub, repo):
    url = cdn_location(hub)
    hub.faults.drop_after = 100
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.netloc, timeout=10)
    conn.request("GET", f"{parts.path}?{parts.query}")
    response = conn.getresponse()
    assert response.status == 200 and response.headers["Content-Length"] == str(len(GGUF))
    with pytest.raises(http.client.IncompleteRead) as caught:
        response.read()
    conn.close()
    assert caught.value.partial == GGUF[:100]
    assert hub.faults.drops_left == 0 and hub.log[-1].dropped and hub.log[-1].bytes_sent == 100
    assert fetch("GET", url)[2] == GGUF  # drop_times=1: the next GET is whole


def test_huggingface_hub_retries_a_dropped_download(hub, repo, tmp_path):
    hub.faults.drop_after = 1000
    path = hf_hub_download(REPO, "model.gguf", cache_dir=tmp_path, endpoint=hub.url, token=False)
    assert Path(path).read_bytes() == GGUF
    gets = [r for r in hub.log if r.server == "cdn" and r.method == "GET"]
    # httpx hands huggingface_hub its body in 10 MiB chunks, so bytes short of one are lost and it starts over
    assert [(r.headers.get("Range"), r.dropped, r.bytes_sent) for r in gets] == [
        (None, True, 1000), (None, False, len(GGUF))]


def test_corrupt_flips_exactly_one_byte_in_every_answer(hub, repo):
    url = cdn_location(hub)
    hub.faults.corrupt = {"model.gguf"}
    body = fetch("GET", url)[2]
    assert len(body) == len(GGUF)
    diff = [i for i in range(len(GGUF)) if body[i] != GGUF[i]]
    assert diff == [corrupt_offset(len(GGUF))] and body[diff[0]] == GGUF[diff[0]] ^ 0xFF
    at = corrupt_offset(len(GGUF))
    assert fetch("GET", url, {"Range": f"bytes={at - 2}-"})[2] == body[at - 2:]  # a resumed read sees it too
    assert fetch("GET", cdn_location(hub, "weights/big.bin"))[2] == BIG  # only the named file


def test_rate_limits_the_transfer(hub, repo):
    url = cdn_location(hub)
    hub.faults.rate = 20_000
    began = time.monotonic()
    assert fetch("GET", url)[2] == GGUF
    assert time.monotonic() - began >= 0.12  # 3080 bytes at 20 kB/s: 0.154 s


def test_stop_cuts_a_transfer_in_progress(tmp_path):
    hub = Hub().start()
    hub.add_hf_repo(REPO, {"model.gguf": GGUF})
    url = cdn_location(hub)
    hub.faults.rate = 100  # 3080 bytes: about 30 s
    got: list[BaseException | bytes] = []
    begun = threading.Event()

    def read() -> None:
        parts = urlsplit(url)
        conn = http.client.HTTPConnection(parts.netloc, timeout=60)
        try:
            conn.request("GET", f"{parts.path}?{parts.query}")
            response = conn.getresponse()
            first = response.read(1)
            begun.set()  # the transfer is under way
            got.append(first + response.read())
        except Exception as exc:
            got.append(exc)
        finally:
            begun.set()
            conn.close()

    reader = threading.Thread(target=read)
    reader.start()
    assert begun.wait(60) and not got, got  # (a bound only for failing)
    hub.stop()
    reader.join(60)
    assert isinstance(got[0], http.client.IncompleteRead), got  # cut, not finished


def test_fail_status_wrong_size_and_no_redirect(hub, repo):
    hub.faults.fail_status = {sha256(GGUF): 503}  # the CDN hop only
    assert fetch("HEAD", hf_hub_url(REPO, "model.gguf", endpoint=hub.url))[0] == 302
    assert fetch("GET", cdn_location(hub))[0] == 503
    hub.faults.fail_status = {"resolve/main/config.json": 429}
    assert fetch("HEAD", hf_hub_url(REPO, "config.json", endpoint=hub.url))[0] == 429
    hub.faults.fail_status = {}

    hub.faults.wrong_size = {"model.gguf"}
    meta = get_hf_file_metadata(hf_hub_url(REPO, "model.gguf", endpoint=hub.url), token=False, endpoint=hub.url)
    assert meta.size == len(GGUF) + 1
    status, head, body = fetch("GET", meta.location)
    assert head["Content-Length"] == str(len(GGUF)) and body == GGUF
    sizes = {s.rfilename: s.size for s in HfApi(endpoint=hub.url, token=False).model_info(
        REPO, files_metadata=True).siblings}
    assert sizes["model.gguf"] == len(GGUF) + 1 and sizes["config.json"] == len(CONFIG)
    hub.faults.wrong_size = set()

    hub.faults.redirect_blobs = False
    status, head, body = fetch("GET", hf_hub_url(REPO, "model.gguf", endpoint=hub.url), {"Range": "bytes=3-"})
    assert status == 206 and body == GGUF[3:] and head["ETag"] == f'"{sha256(GGUF)}"' and head["X-Repo-Commit"] == repo


# -- Ollama registry ------------------------------------------------------------------------------------------

MANIFEST_ACCEPT = {"Accept": "application/vnd.docker.distribution.manifest.v2+json"}


def test_ollama_manifest_and_blobs_through_the_cdn(hub):
    manifest = hub.add_ollama_model("acme", "tiny", "q4", GGUF, projector=BIG, template="{{ .Prompt }}",
                                    params={"stop": ["</s>"]})
    status, head, body = fetch("GET", f"{hub.url}/v2/acme/tiny/manifests/q4", MANIFEST_ACCEPT)
    assert status == 200 and json.loads(body) == manifest
    assert head["Content-Type"] == "application/vnd.docker.distribution.manifest.v2+json"
    assert head["Docker-Content-Digest"] == f"sha256:{sha256(body)}"
    kinds = [layer["mediaType"].rsplit(".", 1)[-1] for layer in manifest["layers"]]
    assert kinds == ["model", "projector", "template", "params"]
    model = manifest["layers"][0]
    assert model == {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{sha256(GGUF)}",
                     "size": len(GGUF)}

    blob_url = f"{hub.url}/v2/acme/tiny/blobs/{model['digest']}"
    status, head, _ = fetch("GET", blob_url)
    assert status == 307 and head["Location"].startswith(hub.cdn_url + "/ollama/docker/registry/v2/blobs/sha256/")
    cdn = head["Location"]
    assert fetch("GET", cdn)[2] == GGUF
    status, head, _ = follow("HEAD", blob_url)  # how Ollama learns the size
    assert status == 200 and head["Content-Length"] == str(len(GGUF))
    status, head, body = fetch("GET", cdn, {"Range": "bytes=16-31"})  # how Ollama fetches a part
    assert status == 206 and body == GGUF[16:32] and head["Content-Range"] == f"bytes 16-31/{len(GGUF)}"

    config = json.loads(follow("GET", f"{hub.url}/v2/acme/tiny/blobs/{manifest['config']['digest']}")[2])
    assert config["model_format"] == "gguf" and config["rootfs"]["diff_ids"] == [
        layer["digest"] for layer in manifest["layers"]]
    template = follow("GET", f"{hub.url}/v2/acme/tiny/blobs/{manifest['layers'][2]['digest']}")[2]
    assert template == b"{{ .Prompt }}"

    hub.faults.wrong_size = {model["digest"]}
    assert json.loads(fetch("GET", f"{hub.url}/v2/acme/tiny/manifests/q4")[2])["layers"][0]["size"] == len(GGUF) + 1
    hub.faults.redirect_blobs = False
    status, _, body = fetch("GET", blob_url)
    assert status == 200 and body == GGUF


def test_ollama_unknown_manifest_and_blob(hub):
    hub.add_ollama_model("acme", "tiny", "q4", GGUF)
    status, head, body = fetch("GET", f"{hub.url}/v2/acme/tiny/manifests/nope", MANIFEST_ACCEPT)
    assert status == 404 and head["Content-Type"].startswith("application/json")
    assert json.loads(body) == {"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]}
    assert fetch("GET", f"{hub.url}/v2/other/model/manifests/q4")[0] == 404
    status, _, body = fetch("GET", f"{hub.url}/v2/acme/tiny/blobs/sha256:{'0' * 64}")
    assert status == 404 and json.loads(body)["errors"][0]["code"] == "BLOB_UNKNOWN"
    assert f"{hub.host}/acme/tiny:q4".startswith("127.0.0.1:")
