"""Scenes on a model's queue, for the fair-queue tests (``test_fair_queues_e2e``, and the real
process's in ``test_fair_queues_serve_e2e``): a model's slots held by long streams the test
ends itself, short requests queued behind them in a known arrival order, then one slot freed: the short
requests then run one at a time through it, so the order they end in is the order the
scheduler let them in. ``Gateway`` drives the aiohttp test client of the app, or an
``aiohttp.ClientSession`` on a real server's URL, alike."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

ROOT = "root-fair"
HOLD = 60000  # tokens a holder stream asks for: it runs until the test ends it
SLOTS = 2
BOUND = 60.0  # seconds before a wait fails: far past what a loaded machine takes


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class Gateway:
    """The app under test and what the scenes do to it."""

    def __init__(self, client, app=None, keys_file=None):
        self.client, self.app, self.keys_file = client, app, keys_file
        self.holders: list[aiohttp.ClientResponse] = []
        self.ended: list[str] = []  # the short requests' names, in the order their answers ended

    async def hold(self, key: str, n: int = SLOTS) -> None:
        """``n`` of ``loop``'s slots held by streams of ``key``, each under way."""
        for _ in range(n):
            r = await self.client.post("/v1/chat/completions", headers=auth(key), json={
                "model": "loop", "messages": [{"role": "user", "content": "hold"}], "max_tokens": HOLD,
                "stream": True})
            assert r.status == 200, await r.text()
            while not (line := await r.content.readline()).startswith(b'data: {"'):
                assert line, "a holder's stream ended before its first chunk"
            self.holders.append(r)

    def free(self) -> None:
        """One holder ended: its slot goes to the request the scheduler picks."""
        self.holders.pop(0).close()

    async def queued(self, model: str = "loop") -> int:
        r = await self.client.get("/models", headers=auth(ROOT))
        body = await r.json()
        return next(m["queued"] for m in body["data"] if m["id"] == model)

    async def until_queued(self, n: int, model: str = "loop") -> None:
        await until(lambda: self.queued(model), lambda q: q == n, f"{n} request(s) queued for {model}")

    def short(self, name: str, key: str, **fields: Any) -> asyncio.Task[int]:
        """A short chat request of ``key`` (``fields`` added to its body), as a task; its name
        goes to ``ended`` when its answer ends; the task's result is its status."""

        async def run() -> int:
            r = await self.client.post("/v1/chat/completions", headers=auth(key), json={
                "model": "loop", "messages": [{"role": "user", "content": name}], "max_tokens": 3, **fields})
            await r.read()
            self.ended.append(name)
            return r.status

        return asyncio.create_task(run())

    async def queue(self, *requests: tuple[str, str, dict[str, Any]]) -> list[asyncio.Task[int]]:
        """Short requests (name, key, body fields) queued one after another, each seen waiting
        before the next is sent: their arrival order is the order given."""
        tasks = []
        base = await self.queued()
        for name, key, fields in requests:
            tasks.append(self.short(name, key, **fields))
            await self.until_queued(base + len(tasks))
        return tasks

    async def drain(self, tasks: list[asyncio.Task[int]]) -> list[str]:
        """Free one slot, let every queued request end through it, then end the other holders:
        the queued requests' names in the order the scheduler let them in."""
        self.free()
        statuses = await asyncio.wait_for(asyncio.gather(*tasks), BOUND)
        while self.holders:
            self.free()
        assert set(statuses) == {200}, statuses
        return self.ended

    async def metrics(self) -> str:
        return await (await self.client.get("/metrics", headers=auth(ROOT))).text()

    async def reload(self, keys: str) -> aiohttp.ClientResponse:
        self.keys_file.write_text(f"root: {{key: {ROOT}, role: admin}}\n{keys}")
        return await self.client.post("/config/reload", headers=auth(ROOT))

    def waiting(self, model: str = "loop") -> list[tuple[str, str, float]]:
        """The model's slots' own queue (``FairSlots.waiting``; the app's, in this process): no
        ghost may stay there."""
        from gateway.api.appkeys import REGISTRY

        sup = self.app[REGISTRY].supervisors.by_name.get(model)
        return sup.slots.waiting() if sup is not None else []


async def until(read: Callable[[], Awaitable[Any]], ok: Callable[[Any], bool], what: str) -> Any:
    deadline = asyncio.get_running_loop().time() + BOUND
    while not ok(got := await read()):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what}: not after {BOUND:.0f} s (last: {got!r})")
        await asyncio.sleep(0.05)
    return got
