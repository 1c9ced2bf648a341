"""The slots' KV caches saved on disk across an unload: each slot's saved when the worker exits
(``save``), and restored when the same model loads again, before any request is admitted
(``restore``); and the states the prompt cache keeps (``promptcache.PromptCache``; here
``kept-N.state``, in llama.cpp's sequence file layout, read back into the prompt cache at load),
each with its checkpoints (``kept-N.ckpt``, listed and digested in its note; a slot's in
``slot-N.ckpt``, with those taken by cutting it back as it is saved where every position was
kept).

A saved slot is two files (three with checkpoints) in the model's own directory under the cache
root (``<root>/<hash of the model file's path>/``, ``model_dir``):
- ``slot-N.state``: llama.cpp's own per-sequence state file (``llama_state_seq_save_file``,
  which holds the cached tokens too);
- ``slot-N.json``: what it belongs to: the model's ``identity`` (the file's path, size and
  modification time, the load settings that shape the cache, llama.cpp's version and build),
  the state file's size and digest, and the token count.

A state file is loaded only when its note matches this load's identity, size and digest;
anything else (another file at that path, other context settings, another llama.cpp, a
truncated or damaged file, a state llama.cpp refuses) is removed and counts as a miss, never
as a failure. The root is kept under ``max_bytes`` by removing the least recently used saved
slots of any model (``prune``, by ``promptcache.evict``, pure). Directories are made mode 0700
and files 0600: a cache holds the text of conversations; a directory another user owns is not
used (``private_dir_problem``). A slot's note keeps its cache scope
(``server.isolate_cache_by_key``), which the restored slot gets back.

Only the worker imports this module (it calls llama.cpp through ``model.ll``).
"""

from __future__ import annotations

import array
import ctypes
import dataclasses
import hashlib
import json
import os
import struct
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import protocol
from .checkpoints import Checkpoint
from .promptcache import TOKEN_BYTES, Entry, PromptCache, cut, evict

# LoadParams fields that do not change what a slot's cache holds
_NOT_IDENTITY = {"name", "n_threads", "n_threads_batch", "n_batch", "n_ubatch", "stream_interval", "chat_template",
                 "kv_cache_dir", "kv_cache_max_bytes", "prompt_cache_bytes",
                "cache_reuse", "ctx_checkpoints"}
_BLOCK = 1 << 20


@dataclasses.dataclass(frozen=True)
class Saved:
    """One saved slot on disk, as ``evict`` sees it."""

    path: Path  # the state file (its note beside it)
    size: int  # bytes of both files
    used: float  # last saved or restored (epoch seconds)


def identity(ll, params: protocol.LoadParams) -> str:
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
    for p in (state, state.with_suffix(".json"), state.with_suffix(".ckpt")):
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def save(model, slots, root: str, max_bytes: int, kept: list[Entry] | tuple[()] = (),
         behind: Callable[[Any], list[Checkpoint]] | None = None) -> tuple[int, int]:
    """Save every slot that holds a cache (and remove the saved files of slots that hold none),
    with its checkpoints and those ``behind`` takes once its state is written (it may cut the
    slot: this is the worker's exit), and the states the prompt cache keeps (``kept``, in place
    of those saved before); then keep the root under ``max_bytes``. (slots saved, tokens saved)."""
    ll, ctx = model.ll, model.ctx
    here = model_dir(root, model.params.path)
    Path(root).mkdir(mode=0o700, parents=True, exist_ok=True)
    here.mkdir(mode=0o700, exist_ok=True)
    for d in (Path(root), here):
        if (problem := private_dir_problem(d)) is not None:
            raise PermissionError(problem)
    ident = identity(ll, model.params)
    window = model.n_swa  # only the window is written: cut where the prompt ended
    n_slots = n_tokens = 0
    for slot in slots:
        if window:
            cut(ll, model.mem, slot, slot.prompt_end)
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
        n = len(slot.cached)
        cps = sorted({c.n_tokens: c for c in [*slot.checkpoints, *(behind(slot) if behind else [])]}.items())
        extra = _write_checkpoints(state.with_suffix(".ckpt"), [c for _, c in cps])
        _commit(tmp, state, ident, n, slot.scope, extra=extra)
        n_slots, n_tokens = n_slots + 1, n_tokens + n
    for old in here.glob("kept-*"):
        old.unlink(missing_ok=True)
    for i, entry in enumerate(sorted(kept, key=lambda e: e.used)):
        state = here / f"kept-{i}.state"
        tmp = state.with_suffix(f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:  # llama_state_seq_save_file's layout: it could load this file too
            f.write(_SEQ_HEADER.pack(ll.LLAMA_STATE_SEQ_MAGIC, ll.LLAMA_STATE_SEQ_VERSION, len(entry.tokens)))
            f.write(array.array("i", entry.tokens).tobytes())
            f.write(entry.data)
        extra = _write_checkpoints(state.with_suffix(".ckpt"), entry.checkpoints)
        # dated by its last use: older than the slots' own, so a tight bound removes it first
        _commit(tmp, state, ident, len(entry.tokens), entry.scope, time.time() - (time.monotonic() - entry.used), extra)
    prune(Path(root), max_bytes)
    return n_slots, n_tokens


_SEQ_HEADER = struct.Struct("=III")  # llama.cpp's sequence state file: magic, version, token count (native order)


def _commit(tmp: Path, state: Path, ident: str, n_tokens: int, scope: str, used: float | None = None,
            extra: dict[str, Any] | None = None) -> None:
    """A state file written in full at ``tmp`` becomes ``state``, with its note beside it; both
    dated ``used`` (epoch seconds: the least recently used are removed first), or now."""
    when = time.time() if used is None else used
    note = {"identity": ident, "bytes": tmp.stat().st_size, "digest": _digest(tmp), "tokens": n_tokens,
            "scope": scope, "saved": when, **(extra or {})}
    _write_private(state.with_suffix(".json"), json.dumps(note))
    os.replace(tmp, state)  # the note first: a state file without its note is never loaded
    if used is not None:
        for p in (state, state.with_suffix(".json"), state.with_suffix(".ckpt")):
            if p.exists():
                os.utime(p, (when, when))


def _write_checkpoints(path: Path, cps: list[Checkpoint]) -> dict[str, Any]:
    """A saved state's checkpoints, one after another in ``path`` (0600); what its note says of
    them (each one's token count and size, and the file's digest); {} where there are none."""
    path.unlink(missing_ok=True)
    if not cps:
        return {}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        for cp in cps:
            f.write(cp.data)
    return {"checkpoints": [[cp.n_tokens, cp.size] for cp in cps], "checkpoints_digest": _digest(path)}


def _read_checkpoints(state: Path, note: dict[str, Any], n_ctx: int) -> list[Checkpoint]:
    """The checkpoints saved with a state, where they are whole (none otherwise: the state
    still serves a prompt that goes on from its end)."""
    listed, path = note.get("checkpoints"), state.with_suffix(".ckpt")
    try:
        if not isinstance(listed, list) or not path.exists() or _digest(path) != note.get("checkpoints_digest"):
            return []
        data = path.read_bytes()
        out, at = [], 0
        for n_tokens, size in listed:
            if not (isinstance(n_tokens, int) and isinstance(size, int) and 0 < n_tokens <= n_ctx and size > 0):
                return []
            piece = bytearray(data[at:at + size])
            out.append(Checkpoint(n_tokens, piece, zlib.crc32(piece)))
            at += size
        return out if at == len(data) else []
    except (OSError, ValueError, TypeError):
        return []


def prune(root: Path, max_bytes: int) -> None:
    saved = []
    for state in root.glob("*/*.state"):
        try:
            note = state.with_suffix(".json").stat()
            st = state.stat()
        except FileNotFoundError:
            continue
        ckpt = state.with_suffix(".ckpt")
        extra = ckpt.stat().st_size if ckpt.exists() else 0
        saved.append(Saved(state, st.st_size + note.st_size + extra, max(st.st_mtime, note.st_mtime)))
    for s in evict(saved, max_bytes):
        _remove(s.path)


def restore(model, slots, root: str, cache: PromptCache | None = None) -> tuple[int, int]:
    """Load each saved slot that belongs to this load into its slot, and each saved kept state
    into ``cache`` (where it fits, the most recent first; its first use reports "disk"); remove
    the rest. (slots restored, tokens restored into them)."""
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
    for state in sorted(here.glob("kept-*.state"), key=lambda p: -p.stat().st_mtime):
        if cache is None or not _keep(ll, state, ident, cache, model.n_ctx):
            _remove(state)
    for stray in [*here.glob("slot-*"), *here.glob("kept-*")]:  # notes without a state file, saves cut short
        if not stray.with_suffix(".state").exists() or stray.suffix == ".tmp":
            stray.unlink(missing_ok=True)
    return n_slots, n_tokens


def _note(state: Path, ident: str) -> dict[str, Any] | None:
    """A saved state's note, where the state belongs to this load and is whole."""
    try:
        note = json.loads(state.with_suffix(".json").read_text())
        if not isinstance(note, dict) or note.get("identity") != ident:
            return None
        if state.stat().st_size != note.get("bytes") or _digest(state) != note.get("digest"):
            return None  # cut short or damaged
    except (OSError, ValueError):
        return None
    return note


def _keep(ll, state: Path, ident: str, cache: PromptCache, n_ctx: int) -> bool:
    """Read one saved kept state into ``cache``; whether it belongs here and fits. (llama.cpp
    checks the state itself when it is loaded into a slot.)"""
    note = _note(state, ident)
    if note is None or cache.held + note["bytes"] - _SEQ_HEADER.size > cache.max_bytes:
        return False  # read the most recent first: an older one that does not fit is left out
    data = bytearray(state.read_bytes())
    if len(data) < _SEQ_HEADER.size:
        return False
    magic, version, n = _SEQ_HEADER.unpack_from(data)
    start = _SEQ_HEADER.size + TOKEN_BYTES * n
    if (magic, version) != (ll.LLAMA_STATE_SEQ_MAGIC, ll.LLAMA_STATE_SEQ_VERSION) or not 0 < n <= n_ctx \
            or len(data) <= start:
        return False
    tokens = array.array("i", data[_SEQ_HEADER.size:start]).tolist()
    del data[:start]
    scope, saved = note.get("scope", ""), note.get("saved")
    age = time.time() - saved if isinstance(saved, (int, float)) else 0.0  # the least recently used stays so
    cps = [c for c in _read_checkpoints(state, note, n_ctx) if c.n_tokens <= len(tokens)]
    if cache.held + len(data) + TOKEN_BYTES * len(tokens) + sum(c.size for c in cps) > cache.max_bytes:
        cps = []  # the state without them, where they would not fit
    cache.entries.append(Entry(tokens, scope if isinstance(scope, str) else "", data, zlib.crc32(data),
                               time.monotonic() - age, "disk", cps))
    return True


def _load(ll, ctx, state: Path, ident: str, by_id: dict[int, Any], n_ctx: int) -> int | None:
    """The tokens restored from one saved slot, or None where it does not belong here."""
    try:
        slot = by_id.get(int(state.stem.split("-", 1)[1]))
    except (ValueError, IndexError):
        return None
    note = _note(state, ident)
    if slot is None or note is None:
        return None
    capacity = n_ctx
    tokens = (ll.llama_token * capacity)()
    count = ctypes.c_size_t(0)
    read = ll.llama_state_seq_load_file(ctx, str(state).encode(), slot.id, tokens, capacity, ctypes.byref(count))
    if not read or count.value == 0:
        ll.llama_memory_seq_rm(ll.llama_get_memory(ctx), slot.id, -1, -1)  # nothing half-loaded stays
        return None
    slot.cached = list(tokens[: count.value])
    slot.checkpoints = [c for c in _read_checkpoints(state, note, n_ctx) if c.n_tokens <= count.value]
    slot.origin, slot.prompt_end = "disk", count.value
    scope = note.get("scope", "")
    slot.scope = scope if isinstance(scope, str) else ""
    return count.value
