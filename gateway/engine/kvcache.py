"""Conversations that survive an unload: each slot's KV cache saved when the worker exits, and
restored when the same model loads again, before any request is admitted.

A saved slot is two files in the model's own directory under the cache root
(``<root>/<hash of the model file's path>/``):
- ``slot-N.state``: llama.cpp's own per-sequence state file (``llama_state_seq_save_file``,
  which holds the cached tokens too);
- ``slot-N.json``: what it belongs to: the model's ``identity`` (the file's path, size and
  modification time, the load settings that shape the cache, llama.cpp's version and build),
  the state file's size and digest, and the token count.

A state file is loaded only when its note matches this load's identity, size and digest;
anything else (another file at that path, other context settings, another llama.cpp, a
truncated or damaged file, a state llama.cpp refuses) is removed and counts as a miss, never
as a failure. The root is kept under ``max_bytes`` by removing the least recently used saved
slots of any model (``evict``, pure). Directories are made mode 0700 and files 0600: a cache
holds the text of conversations; a directory another user owns is not used
(``private_dir_problem``). A slot's note keeps its cache scope (``server.isolate_cache_by_key``),
which the restored slot gets back.

Only the worker imports this module (it calls llama.cpp through ``model.ll``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from . import ipc

# LoadParams fields that do not change what a slot's cache holds
_NOT_IDENTITY = {"name", "n_threads", "n_threads_batch", "n_batch", "n_ubatch", "stream_interval", "chat_template",
                 "kv_cache_dir", "kv_cache_max_bytes"}
_BLOCK = 1 << 20


@dataclasses.dataclass(frozen=True)
class Saved:
    """One saved slot on disk, as ``evict`` sees it."""

    path: Path  # the state file (its note beside it)
    size: int  # bytes of both files
    used: float  # last saved or restored (epoch seconds)


def evict(saved: list[Saved], max_bytes: int) -> list[Saved]:
    """Which saved slots to remove so that the rest fit in ``max_bytes``: the least recently
    used first."""
    total = sum(s.size for s in saved)
    out: list[Saved] = []
    for s in sorted(saved, key=lambda s: s.used):
        if total <= max_bytes:
            break
        out.append(s)
        total -= s.size
    return out


def identity(ll, params: ipc.LoadParams) -> str:
    """What a saved cache must have been made under to be loaded into this one."""
    st = os.stat(params.path)
    settings = {k: v for k, v in dataclasses.asdict(params).items() if k not in _NOT_IDENTITY}
    settings["path"] = os.path.realpath(params.path)
    what = {"settings": settings, "file": [st.st_size, st.st_mtime_ns],
            "llama_cpp": [getattr(ll, "__version__", "?"), ll.llama_print_system_info().decode("utf-8", "replace")]}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def model_dir(root: str | os.PathLike, path: str) -> Path:
    return Path(root) / hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:24]


def private_dir_problem(path: Path) -> str | None:
    """Why a cache directory is not this user's own to read conversations from and write them
    to, or None: one another user owns, or others may write into (they could plant a state file
    or read the saved ones), is not used. A directory of ours with a looser mode is narrowed."""
    st = path.stat()
    if not path.is_dir():
        return f"{path} is not a directory: no KV caches are kept there"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"{path} belongs to another user (uid {st.st_uid}): its KV caches are not used"
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return None


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (0600 whatever the umask)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an older file of looser mode keeps its mode through O_CREAT
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _digest(path: Path) -> str:
    h = hashlib.blake2b(digest_size=20)
    with path.open("rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def _remove(state: Path) -> None:
    for p in (state, state.with_suffix(".json")):
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def save(model, slots, root: str, max_bytes: int) -> tuple[int, int]:
    """Save every slot that holds a cache (and remove the saved files of slots that hold none);
    then keep the root under ``max_bytes``. (slots saved, tokens saved)."""
    ll, ctx = model.ll, model.ctx
    here = model_dir(root, model.params.path)
    Path(root).mkdir(mode=0o700, parents=True, exist_ok=True)
    here.mkdir(mode=0o700, exist_ok=True)
    for d in (Path(root), here):
        if (problem := private_dir_problem(d)) is not None:
            raise PermissionError(problem)
    ident = identity(ll, model.params)
    n_slots = n_tokens = 0
    for slot in slots:
        state = here / f"slot-{slot.id}.state"
        if not slot.cached:
            _remove(state)
            continue
        tmp = state.with_suffix(f".{os.getpid()}.tmp")
        tokens = (ll.llama_token * len(slot.cached))(*slot.cached)
        written = ll.llama_state_seq_save_file(ctx, str(tmp).encode(), slot.id, tokens, len(slot.cached))
        if not written:
            tmp.unlink(missing_ok=True)
            _remove(state)
            continue
        os.chmod(tmp, 0o600)  # llama.cpp writes it under the umask; it holds a conversation
        note = {"identity": ident, "bytes": tmp.stat().st_size, "digest": _digest(tmp), "tokens": len(slot.cached),
                "scope": slot.scope, "saved": time.time()}
        _write_private(state.with_suffix(".json"), json.dumps(note))
        os.replace(tmp, state)  # the note first: a state file without its note is never loaded
        n_slots, n_tokens = n_slots + 1, n_tokens + len(slot.cached)
    prune(Path(root), max_bytes)
    return n_slots, n_tokens


def prune(root: Path, max_bytes: int) -> None:
    saved = []
    for state in root.glob("*/slot-*.state"):
        try:
            note = state.with_suffix(".json").stat()
            st = state.stat()
        except FileNotFoundError:
            continue
        saved.append(Saved(state, st.st_size + note.st_size, max(st.st_mtime, note.st_mtime)))
    for s in evict(saved, max_bytes):
        _remove(s.path)


def restore(model, slots, root: str) -> tuple[int, int]:
    """Load each saved slot that belongs to this load into its slot; remove the rest.
    (slots restored, tokens restored)."""
    ll, ctx = model.ll, model.ctx
    here = model_dir(root, model.params.path)
    if not here.is_dir():
        return 0, 0
    for d in (Path(root), here):
        if (problem := private_dir_problem(d)) is not None:
            raise PermissionError(problem)
    ident = identity(ll, model.params)
    by_id = {slot.id: slot for slot in slots}
    n_slots = n_tokens = 0
    for state in sorted(here.glob("slot-*.state")):
        tokens = _load(ll, ctx, state, ident, by_id, model.n_ctx)
        if tokens is None:
            _remove(state)
            continue
        n_slots, n_tokens = n_slots + 1, n_tokens + tokens
        now = time.time()
        os.utime(state, (now, now))  # used: the last to be evicted
    for stray in here.glob("slot-*"):  # notes without a state file, temporary files of a save cut short
        if not stray.with_suffix(".state").exists() or stray.suffix == ".tmp":
            stray.unlink(missing_ok=True)
    return n_slots, n_tokens


def _load(ll, ctx, state: Path, ident: str, by_id: dict[int, Any], n_ctx: int) -> int | None:
    """The tokens restored from one saved slot, or None where it does not belong here."""
    try:
        slot = by_id.get(int(state.stem.split("-", 1)[1]))
        note = json.loads(state.with_suffix(".json").read_text())
        if slot is None or not isinstance(note, dict) or note.get("identity") != ident:
            return None
        if state.stat().st_size != note.get("bytes") or _digest(state) != note.get("digest"):
            return None  # cut short or damaged
    except (OSError, ValueError, IndexError):
        return None
    capacity = n_ctx
    tokens = (ll.llama_token * capacity)()
    count = ctypes.c_size_t(0)
    read = ll.llama_state_seq_load_file(ctx, str(state).encode(), slot.id, tokens, capacity, ctypes.byref(count))
    if not read or count.value == 0:
        ll.llama_memory_seq_rm(ll.llama_get_memory(ctx), slot.id, -1, -1)  # nothing half-loaded stays
        return None
    slot.cached = list(tokens[: count.value])
    scope = note.get("scope", "")
    slot.scope = scope if isinstance(scope, str) else ""
    return count.value
