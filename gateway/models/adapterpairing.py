"""Which discovered models a LoRA adapter found beside them fits: discovery's pairing.

The layout: an adapter (a GGUF whose header says ``general.type: adapter`` and ``adapter.type:
lora``) goes with the models in its own folder and, where that folder is named ``loras`` or
``adapters`` (``ADAPTER_FOLDERS``), with those in the folder just above it::

    ~/models/qwen3-8b-q4_k_m.gguf
    ~/models/pirate.gguf                 ->  qwen3-8b-q4_k_m:pirate
    ~/models/loras/concise.gguf          ->  qwen3-8b-q4_k_m:concise
    ~/models/adapters/Formal Tone.gguf   ->  qwen3-8b-q4_k_m:formal-tone

It pairs with a model where llama.cpp would load it onto that model (``llama_adapter_lora_init``):
the same ``general.architecture``, and for each of the tensors it adapts (``X.lora_a`` with
``X.lora_b``; the ``*_norm.weight`` ones llama.cpp skips, any other suffix it refuses) the model has
``X`` and its shape fits: in ggml's order (``ne[0]`` first) ``X``'s ``ne[0]`` (its input) is
``lora_a``'s ``ne[0]``, ``X``'s ``ne[1]`` (its output) is ``lora_b``'s ``ne[1]``, and
``lora_a``'s ``ne[1]`` (the rank) is ``lora_b``'s ``ne[0]``; a token embedding's pair is stored
the other way round (``X``'s ``ne[0]`` is ``lora_b``'s ``ne[1]``, its ``ne[1]`` ``lora_a``'s).
An adapter that fits several models goes with each; one that fits none is left out, logged
once with the reason. Its name is its file's stem, as discovery names a model
(``adapternames.from_stem``).

Only headers are read: the adapter's tensors (``GGUFInfo.tensors``, bounded by the reader) and
each candidate model's tensor shapes (``ggufmeta.tensor_shapes``), a model's at most once a
scan and only where an adapter of its architecture lies beside it. Each verdict is kept by the
two files' sizes and times, so a scan that finds nothing new reads no model again. Bounded:
``MAX_ADAPTERS`` adapters a folder (the first by name) and a model, ``MAX_CHECKS`` new verdicts
a scan, each comparing at most the adapter's tensors.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .adapternames import from_stem
from .config import MAX_ADAPTERS, AdapterSpec, normalize_name
from .ggufmeta import GGUFInfo, ModelFileError, tensor_shapes

log = logging.getLogger(__name__)

ADAPTER_FOLDERS = ("loras", "adapters")  # a subfolder of a model's folder that holds its adapters
MAX_CHECKS = 4096  # new (adapter, model) verdicts a scan reaches: the rest wait for a later scan
MAX_KEPT = 1 << 14  # verdicts kept between scans (all forgotten past it: the next scan makes them again)
Shape = tuple[int, ...]
Pairs = dict[str, tuple[Shape, Shape]]  # the model tensor's name -> (lora_a's shape, lora_b's)


def _stem(path: Path) -> str:
    name = path.name
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


def lora_pairs(info: GGUFInfo) -> Pairs | str:
    """An adapter's tensors as llama.cpp pairs them: the model tensor's name -> (``lora_a``'s
    shape, ``lora_b``'s); or why llama.cpp would load it onto no model (pure)."""
    if info.adapter_type != "lora":
        return f"its adapter.type is {info.adapter_type!r}, not 'lora'"
    a: dict[str, Shape] = {}
    b: dict[str, Shape] = {}
    for name, dims, _ in info.tensors:
        if name.endswith(".lora_a"):
            a[name.replace(".lora_a", "")] = dims
        elif name.endswith(".lora_b"):
            b[name.replace(".lora_b", "")] = dims
        elif not name.endswith("_norm.weight"):  # llama.cpp skips these, and refuses any other
            return f"its tensor {name[:64]!r} is neither a .lora_a nor a .lora_b"
    if lone := sorted(a.keys() ^ b.keys()):
        return f"its tensor pair for {lone[0][:64]!r} is missing one of .lora_a and .lora_b"
    if not a:
        return "it adapts no tensor"
    return {name: (a[name], b[name]) for name in a}


def _ne(dims: Shape, i: int) -> int:
    return dims[i] if i < len(dims) else 1  # ggml's missing dimensions are 1


def fit_problem(adapter: GGUFInfo, model: GGUFInfo, shapes: Mapping[str, Shape]) -> str | None:
    """Why llama.cpp would refuse ``adapter`` on ``model`` (whose tensors have ``shapes``), or None
    where it fits (pure; the module's docstring gives the rule)."""
    return _fit(lora_pairs(adapter), adapter.architecture, model, shapes)


def _other_architecture(architecture: str | None, model: GGUFInfo) -> str | None:
    if architecture == model.architecture:
        return None
    return f"it is for {architecture}, the model is {model.architecture}"


def _fit(pairs: Pairs | str, architecture: str | None, model: GGUFInfo, shapes: Mapping[str, Shape]) -> str | None:
    if (other := _other_architecture(architecture, model)) is not None:
        return other
    if isinstance(pairs, str):
        return pairs
    for name, (a, b) in pairs.items():
        t = shapes.get(name)
        if t is None:
            return f"the model has no tensor {name[:64]!r}"
        if name.endswith("token_embd.weight"):  # stored transposed (llama.cpp's llm_build_inp_embd)
            fits = _ne(t, 0) == _ne(b, 1) and _ne(t, 1) == _ne(a, 1)
        else:
            fits = _ne(t, 0) == _ne(a, 0) and _ne(t, 1) == _ne(b, 1) and _ne(a, 1) == _ne(b, 0)
        if not fits:
            return f"its {name[:64]!r} is {list(a)} x {list(b)}, which does not fit the model's {list(t)}"
    return None


class _Verdicts:
    """Verdicts by (adapter, its stamp, model, its stamp), kept between scans; reasons told once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[tuple, str | None] = {}
        self._told: set[tuple] = set()

    def get(self, key: tuple) -> tuple[bool, str | None]:
        with self._lock:
            return (key in self._kept, self._kept.get(key))

    def put(self, key: tuple, verdict: str | None) -> None:
        with self._lock:
            if len(self._kept) >= MAX_KEPT:
                self._kept.clear()
            self._kept[key] = verdict

    def first_time(self, what: tuple) -> bool:
        """Whether ``what`` (an adapter's stamp and what is said of it) is to be told now."""
        with self._lock:
            if what in self._told:
                return False
            if len(self._told) >= MAX_KEPT:
                self._told.clear()
            self._told.add(what)
            return True


VERDICTS = _Verdicts()


def _stamp(path: Path) -> tuple[str, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (str(path), st.st_size, st.st_mtime_ns)


def folders_of(adapter: Path) -> list[Path]:
    """The folders whose models an adapter may go with: its own, and the one above where its own
    is named as ``ADAPTER_FOLDERS`` are."""
    own = adapter.parent
    return [own, own.parent] if own.name.lower() in ADAPTER_FOLDERS else [own]


def pair(models: Sequence[tuple[Path, GGUFInfo]],
         adapters: Sequence[tuple[Path, GGUFInfo]]) -> dict[Path, list[AdapterSpec]]:
    """The adapters each model goes with (by the model's path), at most ``MAX_ADAPTERS`` each, in
    the adapters' order: one in a shallower folder first (the model's own folder before its
    ``loras`` folder), then by path; no name twice (the first in that order keeps it)."""
    by_folder: dict[Path, list[tuple[Path, GGUFInfo]]] = {}
    for path, info in models:
        by_folder.setdefault(path.parent, []).append((path, info))
    per_folder: dict[Path, int] = {}
    scan = _Scan()
    out: dict[Path, list[AdapterSpec]] = {}
    for path, info in sorted(adapters, key=lambda a: (len(a[0].parts), str(a[0]))):
        stamp = _stamp(path)
        per_folder[path.parent] = per_folder.get(path.parent, 0) + 1
        if stamp is None:
            continue
        if per_folder[path.parent] > MAX_ADAPTERS:
            _tell(stamp, f"more than {MAX_ADAPTERS} adapters in its folder: the first {MAX_ADAPTERS} by name go")
            continue
        name = from_stem(_stem(path))
        if name is None:
            _tell(stamp, "its file name leaves no adapter's name")
            continue
        pairs = functools.cache(functools.partial(lora_pairs, info))  # read only where a verdict is to be made
        fitted, problems, deferred = [], [], False
        for model, model_info in (m for folder in folders_of(path) for m in by_folder.get(folder, ())):
            verdict = scan.verdict(stamp, pairs, info.architecture, model, model_info)
            if verdict is _LATER:
                deferred = True
            elif verdict is None:
                fitted.append(model)
            else:
                problems.append(f"{model.name}: {verdict}")
        for model in fitted:
            held = out.setdefault(model, [])
            if any(normalize_name(a.name) == name for a in held):
                _tell(stamp, f"{model.name} has an adapter named {name!r} already")
            elif len(held) >= MAX_ADAPTERS:
                _tell(stamp, f"{model.name} has {MAX_ADAPTERS} adapters already")
            else:
                held.append(AdapterSpec(name=name, path=path, source="discovered"))
        if not fitted and not deferred:
            _tell(stamp, "it fits no model beside it" + (f" ({'; '.join(problems[:4])})" if problems else ""))
    return out


_LATER = "(a later scan)"  # a verdict this scan had no room left for (``MAX_CHECKS``)


class _Scan:
    """One scan's verdicts: kept ones (``VERDICTS``), else made, each model's file looked at once
    and its tensor shapes read at most once, at most ``MAX_CHECKS`` new verdicts that read them."""

    def __init__(self) -> None:
        self.shapes: dict[Path, Mapping[str, Shape] | str] = {}
        self.stamps: dict[Path, tuple[str, int, int] | None] = {}
        self.checks = 0

    def verdict(self, stamp: tuple, pairs: Callable[[], Pairs | str], architecture: str | None,
                model: Path, model_info: GGUFInfo) -> str | None:
        if model not in self.stamps:
            self.stamps[model] = _stamp(model)
        key = (stamp, self.stamps[model])
        known, verdict = VERDICTS.get(key)
        if known:
            return verdict
        if (other := _other_architecture(architecture, model_info)) is not None:
            verdict = other  # said without reading the adapter's tensors or the model's
        elif isinstance(pairs(), str):
            verdict = _fit(pairs(), architecture, model_info, {})  # said without reading the model
        elif self.checks >= MAX_CHECKS:
            return _LATER
        else:
            self.checks += 1
            if model not in self.shapes:
                self.shapes[model] = _shapes(model)
            shapes = self.shapes[model]
            verdict = shapes if isinstance(shapes, str) else _fit(pairs(), architecture, model_info, shapes)
        VERDICTS.put(key, verdict)
        return verdict


def _shapes(model: Path) -> Mapping[str, Shape] | str:
    try:
        return tensor_shapes(model)
    except ModelFileError as e:
        return f"its tensors cannot be read: {e}"
    except Exception as e:  # noqa: BLE001 (a header the reader did not foresee pairs nothing, never fails the scan)
        return f"its tensors cannot be read ({type(e).__name__})"


def _tell(stamp: tuple, why: str) -> None:
    """Say once (per adapter file as it stands) why an adapter is left out of a model."""
    if VERDICTS.first_time((stamp, why)):
        log.info("LoRA adapter %s left out: %s", stamp[0], why)
