"""The store's contract, on both databases: the retry memo's claims and leases, approvals, links; its migrations."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import pytest
from conftest import postgres_schema

from toolkeeper.store import VERSION, SchemaError, SQLiteStore, open_store


def run(coroutine):
    return asyncio.run(coroutine)


def test_a_claimed_call_is_waited_for_then_answered_and_a_lapsed_lease_is_taken_over(location):
    async def scenario():
        first, second = open_store(location), open_store(location)  # two processes' stores
        try:
            mine = await first.claim_call("k", window=60)
            assert mine.owner and mine.answer is None
            theirs = await second.claim_call("k", window=60)
            assert theirs.running_elsewhere  # the first attempt still runs it
            assert await first.renew_claim("k", mine.owner)
            await first.finish_call("k", mine.owner, '["ran", "ok"]', window=60)
            assert (await second.claim_call("k", window=60)).answer == '["ran", "ok"]'

            dead = await first.claim_call("d", window=60)
            await first._execute("UPDATE call_results SET lease = ? WHERE key = ?", (time.time() - 1, "d"))
            taken = await second.claim_call("d", window=60)  # its owner stopped renewing: another may run it
            assert taken.owner and taken.owner != dead.owner
            assert not await first.renew_claim("d", dead.owner)

            gone = await first.claim_call("c", window=60)
            await first.release_call("c", gone.owner)  # cancelled: a retry runs it afresh, at once
            assert (await second.claim_call("c", window=60)).owner
        finally:
            await first.close()
            await second.close()

    run(scenario())


def test_an_approval_answered_through_one_store_wakes_a_waiter_on_another(location):
    async def scenario():
        waiting_side, answering_side = open_store(location), open_store(location)
        try:
            await waiting_side.add_approval({"id": "ap_TEST", "agent": "a", "tool": "t", "args_hash": "h",
                                             "status": "waiting", "arguments": {"x": 1}, "created": time.time()})
            await waiting_side.approval_moved("ap_TEST", 0.01)  # starts listening (PostgreSQL)
            await asyncio.sleep(0.3)
            started = time.monotonic()
            waiter = asyncio.create_task(waiting_side.approval_moved("ap_TEST", 5))
            await asyncio.sleep(0.05)
            assert await answering_side.settle_approval("ap_TEST", "approved", "ops", None)
            await waiter
            assert time.monotonic() - started < 0.9  # woken by the answer, not at the end of a 1 s poll
            assert (await waiting_side.get_approval("ap_TEST"))["status"] == "approved"
            assert not await answering_side.settle_approval("ap_TEST", "denied", "ops", "late")  # moved once
        finally:
            await waiting_side.close()
            await answering_side.close()

    run(scenario())


def test_links_are_taken_once_and_expire(location):
    async def scenario():
        store = open_store(location)
        try:
            await store.put_link("a", {"v": 1}, ttl=60)
            await store.put_link("b", {"v": 2}, ttl=-1)
            assert await store.get_links(["a", "b", "c"]) == {"a": {"v": 1}}
            assert await store.take_link("a") == {"v": 1} and await store.take_link("a") is None
            assert await store.take_expired_links() == [{"v": 2}]
        finally:
            await store.close()

    run(scenario())


def test_an_unversioned_store_of_an_earlier_release_is_migrated_and_keeps_its_approvals(tmp_path):
    path = tmp_path / "toolkeeper.sqlite3"
    old = sqlite3.connect(path)
    old.executescript("""
        CREATE TABLE call_results (key TEXT PRIMARY KEY, answer TEXT NOT NULL, expires REAL NOT NULL);
        CREATE TABLE approvals (id TEXT PRIMARY KEY, agent TEXT NOT NULL, tool TEXT NOT NULL,
            args_hash TEXT NOT NULL, body BLOB NOT NULL, status TEXT NOT NULL, approver TEXT, reason TEXT,
            updated REAL NOT NULL);
        INSERT INTO call_results VALUES ('k', '["old", "ok"]', 1e12);
        INSERT INTO approvals VALUES ('ap_OLD', 'a', 't', 'h', '{"arguments": {}, "granted": "al_X"}', 'approved',
            'ops', NULL, 1.0);
    """)
    old.close()
    store = SQLiteStore(path)
    try:
        approval = run(store.get_approval("ap_OLD"))
        assert approval["status"] == "approved" and approval["granted"] == "al_X"
        assert run(store.claim_call("k", 60)).owner  # the old memo format is gone: nothing stale replays
    finally:
        run(store.close())
    versions = sqlite3.connect(path).execute("SELECT version FROM toolkeeper_schema").fetchall()
    assert versions == [(VERSION,)]


def test_a_store_migrated_by_a_newer_toolkeeper_is_refused(tmp_path):
    path = tmp_path / "toolkeeper.sqlite3"
    run(SQLiteStore(path).close())
    db = sqlite3.connect(path)
    db.execute("UPDATE toolkeeper_schema SET version = 99")
    db.commit()
    db.close()
    with pytest.raises(SchemaError, match="migrated by a newer toolkeeper"):
        SQLiteStore(path)


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://tk:hunter2@db:5432/tk", "postgresql://tk:***@db:5432/tk"),
    ("postgresql://tk:hun@ter2@db/tk", "postgresql://tk:***@db/tk"),
    ("postgresql://db/tk?user=tk&password=hunter2&sslmode=require", "postgresql://db/tk?user=tk&password=***&sslmode=require"),
])
def test_a_database_url_is_shown_without_its_password(url, shown):
    from toolkeeper.database import without_password

    assert without_password(url) == shown


def test_a_store_statement_the_server_cancels_is_not_run_twice():
    """A statement_timeout is not a lost connection: tried again, a DELETE ... RETURNING would lose its row."""
    from toolkeeper.store import StoreError

    async def scenario(url):
        store = open_store(url)
        try:
            with pytest.raises(StoreError, match="canceling statement"):
                await store._fetch("SELECT pg_sleep(3)")  # past the 2 s statement_timeout
            assert await store._fetch("SELECT 1") == [(1,)]  # and the store still answers
        finally:
            await store.close()

    with postgres_schema() as url:
        started = time.monotonic()
        run(scenario(url))
        assert time.monotonic() - started < 4  # once, not twice
