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

``fetch`` writes a file only with a known size, which bounds it, and a digest to check it by:
the SHA-256 a hub or registry declares, or, for a Hugging Face file kept in git rather than LFS
(the hub declares no SHA-256 for those), its git blob id. A file missing either is refused
(``Unverifiable``) before a connection is made. It writes to ``partial`` (never the final name,
so discovery never sees half a file), resuming from what ``partial`` already holds with an HTTP
``Range`` (after a dropped connection, within ``RETRIES`` attempts; after a cancel or a
restart, at the next pull). Every byte is hashed as it is written, on a thread beside the
reader (and the kept bytes first, on a resume); the size and the digest are checked at the
end, and a mismatch deletes ``partial``. Only then does the caller move it into place.

Free space is claimed (``space``): a file's bytes are counted against the pull's ``Claim`` as
they are written, and the claim is checked at each chunk.

Every read ends (``stop``): a pull's cancel is a ``Stop``, which shuts down the sockets the pull
is blocked on at once (a read of the shared client, through ``stop.watch_client``; a file's
connection, through ``stop.held_connections``), and each step has an overall deadline besides the
per-read timeout (a listing or manifest ``SMALL_DEADLINE``, a file's answer
``HEADERS_DEADLINE``, a file's bytes at least ``MIN_WINDOW_BYTES`` every ``READ_TIMEOUT``), so a
server that trickles holds a pull no longer than a server that is silent. A network failure
is told as where it failed, never with the socket's own text (which tells an open port from a
closed one); that goes to the log.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import queue
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..base.addresses import forbidden_text
from .errors import (  # noqa: F401 (the errors are named transfer.X where a pull is carried out)
    MAX_MESSAGE,
    Ambiguous,
    BadPullName,
    Cancelled,
    Corrupt,
    Gated,
    NoSpace,
    NoStore,
    NotFound,
    Offline,
    PullError,
    Refused,
    TimedOut,
    Unreachable,
    Unverifiable,
    some,
)
from .space import SPACE, Claim  # noqa: F401
from .stop import HttpHandler, HttpsHandler, Stop, bounded, current_stop, held_connections, stopping, watch_client

log = logging.getLogger(__name__)

CHUNK = 1 << 20  # read and hash a MiB at a time: the unit of progress and of a cancel's delay
QUEUED = 16  # chunks read ahead of the writer
MAX_REDIRECTS = 5
RETRIES = 5  # reconnections within one fetch while bytes keep coming
CONNECT_TIMEOUT = 10.0  # an unreachable hub or no network fails within this, never hangs
READ_TIMEOUT = 60.0  # a stalled connection is dropped and resumed after this
MAX_SMALL_BYTES = 1 << 20  # a manifest, a listing or an error body is read within this
SMALL_DEADLINE = 120.0  # a manifest, a listing or a file's metadata arrives whole within this
HEADERS_DEADLINE = 60.0  # a file's answer (its status and headers) arrives within this
MIN_WINDOW_BYTES = 64 << 10  # a file's bytes: at least this much every READ_TIMEOUT, else a stall


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
    redirect check, a bound on hops, a connect timeout, reads a pull's cancel and deadline end
    (``stop.watch_client``). Idempotent."""
    global _installed
    with _INSTALLED:
        if _installed:
            return
        import httpx2
        from huggingface_hub import set_client_factory
        from huggingface_hub.utils import disable_progress_bars
        from huggingface_hub.utils._http import hf_request_event_hook

        def factory() -> httpx2.Client:
            client = httpx2.Client(event_hooks={"request": [hf_request_event_hook, _check_request]},
                                   follow_redirects=True, max_redirects=MAX_REDIRECTS,
                                   timeout=httpx2.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT))
            watch_client(client)
            return client

        set_client_factory(factory)
        disable_progress_bars()  # progress is the gateway's own
        _installed = True


def session():  # noqa: ANN201 (httpx2.Client)
    install_client()
    from huggingface_hub import get_session

    return get_session()


def network_error(exc: BaseException, where: str) -> PullError:
    """A transport failure as the caller is told it: where, never the socket's own words (they
    tell an open port from a closed one); those go to the log."""
    import httpx2

    if isinstance(exc, PullError):
        return exc
    cause: BaseException | None = exc
    while cause is not None:  # httpx2 wraps the hook's own refusal, and a stop's
        if isinstance(cause, PullError):
            return cause
        cause = cause.__cause__ or cause.__context__
    if (stop := current_stop()) is not None:
        try:
            stop.check()
        except PullError as stopped:
            return stopped
    if isinstance(exc, httpx2.TooManyRedirects):
        return Refused(f"{where}: more than {MAX_REDIRECTS} redirects")
    log.info("cannot reach %s: %s", where, str(exc) or type(exc).__name__)
    return Unreachable(f"cannot reach {where}")


def read_small(url: str, headers: dict[str, str], what: str, *, limit: int = MAX_SMALL_BYTES) -> tuple[int, bytes]:
    """The status and body of a GET, the body read within ``limit`` bytes (a manifest, a
    listing, an error): more is refused. All of it within ``SMALL_DEADLINE``, ended by a cancel."""
    import httpx2

    with bounded(what, SMALL_DEADLINE) as stop:
        try:
            with session().stream("GET", url, headers=headers) as resp:
                body = bytearray()
                for chunk in resp.iter_bytes(1 << 16):
                    stop.check()
                    body += chunk
                    if len(body) > limit:
                        raise Corrupt(f"{what}: more than {limit} bytes")
                return resp.status_code, bytes(body)
        except httpx2.HTTPError as exc:
            raise network_error(exc, what) from None


class Hashing:
    """A partial file opened for appending, hashing what it holds and what is written: SHA-256,
    or git's blob id (``git_size``: the size git's header states). ``on_write`` is told each
    change in the bytes it holds (a restart: less)."""

    def __init__(self, path: Path, *, git_size: int | None = None,
                 on_write: Callable[[int], None] | None = None):
        self.git_size = git_size
        self.on_write = on_write or (lambda n: None)
        self.digest = self._new()
        self.file = open(path, "ab+")  # noqa: SIM115 (closed by close())
        self.file.seek(0)
        while block := self.file.read(CHUNK):
            self.digest.update(block)
        self.size = self.file.tell()

    def _new(self) -> Any:
        if self.git_size is None:
            return hashlib.sha256()
        digest = hashlib.sha1(usedforsecurity=False)
        digest.update(b"blob %d\0" % self.git_size)
        return digest

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.digest.update(data)
        self.size += len(data)
        self.on_write(len(data))

    def restart(self) -> None:
        """Drop what is held: the server sent the whole file again rather than the range."""
        self.file.seek(0)
        self.file.truncate()
        self.digest = self._new()
        self.on_write(-self.size)
        self.size = 0

    def close(self) -> None:
        self.file.close()


@dataclass(frozen=True)
class Want:
    """One file to fetch: where from, into which partial file, and what it must be."""

    url: str
    partial: Path
    size: int | None  # None: the source declares none, and the file is refused (``unverifiable``)
    sha256: str | None  # hex; None where the source declares none (then ``git_sha1`` is the digest, or none)
    name: str  # as shown in progress and errors
    headers: tuple[tuple[str, str], ...] = ()
    origin: Origin | None = None  # where the pull started: what the URL and its redirects may reach
    git_sha1: str | None = None  # hex: git's blob id, a Hugging Face file kept in git (no SHA-256 declared)


def unverifiable(want: Want) -> str | None:
    """Why ``want`` may not be written, or None: a file is written only with a size that bounds
    it and a digest to check it by (pure)."""
    if want.size is None:
        return f"{want.name}: the hub declares no size for it, so nothing bounds it: not fetched"
    if want.sha256 is None and want.git_sha1 is None:
        return f"{want.name}: the hub declares no digest for it, so nothing could check it: not fetched"
    return None


Progress = Callable[[int], None]  # bytes the partial file now holds


class Stalled(OSError):
    """A file's bytes came slower than ``MIN_WINDOW_BYTES`` a ``READ_TIMEOUT``: a lost try."""


def fetch(want: Want, progress: Progress, cancelled: threading.Event, claim: Claim | None = None) -> None:
    """Fetch ``want`` into ``want.partial``, checked: see the module's docstring. ``claim``, the
    pull's claim on the disk, is told each byte written and checked as bytes arrive. Raises a
    ``PullError``; on ``Corrupt`` the partial file is gone, on anything else it is kept to
    resume from."""
    if why := unverifiable(want):
        raise Unverifiable(why)
    assert want.size is not None
    git = want.sha256 is None
    out = Hashing(want.partial, git_size=want.size if git else None,
                  on_write=claim.wrote if claim is not None else None)
    try:
        with stopping(cancelled) as stop:
            _fetch(want, out, progress, stop, claim)
        if out.size != want.size:
            raise Corrupt(f"{want.name}: {out.size} bytes received, {want.size} declared")
        got = out.digest.hexdigest()
        if not git and got != (want.sha256 or "").lower():
            raise Corrupt(f"{want.name}: SHA-256 {got} is not the declared {(want.sha256 or '').lower()}")
        if git and got != (want.git_sha1 or "").lower():
            raise Corrupt(f"{want.name}: git blob id {got} is not the declared {(want.git_sha1 or '').lower()}")
    except Corrupt:
        out.close()
        want.partial.unlink(missing_ok=True)
        raise
    finally:
        out.close()


def _fetch(want: Want, out: Hashing, progress: Progress, stop: Stop, claim: Claim | None) -> None:
    assert want.size is not None
    progress(out.size)
    tries = 0
    while True:
        stop.check()
        before = out.size
        try:
            _get(want, out, progress, stop, claim)
            if out.size >= want.size:
                return
            lost: Exception = ConnectionError("the body ended early")
        except (OSError, http.client.HTTPException) as exc:  # URLError, a reset, a timeout, a cut body
            stop.check()  # a read a cancel ended is a cancel
            if isinstance(exc, urllib.error.HTTPError):
                raise Unreachable(f"{want.name}: HTTP {exc.code} from {urlsplit(exc.url).hostname}") from None
            if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, PullError):
                raise exc.reason from None
            lost = exc
        stop.check()
        # a stall counts as a try however many bytes it brought: a trickle is no progress
        tries = tries + 1 if out.size == before or isinstance(lost, Stalled) else 1
        connect = isinstance(lost, urllib.error.URLError)
        if tries > RETRIES or (connect and tries > 2):
            log.info("%s: giving up after %d tries: %s", want.name, tries, lost)
            raise Unreachable(f"cannot reach {urlsplit(want.url).hostname} for {want.name}") from None
        log.info("%s: connection lost at %d bytes, resuming (%s)", want.name, out.size, lost)
        if stop.wait(min(0.2 * 2 ** tries, 2.0)):
            stop.check()


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


def _get(want: Want, out: Hashing, progress: Progress, stop: Stop, claim: Claim | None) -> None:
    """One GET from where ``out`` stands, until its body ends or breaks. The standard library's
    client (far less work a byte than an asyncio-free httpx2 stream), reading into a writer
    thread that hashes and writes while the next bytes arrive. Its sockets are ``stop``'s to
    shut down; its answer comes within ``HEADERS_DEADLINE``."""
    asked = out.size
    headers = {"User-Agent": "gguf-gateway", "Accept-Encoding": "identity", **dict(want.headers)}
    if asked:
        headers["Range"] = f"bytes={asked}-"
    if want.origin is not None and (why := problem(want.url, want.origin)):
        raise Refused(why)
    opener = urllib.request.build_opener(_Redirects(want.origin), HttpHandler, HttpsHandler)
    with held_connections(stop):
        try:
            with stop.deadline(HEADERS_DEADLINE, f"{want.name}: the answer of {urlsplit(want.url).hostname}"):
                resp = opener.open(urllib.request.Request(want.url, headers=headers), timeout=READ_TIMEOUT)
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 416:
                if asked >= (want.size or 0):
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
            elif asked and status == 206 and not str(resp.headers.get("Content-Range", "")).startswith(
                    f"bytes {asked}-"):
                got = resp.headers.get("Content-Range")
                raise Corrupt(f"{want.name}: asked for bytes from {asked}, got {got!r}")
            _copy(resp, out, want, progress, stop, claim)


def _copy(resp, out: Hashing, want: Want, progress: Progress, stop: Stop, claim: Claim | None) -> None:  # noqa: ANN001
    """The body into ``out``: read here, hashed and written on a second thread (both leave the
    GIL for the bytes), ``CHUNK`` at a time, at most ``QUEUED`` chunks apart. At least
    ``MIN_WINDOW_BYTES`` must come every ``READ_TIMEOUT`` (else ``Stalled``), and the disk's
    claim is checked at each chunk."""
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
    window, in_window = time.monotonic(), 0
    try:
        while chunk := resp.read1(CHUNK):  # what has come, up to CHUNK: progress on a slow link too
            stop.check()
            if failed:
                break
            got += len(chunk)
            if want.size is not None and got > want.size:
                raise Corrupt(f"{want.name}: more than the declared {want.size} bytes")
            if claim is not None:
                claim.check()
            chunks.put(chunk)
            progress(got)
            in_window += len(chunk)
            if (now := time.monotonic()) - window >= READ_TIMEOUT:
                if in_window < MIN_WINDOW_BYTES:
                    raise Stalled(f"{in_window} bytes in {now - window:.0f} s")
                window, in_window = now, 0
    finally:
        chunks.put(None)
        writer.join()
    stop.check()  # a body a cancel cut short is a cancel
    if failed:
        raise PullError(f"{want.name}: cannot write {want.partial}: {failed[0]}")

def place(partial: Path, final: Path) -> None:
    """Move a verified file into its name (atomic on one filesystem), readable as the stores' files are."""
    os.chmod(partial, 0o644)
    os.replace(partial, final)
