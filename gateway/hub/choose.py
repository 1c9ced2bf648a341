"""Which files of a Hugging Face repo a name means: llama.cpp's rule for ``-hf``, ties refused.

llama.cpp's rule (``common/download.cpp``: ``get_hf_plan``/``common_download_get_hf_plan``,
``find_best_model``, ``gguf_filename_is_model``, ``get_gguf_split_info``, ``get_split_files``,
``find_best_mmproj``):
- a model is a ``.gguf`` whose basename holds neither ``mmproj`` nor ``imatrix``;
- ``USER/REPO:QUANT`` takes the first model in the listing whose path matches ``QUANT[.-]``,
  case-insensitively; with no quant it tries ``Q4_K_M``, then ``Q8_0``, then the first model of
  any kind. Only the first part of a split model is taken as the match;
- a split model is ``PREFIX-NNNNN-of-MMMMM.gguf``; its parts are every file with the same prefix
  and count;
- ``--hf-file`` names a file exactly; its split parts come with it;
- the projector is a ``.gguf`` with ``mmproj`` in its path in the model's folder or a folder above
  it, the deepest first, then the one whose quantization's bit count is closest to the model's.

The gateway keeps the default and its fallbacks, the case-insensitive match, and the split
grouping, and differs where llama.cpp's first-in-the-listing would pick silently:
- a tie is an error (``Ambiguous``, listing the choices) where llama.cpp takes the first listed:
  a quant matching two different models (other folders, or ``model-Q4_K_M.gguf`` beside
  ``model-instruct-Q4_K_M.gguf``), or no quant given, neither default present, and several models;
- the quant is matched on the basename, and must start a word there (after the start or a character
  other than a letter or digit), so ``Q4_0`` does not match ``IQ4_0``;
- a split model missing a part is ``Incomplete`` rather than a download that fails part-way;
- ``mmproj`` is matched case-insensitively, and the projector is chosen as discovery pairs one
  (``gateway.models.discovery.pair``) among those in the model's folder, else the nearest folder
  above it that has any: then a model pulled and a model found on disk get the same one;
- entries of the listing whose path is not safe to write (``names.file_path_problem``) are left out.

A listing comes from the hub and so is bounded: at most ``MAX_LISTING`` entries, and a split
model of at most ``MAX_SPLIT`` parts; beyond either, ``ValueError``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..models.discovery import pair
from .names import file_path_problem

MAX_LISTING = 100_000  # entries in one repo's listing; the largest real repos hold a few thousand
MAX_SPLIT = 1024  # parts of one split model
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")  # llama.cpp's find_best_model, in order

_SPLIT = re.compile(r"(?P<prefix>.+)-(?P<index>[0-9]{5})-of-(?P<count>[0-9]{5})\.gguf", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)  # llama.cpp's re_tag: the quant at the end of a stem


@dataclass(frozen=True)
class RepoFile:
    path: str  # path in the repo
    size: int | None
    sha256: str | None  # the LFS object's sha256 (hex), None when the file is not in LFS
    git_sha1: str | None = None  # a file kept in git (not LFS): its git blob id (hex), as the listing gives it


@dataclass(frozen=True)
class Choice:
    files: tuple[RepoFile, ...]  # the model: every part of a split GGUF, in part order (one file when not split)
    projector: RepoFile | None  # the vision/audio projector that goes with it
    quant: str  # what was picked, upper-case (e.g. "Q4_K_M"), or the file name's stem when named by file


class NoMatch(LookupError):
    """Nothing in the repo matches; ``choices`` are the quantizations (or files) it has."""

    def __init__(self, message: str, choices: Sequence[str] = ()):
        super().__init__(message)
        self.choices = tuple(choices)


class Ambiguous(LookupError):
    """The name matches several different models; ``choices`` lists them."""

    def __init__(self, message: str, choices: Sequence[str] = ()):
        super().__init__(message)
        self.choices = tuple(choices)


class Incomplete(LookupError):
    """A split model with a part missing from the listing."""


def is_projector(path: str) -> bool:
    return path.endswith(".gguf") and "mmproj" in _basename(path).lower()


def is_model(path: str) -> bool:
    """A ``.gguf`` that is a model: not a projector, not an importance matrix (llama.cpp's rule)."""
    base = _basename(path).lower()
    return path.endswith(".gguf") and "mmproj" not in base and "imatrix" not in base


def _basename(path: str) -> str:
    return path.rpartition("/")[2]


@dataclass
class _Model:
    """One model of the listing: a single file, or the parts found of a split one."""

    prefix: str  # the path less ".gguf" and the split suffix
    count: int  # parts it is split into; 1 when not split
    split: bool  # named as a part (-NNNNN-of-MMMMM), even of one
    parts: dict[int, RepoFile] = field(default_factory=dict)

    @property
    def stem(self) -> str:
        return _basename(self.prefix)

    @property
    def label(self) -> str:
        """Its quantization as llama.cpp reads it (upper-case), or its stem when it names none."""
        m = _TAG.search(self.stem)
        return m.group(1).upper() if m else self.stem

    @property
    def shown(self) -> str:
        """The path to name it by: the file, or the first part of a split model."""
        return f"{self.prefix}-00001-of-{self.count:05d}.gguf" if self.split else f"{self.prefix}.gguf"


def _read(files: Sequence[RepoFile]) -> tuple[dict[str, RepoFile], list[_Model], list[RepoFile]]:
    """The listing's safe entries by path, its models in listing order, its projectors."""
    if len(files) > MAX_LISTING:
        raise ValueError(f"the repo lists {len(files)} files, more than the {MAX_LISTING} a pull reads")
    by_path: dict[str, RepoFile] = {}
    models: dict[tuple[str, int, bool], _Model] = {}  # (prefix, count, split) -> the model
    projectors: list[RepoFile] = []
    for f in files:
        if f.path in by_path or file_path_problem(f.path):
            continue
        by_path[f.path] = f
        if is_projector(f.path):
            projectors.append(f)
        if not is_model(f.path):
            continue
        m = _SPLIT.fullmatch(f.path)
        if m:
            index, count = int(m.group("index")), int(m.group("count"))
            if not 1 <= index <= count:
                continue  # not a part of anything: "-00000-of-00002", "-00003-of-00002"
            key = (m.group("prefix"), count, True)
        else:
            index, count, key = 1, 1, (f.path.removesuffix(".gguf"), 1, False)
        models.setdefault(key, _Model(*key)).parts.setdefault(index, f)
    return by_path, list(models.values()), projectors


def _matches(stem: str, quant: str) -> bool:
    """llama.cpp's ``QUANT[.-]`` (case-insensitive), on the stem, starting a word."""
    return re.search(rf"(?:^|[^A-Za-z0-9]){re.escape(quant)}(?=[.-]|$)", stem, re.IGNORECASE) is not None


def _projector(model: _Model, projectors: list[RepoFile]) -> RepoFile | None:
    """Discovery's pairing among the projectors of the model's folder, else of the nearest folder above."""
    folders: dict[str, list[RepoFile]] = {}
    for p in projectors:
        folders.setdefault(p.path.rpartition("/")[0], []).append(p)
    folder = model.prefix.rpartition("/")[0]
    while True:
        if folder in folders:
            by_path = {Path(p.path): p for p in folders[folder]}
            best = pair(sorted(by_path))
            return by_path[best] if best is not None else None
        if not folder:
            return None
        folder = folder.rpartition("/")[0]


def _finish(model: _Model, quant: str, projectors: list[RepoFile]) -> Choice:
    if model.count > MAX_SPLIT:
        raise ValueError(f"{model.shown} is split into {model.count} parts, more than the {MAX_SPLIT} a pull takes")
    missing = [i for i in range(1, model.count + 1) if i not in model.parts]
    if missing:
        shown = ", ".join(str(i) for i in missing[:10]) + (", ..." if len(missing) > 10 else "")
        raise Incomplete(f"{model.shown}: the repo lacks part {shown} of {model.count}")
    return Choice(tuple(model.parts[i] for i in range(1, model.count + 1)), _projector(model, projectors), quant)


def _one(found: list[_Model], what: str) -> _Model:
    if len(found) > 1:
        choices = sorted(m.shown for m in found)
        raise Ambiguous(f"{what} matches {len(found)} models in the repo: name one by its file", choices)
    return found[0]


def quants(files: Sequence[RepoFile]) -> tuple[str, ...]:
    """The quantizations a repo offers (a model's stem where its name gives none), sorted, for messages."""
    return tuple(sorted({m.label for m in _read(files)[1]}))


def choose(files: Sequence[RepoFile], quant: str | None = None, file: str | None = None) -> Choice:
    """The model (and projector) that ``quant`` or ``file`` means among a repo's ``files``.

    Raises ``NoMatch``, ``Ambiguous`` or ``Incomplete`` (a ``LookupError``: the name does not fit
    the repo), or ``ValueError`` for a listing or split past the bounds."""
    if quant is not None and file is not None:
        raise ValueError("choose by a quantization or by a file, not both")
    by_path, models, projectors = _read(files)
    if file is not None:
        if file not in by_path:
            raise NoMatch(f"the repo has no file {file!r}", sorted(m.shown for m in models))
        if not is_model(file):
            raise NoMatch(f"{file!r} is not a model (a projector, an importance matrix, or not a .gguf)",
                          sorted(m.shown for m in models))
        model = next((m for m in models if any(p.path == file for p in m.parts.values())), None)
        if model is None:
            raise NoMatch(f"{file!r} is numbered as no part of a split model", sorted(m.shown for m in models))
        return _finish(model, model.stem, projectors)
    if not models:
        raise NoMatch("the repo has no GGUF model")
    if quant is not None:
        found = [m for m in models if _matches(m.stem, quant)]
        if not found:
            raise NoMatch(f"the repo has no {quant!r} model", quants(files))
        return _finish(_one(found, quant.upper()), quant.upper(), projectors)
    for default in DEFAULT_QUANTS:
        found = [m for m in models if _matches(m.stem, default)]
        if found:
            return _finish(_one(found, default), default, projectors)
    if len(models) > 1:
        labels = sorted({m.label for m in models})
        choices = labels if len(labels) == len(models) else sorted(m.shown for m in models)
        raise Ambiguous(f"the repo has no {' or '.join(DEFAULT_QUANTS)} and {len(models)} other models: name one",
                        choices)
    return _finish(models[0], models[0].label, projectors)
