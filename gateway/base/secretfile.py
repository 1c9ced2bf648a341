"""A secret the gateway keeps across restarts: random bytes in a file of its state folder, made
on first use, readable by this user alone (the folder 0700, the file 0600 whatever the umask).

``KeptSecret.get`` reads it, or makes it where there is none: written whole to a file of its
own and linked into place, so two gateways starting at once never read a half-written one and
agree on the first. A folder or file another user owns is not trusted; ours of a looser mode
is narrowed (0700, 0600) and used. Where the folder cannot hold it (a
read-only home, another user's folder), the secret is this process's own, and what it signed
stops opening at the next start: said once in the log, never a failure of a request.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from pathlib import Path

log = logging.getLogger(__name__)

SIZE = 32  # bytes: HMAC-SHA256's own key size


class KeptSecret:
    def __init__(self, path: Path):
        self.path = path
        self._value: bytes | None = None
        self._lock = threading.Lock()

    def get(self) -> bytes:
        """The secret: the file's, made first where there is none (see the module)."""
        with self._lock:
            if self._value is None:
                try:
                    self._value = load_or_make(self.path)
                except (OSError, ValueError) as e:
                    log.warning("cannot keep a secret at %s (%s): using one for this run alone; what it signed "
                                "will not be accepted after a restart", self.path, e)
                    self._value = secrets.token_bytes(SIZE)
            return self._value


def load_or_make(path: Path) -> bytes:
    """The secret in ``path``, made first where there is none; raises ``OSError`` or
    ``ValueError`` (a file that is not this user's own, or not a secret of ours)."""
    _private_dir(path.parent)
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, secrets.token_hex(SIZE).encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # fails where another process made it first: its secret is the one
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return _read(path)


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise ValueError(f"{path} belongs to another user (uid {st.st_uid})")
    if st.st_mode & 0o077:  # ours, but looser than it should be (as the KV cache's folder is narrowed)
        os.chmod(path, 0o700)


def _read(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        st = os.fstat(fd)
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise ValueError(f"{path} belongs to another user (uid {st.st_uid})")
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o600)
        text = os.read(fd, 4 * SIZE).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    try:
        value = bytes.fromhex(text)
    except ValueError:
        value = b""
    if len(value) != SIZE:
        raise ValueError(f"{path} does not hold a secret of {SIZE} bytes in hex")
    return value
