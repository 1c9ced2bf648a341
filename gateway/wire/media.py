"""Pictures and sounds in a request: each wire's part read into a ``protocol.Media`` (its bytes in
base64, or an http(s) address the gateway fetches), its place in the prompt's text marked with
``MARKER`` (llama.cpp's ``mtmd_default_marker``, where libmtmd puts the media's tokens, as
llama-server builds its prompts); the bytes checked before a model sees them (``checked``: a
format llama.cpp decodes, within the server's limits); and a model's refusal of a kind it does
not take (``require``). Pure: fetching is ``server/fetch.py``'s, done by ``api/media.py``.

Nothing is decoded that has not been sized: ``checked`` reads each file's size from its header
the way llama.cpp's decoders will (``mediasize``), refuses one whose size it cannot read, and
holds the request to ``Limits``: a picture's pixels, and the request's media, pixels and seconds
of sound altogether (``admit`` refuses a medium past the count before it is even fetched).

Every refusal is a 400 naming the caller's part (``messages[1].content[0]``: ``Media.param``), or
the field inside it where the part's own shape is wrong (``messages[1].content[0].image_url.url``
missing)."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, replace
from typing import Any

from ..base.errors import InvalidRequest, shown
from ..protocol import GenerationRequest, Media
from .mediasize import AUDIO, IMAGE, sniff

MARKER = "<__media__>"

# what llama.cpp decodes (stb_image for pictures, miniaudio for sounds) and ``mediasize`` sizes
IMAGE_FORMATS = ("PNG", "JPEG", "GIF", "BMP")
AUDIO_FORMATS = ("WAV", "MP3", "FLAC")
_DATA_URI = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?);base64,", re.I)


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
    raise InvalidRequest(f"`{where}.type` {shown(kind)} is not a picture or a sound", f"{where}.type")


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


@dataclass(frozen=True)
class Limits:
    """What a request's media may take (``server.*``), checked on their headers before anything
    decodes them: a picture's pixels, and each request's media, pixels and seconds of sound."""

    pixels: int  # max_media_pixels
    count: int  # max_media_per_request
    total_pixels: int  # max_media_pixels_per_request
    seconds: float  # max_media_seconds_per_request


@dataclass(frozen=True)
class Spent:
    """What a request's media took so far."""

    count: int = 0
    pixels: int = 0
    seconds: float = 0.0


def admit(media: Media, limits: Limits, spent: Spent) -> None:
    """Refuse a medium past the request's count, before its bytes are fetched or decoded."""
    if spent.count >= limits.count:
        raise InvalidRequest(f"`{media.param}`: this server takes at most {limits.count} pictures and sounds in a "
                             "request (server.max_media_per_request)", media.param, "too_many_media")


def checked(media: Media, data: bytes, limits: Limits, spent: Spent) -> tuple[Media, Spent]:
    """``media`` with ``data`` as its bytes and its size, once they are a format llama.cpp
    decodes, of the part's kind, whose size its header tells exactly (``mediasize``), within
    ``limits`` with what the request's media before it ``spent``; and what they all spent."""
    param = media.param
    what = sniff(data, max_seconds=limits.seconds - spent.seconds)
    formats = ", ".join(IMAGE_FORMATS if media.kind == IMAGE else AUDIO_FORMATS)
    if what is None or what.kind != media.kind:
        said = f"{what.format} {what.kind}" if what else "not in a format this server decodes"
        raise InvalidRequest(f"`{param}` is not {'an image' if media.kind == IMAGE else 'audio'} this server "
                             f"reads ({said}); send {formats}", param, "invalid_media")
    if what.problem is not None:
        raise InvalidRequest(f"`{param}`: this server reads no size from this {what.format} file "
                             f"({what.problem}), and decodes nothing it has not sized; send {formats}", param,
                             "invalid_media")
    if media.kind == IMAGE:
        _within(what.pixels > limits.pixels, param, f"is {what.width}x{what.height} pixels, more than this server "
                f"takes ({limits.pixels} pixels: server.max_media_pixels)")
        _within(spent.pixels + what.pixels > limits.total_pixels, param, f"is {what.width}x{what.height} pixels: "
                f"with the pictures before it, more than this server takes in a request ({limits.total_pixels} "
                "pixels: server.max_media_pixels_per_request)")
        size = (what.width, what.height)
    else:
        _within(spent.seconds + what.seconds > limits.seconds, param, f"is {what.format} audio of more than "
                f"{max(0.0, limits.seconds - spent.seconds):.0f} seconds: with the sounds before it, more than this "
                f"server takes in a request ({limits.seconds:g} seconds: server.max_media_seconds_per_request)")
        size = (what.frames, what.rate)
    kept = replace(media, data=base64.b64encode(data).decode("ascii"), url=None, size=size)  # its note stays
    return kept, Spent(spent.count + 1, spent.pixels + what.pixels, spent.seconds + what.seconds)


def _within(past: bool, param: str, says: str) -> None:
    if past:
        raise InvalidRequest(f"`{param}` {says}", param, "media_too_large")


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
