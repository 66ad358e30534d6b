"""The store in PostgreSQL: replicas share history, the retry memo and approvals.

Statements run on a small pool of connections (psycopg's async pool: no
thread per statement on the hot path). Each waits at most `WAIT` seconds, for
a connection or an answer; a connection the server dropped (a restart) is
replaced and the statement tried once more. An approval answered on one replica
wakes the calls waiting on every other through LISTEN/NOTIFY; while the
listening connection is down, waiters poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from toolkeeper.database import connect_arguments, cut, without_password
from toolkeeper.store.base import SQLStore, StoreError
from toolkeeper.store.schema import migrate

log = logging.getLogger("toolkeeper")

WAIT = 2.0  # seconds for a connection, a lock or a statement
CUT_AFTER = 0.5  # seconds past WAIT before a statement's connection is cut: the server did not answer at all
POOL_SIZE = 8
CHANNEL = "toolkeeper_approvals"
SCHEMA_LOCK = 7335003  # an advisory lock: processes starting together migrate one at a time


class PostgresStore(SQLStore):
    def __init__(self, url: str):
        import psycopg  # only for deployments that use it

        super().__init__()
        self.url = url
        self.location = without_password(url)
        self._psycopg = psycopg
        self._connect = connect_arguments(url, WAIT)
        self._sql: dict[str, str] = {}
        self._pool: Any = None
        self._opening = asyncio.Lock()
        self._listener: asyncio.Task[None] | None = None
        self._listening = False
        self._stalled = False  # the last statement found the server not answering
        self._clock_offset = 0.0  # the database's clock minus this machine's: leases in one clock for all replicas
        self._migrate()

    def now(self) -> float:
        return time.time() + self._clock_offset

    @property
    def poll(self) -> float:  # type: ignore[override]
        return 1.0 if self._listening else 0.25

    def _migrate(self) -> None:
        psycopg = self._psycopg
        try:
            with psycopg.connect(self.url, autocommit=True, **self._connect) as db:
                with db.transaction():
                    db.execute(f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK})")
                    migrate(lambda sql, params: _rows(db.execute(self.dialect(sql), params)),
                            real="DOUBLE PRECISION", blob="BYTEA")
                asked = time.time()
                server = db.execute("SELECT extract(epoch from clock_timestamp())").fetchone()[0]
                self._clock_offset = float(server) - (asked + time.time()) / 2
        except psycopg.Error as exc:
            raise StoreError(f"cannot open the store at {self.location}: {exc}") from exc

    def dialect(self, sql: str) -> str:
        converted = self._sql.get(sql)
        if converted is None:
            converted = self._sql[sql] = sql.replace("?", "%s")
        return converted

    async def _pooled(self) -> Any:
        if self._pool is None:
            from psycopg_pool import AsyncConnectionPool

            async with self._opening:
                if self._pool is None:
                    pool = AsyncConnectionPool(self.url, min_size=1, max_size=POOL_SIZE, open=False, timeout=WAIT,
                                               kwargs={"autocommit": True, **self._connect}, name="toolkeeper-store")
                    await pool.open(wait=False)
                    self._pool = pool
        return self._pool

    async def _run(self, statements: list[tuple[str, Sequence[Any]]], fetch: bool, *, probe: bool = False) -> Any:
        """The statements on one connection (several: in one transaction), tried again on a fresh connection
        when the server dropped the first (a restart). A server that does not answer within WAIT is a StoreError,
        and later statements fail at once until a probe (the readiness check) finds it answering again."""
        if self._stalled and not probe:
            raise StoreError(f"the store ({self.location}) stopped answering; waiting for it to come back")
        psycopg = self._psycopg
        for attempt in (1, 2):
            try:
                result = await self._bounded(statements, fetch)
                self._stalled = False
                return result
            except psycopg.OperationalError as exc:
                if attempt == 2 or self._stalled or not _connection_lost(exc):
                    raise StoreError(f"the store ({self.location}) failed: {exc}") from exc
                await (await self._pooled()).check()  # drop the pool's other dead connections before trying again
            except (psycopg.Error, _pool_error()) as exc:
                raise StoreError(f"the store ({self.location}) failed: {exc}") from exc
        raise AssertionError("unreachable")

    async def _bounded(self, statements: list[tuple[str, Sequence[Any]]], fetch: bool) -> Any:
        """Past WAIT, a timer cuts the connection's socket: the statement fails at once. (Cancelling it would not
        do: psycopg then waits for the cancelled statement's answer, which a hung server never sends.)"""
        used: dict[str, Any] = {}
        # the server's own statement_timeout (WAIT) answers first when it can answer at all
        timer = asyncio.get_running_loop().call_later(WAIT + CUT_AFTER, self._stall, used)
        try:
            return await self._on_connection(statements, fetch, used)
        except self._psycopg.Error as exc:
            if used.get("stalled"):
                raise StoreError(f"the store ({self.location}) did not answer within {WAIT + CUT_AFTER:g} s") from exc
            raise
        finally:
            timer.cancel()

    def _stall(self, used: dict[str, Any]) -> None:
        """A statement that has waited WAIT on its connection: the server does not answer. (Waiting for a free
        connection is the pool's own timeout, and says nothing of the server.)"""
        if used.get("connection") is not None:
            used["stalled"] = self._stalled = True
            cut(used["connection"])

    async def _on_connection(self, statements: list[tuple[str, Sequence[Any]]], fetch: bool,
                             used: dict[str, Any]) -> Any:
        pool = await self._pooled()
        async with pool.connection() as db:
            used["connection"] = db
            if len(statements) == 1:
                cursor = await db.execute(self.dialect(statements[0][0]), tuple(statements[0][1]))
                return (await cursor.fetchall() if cursor.description else []) if fetch else cursor.rowcount
            return await self._together(db, statements)

    async def _together(self, db: Any, statements: list[tuple[str, Sequence[Any]]]) -> list[list[tuple]]:
        """Several statements in one query: the server runs them as one transaction (all or none), each statement
        with a snapshot of its own, and answers once: one round trip, where BEGIN, each statement and COMMIT would
        take one each (a limit's reservation holds its scope's row lock that much shorter). The values are bound
        here, by psycopg's client-side cursor, quoted as the server's own literals."""
        cursor = self._psycopg.AsyncClientCursor(db)
        await cursor.execute("; ".join(self.dialect(sql) for sql, _ in statements),
                             [value for _, params in statements for value in params])
        found = []
        while True:
            found.append(await cursor.fetchall() if cursor.description else [])
            if not cursor.nextset():
                return found

    async def check(self) -> None:
        await self._run([("SELECT 1", ())], fetch=True, probe=True)

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        return await self._run([(sql, params)], fetch=True)

    async def _execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return await self._run([(sql, params)], fetch=False)

    async def _atomic(self, statements: list[tuple[str, Sequence[Any]]]) -> list[list[tuple]]:
        if len(statements) == 1:
            return [await self._run(statements, fetch=True)]
        return await self._run(statements, fetch=True)

    async def _announce(self, approval_id: str) -> None:
        await self._fetch(f"SELECT pg_notify('{CHANNEL}', ?)", (approval_id,))

    async def approval_moved(self, approval_id: str, timeout: float) -> None:
        if self._listener is None:
            self._listener = asyncio.get_running_loop().create_task(self._listen())
        await super().approval_moved(approval_id, timeout)

    async def _listen(self) -> None:
        """Wake local waiters on every replica's answer; reconnect when the connection drops."""
        psycopg = self._psycopg
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.url, autocommit=True, **self._connect) as db:
                    await db.execute(f"LISTEN {CHANNEL}")
                    self._listening = True
                    self._wake_all()  # an answer may have come while no one listened
                    async for note in db.notifies():
                        self.wake(note.payload)
            except psycopg.Error as exc:
                if self._listening:
                    log.warning("the store's approval notifications stopped (%s): polling until they are back", exc)
            finally:
                self._listening = False
            await asyncio.sleep(1)

    def _wake_all(self) -> None:
        for approval_id in list(self._watchers):
            self.wake(approval_id)

    async def close(self) -> None:
        await self._purge_ended()
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
        if self._pool is not None:
            await self._pool.close()


def _connection_lost(exc: Exception) -> bool:
    """The connection died (a restart, a network cut): the statement may be tried on another. A statement the
    server cancelled (statement_timeout, lock_timeout) did not lose its connection, and may have had effects."""
    state = getattr(exc, "sqlstate", None)
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


def _rows(cursor: Any) -> list[tuple]:
    return cursor.fetchall() if cursor.description else []


def _pool_error() -> type[Exception]:
    from psycopg_pool import PoolTimeout

    return PoolTimeout
