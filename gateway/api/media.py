"""A request's pictures and sounds made ready before its model is leased: each fetched where it
came by URL (only under ``server.allow_remote_media``: ``server/fetch.py``), decoded where it came
inline, and checked (``wire.media.checked``: a format llama.cpp decodes, its size read from its
header as llama.cpp's decoders read it, within ``server.max_media_bytes`` and
``server.max_media_pixels``, and the request's media within ``server.max_media_per_request``,
``max_media_pixels_per_request`` and ``max_media_seconds_per_request``). Every refusal is a 400
naming the part, in the caller's shape (the errors middleware writes it); a tool's picture that
would be refused is told as its note instead."""

from __future__ import annotations

import asyncio

from ..base.errors import InvalidRequest
from ..models.config import ServerConfig
from ..protocol import Media
from ..server.fetch import fetch_media
from ..wire import media as wire_media
from ..wire.context import Context
from ..wire.params import Parsed


def limits(server: ServerConfig) -> wire_media.Limits:
    return wire_media.Limits(pixels=server.max_media_pixels, count=server.max_media_per_request,
                             total_pixels=server.max_media_pixels_per_request,
                             seconds=server.max_media_seconds_per_request)


async def ready(ctx: Context, parsed: Parsed) -> None:
    """Each request's media as bytes llama.cpp can decode, or a 400."""
    server = ctx.server
    bounds = limits(server)
    told = ctx.observation.media
    for req in parsed.requests:
        spent = wire_media.Spent()
        unread = []
        for i, media in enumerate(req.media):
            told[media.kind] = told.get(media.kind, 0) + 1
            try:
                wire_media.admit(media, bounds, spent)
                data = await _bytes(media, server)
                # (off the event loop: an MP3's frames are counted one by one)
                req.media[i], spent = await asyncio.to_thread(wire_media.checked, media, data, bounds, spent)
            except InvalidRequest:
                if media.note is None:
                    raise
                unread.append(i)  # a tool's picture no model could read: its note, not a 400
        for i in reversed(unread):
            wire_media.tell(req, i)


async def _bytes(media: Media, server: ServerConfig) -> bytes:
    if media.url is None:
        return wire_media.decoded(media, server.max_media_bytes)
    if not server.allow_remote_media:
        raise InvalidRequest(f"`{media.param}`: this server fetches no URLs (server.allow_remote_media is off); "
                             "send the file inline (a base64 data: URI)", media.param, "remote_media_disabled")
    return await fetch_media(media.url, media.param, max_bytes=server.max_media_bytes,
                             timeout=server.remote_media_timeout, allow_private=server.allow_remote_media_private)
