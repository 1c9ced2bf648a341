"""Pulling from an Ollama registry into Ollama's own store, so Ollama and discovery both see it.

The registry speaks the Docker registry's v2 routes as Ollama uses them: the manifest at
``/v2/NS/MODEL/manifests/TAG`` (read within ``discovery.MAX_MANIFEST_BYTES`` through the bounded
JSON parser, every layer's digest and size checked for shape before a byte is fetched), each
layer at ``/v2/NS/MODEL/blobs/DIGEST`` (registries redirect these to a CDN; ``transfer``
decides which redirects to follow). Each blob is fetched through a partial file beside it,
checked against its digest and size, and renamed to ``blobs/sha256-HEX``; the manifest is
written last, by rename, to ``manifests/HOST/NS/MODEL/TAG``, which is how Ollama and discovery
find a model. A registry named with ``insecure`` is asked over plain http, as Ollama does.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..base import strictjson
from ..models import discovery
from . import transfer
from .names import OllamaName
from .plan import Blob, Plan

MANIFEST_ACCEPT = "application/vnd.docker.distribution.manifest.v2+json"
DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
MEDIA_TYPE = re.compile(r"[A-Za-z0-9.+/_-]{1,200}")
MAX_LAYERS = 64  # a model, its projector, template, parameters, licence, messages: a handful
MAX_BLOB_BYTES = 1 << 44  # no model file is near 16 TiB


def base_url(name: OllamaName, insecure: bool) -> str:
    return f"{'http' if insecure else 'https'}://{name.host}"


def manifest(name: OllamaName, insecure: bool) -> tuple[bytes, dict]:
    """The manifest's bytes, as the registry sent them, and its checked content (blocking)."""
    url = f"{base_url(name, insecure)}/v2/{name.namespace}/{name.model}/manifests/{name.tag}"
    status, body = transfer.read_small(url, {"Accept": MANIFEST_ACCEPT}, f"{name.host}",
                                       limit=discovery.MAX_MANIFEST_BYTES)
    if status == 404:
        raise transfer.NotFound(f"no model {name.canonical!r} on {name.host}")
    if status in (401, 403):
        raise transfer.NotFound(f"{name.canonical!r} on {name.host}: HTTP {status} (unknown, or not yours to pull)")
    if status != 200:
        raise transfer.Unreachable(f"{name.host} answered HTTP {status} for {name.canonical}")
    try:
        data = strictjson.loads(body, "the registry's manifest")
    except ValueError as exc:
        raise transfer.Corrupt(f"{name.canonical}: the manifest is not JSON ({exc})") from None
    layers = data.get("layers") if isinstance(data, dict) else None
    if not isinstance(layers, list) or not 0 < len(layers) <= MAX_LAYERS:
        raise transfer.Corrupt(f"{name.canonical}: the manifest lists no layers, or more than {MAX_LAYERS}")
    config = data.get("config")
    for layer in [*layers, *([config] if config is not None else [])]:
        if not (isinstance(layer, dict) and isinstance(layer.get("digest"), str) and DIGEST.fullmatch(layer["digest"])
                and type(layer.get("size")) is int and 0 <= layer["size"] <= MAX_BLOB_BYTES
                and isinstance(layer.get("mediaType"), str) and MEDIA_TYPE.fullmatch(layer["mediaType"])):
            raise transfer.Corrupt(f"{name.canonical}: the manifest has a malformed layer")
    if not any(layer["mediaType"] == discovery.OLLAMA_MODEL_LAYER for layer in layers):
        raise transfer.NotFound(f"{name.canonical}: the manifest has no model layer (not a GGUF model)")
    return body, data


def manifest_path(store: Path, name: OllamaName) -> Path:
    """Where Ollama keeps ``name``'s manifest in ``store``."""
    return store / "manifests" / Path(*name.store_parts)


def plan(name: OllamaName, store: Path, insecure: bool) -> Plan:
    """What pulling ``name`` into the Ollama store ``store`` writes (blocking: network)."""
    base = base_url(name, insecure)
    origin = transfer.Origin.of(base, insecure=insecure)
    with transfer.within(origin):
        body, data = manifest(name, insecure)
    layers = [*([data["config"]] if data.get("config") else []), *data["layers"]]
    blobs, seen = [], set()
    for layer in layers:
        digest = layer["digest"]
        if digest in seen:
            continue
        seen.add(digest)
        final = store / "blobs" / digest.replace(":", "-")
        want = transfer.Want(f"{base}/v2/{name.namespace}/{name.model}/blobs/{digest}",
                             final.with_name(final.name + ".gguf-gateway-partial"), layer["size"],
                             DIGEST.fullmatch(digest).group(1),  # type: ignore[union-attr]
                             f"{name.canonical} {digest[:19]}", origin=origin)
        blobs.append(Blob(want, final, final.with_name(final.name + ".gguf-gateway-lock"), digest))
    target = manifest_path(store, name)
    model_blob = next(store / "blobs" / layer["digest"].replace(":", "-") for layer in data["layers"]
                      if layer["mediaType"] == discovery.OLLAMA_MODEL_LAYER)

    def finish() -> list[Path]:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_bytes(body)
        os.replace(tmp, target)
        return [model_blob]

    return Plan(name.canonical, "ollama", store, tuple(blobs), finish)


def remove(name: OllamaName, store: Path) -> list[Path]:
    """Ollama's own rule: the manifest goes, and each blob no other manifest names."""
    target = manifest_path(store, name)
    if not target.is_file():
        raise transfer.NotFound(f"no model {name.canonical!r} in {store}")
    try:
        data = discovery.read_manifest(target)
    except (OSError, ValueError):
        data = {}
    target.unlink()
    gone = [target]
    for parent in target.parents:
        if parent == store / "manifests" or not parent.is_dir() or any(parent.iterdir()):
            break
        parent.rmdir()
    used = set()
    for other in (store / "manifests").rglob("*"):
        if other.is_file():
            try:
                used |= _digests(discovery.read_manifest(other))
            except (OSError, ValueError):
                continue
    for digest in _digests(data) - used:
        blob = store / "blobs" / digest.replace(":", "-")
        if blob.is_file():
            blob.unlink()
            gone.append(blob)
    return gone


def _digests(data: dict) -> set[str]:
    layers: list = data["layers"] if isinstance(data.get("layers"), list) else []
    config = [data["config"]] if isinstance(data.get("config"), dict) else []
    return {str(layer.get("digest")) for layer in [*layers, *config] if isinstance(layer, dict)
            and isinstance(layer.get("digest"), str) and DIGEST.fullmatch(layer["digest"])}
