"""One file from a hub or registry onto disk: resumable, bounded, verified, cancellable.

Listings, manifests and metadata go through ``huggingface_hub``'s shared HTTP client, so
``HF_TOKEN``'s headers, proxies and its connection pool are the ones every Hugging Face tool
uses; the gateway installs its own client factory (``install_client``) whose every request,
each redirect hop included, is checked against the pull's ``Origin`` first (``problem``). A
file's bytes go through the standard library's client (``_get``: far less work a byte), with
the same check at each hop (``_Redirects``), the hub's headers, and the environment's proxies.
The rule:

- ``https`` anywhere public; ``http`` only to the origin's own host, and only when the pull is
  ``insecure`` (a registry the operator named over http);
- never into the loopback or private ranges unless the origin itself is there (a registry on
  this machine or the LAN), whatever a redirect says;
- at most ``MAX_REDIRECTS`` hops; a key sent to the hub is not sent on to another host.

``fetch`` writes to ``partial`` (never the final name, so discovery never sees half a file),
resuming from what ``partial`` already holds with an HTTP ``Range`` (after a dropped
connection, within ``RETRIES`` attempts; after a cancel or a restart, at the next pull). Every
byte is hashed as it is written, on a thread beside the reader (and the kept bytes first, on a
resume); the size and the SHA-256 are checked at the end, and a mismatch deletes ``partial``.
Only then does the caller move it into place.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import queue
import shutil
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ..base.addresses import forbidden_text
from ..base.errors import ApiError

log = logging.getLogger(__name__)

CHUNK = 1 << 20  # read and hash a MiB at a time: the unit of progress and of a cancel's delay
QUEUED = 16  # chunks read ahead of the writer
MAX_REDIRECTS = 5
RETRIES = 5  # reconnections within one fetch while bytes keep coming
CONNECT_TIMEOUT = 10.0  # an unreachable hub or no network fails within this, never hangs
READ_TIMEOUT = 60.0  # a stalled connection is dropped and resumed after this
MAX_SMALL_BYTES = 1 << 20  # a manifest, a listing or an error body is read within this


class PullError(ApiError):
    """A pull that cannot go on, as an HTTP caller is told it (each kind its status and code;
    ``param`` is the model's name, which is what the caller got wrong where it is a 4xx)."""

    STATUS, CODE = 502, "pull_failed"

    def __init__(self, message: str):
        super().__init__(message, status=self.STATUS, code=self.CODE, param="model" if self.STATUS < 500 else None)


class NotFound(PullError):
    STATUS, CODE = 404, "model_not_found"


class NoStore(PullError):
    STATUS, CODE = 501, "no_store_to_pull_into"


class BadPullName(PullError):
    STATUS, CODE = 400, "invalid_model_name"


class Ambiguous(PullError):
    STATUS, CODE = 400, "ambiguous_model_name"


class Gated(PullError):
    STATUS, CODE = 403, "model_gated"


class Unreachable(PullError):
    STATUS, CODE = 502, "hub_unreachable"


class Offline(PullError):
    STATUS, CODE = 503, "hub_offline"


class Corrupt(PullError):
    STATUS, CODE = 502, "download_corrupt"


class NoSpace(PullError):
    STATUS, CODE = 507, "insufficient_storage"


class Refused(PullError):
    STATUS, CODE = 502, "redirect_refused"


class Cancelled(PullError):
    STATUS, CODE = 409, "pull_cancelled"


@dataclass(frozen=True)
class Origin:
    """Where a pull starts: a hub's endpoint or a registry. ``private`` is whether the origin
    itself is in the loopback or private ranges (then its redirects may stay there)."""

    host: str  # the host name or address, no port
    insecure: bool  # plain http allowed, to this host only
    private: bool

    @classmethod
    def of(cls, url: str, *, insecure: bool, resolve: Callable[[str], list[str]] | None = None) -> Origin:
        host = urlsplit(url).hostname or ""
        addresses = (resolve or addresses_of)(host)
        return cls(host.lower(), insecure, any(forbidden_text(a) for a in addresses))


def addresses_of(host: str) -> list[str]:
    """The addresses ``host`` resolves to (blocking; on a pull's thread), or [] when it does not."""
    try:
        return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, None)})
    except (OSError, UnicodeError):
        return []


def problem(url: str, origin: Origin, resolve: Callable[[str], list[str]] = addresses_of) -> str | None:
    """Why a request for ``url`` may not be made within a pull from ``origin``, or None (pure
    but for ``resolve``). See the module's docstring for the rule."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if not host:
        return f"{url!r} names no host"
    if parts.scheme == "http":
        if not (origin.insecure and host == origin.host):
            return f"refusing plain http to {host} (only https, or http to the registry itself when insecure)"
    elif parts.scheme != "https":
        return f"refusing a {parts.scheme or 'relative'} URL"
    if not origin.private and host != origin.host:
        addresses = resolve(host)
        if any(forbidden_text(a) for a in addresses):
            return f"refusing a redirect to {host}: it is a loopback or private address"
    return None


_CURRENT = threading.local()  # the pull this thread is serving: its Origin


class within:
    """``with within(origin):`` every request this thread makes through the shared client is
    checked against ``origin`` (``problem``)."""

    def __init__(self, origin: Origin):
        self.origin = origin

    def __enter__(self) -> Origin:
        self.saved = getattr(_CURRENT, "origin", None)
        _CURRENT.origin = self.origin
        return self.origin

    def __exit__(self, *exc: object) -> None:
        _CURRENT.origin = self.saved


def _check_request(request) -> None:  # noqa: ANN001 (httpx2.Request)
    origin = getattr(_CURRENT, "origin", None)
    if origin is None:
        return  # a request outside a pull: not the gateway's
    why = problem(str(request.url), origin)
    if why:
        raise Refused(why)


_INSTALLED = threading.Lock()
_installed = False


def install_client() -> None:
    """Make ``huggingface_hub``'s shared client the gateway's: its own request hook, then the
    redirect check, a bound on hops, a connect timeout. Idempotent."""
    global _installed
    with _INSTALLED:
        if _installed:
            return
        import httpx2
        from huggingface_hub import set_client_factory
        from huggingface_hub.utils import disable_progress_bars
        from huggingface_hub.utils._http import hf_request_event_hook

        def factory() -> httpx2.Client:
            return httpx2.Client(event_hooks={"request": [hf_request_event_hook, _check_request]},
                                 follow_redirects=True, max_redirects=MAX_REDIRECTS,
                                 timeout=httpx2.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT))

        set_client_factory(factory)
        disable_progress_bars()  # progress is the gateway's own
        _installed = True


def session():  # noqa: ANN201 (httpx2.Client)
    install_client()
    from huggingface_hub import get_session

    return get_session()


def network_error(exc: BaseException, where: str) -> PullError:
    """A transport failure as the caller is told it."""
    import httpx2

    if isinstance(exc, PullError):
        return exc
    cause: BaseException | None = exc
    while cause is not None:  # httpx2 wraps the hook's own refusal
        if isinstance(cause, Refused):
            return cause
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, httpx2.TooManyRedirects):
        return Refused(f"{where}: more than {MAX_REDIRECTS} redirects")
    return Unreachable(f"cannot reach {where}: {str(exc) or type(exc).__name__}")


def read_small(url: str, headers: dict[str, str], what: str, *, limit: int = MAX_SMALL_BYTES) -> tuple[int, bytes]:
    """The status and body of a GET, the body read within ``limit`` bytes (a manifest, a
    listing, an error): more is refused."""
    import httpx2

    try:
        with session().stream("GET", url, headers=headers) as resp:
            body = bytearray()
            for chunk in resp.iter_bytes(1 << 16):
                body += chunk
                if len(body) > limit:
                    raise Corrupt(f"{what}: more than {limit} bytes")
            return resp.status_code, bytes(body)
    except httpx2.HTTPError as exc:
        raise network_error(exc, what) from None


class Hashing:
    """A partial file opened for appending, hashing what it holds and what is written."""

    def __init__(self, path: Path):
        self.digest = hashlib.sha256()
        self.file = open(path, "ab+")  # noqa: SIM115 (closed by close())
        self.file.seek(0)
        while block := self.file.read(CHUNK):
            self.digest.update(block)
        self.size = self.file.tell()

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.digest.update(data)
        self.size += len(data)

    def restart(self) -> None:
        """Drop what is held: the server sent the whole file again rather than the range."""
        self.file.seek(0)
        self.file.truncate()
        self.digest = hashlib.sha256()
        self.size = 0

    def close(self) -> None:
        self.file.close()


@dataclass(frozen=True)
class Want:
    """One file to fetch: where from, into which partial file, and what it must be."""

    url: str
    partial: Path
    size: int | None
    sha256: str | None  # hex; None where the source declares none (then the size alone is checked)
    name: str  # as shown in progress and errors
    headers: tuple[tuple[str, str], ...] = ()
    origin: Origin | None = None  # where the pull started: what the URL and its redirects may reach


Progress = Callable[[int], None]  # bytes the partial file now holds


def fetch(want: Want, progress: Progress, cancelled: threading.Event) -> None:
    """Fetch ``want`` into ``want.partial``, checked: see the module's docstring. Raises a
    ``PullError``; on ``Corrupt`` the partial file is gone, on anything else it is kept to
    resume from."""
    out = Hashing(want.partial)
    try:
        progress(out.size)
        tries = 0
        while True:
            if cancelled.is_set():
                raise Cancelled(f"{want.name}: cancelled")
            before = out.size
            try:
                _get(want, out, progress, cancelled)
                if want.size is None or out.size >= want.size:
                    break
                lost: Exception = ConnectionError("the body ended early")
            except (OSError, http.client.HTTPException) as exc:  # URLError, a reset, a timeout, a cut body
                if isinstance(exc, urllib.error.HTTPError):
                    raise Unreachable(f"{want.name}: HTTP {exc.code} from {urlsplit(exc.url).hostname}") from None
                if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, PullError):
                    raise exc.reason from None
                lost = exc
            tries = tries + 1 if out.size == before else 1
            connect = isinstance(lost, urllib.error.URLError)
            if tries > RETRIES or (connect and tries > 2):
                raise Unreachable(f"cannot reach {urlsplit(want.url).hostname} for {want.name}: "
                                  f"{getattr(lost, 'reason', lost) or type(lost).__name__}") from None
            log.info("%s: connection lost at %d bytes, resuming (%s)", want.name, out.size, lost)
            time.sleep(min(0.2 * 2 ** tries, 2.0))
        if want.size is not None and out.size != want.size:
            raise Corrupt(f"{want.name}: {out.size} bytes received, {want.size} declared")
        if want.sha256 is not None and out.digest.hexdigest() != want.sha256.lower():
            raise Corrupt(f"{want.name}: SHA-256 {out.digest.hexdigest()} is not the declared {want.sha256.lower()}")
    except Corrupt:
        out.close()
        want.partial.unlink(missing_ok=True)
        raise
    finally:
        out.close()


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Redirects within a pull's ``Origin`` (``problem``), at most ``MAX_REDIRECTS``; a key sent
    to the hub never goes on to another host."""

    max_redirections = MAX_REDIRECTS

    def __init__(self, origin: Origin | None):
        self.origin = origin

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001, ANN201 (urllib's)
        if self.origin is not None and (why := problem(newurl, self.origin)):
            fp.close()  # urllib closes it only after a redirect it follows
            raise urllib.error.URLError(Refused(why))
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urlsplit(newurl).netloc != urlsplit(req.full_url).netloc:
            for key in [k for k in new.headers if k.lower() in ("authorization", "cookie")]:
                del new.headers[key]
            new.unredirected_hdrs.clear()
        return new


def _get(want: Want, out: Hashing, progress: Progress, cancelled: threading.Event) -> None:
    """One GET from where ``out`` stands, until its body ends or breaks. The standard library's
    client (far less work a byte than an asyncio-free httpx2 stream), reading into a writer
    thread that hashes and writes while the next bytes arrive."""
    asked = out.size
    headers = {"User-Agent": "gguf-gateway", "Accept-Encoding": "identity", **dict(want.headers)}
    if asked:
        headers["Range"] = f"bytes={asked}-"
    if want.origin is not None and (why := problem(want.url, want.origin)):
        raise Refused(why)
    opener = urllib.request.build_opener(_Redirects(want.origin))
    try:
        resp = opener.open(urllib.request.Request(want.url, headers=headers), timeout=READ_TIMEOUT)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 416 and want.size is not None:
            if asked >= want.size:
                return  # what is held is already all of it (or more: the size check says so)
            raise Corrupt(f"{want.name}: the server has {asked} bytes or fewer, {want.size} declared") from None
        if exc.code == 404:
            raise NotFound(f"{want.name}: not found") from None
        if 300 <= exc.code < 400:  # past the hop bound, or to a scheme urllib will not follow
            scheme = urlsplit(exc.headers.get("Location") or "").scheme
            raise Refused(f"{want.name}: refusing a {scheme} URL" if scheme not in ("", "http", "https")
                          else f"{want.name}: more than {MAX_REDIRECTS} redirects") from None
        raise
    with resp:
        status = resp.status
        if asked and status == 200:
            out.restart()  # the server ignored the range: take the whole file
            progress(0)
        elif asked and status == 206 and not str(resp.headers.get("Content-Range", "")).startswith(f"bytes {asked}-"):
            raise Corrupt(f"{want.name}: asked for bytes from {asked}, got {resp.headers.get('Content-Range')!r}")
        _copy(resp, out, want, progress, cancelled)


def _copy(resp, out: Hashing, want: Want, progress: Progress, cancelled: threading.Event) -> None:  # noqa: ANN001
    """The body into ``out``: read here, hashed and written on a second thread (both leave the
    GIL for the bytes), ``CHUNK`` at a time, at most ``QUEUED`` chunks apart."""
    chunks: queue.Queue[bytes | None] = queue.Queue(QUEUED)
    failed: list[BaseException] = []

    def write() -> None:
        while (chunk := chunks.get()) is not None:
            if failed:
                continue
            try:
                out.write(chunk)
            except BaseException as exc:  # noqa: BLE001 (a full disk: told to the reader)
                failed.append(exc)

    writer = threading.Thread(target=write, name="pull-writer", daemon=True)
    writer.start()
    got = out.size
    try:
        while chunk := resp.read1(CHUNK):  # what has come, up to CHUNK: progress on a slow link too
            if cancelled.is_set():
                raise Cancelled(f"{want.name}: cancelled")
            if failed:
                break
            got += len(chunk)
            if want.size is not None and got > want.size:
                raise Corrupt(f"{want.name}: more than the declared {want.size} bytes")
            chunks.put(chunk)
            progress(got)
    finally:
        chunks.put(None)
        writer.join()
    if failed:
        raise PullError(f"{want.name}: cannot write {want.partial}: {failed[0]}")


def free_bytes(folder: Path) -> int:
    """Free space where ``folder`` is (or would be: its nearest existing parent)."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def check_space(folder: Path, needed: int, reserve: int, what: str) -> None:
    """Refuse before the first byte when ``needed`` more bytes would leave less than ``reserve`` free."""
    free = free_bytes(folder)
    if needed + reserve > free:
        raise NoSpace(f"{what} needs {_mib(needed)} more and {folder} has {_mib(free)} free"
                      + (f" (keeping {_mib(reserve)} free: server.pull_keep_free_bytes)" if reserve else ""))


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def place(partial: Path, final: Path) -> None:
    """Move a verified file into its name (atomic on one filesystem), readable as the stores' files are."""
    os.chmod(partial, 0o644)
    os.replace(partial, final)
