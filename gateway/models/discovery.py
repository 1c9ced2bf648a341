"""Find the GGUF models a workstation already has, and the names they answer to.

Roots are ``server.models_dirs`` plus, unless ``server.discover_default_stores`` is false,
the stores people already have: ``~/models``, llama.cpp's cache, the Hugging Face hub
cache, LM Studio's folders and Ollama's store (whose manifests map ``name:tag`` to blobs).

Every file's header is read (``ggufmeta``; cached by path, size and mtime), files that are
not models (projectors, adapters, vocab-only files) are skipped, and each model is offered
under names in two classes:
- explicit: the file stem (``-00001-of-00003`` dropped for split models), the Ollama name
  (``llama3.2:3b``, and ``llama3.2`` for ``:latest``), the Hugging Face or LM Studio
  repository (``org/repo`` and ``org/repo:QUANT``, the quantization its header and its file name
  say; a Hugging Face one also with its host, ``hf.co/org/repo:QUANT``, and by its path in the
  repo, ``org/repo/FILE.gguf``: the names it is pulled by);
- fallback: the architecture (``qwen3``), used only where no explicit name claims it.
A LoRA adapter is no model of its own: it goes with the models it fits in its folder, or in the
folder above where it lies in a subfolder named ``loras`` or ``adapters`` (``adapterpairing``: the
same architecture, tensors of shapes llama.cpp takes), as ``Found.loras``, which requests name
as ``MODEL:ADAPTER`` (its file's stem)::

    ~/models/qwen3-8b.gguf          the model
    ~/models/pirate.gguf            qwen3-8b:pirate
    ~/models/loras/concise.gguf     qwen3-8b:concise

When several files claim a name, the winner is the first by (class, reached through a
symbolic link or not, root order, path depth, path), so every scan gives the same answer and a
link dropped into a folder cannot take a name from a model file there; ``Catalog.conflicts``
lists the losers.

A model file is a stranger's: a file whose header is refused (``ModelFileError``: damaged, or
saying what no real model does) is listed with the reason, and its names answer 503 with it; a
failure the reader did not foresee refuses that file the same way, never the scan.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..base import strictjson
from . import adapterpairing
from .config import AdapterSpec, normalize_name
from .ggufmeta import SPLIT_RE, GGUFInfo, ModelFileError, read_info

log = logging.getLogger(__name__)

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_PROJECTOR_LAYER = "application/vnd.ollama.image.projector"
OLLAMA_DEFAULT_REGISTRY = ("registry.ollama.ai", "library")
HF_HOSTS = ("hf.co", "huggingface.co")  # a Hugging Face repo's names with its host, as Ollama writes them
# the quantization a file's name ends with (llama.cpp's -hf tag: Q4_K_M, IQ2_XS, F16, BF16, ...)
FILE_QUANT = re.compile(r"[-.]((?:i?q|f|bf|tq|mxfp)[0-9][a-z0-9_]*)$")
NOT_MODELS = frozenset({"clip", "mmproj"})  # general.architecture / general.type of projectors


@dataclass(frozen=True)
class Root:
    kind: str  # dir | huggingface | ollama | lmstudio
    path: Path


@dataclass
class Found:
    """One model file and the names it offers (best first)."""

    path: Path
    root: Root
    order: int  # root index: earlier roots win ties
    names: list[str] = field(default_factory=list)
    fallback: list[str] = field(default_factory=list)
    info: GGUFInfo | None = None
    error: str | None = None
    linked: bool = False  # reached through a symbolic link (where the store's own layout has none)
    mmproj: Path | None = None  # its projector (pictures, sounds): Ollama's layer, or one beside it
    loras: list[AdapterSpec] = field(default_factory=list)  # the LoRA adapters beside it that fit it

    @property
    def source(self) -> str:
        return {"dir": "discovered", "huggingface": "huggingface", "ollama": "ollama",
                "lmstudio": "lmstudio"}[self.root.kind]


def default_stores(env: dict[str, str] | None = None) -> list[Root]:
    env = dict(os.environ if env is None else env)
    home = Path(env.get("HOME") or os.path.expanduser("~"))
    roots = [Root("dir", home / "models")]
    roots.append(Root("dir", Path(env["LLAMA_CACHE"]) if env.get("LLAMA_CACHE") else home / ".cache" / "llama.cpp"))
    hf_home = Path(env["HF_HOME"]) if env.get("HF_HOME") else home / ".cache" / "huggingface"
    roots.append(Root("huggingface", Path(env["HF_HUB_CACHE"]) if env.get("HF_HUB_CACHE") else hf_home / "hub"))
    roots += [Root("lmstudio", home / ".lmstudio" / "models"),
              Root("lmstudio", home / ".cache" / "lm-studio" / "models")]
    if env.get("OLLAMA_MODELS"):
        roots.append(Root("ollama", Path(env["OLLAMA_MODELS"])))
    else:
        roots += [Root("ollama", home / ".ollama" / "models"), Root("ollama", Path("/usr/share/ollama/.ollama/models"))]
    return roots


def roots_for(models_dirs: tuple[Path, ...], default: bool) -> list[Root]:
    roots = [Root("dir", p) for p in models_dirs]
    if default:
        roots += [r for r in default_stores() if r.path not in models_dirs]
    return roots


def stem_name(path: Path) -> str:
    m = SPLIT_RE.match(path.name)
    stem = m.group("stem") if m else path.name[: -len(".gguf")]
    return stem.lower()


class _InfoCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[tuple[int, int], GGUFInfo | ModelFileError]] = {}

    def get(self, path: Path) -> GGUFInfo:
        try:
            st = path.stat()
        except OSError as e:
            raise ModelFileError(f"cannot open {path}: {e.strerror}") from None
        key, stamp = str(path), (st.st_size, st.st_mtime_ns)
        with self._lock:
            hit = self._cache.get(key)
        if hit is None or hit[0] != stamp:
            try:
                value: GGUFInfo | ModelFileError = read_info(path)
            except ModelFileError as e:
                value = e
            except Exception as e:  # noqa: BLE001 (a header the reader did not foresee refuses that file alone)
                log.warning("cannot read the GGUF header of %s: %s: %s", path, type(e).__name__, e,
                            exc_info=log.isEnabledFor(logging.DEBUG))
                value = ModelFileError(f"{path}: unreadable GGUF header ({type(e).__name__})")
            with self._lock:
                self._cache[key] = (stamp, value)
            hit = (stamp, value)
        if isinstance(hit[1], ModelFileError):
            raise hit[1]
        return hit[1]


INFO_CACHE = _InfoCache()


def _gguf_files(root: Path) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True, onerror=lambda e: None):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for fn in filenames:
            if fn.lower().endswith(".gguf") and not fn.startswith("."):
                m = SPLIT_RE.match(fn)
                if not m or int(m.group("part")) == 1:
                    files.append(Path(dirpath) / fn)
    return sorted(files, key=lambda p: (len(p.relative_to(root).parts), str(p)))


def hf_spellings(name: str) -> list[str]:
    """A Hugging Face name as it is written bare (llama-server's ``-hf``) and with each host."""
    return [name, *(f"{host}/{name}" for host in HF_HOSTS)]


def _scan_dir(root: Root, order: int) -> list[Found]:
    out = []
    for path in _gguf_files(root.path):
        found = Found(path, root, order, [stem_name(path)])
        rel = path.relative_to(root.path).parts
        if root.kind == "huggingface" and rel[0].startswith("models--"):
            repo = rel[0][len("models--"):].replace("--", "/").lower()
            found.names += hf_spellings(repo)
            if len(rel) > 3 and rel[1] == "snapshots":  # the file by its path in the repo, as pulled
                found.names += hf_spellings(f"{repo}/{'/'.join(rel[3:]).lower()}")
            if m := FILE_QUANT.search(stem_name(path)):  # the quantization its name says, as it was pulled by
                found.names += hf_spellings(f"{repo}:{m.group(1)}")
        elif root.kind == "lmstudio" and len(rel) >= 3:
            found.names.append(f"{rel[0]}/{rel[1]}".lower())
        out.append(found)
    return out


MAX_MANIFEST_BYTES = 1 << 20  # an Ollama manifest lists a few layers in about a kilobyte


def read_manifest(path: Path) -> dict:
    """An Ollama manifest, read within ``MAX_MANIFEST_BYTES`` and parsed by the bounded parser
    (a store's file is another program's or a registry's text); raises ``ValueError``."""
    with open(path, "rb") as f:
        data = f.read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise ValueError(f"{path}: more than {MAX_MANIFEST_BYTES} bytes")
    value = strictjson.loads(data, str(path))
    if not isinstance(value, dict):
        raise ValueError(f"{path}: not a JSON object")
    return value


def _scan_ollama(root: Root, order: int) -> list[Found]:
    manifests = root.path / "manifests"
    by_blob: dict[Path, Found] = {}
    if not manifests.is_dir():
        return []
    for dirpath, dirnames, filenames in os.walk(manifests, onerror=lambda e: None):
        dirnames.sort()
        for tag in sorted(filenames):
            manifest = Path(dirpath) / tag
            parts = manifest.relative_to(manifests).parts  # registry, namespace, model, tag
            if len(parts) != 4:
                continue
            try:
                data = read_manifest(manifest)
                digest = next(layer["digest"] for layer in data.get("layers", [])
                              if layer.get("mediaType") == OLLAMA_MODEL_LAYER)
                projector = next((root.path / "blobs" / str(layer["digest"]).replace(":", "-")
                                  for layer in data.get("layers", [])
                                  if layer.get("mediaType") == OLLAMA_PROJECTOR_LAYER), None)
            except (OSError, ValueError, StopIteration, KeyError, TypeError, AttributeError):
                log.debug("skipping Ollama manifest %s", manifest)
                continue
            blob = root.path / "blobs" / str(digest).replace(":", "-")
            if not blob.is_file():
                continue
            registry, namespace, model, _ = parts
            base = model if (registry, namespace) == OLLAMA_DEFAULT_REGISTRY else (
                f"{namespace}/{model}" if registry == OLLAMA_DEFAULT_REGISTRY[0] else f"{registry}/{namespace}/{model}")
            names = [f"{base}:{tag}".lower()] + ([base.lower()] if tag == "latest" else [])
            found = by_blob.setdefault(blob, Found(blob, root, order))
            found.names += [n for n in names if n not in found.names]
            if projector is not None and projector.is_file():
                found.mmproj = projector
    return list(by_blob.values())


def _through_link(found: Found, real: str) -> bool:
    """Whether a file of a models folder or LM Studio's is reached through a symbolic link (the
    file or a folder on its way). Hugging Face's snapshots are links by design; Ollama's blobs
    are read by digest."""
    if found.root.kind not in ("dir", "lmstudio"):
        return False
    return real != os.path.join(os.path.realpath(found.root.path), found.path.relative_to(found.root.path))


def scan(roots: list[Root]) -> list[Found]:
    """Every model file under ``roots`` with its header read (or the reason it could not be).
    A file reached by several paths (another snapshot, a link, another root) is listed once: by
    its own path rather than through a link, else by the first found."""
    candidates: list[tuple[str, Found]] = []
    for order, root in enumerate(roots):
        if root.path.is_dir():
            for found in (_scan_ollama if root.kind == "ollama" else _scan_dir)(root, order):
                real = os.path.realpath(found.path)
                found.linked = _through_link(found, real)
                candidates.append((real, found))
    chosen: dict[str, Found] = {}
    for real, found in candidates:
        if real not in chosen or (chosen[real].linked and not found.linked):
            chosen[real] = found
    out: list[Found] = []
    projectors: dict[Path, list[Path]] = {}  # folder -> the projectors in it
    adapters: list[Found] = []
    for real, found in candidates:
        if chosen[real] is found:
            try:
                found.info = INFO_CACHE.get(found.path)
            except ModelFileError as e:
                found.error = str(e)
                out.append(found)  # listed with its error; its names still resolve (to a 503)
                continue
            info = found.info
            if info.architecture in NOT_MODELS or info.kind in NOT_MODELS:
                projectors.setdefault(found.path.parent, []).append(found.path)
                continue  # projectors are not models to serve, but go with the models beside them
            if info.kind == "adapter":
                adapters.append(found)  # nor are LoRA adapters, which go with the models they fit
                continue
            if info.n_tensors == 0:
                continue  # nor are vocab-only files
            if found.root.kind == "lmstudio" and info.quantization and len(found.names) > 1:
                found.names.append(f"{found.names[1]}:{info.quantization.lower()}")
            elif found.root.kind == "huggingface" and info.quantization and len(found.names) > 1:
                found.names += [n for n in hf_spellings(f"{found.names[1]}:{info.quantization.lower()}")
                                if n not in found.names]
            found.fallback = [info.architecture.lower()] if info.architecture else []
            out.append(found)
    for found in out:
        if found.mmproj is None and found.root.kind != "ollama":
            found.mmproj = pair(projectors.get(found.path.parent, []))
    loras = adapterpairing.pair([(f.path, f.info) for f in out if f.info is not None],
                                [(a.path, a.info) for a in adapters if a.info is not None])
    for found in out:
        found.loras = loras.get(found.path, [])
    return out


def pair(projectors: list[Path]) -> Path | None:
    """The projector a model takes from those in its folder (llama-server's router pairs them
    the same way): one named ``mmproj*`` first, then the F16 one of several quantizations, then
    the first by name. A projector paired so (or by an Ollama manifest's projector layer) is
    optional at load: one llama.cpp refuses is left out with a warning (``mmproj_optional``);
    one models.yaml names (``mmproj:``) is not."""
    return min(projectors, key=lambda p: (not p.name.lower().startswith("mmproj"), "f16" not in p.name.lower(),
                                          p.name), default=None)


@dataclass
class Catalog:
    """Discovered models with the names each one won."""

    models: list[Found]
    names: dict[str, Found]
    conflicts: dict[str, list[Found]]  # name -> every claimant, the winner first

    @classmethod
    def build(cls, found: list[Found], taken: set[str]) -> Catalog:
        claims: dict[str, list[tuple[tuple, Found]]] = {}
        for f in found:
            depth = len(f.path.parts)
            for cls_, claimed in ((0, f.names), (1, f.fallback)):
                for n in claimed:
                    key = normalize_name(n)
                    if key and key not in taken:
                        # a file's own name before one a link claims: a link dropped into a
                        # folder does not take over a model's name, whatever it sorts as
                        claims.setdefault(key, []).append(((cls_, f.linked, f.order, depth, str(f.path)), f))
        names: dict[str, Found] = {}
        conflicts: dict[str, list[Found]] = {}
        for key, lst in claims.items():
            lst.sort(key=lambda c: c[0])
            names[key] = lst[0][1]
            if len({id(f) for _, f in lst}) > 1:
                conflicts[key] = [f for _, f in lst]
        winners = {id(f) for f in names.values()}
        return cls([f for f in found if id(f) in winners], names, conflicts)
