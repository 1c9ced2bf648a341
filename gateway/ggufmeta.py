"""Read what a GGUF file is from its header, with llama.cpp's own ``gguf`` reader.

Nothing is loaded into llama.cpp here: this is cheap enough for listing every model on
disk and for checking a file before a worker is spawned for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


class ModelFileError(Exception):
    """The file is missing, is not GGUF, or its header cannot be read."""


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    file_size: int  # bytes, all split parts together
    architecture: str | None
    name: str | None
    size_label: str | None
    quantization: str | None
    context_length: int | None
    embedding_length: int | None
    has_chat_template: bool
    split_count: int = 1


def split_parts(path: Path) -> list[Path]:
    """All files of a split model (``-00001-of-00003.gguf``), or just ``[path]``."""
    m = SPLIT_RE.match(path.name)
    if not m:
        return [path]
    count = int(m.group("count"))
    return [path.with_name(f"{m.group('stem')}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def quantization_name(file_type: int | None) -> str | None:
    if file_type is None:
        return None
    import gguf

    try:
        name = gguf.LlamaFileType(file_type).name
    except ValueError:
        return f"type {file_type}"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def read_info(path: str | Path) -> GGUFInfo:
    """Header metadata of ``path``; raises ``ModelFileError`` with a reason a person can act on."""
    import gguf

    path = Path(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelFileError(f"cannot open {path}: {e.strerror or e}") from None
    if magic != b"GGUF":
        raise ModelFileError(f"{path} is not a GGUF file (magic {magic!r})")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # the reader raises ValueError, IndexError, struct errors, ...
        raise ModelFileError(f"{path}: unreadable GGUF header: {e}") from None

    def value(key: str):
        fld = reader.fields.get(key)
        if fld is None:
            return None
        try:
            return fld.contents()
        except Exception:
            return None

    arch = value("general.architecture")
    parts = split_parts(path)
    size = sum(p.stat().st_size for p in parts if p.exists())
    return GGUFInfo(
        path=path,
        file_size=size,
        architecture=arch,
        name=value("general.name"),
        size_label=value("general.size_label"),
        quantization=quantization_name(value("general.file_type")),
        context_length=value(f"{arch}.context_length") if arch else None,
        embedding_length=value(f"{arch}.embedding_length") if arch else None,
        has_chat_template=reader.fields.get("tokenizer.chat_template") is not None,
        split_count=len(parts),
    )
