"""A Hugging Face hub, an Ollama registry and the CDN they both send file bytes to, on loopback.

The gateway's download tests point ``HF_ENDPOINT`` (or ``endpoint=``) at ``Hub.url`` and pull Ollama names
``f"{hub.host}/NS/MODEL:TAG"`` with ``insecure``; nothing leaves the machine. The routes, headers and JSON are the
ones the real services answer and the real clients parse (``huggingface_hub`` 2.4 and Ollama's ``server/download.go``);
tests/test_hubserver.py drives them with those clients to keep the fixture honest.

The hub (``Hub.url``), one aiohttp application:

- ``GET|HEAD /{repo}/resolve/{revision}/{path}``, revision ``main`` or a commit. Every answer carries
  ``X-Repo-Commit``. An LFS file answers ``302`` to a signed CDN URL with ``ETag`` and ``X-Linked-Etag`` (the
  sha256, quoted) and ``X-Linked-Size``; a regular git file answers ``307`` to the relative
  ``/api/resolve-cache/models/{repo}/{commit}/{path}``, which answers ``200`` with ``ETag`` (the git blob sha1,
  quoted) and the bytes, as huggingface.co does. No ``X-Xet-*`` header is ever sent, so clients use plain HTTP.
- ``GET /api/models/{repo}``, ``/api/models/{repo}/revision/{revision}`` (``?blobs=true`` adds ``blobId``,
  ``size`` and ``lfs`` {sha256, size, pointerSize} to each sibling) and ``/api/models/{repo}/tree/{revision}[/path]``
  (``?recursive=true``, ``?expand=true``; one page, no ``Link`` header).
- Errors as the hub sends them: unknown repo ``401`` (``404`` when an ``Authorization`` header came) with
  ``X-Error-Code: RepoNotFound``; unknown revision ``404`` ``RevisionNotFound``; unknown file ``404``
  ``EntryNotFound`` (with ``X-Repo-Commit``, which huggingface_hub uses to cache the absence).

The registry (same port, Docker registry v2 as Ollama uses it):

- ``GET|HEAD /v2/{ns}/{model}/manifests/{tag-or-digest}``: the manifest, ``Content-Type`` its media type,
  ``Docker-Content-Digest`` the sha256 of its bytes; unknown: ``404`` ``MANIFEST_UNKNOWN``.
- ``GET|HEAD /v2/{ns}/{model}/blobs/sha256:HEX``: ``307`` to a signed CDN URL (Ollama HEADs it following the
  redirect for the size, then GETs it without following to learn the CDN URL, then sends Range GETs there);
  a digest not in that repository: ``404`` ``BLOB_UNKNOWN``.

The CDN (``Hub.cdn_url``, another port) serves blobs by content: ``/repos/../{sha256}`` for the hub (CloudFront
style, ``Expires``/``Signature`` query) and ``/ollama/docker/registry/v2/blobs/sha256/HH/HEX/data`` for the
registry (R2 style, ``X-Amz-*`` query). A URL without its signature answers ``403``, so a client that drops the
query string is caught. It honours ``Range`` (``bytes=N-``, ``bytes=N-M``, ``bytes=-N``) with ``206``,
``Content-Range``, ``Content-Length`` and ``Accept-Ranges: bytes``, answers ``416`` past the end, and echoes
``response-content-disposition`` as ``Content-Disposition`` as S3 does.

Both sites share one ``Hub.log`` and one ``Hub.faults``. Files given as ``Path`` are hashed once when added
(1 MiB blocks) and streamed from disk on every request, so 250 MB models cost no memory; they must not change
while served. The CDN shares 127.0.0.1 with the hub and differs by port only: huggingface_hub compares origins
(scheme, host, port), but Ollama's own Go client follows a blob redirect to the same *host name*, so the real
``ollama pull`` binary would not work against this fixture; the gateway's puller and raw HTTP do.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import re
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from aiohttp import web
from multidict import CIMultiDict

__all__ = ["Faults", "Hub", "Request", "corrupt_offset", "git_blob_sha1"]

LFS_THRESHOLD = 1024  # bytes: a file above this (or any .gguf) is stored in LFS, as `git lfs track` setups do
BLOCK = 2**20  # read size when hashing or streaming a file from disk
MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
OLLAMA_TYPES = {
    "model": "application/vnd.ollama.image.model",
    "projector": "application/vnd.ollama.image.projector",
    "template": "application/vnd.ollama.image.template",
    "params": "application/vnd.ollama.image.params",
}
DATE = "2024-05-01T12:00:00.000Z"  # every repo's createdAt / lastModified: tests compare, not clocks
_COMMIT = re.compile(r"[0-9a-f]{40}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def git_blob_sha1(data: bytes) -> str:
    """The git object id of ``data`` as a blob: what the hub calls a regular file's ``blobId`` and ``ETag``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def corrupt_offset(size: int) -> int:
    """The one byte (xor 0xFF) that ``Faults.corrupt`` flips in a file of ``size`` bytes: the middle, so headers
    still parse and only a digest check can notice. The same byte in every answer, resumed ones included."""
    return size // 2


def _lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()



ENTRY = web.RequestKey("entry", object)  # the log entry of the request being served

class Faults:
    """What the servers do wrong, all off by default; a test sets attributes between (or during) requests.

    Byte faults (``drop_after``, ``corrupt``, ``rate``, ``ignore_range``) apply to every answer that carries the
    bytes of a blob (an LFS file or an Ollama blob): on the CDN, or on the hub and registry themselves when
    ``redirect_blobs`` is off. Regular git files, which the hub serves itself, are never altered.

    - ``drop_after``: the connection is closed (cleanly at TCP level, so the client sees a short body against its
      ``Content-Length``) once this many body bytes of an answer are sent, for the next ``drop_times`` blob GETs
      whose answer is longer than that. Setting either attribute re-arms the count; ``drops_left`` says what remains.
    - ``corrupt``: names (HF path in the repo, or Ollama digest ``sha256:HEX``) whose byte at ``corrupt_offset``
      is flipped; the length stays the same.
    - ``rate``: bytes per second, sent in small writes with sleeps, so a test can cancel or restart mid-transfer.
    - ``redirect_blobs``: hub and registry redirect blob bytes to the CDN (302 for HF LFS, 307 for Ollama);
      off, they serve the bytes themselves (``200``/``206``).
    - ``fail_status``: request path (decoded, no query) suffix -> status answered instead, on either site.
      The hub's resolve path ends with the file's path, the CDN's HF path with its sha256, the registry's blob
      path with ``sha256:HEX`` and the CDN's Ollama path with ``HEX/data``, so each hop can be failed alone.
    - ``wrong_size``: names whose *declared* size is one byte too many: ``X-Linked-Size``, the API's sizes and
      the manifest's layer size. ``Content-Length`` always stays true.
    - ``ignore_range``: the CDN answers ``200`` with the whole file to a Range request.
    - ``undeclared``: HF paths the hub declares neither a size nor a digest for: the listing gives their name
      alone, and the resolve answer no ``X-Linked-Size`` or ``X-Linked-Etag`` and an opaque ``ETag``.
    - ``trickle``: seconds between the bytes of a manifest's body, sent one at a time (a registry that holds a
      pull); ``None`` sends it at once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._drop_after: int | None = None
        self._drop_times = 1
        self.drops_left = 1
        self.corrupt: set[str] = set()
        self.rate: int | None = None
        self.redirect_blobs = True
        self.fail_status: dict[str, int] = {}
        self.wrong_size: set[str] = set()
        self.ignore_range = False
        self.undeclared: set[str] = set()
        self.trickle: float | None = None

    @property
    def drop_after(self) -> int | None:
        return self._drop_after

    @drop_after.setter
    def drop_after(self, value: int | None) -> None:
        with self._lock:
            self._drop_after = value
            self.drops_left = self._drop_times

    @property
    def drop_times(self) -> int:
        return self._drop_times

    @drop_times.setter
    def drop_times(self, value: int) -> None:
        with self._lock:
            self._drop_times = value
            self.drops_left = value

    def take_drop(self, length: int) -> int | None:
        """How many bytes of an answer of ``length`` body bytes to send before closing; ``None``: send it all.
        Consumes one drop: the servers call it once per blob GET."""
        with self._lock:
            limit = self._drop_after
            if limit is None or self.drops_left <= 0 or limit >= length:
                return None
            self.drops_left -= 1
            return limit

    def failure(self, path: str) -> int | None:
        """The status ``fail_status`` injects for ``path``, if any (the longest matching suffix wins)."""
        hits = [(len(s), st) for s, st in list(self.fail_status.items()) if path.endswith(s)]
        return max(hits)[1] if hits else None


@dataclass
class Request:
    """One request either site received. ``status`` is set when the answer starts (``None`` before);
    ``bytes_sent`` counts body bytes of blob answers as they go out; ``dropped`` says ``drop_after`` cut it."""

    method: str
    path: str  # decoded, without the query
    query: str
    headers: CIMultiDict[str]
    server: str  # "hub" (hub and registry) or "cdn"
    status: int | None = None
    bytes_sent: int = 0
    dropped: bool = False
    time: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class _Blob:
    """Content served by digest: bytes in memory or a file on disk. ``names`` are the HF paths and Ollama
    digests it was added under, which the byte faults are keyed on."""

    sha256: str
    size: int
    data: bytes | None
    path: Path | None
    names: set[str] = field(default_factory=set)


@dataclass(eq=False)
class _HfFile:
    path: str
    blob: _Blob
    lfs: bool
    oid: str  # git blob sha1 of the content (regular) or of the LFS pointer

    @property
    def etag(self) -> str:
        return self.blob.sha256 if self.lfs else self.oid


@dataclass(eq=False)
class _HfRepo:
    commits: dict[str, dict[str, _HfFile]] = field(default_factory=dict)
    main: str = ""

    def resolve(self, revision: str) -> str | None:
        if revision == "main":
            return self.main
        return revision if revision in self.commits else None


@dataclass(eq=False)
class _OllamaRepo:
    manifests: dict[str, dict] = field(default_factory=dict)  # tag -> manifest (true sizes)
    blobs: set[str] = field(default_factory=set)  # digests any of its manifests reference


def _source(value: Path | bytes | str | os.PathLike) -> tuple[bytes | None, Path | None, str, int]:
    """(data, path, sha256, size) of a file given as bytes or a path; a path is hashed in blocks, never held."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        return data, None, hashlib.sha256(data).hexdigest(), len(data)
    path = Path(value)
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while block := f.read(BLOCK):
            digest.update(block)
            size += len(block)
    return None, path, digest.hexdigest(), size


def _read_all(blob: _Blob) -> bytes:
    if blob.data is not None:
        return blob.data
    assert blob.path is not None
    return blob.path.read_bytes()


def _parse_range(header: str, size: int) -> tuple[int, int] | str | None:
    """``(start, end_exclusive)`` for a single byte range, ``"unsatisfiable"`` (416), or ``None`` to ignore the
    header and answer the whole file (several ranges, other units, or a malformed one, as RFC 9110 allows)."""
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash:
        return None
    try:
        if first == "":
            n = int(last)
            if n <= 0:
                return "unsatisfiable"
            return max(size - n, 0), size
        start = int(first)
        end = int(last) + 1 if last != "" else size
    except ValueError:
        return None
    if start < 0 or end <= start:
        return None if start < size else "unsatisfiable"
    if start >= size:
        return "unsatisfiable"
    return start, min(end, size)


def _docker_error(status: int, code: str, message: str, detail: Any = None) -> web.Response:
    error: dict[str, Any] = {"code": code, "message": message}
    if detail is not None:
        error["detail"] = detail
    return web.json_response({"errors": [error]}, status=status)


class Hub:
    """Runs in its own thread with its own event loop, so synchronous clients in the test thread and a gateway
    in another process can use it. Binds 127.0.0.1 on free ports.

    ``add_hf_repo`` and ``add_ollama_model`` work before ``start`` and while running (a second ``add_hf_repo``
    of a repo makes a new commit that ``main`` moves to; the old commit stays resolvable). ``url``, ``cdn_url``
    and ``host`` exist once started.
    """

    def __init__(self) -> None:
        self.faults = Faults()
        self.log: list[Request] = []
        self._lock = threading.Lock()
        self._blobs: dict[str, _Blob] = {}
        self._hf: dict[str, _HfRepo] = {}
        self._ollama: dict[tuple[str, str], _OllamaRepo] = {}
        self._secret = secrets.token_bytes(16)  # signs CDN URLs
        self._commits = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._closing = False
        self._ports: tuple[int, int] | None = None

    # -- lifecycle ----------------------------------------------------------------------------------------

    def start(self) -> Hub:
        """Bind both ports and serve; returns once both accept connections."""
        if self._thread is not None:
            raise RuntimeError("Hub already started")
        socks = []
        for _ in range(2):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        self._ports = (socks[0].getsockname()[1], socks[1].getsockname()[1])
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(self._main(socks, ready))
            except BaseException as exc:  # handed to the starting thread
                failure.append(exc)
                ready.set()

        self._thread = threading.Thread(target=run, name="hubserver", daemon=True)
        self._thread.start()
        ready.wait(30)
        if failure or not ready.is_set():
            for sock in socks:
                sock.close()
            raise RuntimeError("hubserver did not start") from (failure[0] if failure else None)
        return self

    def stop(self) -> None:
        """Stop both sites: transfers in progress are cut, idle connections closed. Idempotent."""
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None:
            return
        self._closing = True
        if loop is not None and stopping is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stopping.set)
            except RuntimeError:  # the loop ended on its own
                pass
        thread.join(30)
        self._thread = None

    def __enter__(self) -> Hub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _main(self, socks: list[socket.socket], ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        runners = []
        try:
            for name, handler, sock in (("hub", self._hub, socks[0]), ("cdn", self._cdn, socks[1])):
                app = web.Application(middlewares=[self._middleware(name)])
                app.router.add_route("*", "/{tail:.*}", handler)
                runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
                await runner.setup()
                runners.append(runner)
                await web.SockSite(runner, sock).start()
            ready.set()
            await self._stopping.wait()
        finally:
            for runner in runners:
                await runner.cleanup()
            for sock in socks:
                sock.close()

    def _port(self, i: int) -> int:
        if self._ports is None:
            raise RuntimeError("Hub not started")
        return self._ports[i]

    @property
    def url(self) -> str:
        """The hub's and registry's base URL, ``http://127.0.0.1:PORT``: ``HF_ENDPOINT``, and the registry host."""
        return f"http://127.0.0.1:{self._port(0)}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self._port(1)}"

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``, the host part of Ollama names: ``f"{hub.host}/ns/model:tag"``."""
        return f"127.0.0.1:{self._port(0)}"

    # -- content --------------------------------------------------------------------------------------------

    def _blob(self, source: tuple[bytes | None, Path | None, str, int], name: str) -> _Blob:
        data, path, sha, size = source
        with self._lock:
            blob = self._blobs.get(sha)
            if blob is None:
                blob = self._blobs[sha] = _Blob(sha, size, data, path)
            blob.names.add(name)
        return blob

    def add_hf_repo(self, repo: str, files: dict[str, Path | bytes], *, commit: str | None = None,
                    regular: set[str] | frozenset[str] = frozenset()) -> str:
        """Publish ``files`` (path in repo -> content) as a new commit of ``repo`` and point ``main`` at it;
        returns the commit sha (40 hex, derived from the content unless given). A file is in LFS (ETag its
        sha256, bytes on the CDN) when it ends ``.gguf`` or is over 1 KiB, unless named in ``regular``; else a
        regular git file (ETag its git blob sha1, served by the hub)."""
        if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", repo):
            raise ValueError(f"bad repo id {repo!r}")
        if commit is not None and not _COMMIT.fullmatch(commit):
            raise ValueError(f"commit must be 40 lowercase hex digits, not {commit!r}")
        tree: dict[str, _HfFile] = {}
        for name, value in files.items():
            if not name or name.startswith("/") or ".." in name.split("/"):
                raise ValueError(f"bad file name {name!r}")
            blob = self._blob(_source(value), name)
            lfs = (name.endswith(".gguf") or blob.size > LFS_THRESHOLD) and name not in regular
            oid = git_blob_sha1(_lfs_pointer(blob.sha256, blob.size) if lfs else _read_all(blob))
            tree[name] = _HfFile(name, blob, lfs, oid)
        with self._lock:
            self._commits += 1
            if commit is None:
                seed = f"{repo}\n{self._commits}\n" + "".join(f"{p} {f.oid}\n" for p, f in sorted(tree.items()))
                commit = hashlib.sha1(seed.encode()).hexdigest()
            entry = self._hf.setdefault(repo, _HfRepo())
            entry.commits[commit] = tree
            entry.main = commit
        return commit

    def add_ollama_model(self, namespace: str, model: str, tag: str, model_file: Path | bytes, *,
                         projector: Path | bytes | None = None, template: str | None = None,
                         params: dict | None = None) -> dict:
        """Publish ``namespace/model:tag``; returns its manifest (as served, sizes true). Layers in Ollama's order:
        model, projector, template, params; the config blob (``rootfs.diff_ids``) is stored too. Every digest is
        the sha256 of the blob's bytes, which the registry serves from the CDN."""
        layers = []
        parts: list[tuple[str, Path | bytes | None]] = [
            ("model", model_file), ("projector", projector),
            ("template", template.encode() if template is not None else None),
            ("params", json.dumps(params).encode() if params is not None else None),
        ]
        digests = []
        for kind, value in parts:
            if value is None:
                continue
            source = _source(value)
            sha, size = source[2], source[3]
            digest = f"sha256:{sha}"
            self._blob(source, digest)
            layers.append({"mediaType": OLLAMA_TYPES[kind], "digest": digest, "size": size})
            digests.append(digest)
        config = json.dumps({
            "model_format": "gguf", "architecture": "amd64", "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": digests},
        }).encode()
        config_digest = f"sha256:{hashlib.sha256(config).hexdigest()}"
        self._blob(_source(config), config_digest)
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "digest": config_digest, "size": len(config)},
            "layers": layers,
        }
        with self._lock:
            repo = self._ollama.setdefault((namespace, model), _OllamaRepo())
            repo.manifests[tag] = manifest
            repo.blobs.update(digests + [config_digest])
        return json.loads(json.dumps(manifest))

    # -- URLs -------------------------------------------------------------------------------------------

    def _sign(self, path: str) -> str:
        return hmac.new(self._secret, path.encode(), hashlib.sha256).hexdigest()

    def cdn_link(self, key: str, filename: str | None = None) -> str:
        """The signed CDN URL of a blob, as the hub (``key`` a bare sha256, optional ``filename``) or the registry
        (``key`` ``sha256:HEX``) would redirect to it: for tests that want the CDN without the redirect."""
        if key.startswith("sha256:"):
            hexd = key[7:]
            path = f"/ollama/docker/registry/v2/blobs/sha256/{hexd[:2]}/{hexd}/data"
            return (f"{self.cdn_url}{path}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires=1200"
                    f"&X-Amz-SignedHeaders=host&X-Amz-Signature={self._sign(path)}")
        path = f"/repos/{key[:2]}/{key[2:4]}/{hashlib.sha256(key.encode()).hexdigest()}/{key}"
        disposition = ""
        if filename is not None:
            base = filename.rsplit("/", 1)[-1]
            value = f"attachment; filename*=UTF-8''{quote(base)}; filename=\"{base}\";"
            disposition = f"response-content-disposition={quote(value, safe='')}&"
        return f"{self.cdn_url}{path}?{disposition}Expires=4102444800&Signature={self._sign(path)}&Key-Pair-Id=K3HUB"

    # -- request plumbing -------------------------------------------------------------------------------

    def _middleware(self, server: str):
        @web.middleware
        async def middleware(request: web.Request, handler) -> web.StreamResponse:
            entry = Request(request.method, request.path, request.query_string, CIMultiDict(request.headers), server)
            self.log.append(entry)
            request[ENTRY] = entry
            status = self.faults.failure(request.path)
            if status is not None:
                entry.status = status
                if request.path.startswith("/v2/"):
                    return _docker_error(status, "UNAVAILABLE", "injected failure")
                return web.json_response({"error": f"injected failure {status}"}, status=status)
            try:
                response = await handler(request)
            except web.HTTPException as exc:
                entry.status = exc.status
                raise
            if entry.status is None:
                entry.status = response.status
            return response
        return middleware

    @staticmethod
    def _segments(request: web.Request) -> list[str]:
        """The path split on ``/`` before decoding, so an encoded ``%2F`` (a revision like ``refs%2Fpr%2F1``)
        stays inside its segment."""
        return [unquote(s) for s in request.rel_url.raw_path.split("/")[1:]]

    def _split_repo(self, segs: list[str]) -> tuple[str, list[str]]:
        """(repo id, the rest) for hub paths, whose repo ids have one or two segments: a known two-segment id
        first, else a known one-segment id, else the first two segments (an unknown repo, as the hub reads it)."""
        if len(segs) >= 2 and "/".join(segs[:2]) in self._hf:
            return "/".join(segs[:2]), segs[2:]
        if segs and segs[0] in self._hf:
            return segs[0], segs[1:]
        return "/".join(segs[:2]), segs[2:]

    # -- hub site ---------------------------------------------------------------------------------------

    async def _hub(self, request: web.Request) -> web.StreamResponse:
        segs = self._segments(request)
        if segs[:1] == ["v2"]:
            return await self._registry(request, segs[1:])
        if segs[:2] == ["api", "models"]:
            return self._api(request, segs[2:])
        if segs[:3] == ["api", "resolve-cache", "models"]:
            repo_id, rest = self._split_repo(segs[3:])
            if len(rest) < 2:
                raise web.HTTPNotFound()
            return await self._resolve(request, repo_id, rest[0], "/".join(rest[1:]), cached=True)
        for i in (2, 1):  # /{ns}/{name}/resolve/... or /{name}/resolve/...
            if len(segs) > i + 2 and segs[i] == "resolve":
                return await self._resolve(request, "/".join(segs[:i]), segs[i + 1], "/".join(segs[i + 2:]))
        raise web.HTTPNotFound()

    def _repo_not_found(self, request: web.Request) -> web.Response:
        # huggingface.co answers 401 to anonymous callers (not to reveal private repos), 404 to signed-in ones.
        status = 404 if "Authorization" in request.headers else 401
        return web.json_response({"error": "Repository not found"}, status=status,
                                 headers={"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"})

    def _lookup(self, request: web.Request, repo_id: str,
                revision: str) -> tuple[str, dict[str, _HfFile]] | web.Response:
        repo = self._hf.get(repo_id)
        if repo is None:
            return self._repo_not_found(request)
        commit = repo.resolve(revision)
        if commit is None:
            message = f"Invalid rev id: {revision}"
            return web.json_response({"error": message}, status=404,
                                     headers={"X-Error-Code": "RevisionNotFound", "X-Error-Message": message})
        return commit, repo.commits[commit]

    def _declared(self, f: _HfFile) -> int:
        return f.blob.size + (1 if f.path in self.faults.wrong_size else 0)

    async def _resolve(self, request: web.Request, repo_id: str, revision: str, path: str,
                       cached: bool = False) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "HEAD"])
        found = self._lookup(request, repo_id, revision)
        if isinstance(found, web.Response):
            return found
        commit, tree = found
        f = tree.get(path)
        headers = {"X-Repo-Commit": commit, "Accept-Ranges": "bytes"}
        if f is None:
            return web.Response(status=404, text="Entry not found", headers={
                **headers, "X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found"})
        etag = f'"{f.etag}"'
        if f.path in self.faults.undeclared:  # no size, no digest: an opaque tag, and the bytes on the CDN
            headers["ETag"] = f'W/"opaque-{f.oid[:12]}"'
            if self.faults.redirect_blobs and not cached:
                location = self.cdn_link(f.blob.sha256, f.path)
                return web.Response(status=302, headers={**headers, "Location": location})
            return await self._send(request, f.blob, headers, faults=True)
        if f.lfs:
            headers.update({"ETag": etag, "X-Linked-Etag": etag, "X-Linked-Size": str(self._declared(f))})
            if self.faults.redirect_blobs and not cached:
                location = self.cdn_link(f.blob.sha256, f.path)
                return web.Response(status=302, text=f"Found. Redirecting to {location}",
                                    headers={**headers, "Location": location})
            return await self._send(request, f.blob, headers, faults=True)
        if not cached:
            # huggingface.co sends regular files through a relative redirect to its resolve cache
            location = (f"/api/resolve-cache/models/{repo_id}/{commit}/{quote(path)}"
                        f"?{quote(request.rel_url.raw_path, safe='')}=&etag={quote(etag, safe='')}")
            return web.Response(status=307, text=f"Temporary Redirect. Redirecting to {location}",
                                headers={**headers, "Location": location})
        headers["ETag"] = etag
        return await self._send(request, f.blob, headers, faults=False)

    def _api(self, request: web.Request, segs: list[str]) -> web.Response:
        if request.method != "GET":
            raise web.HTTPMethodNotAllowed(request.method, ["GET"])
        repo_id, rest = self._split_repo(segs)
        if not rest:
            revision, kind = "main", "info"
        elif rest[0] == "revision" and len(rest) == 2:
            revision, kind = rest[1], "info"
        elif rest[0] == "tree" and len(rest) >= 2:
            revision, kind = rest[1], "tree"
        else:
            raise web.HTTPNotFound()
        found = self._lookup(request, repo_id, revision)
        if isinstance(found, web.Response):
            return found
        commit, tree = found
        flag = {k: request.query.get(k, "").lower() in ("1", "true") for k in ("blobs", "recursive", "expand")}
        if kind == "tree":
            return self._tree(commit, tree, "/".join(rest[2:]).strip("/"), flag["recursive"], flag["expand"])
        siblings = []
        for f in tree.values():
            sibling: dict[str, Any] = {"rfilename": f.path}
            if flag["blobs"] and f.path not in self.faults.undeclared:
                sibling.update({"blobId": f.oid, "size": self._declared(f)})
                if f.lfs:
                    pointer = len(_lfs_pointer(f.blob.sha256, f.blob.size))
                    sibling["lfs"] = {"sha256": f.blob.sha256, "size": self._declared(f), "pointerSize": pointer}
            siblings.append(sibling)
        author = repo_id.split("/")[0] if "/" in repo_id else None
        gguf = any(p.endswith(".gguf") for p in tree)
        return web.json_response({
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24], "id": repo_id, "modelId": repo_id,
            "author": author, "sha": commit, "lastModified": DATE, "createdAt": DATE, "private": False,
            "gated": False, "disabled": False, "downloads": 0, "likes": 0, "tags": ["gguf"] if gguf else [],
            "siblings": siblings, "spaces": [], "usedStorage": sum(f.blob.size for f in tree.values()),
        })

    def _tree(self, commit: str, tree: dict[str, _HfFile], base: str, recursive: bool,
              expand: bool) -> web.Response:
        prefix = f"{base}/" if base else ""
        dirs: set[str] = set()
        files = []
        for path, f in sorted(tree.items()):
            if not path.startswith(prefix):
                continue
            rel = path[len(prefix):].split("/")
            for depth in range(1, len(rel)):
                if recursive or depth == 1:
                    dirs.add(prefix + "/".join(rel[:depth]))
            if recursive or len(rel) == 1:
                files.append(f)
        if base and not files and not dirs:
            return web.Response(status=404, text="Entry not found", headers={
                "X-Error-Code": "EntryNotFound", "X-Error-Message": f"{base} does not exist on \"{commit}\""})
        last = {"id": commit, "title": "Upload", "date": DATE}
        out: list[dict[str, Any]] = []
        for d in sorted(dirs):
            item: dict[str, Any] = {"type": "directory", "oid": hashlib.sha1(f"{commit}/{d}".encode()).hexdigest(),
                                    "size": 0, "path": d}
            if expand:
                item["lastCommit"] = last
            out.append(item)
        for f in files:
            item = {"type": "file", "oid": f.oid, "size": self._declared(f), "path": f.path}
            if f.lfs:
                item["lfs"] = {"oid": f.blob.sha256, "size": self._declared(f),
                               "pointerSize": len(_lfs_pointer(f.blob.sha256, f.blob.size))}
            if expand:
                item["lastCommit"] = last
                item["securityFileStatus"] = {"status": "safe", "avScan": {"virusFound": False, "virusNames": None},
                                              "pickleImportScan": None}
            out.append(item)
        return web.json_response(out)

    # -- registry ---------------------------------------------------------------------------------------

    def _manifest_bytes(self, manifest: dict) -> bytes:
        """The manifest as served now: ``wrong_size`` adds one to the sizes it names."""
        wrong = self.faults.wrong_size
        shown = json.loads(json.dumps(manifest))
        for layer in [shown["config"], *shown["layers"]]:
            if layer["digest"] in wrong:
                layer["size"] += 1
        return json.dumps(shown, separators=(",", ":")).encode()

    async def _registry(self, request: web.Request, segs: list[str]) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            return _docker_error(405, "UNSUPPORTED", "The operation is unsupported.")
        if segs in ([], [""]):
            return web.json_response({})
        if len(segs) != 4 or segs[2] not in ("manifests", "blobs"):
            return _docker_error(404, "NAME_UNKNOWN", "repository name not known to registry")
        ns, model, kind, ref = segs
        repo = self._ollama.get((ns, model))
        if kind == "manifests":
            manifest = None
            if repo is not None:
                manifest = repo.manifests.get(ref)
                if manifest is None and _DIGEST.fullmatch(ref):
                    for m in repo.manifests.values():
                        if f"sha256:{hashlib.sha256(self._manifest_bytes(m)).hexdigest()}" == ref:
                            manifest = m
            if manifest is None:
                return _docker_error(404, "MANIFEST_UNKNOWN", "manifest unknown")
            body = self._manifest_bytes(manifest)
            headers = {"Content-Type": MANIFEST_TYPE, "Docker-Content-Digest": f"sha256:{hashlib.sha256(body).hexdigest()}",
                       "Docker-Distribution-Api-Version": "registry/2.0"}
            if self.faults.trickle is not None and request.method == "GET":
                return await self._trickle(request, body, headers, self.faults.trickle)
            return web.Response(body=body, headers=headers)
        blob = self._blobs.get(ref[7:]) if _DIGEST.fullmatch(ref) else None
        if repo is None or ref not in repo.blobs or blob is None:
            return _docker_error(404, "BLOB_UNKNOWN", "blob unknown to registry", {"digest": ref})
        headers = {"Docker-Content-Digest": ref, "Docker-Distribution-Api-Version": "registry/2.0"}
        if self.faults.redirect_blobs:
            location = self.cdn_link(ref)
            return web.Response(status=307, text=f'<a href="{location}">Temporary Redirect</a>.',
                                headers={**headers, "Location": location})
        return await self._send(request, blob, headers, faults=True)

    async def _trickle(self, request: web.Request, body: bytes, headers: dict[str, str],
                       every: float) -> web.StreamResponse:
        """``body`` one byte at a time, ``every`` seconds apart, until done, the client leaves or the hub stops."""
        entry: Request = request[ENTRY]
        response = web.StreamResponse(status=200, headers=headers)
        response.content_length = len(body)
        entry.status = 200
        await response.prepare(request)
        try:
            for i in range(len(body)):
                if self._closing:
                    break
                await response.write(body[i:i + 1])
                entry.bytes_sent += 1
                await asyncio.sleep(every)
        except ConnectionError:
            return response
        if entry.bytes_sent < len(body) and request.transport is not None:
            request.transport.close()
        return response

    # -- CDN --------------------------------------------------------------------------------------------

    async def _cdn(self, request: web.Request) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "HEAD"])
        path = request.rel_url.raw_path
        m = re.fullmatch(r"/repos/[0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{64}/([0-9a-f]{64})", path)
        signature = request.query.get("Signature")
        if m is None:
            m = re.fullmatch(r"/ollama/docker/registry/v2/blobs/sha256/[0-9a-f]{2}/([0-9a-f]{64})/data", path)
            signature = request.query.get("X-Amz-Signature")
        if m is None:
            return web.Response(status=404, content_type="application/xml",
                                text="<Error><Code>NoSuchKey</Code><Message>The specified key does not exist."
                                     "</Message></Error>")
        if signature is None or not hmac.compare_digest(signature, self._sign(path)):
            return web.Response(status=403, content_type="application/xml",
                                text="<Error><Code>AccessDenied</Code><Message>Access denied</Message></Error>")
        blob = self._blobs.get(m.group(1))
        if blob is None:
            return web.Response(status=404, text="<Error><Code>NoSuchKey</Code></Error>",
                                content_type="application/xml")
        headers = {"ETag": f'"{blob.sha256}"', "Last-Modified": "Wed, 01 May 2024 12:00:00 GMT"}
        disposition = request.query.get("response-content-disposition")
        if disposition:
            headers["Content-Disposition"] = disposition
        return await self._send(request, blob, headers, faults=True)

    # -- bytes ------------------------------------------------------------------------------------------

    async def _send(self, request: web.Request, blob: _Blob, headers: dict[str, str],
                    faults: bool) -> web.StreamResponse:
        """Answer ``blob``'s bytes to a GET or HEAD, honouring Range; with ``faults``, the byte faults apply."""
        entry: Request = request[ENTRY]
        fs = self.faults
        size = blob.size
        start, end, status = 0, size, 200
        header = request.headers.get("Range")
        if header and not (faults and fs.ignore_range):
            span = _parse_range(header, size)
            if span == "unsatisfiable":
                return web.Response(status=416, headers={**headers, "Content-Range": f"bytes */{size}"})
            if isinstance(span, tuple):
                start, end = span
                status = 206
        response = web.StreamResponse(status=status, headers={
            "Content-Type": "application/octet-stream", "Accept-Ranges": "bytes", **headers})
        if status == 206:
            response.headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        response.content_length = end - start
        entry.status = status
        if request.method == "HEAD":
            await response.prepare(request)
            return response
        limit = fs.take_drop(end - start) if faults else None
        flip = corrupt_offset(size) if faults and blob.names & fs.corrupt else None
        rate = fs.rate if faults else None
        await response.prepare(request)
        stop = end if limit is None else start + limit
        pos = start
        handle = blob.path.open("rb") if blob.path is not None else None
        try:
            if handle is not None:
                handle.seek(start)
            while pos < stop and not self._closing:
                n = min(BLOCK if rate is None else max(1, min(rate // 50, 65536)), stop - pos)
                if handle is not None:
                    chunk = await asyncio.to_thread(handle.read, n)
                else:
                    assert blob.data is not None
                    chunk = blob.data[pos:pos + n]
                if not chunk:
                    break
                if flip is not None and pos <= flip < pos + len(chunk):
                    buf = bytearray(chunk)
                    buf[flip - pos] ^= 0xFF
                    chunk = bytes(buf)
                await response.write(chunk)
                pos += len(chunk)
                entry.bytes_sent += len(chunk)
                if rate:
                    await asyncio.sleep(len(chunk) / rate)
        except ConnectionError:  # the client went away: nothing left to answer
            return response
        finally:
            if handle is not None:
                handle.close()
        if pos < end and request.transport is not None:
            # drop_after (or stop): close with the body short of its Content-Length; buffered bytes still go out
            entry.dropped = limit is not None
            request.transport.close()
        return response
