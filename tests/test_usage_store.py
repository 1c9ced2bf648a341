"""The usage store (gateway/access/usage.py) on real SQLite files: what it records and answers,
what survives a restart, retention, WAL, and the files it cannot use."""

from __future__ import annotations

import asyncio
import calendar
import logging
import os
import sqlite3
import stat
import time
from contextlib import closing
from pathlib import Path

import pytest

from gateway.access import usage
from gateway.access.usage import MEMORY, Spend, UsageRow, UsageStore, read_last_used, retention_cutoff

T0 = calendar.timegm((2026, 11, 27, 6, 0, 0))  # a Friday 06:00 UTC
FOREVER = 36500  # keep_days that keeps every row of these tests


def spend(key="alice", model="m1", wire="chat", prompt=10, completion=5, at=T0 + 60) -> Spend:
    return Spend(key=key, model=model, wire=wire, prompt_tokens=prompt, completion_tokens=completion, at=at)


def errors(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "gateway.access.usage" and r.levelno >= logging.ERROR]


def totals(rows: list[UsageRow]) -> tuple[int, int, int]:
    return (sum(r.requests for r in rows), sum(r.prompt_tokens for r in rows), sum(r.completion_tokens for r in rows))


async def started(path: Path, keep_days: int = FOREVER, flush_seconds: float = 0.05) -> UsageStore:
    store = UsageStore(path, keep_days, flush_seconds=flush_seconds)
    store.start()
    await store.query()  # the writer has opened the database: status is settled
    return store


async def test_records_answer_by_day_and_by_hour_with_filters(tmp_path):
    store = await started(tmp_path / "usage.db")
    try:
        store.record(spend(at=T0 + 60))
        store.record(spend(at=T0 + 120, prompt=1, completion=2))
        store.record(spend(at=T0 + 3600 + 5, model="m2", wire="messages", prompt=100, completion=0))
        store.record(spend(key="bob", at=T0 + 1800))
        store.record(spend(key="bob", at=T0 + 86400, wire="embeddings", prompt=7, completion=0))  # the next day

        by_day = await store.query()
        assert [r.as_json() for r in by_day] == [
            {"period": "2026-11-27", "key": "alice", "model": "m1", "wire": "chat", "requests": 2,
             "prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
            {"period": "2026-11-27", "key": "alice", "model": "m2", "wire": "messages", "requests": 1,
             "prompt_tokens": 100, "completion_tokens": 0, "total_tokens": 100},
            {"period": "2026-11-27", "key": "bob", "model": "m1", "wire": "chat", "requests": 1,
             "prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            {"period": "2026-11-28", "key": "bob", "model": "m1", "wire": "embeddings", "requests": 1,
             "prompt_tokens": 7, "completion_tokens": 0, "total_tokens": 7},
        ]
        by_hour = await store.query(group="hour")
        assert [(r.period, r.key, r.model, r.wire, r.requests) for r in by_hour] == [
            ("2026-11-27T06:00Z", "alice", "m1", "chat", 2),
            ("2026-11-27T06:00Z", "bob", "m1", "chat", 1),
            ("2026-11-27T07:00Z", "alice", "m2", "messages", 1),
            ("2026-11-28T06:00Z", "bob", "m1", "embeddings", 1),
        ]
        assert totals(by_day) == totals(by_hour) == (5, 128, 12)

        assert {r.key for r in await store.query(keys=["bob"])} == {"bob"}
        assert await store.query(keys=[]) == []
        assert totals(await store.query(keys={"alice", "bob"})) == (5, 128, 12)
        assert totals(await store.query(model="m2")) == (1, 100, 0)
        assert totals(await store.query(wire="chat")) == (3, 21, 12)
        assert totals(await store.query(keys=["alice"], wire="chat", model="m1")) == (2, 11, 7)
        assert totals(await store.query(since=T0 + 3600 + 1800)) == (2, 107, 0)  # from 07:00's bucket on
        assert totals(await store.query(until=T0 + 3600)) == (3, 21, 12)  # until is exclusive
        assert totals(await store.query(since=T0, until=T0 + 86400)) == (4, 121, 12)
        assert await store.query(model="nobody") == []
        with pytest.raises(ValueError):
            await store.query(group="week")
    finally:
        await store.close()


async def test_a_query_sees_every_record_made_before_it(tmp_path):
    store = await started(tmp_path / "usage.db", flush_seconds=3600)  # only a query makes it flush
    try:
        for n in range(3):
            store.record(spend(prompt=n))
            assert totals(await store.query()) == (n + 1, sum(range(n + 1)), 5 * (n + 1))
    finally:
        await store.close()


async def test_a_restart_keeps_the_rows_and_the_last_use(tmp_path):
    path = tmp_path / "state" / "usage.db"  # the folder is made
    store = await started(path)
    store.record(spend(key="alice", at=T0 + 10, prompt=3, completion=4))
    store.record(spend(key="alice", at=T0 + 7200, prompt=30, completion=40))
    store.record(spend(key="bob", at=T0 + 20, prompt=1, completion=1))
    await store.close()
    await store.close()  # idempotent

    again = await started(path)
    try:
        assert totals(await again.query()) == (3, 34, 45)
        assert await again.last_used() == {"alice": T0 + 7200, "bob": T0 + 20}
        assert await again.spent_since({"alice": T0 + 3600, "bob": T0, "carol": T0}) == {"alice": 70, "bob": 2, "carol": 0}
        assert await again.spent_since({"alice": T0 + 60}) == {"alice": 77}  # by hour bucket: 06:00's counts
        assert read_last_used(path) == {"alice": T0 + 7200, "bob": T0 + 20}  # while the gateway has it open
        again.record(spend(key="bob", at=T0 + 9000))
        assert (await again.last_used())["bob"] == T0 + 9000
    finally:
        await again.close()
    assert read_last_used(path) == {"alice": T0 + 7200, "bob": T0 + 9000}


async def test_the_file_is_wal_private_and_versioned(tmp_path):
    path = tmp_path / "usage.db"
    store = await started(path)
    store.record(spend())
    await store.query()
    try:
        assert store.status.recording and store.status.path == str(path) and store.status.reason is None
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        with closing(sqlite3.connect(path)) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert conn.execute("PRAGMA user_version").fetchone()[0] == usage.SCHEMA_VERSION
            assert conn.execute("SELECT hour, key, model, wire, requests FROM usage").fetchall() == [(T0, "alice", "m1", "chat", 1)]
    finally:
        await store.close()


async def test_retention_deletes_rows_older_than_keep_days(tmp_path):
    path = tmp_path / "usage.db"
    now = time.time()
    store = await started(path)
    store.record(spend(key="old", at=now - 10 * 86400))
    store.record(spend(key="older", at=now - 400 * 86400))
    store.record(spend(key="new", at=now - 86400))
    await store.close()

    again = await started(path, keep_days=3)  # deletes at start
    try:
        assert {r.key for r in await again.query()} == {"new"}
        assert set(await again.last_used()) == {"old", "older", "new"}  # when a key was last used stays
    finally:
        await again.close()


def test_keep_days_zero_keeps_the_current_hour_only():
    now = T0 + 1234.5
    assert retention_cutoff(now, 0) == T0
    assert retention_cutoff(now, 2) == T0 - 2 * 86400
    assert retention_cutoff(now, -1) == T0


async def fallen_back(store: UsageStore, path: Path, caplog) -> None:
    """The store recorded nothing to ``path``, said why once, and answers from memory."""
    status = store.status
    assert not status.recording and status.path == str(path)
    assert status.reason and str(path) in status.reason
    logged = errors(caplog)
    assert len(logged) == 1 and str(path) in logged[0].getMessage()
    store.record(spend(prompt=2, completion=3))
    store.record(spend(prompt=2, completion=3))
    assert totals(await store.query()) == (2, 4, 6)
    assert await store.spent_since({"alice": T0}) == {"alice": 10}
    assert await store.last_used() == {"alice": T0 + 60}
    assert len(errors(caplog)) == 1  # once, not once per request


async def test_a_damaged_file_is_left_alone_and_usage_is_kept_in_memory(tmp_path, caplog):
    path = tmp_path / "usage.db"
    junk = os.urandom(8192)
    path.write_bytes(junk)
    store = await started(path)
    try:
        await fallen_back(store, path, caplog)
        assert "not a database" in (store.status.reason or "")
    finally:
        await store.close()
    assert path.read_bytes() == junk
    assert read_last_used(path) == {}


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only files")
async def test_a_read_only_file_is_kept_in_memory(tmp_path, caplog):
    path = tmp_path / "usage.db"
    store = await started(path)
    store.record(spend(key="before"))
    await store.close()
    path.chmod(0o444)
    store = await started(path)
    try:
        await fallen_back(store, path, caplog)
    finally:
        await store.close()
    assert read_last_used(path) == {"before": T0 + 60}  # the command line still reads it


async def test_a_database_sqlite_opens_read_only_is_kept_in_memory(tmp_path, caplog, monkeypatch):
    """As the test above, where root runs it: sqlite opens the file read-only itself."""
    path = tmp_path / "usage.db"
    store = await started(path)
    store.record(spend(key="before"))
    await store.close()

    def read_only(p: Path) -> sqlite3.Connection:
        return sqlite3.connect(p.resolve().as_uri() + "?mode=ro", uri=True, isolation_level=None)

    monkeypatch.setattr(usage, "_connect", read_only)
    store = await started(path)
    try:
        await fallen_back(store, path, caplog)
        assert "readonly" in (store.status.reason or "")
    finally:
        await store.close()


async def test_a_folder_that_cannot_be_made_is_kept_in_memory(tmp_path, caplog):
    (tmp_path / "file").write_text("not a folder")
    path = tmp_path / "file" / "state" / "usage.db"
    store = await started(path)
    try:
        await fallen_back(store, path, caplog)
    finally:
        await store.close()
    assert read_last_used(path) == {}


async def test_a_full_disk_keeps_the_rows_that_failed_and_goes_on_in_memory(tmp_path, caplog, monkeypatch):
    path = tmp_path / "usage.db"
    real = usage._connect

    def small(p: Path) -> sqlite3.Connection:
        conn = real(p)
        conn.execute("PRAGMA max_page_count = 4")  # room for the schema and a page of rows
        return conn

    monkeypatch.setattr(usage, "_connect", small)
    store = await started(path, flush_seconds=3600)
    try:
        assert store.status.recording
        for n in range(500):
            store.record(spend(model=f"model-{n:03}-" + "x" * 300, prompt=1, completion=1))
        rows = await store.query()  # the flush fails: the rows land in memory, none lost
        assert totals(rows) == (500, 500, 500) and len(rows) == 500
        assert all(len(r.model) == usage.MAX_TEXT for r in rows)
        assert not store.status.recording and "full" in (store.status.reason or "")
        assert len(errors(caplog)) == 1 and str(path) in errors(caplog)[0].getMessage()
        store.record(spend())
        assert totals(await store.query()) == (501, 510, 505)
    finally:
        await store.close()


async def test_another_process_s_lock_makes_the_rows_wait(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(usage, "BUSY_SECONDS", 0.05)
    path = tmp_path / "usage.db"
    store = await started(path, flush_seconds=0.02)
    try:
        with closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            store.record(spend())
            await asyncio.sleep(0.3)  # flushes fail on the lock
            other.execute("COMMIT")
        assert totals(await store.query()) == (1, 10, 5)
        assert store.status.recording and not errors(caplog)
        assert [r.getMessage() for r in caplog.records if "locked" in r.getMessage()]  # once, a warning
    finally:
        await store.close()


async def test_the_memory_store_touches_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = await started(MEMORY)
    try:
        assert (store.status.recording, store.status.path, store.status.reason) == (False, None, None)
        store.record(spend())
        assert totals(await store.query()) == (1, 10, 5)
    finally:
        await store.close()
    assert list(tmp_path.iterdir()) == []
    assert read_last_used(MEMORY) == {}


async def test_strings_from_outside_are_capped(tmp_path):
    store = await started(tmp_path / "usage.db")
    try:
        long = "k" * 1000
        store.record(spend(key=long, model="m" * 1000, wire="w" * 1000))
        (row,) = await store.query(keys=[long], model="m" * 300)
        assert (len(row.key), len(row.model), len(row.wire)) == (256, 256, 256)
        assert await store.spent_since({long: T0}) == {long: 15}
    finally:
        await store.close()


async def test_record_never_blocks_and_its_memory_is_bounded(tmp_path):
    store = UsageStore(tmp_path / "usage.db", FOREVER)  # no thread: nothing is ever written
    started_at = time.perf_counter()
    for n in range(100_000):
        store.record(spend(key=f"key{n % 10}", prompt=n % 7))
    elapsed = time.perf_counter() - started_at
    assert len(store._pending) <= 10 and len(store._last) <= 10  # by combination, not by request
    assert elapsed < 10  # well under a second on any machine; loose against a loaded one
    store.record(spend(at=float("nan")))  # a bad spend is dropped, not raised
    store.record(Spend(None, "m", "chat", 1, 1, T0))  # type: ignore[arg-type]
    await store.close()  # start() was never called
    await store.close()
    with pytest.raises(RuntimeError):
        await store.query()
    assert not (tmp_path / "usage.db").exists()


async def test_past_max_pending_new_models_fold_into_other(tmp_path, monkeypatch):
    monkeypatch.setattr(usage, "MAX_PENDING", 3)
    store = await started(tmp_path / "usage.db", flush_seconds=3600)
    try:
        for n in range(10):
            store.record(spend(model=f"m{n}"))
        assert len(store._pending) == 4  # three models and OTHER
        rows = await store.query()
        assert sorted(r.model for r in rows) == ["(other)", "m0", "m1", "m2"]
        assert totals(rows) == (10, 100, 50)
        assert await store.spent_since({"alice": T0}) == {"alice": 150}  # budgets stay exact
    finally:
        await store.close()


async def test_concurrent_records_while_queries_run_add_up_exactly(tmp_path):
    store = await started(tmp_path / "usage.db", flush_seconds=0.001)  # swaps race the records
    keys, rounds = ["a", "b", "c", "d"], 2000

    async def recorder(key: str) -> None:
        for n in range(rounds):
            store.record(spend(key=key, model=f"m{n % 3}", wire=("chat", "fim")[n % 2], prompt=1, completion=2,
                               at=T0 + n))
            if n % 50 == 0:
                await asyncio.sleep(0)

    async def reader() -> None:
        for _ in range(20):
            rows = await store.query(group="hour")
            assert all(r.prompt_tokens * 2 == r.completion_tokens == 2 * r.requests for r in rows)
            await store.spent_since(dict.fromkeys(keys, T0))

    try:
        await asyncio.gather(*(recorder(k) for k in keys), reader(), reader())
        assert totals(await store.query()) == (4 * rounds, 4 * rounds, 8 * rounds)
        assert await store.spent_since(dict.fromkeys(keys, T0)) == dict.fromkeys(keys, 3 * rounds)
        assert await store.last_used() == dict.fromkeys(keys, T0 + rounds - 1)
    finally:
        await store.close()
    again = await started(tmp_path / "usage.db")
    try:
        assert totals(await again.query()) == (4 * rounds, 4 * rounds, 8 * rounds)
    finally:
        await again.close()


def test_read_last_used_of_a_missing_file_is_empty(tmp_path):
    assert read_last_used(tmp_path / "nothing.db") == {}
    assert read_last_used(tmp_path) == {}
