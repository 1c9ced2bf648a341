"""Pictures and sounds in a request: each wire's part read into an ``ipc.Media`` (its bytes in
base64, or an http(s) address the gateway fetches), its place in the prompt's text marked with
``MARKER`` (llama.cpp's ``mtmd_default_marker``, where libmtmd puts the media's tokens, as
llama-server builds its prompts); the bytes checked before a model sees them (``checked``: a
format llama.cpp decodes, within the server's limits); and a model's refusal of a kind it does
not take (``require``). Pure: fetching is ``server/fetch.py``'s, done by ``api/media.py``.

Every refusal is a 400 naming the caller's part (``messages[1].content[0]``: ``Media.param``), or
the field inside it where the part's own shape is wrong (``messages[1].content[0].image_url.url``
missing)."""

from __future__ import annotations

import base64
import binascii
import re
import struct
from dataclasses import dataclass, replace
from typing import Any

from ..base.errors import InvalidRequest
from ..engine.ipc import GenerationRequest, Media

MARKER = "<__media__>"
IMAGE, AUDIO = "image", "audio"

# what llama.cpp decodes (stb_image for pictures, miniaudio for sounds), by the bytes they open with
IMAGE_FORMATS = ("PNG", "JPEG", "GIF", "BMP")
AUDIO_FORMATS = ("WAV", "MP3", "FLAC")
_DATA_URI = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?);base64,", re.I)


@dataclass(frozen=True)
class Sniffed:
    """What a file's first bytes say it is; pictures' sizes from their headers (0: unknown)."""

    kind: str  # IMAGE | AUDIO
    format: str
    width: int = 0
    height: int = 0


def from_url(url: Any, kind: str, param: str, part: str) -> Media:
    """An image part's ``url`` (the field ``param`` of the part ``part``): a ``data:`` URI (its
    base64 payload) or an http(s) address."""
    if not isinstance(url, str) or not url:
        raise InvalidRequest(f"`{param}` must be a data: URI or an http(s) URL", param)
    if url[:5].lower() == "data:":
        m = _DATA_URI.match(url)
        if m is None:
            raise InvalidRequest(f"`{param}` must be a base64 data: URI (data:image/png;base64,...)", param)
        return Media(kind, part, url[m.end():])
    if url.split(":", 1)[0].lower() in ("http", "https"):
        return Media(kind, part, url=url)
    raise InvalidRequest(f"`{param}` must be a data: URI or an http(s) URL, got {url[:40]!r}", param)


def from_base64(data: Any, kind: str, param: str, part: str | None = None) -> Media:
    """A part's bytes in base64 (the field ``param`` of the part ``part``, by default the same)."""
    if not isinstance(data, str) or not data:
        raise InvalidRequest(f"`{param}` must be the file's bytes in base64", param)
    return Media(kind, part or param, data)


def openai_part(part: dict[str, Any], where: str) -> Media:
    """OpenAI's chat parts (``image_url``, ``input_audio``) and Responses' ``input_image``
    (``MEDIA_PARTS``)."""
    kind = part.get("type")
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        field = f"{where}.image_url.url" if isinstance(image, dict) else f"{where}.image_url"
        return from_url(url, IMAGE, field, where)
    if kind == "input_image":
        if part.get("image_url") is None and part.get("file_id") is not None:
            raise InvalidRequest(f"`{where}.file_id`: this server keeps no files; send the image as "
                                 "`image_url` (a data: URI)", f"{where}.file_id")
        return from_url(part.get("image_url"), IMAGE, f"{where}.image_url", where)
    if kind == "input_audio":
        audio = part.get("input_audio")
        if not isinstance(audio, dict):
            raise InvalidRequest(f"`{where}.input_audio` must be an object with `data` and `format`",
                                 f"{where}.input_audio")
        return from_base64(audio.get("data"), AUDIO, f"{where}.input_audio.data", where)
    raise InvalidRequest(f"`{where}.type` {kind!r} is not a picture or a sound", f"{where}.type")


MEDIA_PARTS = ("image_url", "input_image", "input_audio")


def anthropic_source(block: dict[str, Any], where: str) -> Media:
    """An Anthropic ``image`` block's ``source``: ``base64`` (with its ``media_type``) or ``url``."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        return from_base64(source.get("data"), IMAGE, f"{where}.source.data", where)  # type: ignore[union-attr]
    if kind == "url":
        return from_url(source.get("url"), IMAGE, f"{where}.source.url", where)  # type: ignore[union-attr]
    raise InvalidRequest(f"{where}.source: must be {{type: base64, media_type, data}} or {{type: url, url}}",
                         f"{where}.source")


def sniff(data: bytes) -> Sniffed | None:
    """The format of a picture or sound llama.cpp decodes, by its first bytes; None for another."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return Sniffed(IMAGE, "PNG", width, height)
    if data.startswith(b"\xff\xd8\xff"):
        return Sniffed(IMAGE, "JPEG", *_jpeg_size(data))
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return Sniffed(IMAGE, "GIF", *struct.unpack("<HH", data[6:10]))
    if data.startswith(b"BM") and len(data) >= 26:
        width, height = struct.unpack("<ii", data[18:26])
        return Sniffed(IMAGE, "BMP", abs(width), abs(height))
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return Sniffed(AUDIO, "WAV")
    if data.startswith(b"fLaC"):
        return Sniffed(AUDIO, "FLAC")
    if data.startswith(b"ID3") or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return Sniffed(AUDIO, "MP3")
    return None


def _jpeg_size(data: bytes) -> tuple[int, int]:
    """A JPEG's width and height from its frame header (SOFn); (0, 0) where none is found."""
    i = 2
    while i + 9 < len(data):
        if data[i] != 0xFF:
            return 0, 0
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2:i + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", data[i + 5:i + 9])
            return width, height
        i += 2 + length
    return 0, 0


def decoded(media: Media, max_bytes: int) -> bytes:
    """The bytes of a part given inline, refused where they are not base64 or exceed
    ``max_bytes`` (checked on the base64 text's length first, before decoding)."""
    if len(media.data) * 3 // 4 > max_bytes + 3:
        raise too_large(media.param, max_bytes)
    try:
        data = base64.b64decode(media.data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"`{media.param}` is not valid base64", media.param) from None
    if len(data) > max_bytes:
        raise too_large(media.param, max_bytes)
    return data


def too_large(param: str, max_bytes: int) -> InvalidRequest:
    return InvalidRequest(f"`{param}` is larger than this server takes: {max_bytes} bytes (server.max_media_bytes)",
                          param, "media_too_large")


def checked(media: Media, data: bytes, max_pixels: int) -> Media:
    """``media`` with ``data`` as its bytes, once they are a format llama.cpp decodes, of the
    part's kind, within ``max_pixels``."""
    what = sniff(data)
    if what is None or what.kind != media.kind:
        formats = IMAGE_FORMATS if media.kind == IMAGE else AUDIO_FORMATS
        said = f"{what.format} {what.kind}" if what else "not in a format this server decodes"
        raise InvalidRequest(f"`{media.param}` is not {'an image' if media.kind == IMAGE else 'audio'} this server "
                             f"reads ({said}); send {', '.join(formats)}", media.param, "invalid_media")
    if what.width * what.height > max_pixels:
        raise InvalidRequest(f"`{media.param}` is {what.width}x{what.height} pixels, more than this server takes "
                             f"({max_pixels} pixels: server.max_media_pixels)", media.param, "media_too_large")
    return replace(media, data=base64.b64encode(data).decode("ascii"), url=None)  # its note stays


def require(req: GenerationRequest, info: dict[str, Any], model: str) -> None:
    """Refuse a picture (or a sound) to a model that does not take one, naming the first such
    part: ``info`` is the backend's (``vision``, ``audio``: what its projector encodes). One
    with a ``note`` (a tool's picture) is told as the note instead."""
    unread = [i for i, m in enumerate(req.media) if not info.get("vision" if m.kind == IMAGE else "audio")]
    for media in (req.media[i] for i in unread if req.media[i].note is None):
        what = "images" if media.kind == IMAGE else "audio"
        raise InvalidRequest(f"model {model!r} does not take {what} (it has no projector for them: "
                             f"`mmproj` in models.yaml)", media.param, f"{media.kind}_not_supported")
    for i in reversed(unread):
        tell(req, i)


def tell(req: GenerationRequest, index: int) -> None:
    """The request's ``index``-th medium told as its note: its marker replaced (the prompt's
    markers are in the order of ``req.media``), the medium dropped."""
    note = req.media.pop(index).note or ""
    seen = 0
    texts = [m for m in req.messages or [] if isinstance(m.get("content"), str)]
    for holder, key in [(m, "content") for m in texts] + ([(req, "prompt")] if req.prompt else []):
        text = holder[key] if isinstance(holder, dict) else getattr(holder, key)
        n = text.count(MARKER)
        if seen + n > index:
            parts = text.split(MARKER)
            k = index - seen
            text = MARKER.join(parts[:k + 1]) + note + MARKER.join(parts[k + 1:])
            if isinstance(holder, dict):
                holder[key] = text
            else:
                setattr(holder, key, text)
            return
        seen += n


KEPT_NOTE = "[a picture or sound from an earlier turn, not kept]"


def unmarked(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each media marker told as a note, for a conversation kept without its
    media (a stored response's, read again by ``previous_response_id``)."""
    return [{**m, "content": m["content"].replace(MARKER, KEPT_NOTE)}
            if isinstance(m.get("content"), str) and MARKER in m["content"] else m for m in messages]
