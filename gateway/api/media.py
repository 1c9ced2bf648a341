"""A request's pictures and sounds made ready before its model is leased: each fetched where it
came by URL (only under ``server.allow_remote_media``: ``server/fetch.py``), decoded where it came
inline, and checked (``wire.media.checked``: a format llama.cpp decodes, within
``server.max_media_bytes`` and ``server.max_media_pixels``). Every refusal is a 400 naming the
part, in the caller's shape (the errors middleware writes it)."""

from __future__ import annotations

from aiohttp import web

from ..base.errors import InvalidRequest
from ..engine.ipc import Media
from ..models.config import ServerConfig
from ..server.events import observation
from ..server.fetch import fetch_media
from ..wire import media as wire_media
from ..wire.params import Parsed
from .appkeys import CONFIG


async def ready(request: web.Request, parsed: Parsed) -> None:
    """Each request's media as bytes llama.cpp can decode, or a 400."""
    server = request.app[CONFIG].server
    told = observation(request).media
    for req in parsed.requests:
        for i in reversed(range(len(req.media))):
            media = req.media[i]
            told[media.kind] = told.get(media.kind, 0) + 1
            try:
                req.media[i] = wire_media.checked(media, await _bytes(media, server), server.max_media_pixels)
            except InvalidRequest:
                if media.note is None:
                    raise
                wire_media.tell(req, i)  # a tool's picture no model could read: its note, not a 400


async def _bytes(media: Media, server: ServerConfig) -> bytes:
    if media.url is None:
        return wire_media.decoded(media, server.max_media_bytes)
    if not server.allow_remote_media:
        raise InvalidRequest(f"`{media.param}`: this server fetches no URLs (server.allow_remote_media is off); "
                             "send the file inline (a base64 data: URI)", media.param, "remote_media_disabled")
    return await fetch_media(media.url, media.param, max_bytes=server.max_media_bytes,
                             timeout=server.remote_media_timeout, allow_private=server.allow_remote_media_private)
