"""Pulling from the Hugging Face hub into its own cache, in the layout ``huggingface_hub`` writes.

``plan`` reads the repo's listing (``/api/models/REPO/revision/REV?blobs=true``, within a bound,
through the bounded JSON parser), picks the files the name means (``choose``: the quantization,
every split part, the projector), and asks the hub for each file's metadata with
``huggingface_hub.get_hf_file_metadata`` (the commit, the etag, which for a file in LFS is its
SHA-256, the size, the CDN location). Files land where ``hf_hub_download`` puts them:
``models--ORG--REPO/blobs/ETAG``, fetched through ``blobs/ETAG.incomplete`` under the lock
``.locks/models--ORG--REPO/ETAG.lock`` that ``huggingface_hub`` takes too, then linked from
``snapshots/COMMIT/PATH``, and ``refs/main`` names the commit. ``HF_ENDPOINT``, ``HF_TOKEN``
(through ``build_hf_headers``) and ``HF_HUB_OFFLINE`` mean what they mean to every Hugging Face
tool. Unlike ``hf_hub_download``, a pull keeps its partial file when cut short, so the next one
resumes (``transfer``), and checks every file before it takes its name: an LFS file by its
SHA-256, a file kept in git (the hub declares no SHA-256 for those) by its git blob id, which the
listing gives as ``blobId`` and the hub as its ``ETag``. A file whose size or digest neither the
listing nor the hub's answer declares is refused (``transfer.Unverifiable``) before a byte is
fetched. The listing and each file's metadata are read within ``transfer.SMALL_DEADLINE``, and a
message naming the repo's files names a few and counts the rest (``transfer.some``).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from urllib.parse import quote, urlsplit

from ..base import strictjson
from ..models.ggufmeta import SPLIT_RE
from . import choose, transfer
from .names import HFName
from .plan import Blob, Plan

MAX_LISTING_BYTES = 16 << 20  # a repo's listing with file metadata; the largest real ones are far smaller
MAX_LISTED_FILES = 100_000
SHA256 = re.compile(r"[0-9a-f]{64}")
GIT_SHA1 = re.compile(r"[0-9a-f]{40}")
COMMIT = re.compile(r"[0-9a-f]{40}")
_TRUE = {"1", "on", "yes", "true"}
DEFAULT_ENDPOINT = "https://huggingface.co"


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def _headers() -> dict[str, str]:
    from huggingface_hub.utils import build_hf_headers

    return dict(build_hf_headers(library_name="gguf-gateway"))


def listing(repo: str, revision: str = "main") -> tuple[str, list[choose.RepoFile]]:
    """The commit ``revision`` names and the repo's files there (blocking)."""
    url = f"{endpoint()}/api/models/{repo}/revision/{quote(revision, safe='')}?blobs=true"
    status, body = transfer.read_small(url, _headers(), f"{repo} on {endpoint()}", limit=MAX_LISTING_BYTES)
    if status in (401, 404):
        raise transfer.NotFound(f"no model {repo!r} on {endpoint()} (or it is private: set HF_TOKEN)")
    if status == 403:
        raise transfer.Gated(f"{repo} is gated on {endpoint()}: accept its terms on the hub and set HF_TOKEN")
    if status != 200:
        raise transfer.Unreachable(f"{endpoint()} answered HTTP {status} for {repo}")
    try:
        data = strictjson.loads(body, "the hub's listing")
    except ValueError as exc:
        raise transfer.Corrupt(f"{repo}: the hub's listing is not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("siblings"), list):
        raise transfer.Corrupt(f"{repo}: the hub's listing has no files")
    commit = data.get("sha")
    if not isinstance(commit, str) or not COMMIT.fullmatch(commit):
        raise transfer.Corrupt(f"{repo}: the hub's listing names no commit")
    siblings = data["siblings"]
    if len(siblings) > MAX_LISTED_FILES:
        raise transfer.Corrupt(f"{repo}: more than {MAX_LISTED_FILES} files listed")
    files = []
    for s in siblings:
        if not isinstance(s, dict) or not isinstance(s.get("rfilename"), str):
            continue
        lfs: dict = s["lfs"] if isinstance(s.get("lfs"), dict) else {}
        sha = lfs["sha256"] if isinstance(lfs.get("sha256"), str) and SHA256.fullmatch(lfs["sha256"]) else None
        size = lfs.get("size", s.get("size"))
        blob_id = s.get("blobId") if not lfs and isinstance(s.get("blobId"), str) else None
        git = blob_id if blob_id is not None and GIT_SHA1.fullmatch(blob_id) else None
        files.append(choose.RepoFile(s["rfilename"], size if type(size) is int and size >= 0 else None, sha, git))
    return commit, files


def pick(name: HFName, files: list[choose.RepoFile]) -> choose.Choice:
    try:
        return choose.choose(files, name.quant, name.file)
    except choose.Ambiguous as exc:
        raise transfer.Ambiguous(f"{name.canonical} matches several models: {transfer.some(exc.choices)}; "
                                 "name one by its quantization or file") from None
    except choose.NoMatch as exc:
        offer = f"; it has: {transfer.some(exc.choices)}" if exc.choices else "; it has no GGUF file"
        raise transfer.NotFound(f"no file of {name.repo} matches {name.canonical}{offer}") from None
    except (choose.Incomplete, ValueError) as exc:
        raise transfer.NotFound(f"{name.canonical}: {exc}") from None


def storage(cache: Path, repo: str) -> Path:
    return cache / ("models--" + repo.replace("/", "--"))


def plan(name: HFName, cache: Path) -> Plan:
    """What pulling ``name`` into the hub cache ``cache`` writes (blocking: network)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    if offline():
        raise transfer.Offline("HF_HUB_OFFLINE is set: not asking the hub")
    base, headers = endpoint(), _headers()
    origin = transfer.Origin.of(base, insecure=base.startswith("http://"))
    with transfer.within(origin):
        commit, files = listing(name.repo)
        choice = pick(name, files)
        folder = storage(cache, name.repo)
        blobs, links = [], []
        wanted = [*choice.files, *([choice.projector] if choice.projector else [])]
        for f in wanted:
            url = hf_hub_url(name.repo, f.path, revision=commit, endpoint=base)
            try:
                with transfer.bounded(f"{f.path} on {base}", transfer.SMALL_DEADLINE):
                    meta = get_hf_file_metadata(url, headers=headers, endpoint=base)
            except Exception as exc:  # noqa: BLE001 (huggingface_hub's errors: mapped by status below)
                raise _metadata_error(exc, f.path) from None
            etag = (meta.etag or "").strip('"').removeprefix("W/").strip('"')
            if not etag or "/" in etag or etag in (".", ".."):
                raise transfer.Corrupt(f"{f.path}: the hub gave no usable etag")
            sha = f.sha256 or (etag if SHA256.fullmatch(etag) else None)
            if f.sha256 and SHA256.fullmatch(etag) and etag != f.sha256:
                raise transfer.Corrupt(f"{f.path}: the hub's etag {etag} is not the listed SHA-256 {f.sha256}")
            # a file kept in git: its blob id, where the listing and the hub's etag agree on one
            git = None if sha else f.git_sha1 or (etag if GIT_SHA1.fullmatch(etag) else None)
            if git and GIT_SHA1.fullmatch(etag) and etag != git:
                raise transfer.Corrupt(f"{f.path}: the hub's etag {etag} is not the listed blob id {git}")
            size = meta.size if meta.size is not None else f.size
            if f.size is not None and meta.size is not None and f.size != meta.size:
                raise transfer.Corrupt(f"{f.path}: the hub says {meta.size} bytes and its listing {f.size}")
            blob = folder / "blobs" / etag
            # the hub's key goes to the hub alone, never to the CDN its answer points at
            sent = headers if urlsplit(meta.location).netloc == urlsplit(url).netloc else {}
            want = transfer.Want(meta.location, blob.with_name(etag + ".incomplete"), size, sha,
                                 f"{name.repo}/{f.path}", tuple(sent.items()), origin, git)
            if why := transfer.unverifiable(want):
                raise transfer.Unverifiable(why)
            blobs.append(Blob(want, blob, cache / ".locks" / folder.name / f"{etag}.lock", f"sha256:{sha or etag}"))
            links.append((blob, folder / "snapshots" / commit / f.path))

    def finish() -> list[Path]:
        from huggingface_hub.file_download import _create_symlink

        (folder / "refs").mkdir(parents=True, exist_ok=True)
        ref = folder / "refs" / "main"
        tmp = ref.with_name(f"main.{os.getpid()}.tmp")
        tmp.write_text(commit)
        os.replace(tmp, ref)
        # the first part last: discovery lists a split model by its first part, a model with its projector
        for blob, link in reversed(links):
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                _create_symlink(str(blob), str(link), new_blob=True)
        return [link for _, link in links[: len(choice.files)]]

    return Plan(name.canonical, "huggingface", cache, tuple(blobs), finish)


def _metadata_error(exc: Exception, path: str) -> transfer.PullError:
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status in (401, 404):
        return transfer.NotFound(f"{path}: not found on {endpoint()}")
    if type(exc).__name__ == "OfflineModeIsEnabled":
        return transfer.Offline("HF_HUB_OFFLINE is set: not asking the hub")
    return transfer.network_error(exc, f"{path} on {endpoint()}")


def remove(paths: list[Path], cache: Path) -> list[Path]:
    """Remove a pulled model's snapshot links (each split part), their blobs where no other
    snapshot links to them, and the projector beside it when no model is left in its folder;
    a repo left with no files goes whole. Returns what was removed."""
    gone: list[Path] = []
    for link in paths:
        repo = _repo_folder(link, cache)
        if repo is None:
            raise transfer.PullError(f"{link} is not in the Hugging Face cache {cache}")
        gone += _unlink(link, repo)
        folder = link.parent
        if folder.is_dir() and not any(p.suffix == ".gguf" and "mmproj" not in p.name.lower()
                                       for p in folder.iterdir()):
            for p in list(folder.iterdir()):
                if p.suffix == ".gguf":
                    gone += _unlink(p, repo)
        snapshots = repo / "snapshots"
        if not any(p.is_file() for p in snapshots.rglob("*")):
            shutil.rmtree(repo, ignore_errors=True)
            shutil.rmtree(cache / ".locks" / repo.name, ignore_errors=True)
            gone.append(repo)
    return gone


def _repo_folder(path: Path, cache: Path) -> Path | None:
    try:
        rel = path.relative_to(cache)
    except ValueError:
        return None
    return cache / rel.parts[0] if len(rel.parts) > 3 and rel.parts[1] == "snapshots" else None


def parts_of(path: Path) -> list[Path]:
    """A model file and, where it is the first part of a split model, its other parts (those there are)."""
    m = SPLIT_RE.match(path.name)
    if not m:
        return [path]
    count = int(m.group("count"))
    return [path.with_name(f"{m.group('stem')}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def _unlink(link: Path, repo: Path) -> list[Path]:
    gone = []
    for part in parts_of(link):
        if not part.is_symlink() and not part.exists():
            continue
        blob = Path(os.path.realpath(part))
        part.unlink()
        gone.append(part)
        others = [p for p in (repo / "snapshots").rglob("*") if p.is_symlink() and os.path.realpath(p) == str(blob)]
        if not others and blob.is_relative_to(os.path.realpath(repo / "blobs")):
            blob.unlink(missing_ok=True)
    return gone
