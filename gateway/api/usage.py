"""``GET /usage``: tokens spent per key, model, wire and day or hour (``access/usage``), and where
each key stands against its limits. An admin's key sees every key's; another key its own.

Query: ``key``, ``model``, ``wire`` (each may repeat: any of them), ``since`` and ``until`` (a
date, ``2026-11-01``, a time, ``2026-11-01T12:00:00Z``, or epoch seconds; ``until`` exclusive;
by default the last 30 days), ``group`` (``day``, the default, or ``hour``)."""

from __future__ import annotations

import time

from aiohttp import web

from ..access.limits import iso
from ..base.checks import parse_time
from ..base.errors import InvalidRequest
from .access import KEY, forbidden, is_admin
from .appkeys import GATE

DEFAULT_DAYS = 30
MAX_VALUES = 64  # of each filter: a query names a few keys or models, not a list without end


LAST = 253402300799.0  # 9999-12-31T23:59:59Z: the last time an ISO date can say


def query_time(text: str, param: str) -> float:
    problem = InvalidRequest(f"`{param}` must be a date (2026-11-01), a time (2026-11-01T12:00:00Z) or epoch "
                             f"seconds from 0 to {LAST:.0f}", param)
    try:
        t: float | None = float(text)
    except ValueError:
        t = parse_time(text)
    if t is None or not 0 <= t <= LAST:  # NaN too
        raise problem
    return t


def query_values(request: web.Request, param: str) -> list[str] | None:
    values = [v for v in request.query.getall(param, []) if v]
    if len(values) > MAX_VALUES:
        raise InvalidRequest(f"`{param}` is given {len(values)} times; at most {MAX_VALUES}", param)
    return values or None


async def usage(request: web.Request) -> web.Response:
    gate = request.app[GATE]
    group = request.query.get("group", "day")
    if group not in ("day", "hour"):
        raise InvalidRequest("`group` must be day or hour", "group")
    now = time.time()
    until = query_time(request.query["until"], "until") if request.query.get("until") else now + 3600
    since = query_time(request.query["since"], "since") if request.query.get("since") else now - DEFAULT_DAYS * 86400
    keys = query_values(request, "key")
    if not is_admin(request):
        own = request[KEY].name
        if keys is not None and set(keys) != {own}:
            raise forbidden(request, "reading another key's usage")
        keys = [own]
    models, wires = query_values(request, "model"), query_values(request, "wire")
    rows = await gate.usage.query(keys=keys, model=models[0] if models and len(models) == 1 else None,
                                  wire=wires[0] if wires and len(wires) == 1 else None,
                                  since=since, until=until, group=group)
    data = [r.as_json() for r in rows if (models is None or r.model in models) and (wires is None or r.wire in wires)]
    names = sorted(keys if keys is not None else gate.keys.names())
    limits = {name: state for name in names if (state := gate.state(name)) is not None}
    status = gate.usage.status
    return web.json_response({"object": "usage", "group": group, "since": iso(since), "until": iso(until),
                              "recording": status.recording, "reason": status.reason, "data": data,
                              "limits": limits})


def setup(app: web.Application) -> None:
    app.router.add_get("/usage", usage)
