"""Find GGUF files under the model directories and propose names for them.

A split model (``x-00001-of-00003.gguf``) is one model, named and found by its first
part. Names are file stems, lower-cased; when two files claim one name, the first root
listed wins and, within a root, the shortest path, then alphabetical order, so the
choice is the same on every scan.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .ggufmeta import SPLIT_RE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Found:
    name: str
    path: Path
    root: Path


def model_name(path: Path) -> str:
    m = SPLIT_RE.match(path.name)
    stem = m.group("stem") if m else path.name[: -len(".gguf")]
    return stem.lower()


def scan(roots: Iterable[Path]) -> list[Found]:
    found: dict[str, Found] = {}
    for root in roots:
        if not root.is_dir():
            continue
        files: list[Path] = []
        for dirpath, dirnames, filenames in os.walk(root, followlinks=True, onerror=_log_walk_error):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for fn in filenames:
                if not fn.lower().endswith(".gguf") or fn.startswith("."):
                    continue
                m = SPLIT_RE.match(fn)
                if m and int(m.group("part")) != 1:
                    continue
                files.append(Path(dirpath) / fn)
        for path in sorted(files, key=lambda p: (len(p.relative_to(root).parts), str(p))):
            name = model_name(path)
            if name not in found:
                found[name] = Found(name=name, path=path, root=root)
    return sorted(found.values(), key=lambda f: f.name)


def _log_walk_error(err: OSError) -> None:
    log.debug("skipping %s: %s", err.filename, err.strerror)
