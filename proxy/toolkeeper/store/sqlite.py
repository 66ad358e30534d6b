"""The embedded store: one SQLite file, shared by the workers of one machine.

Called straight from the event loop: in WAL mode with synchronous=NORMAL a
write is a few tens of microseconds with no fsync (the WAL is synced at
checkpoints), cheaper than a hop to a thread; a crash can lose the last moments
of hidden history, which degrades to forwarding the agent's history as it is.
Workers of one `serve` open the same file; another worker's write holds the
lock for microseconds (`busy_timeout` covers it).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolkeeper.database import private_file, write_ahead
from toolkeeper.store.base import SQLStore, StoreError
from toolkeeper.store.schema import migrate

BUSY_WAIT = 5000  # milliseconds a statement waits for another process's write


class SQLiteStore(SQLStore):
    def __init__(self, path: str | Path):
        super().__init__()
        self.location = str(path)
        private_file(self.location)
        self._db = sqlite3.connect(self.location, check_same_thread=False, isolation_level=None)
        self._db.execute(f"PRAGMA busy_timeout={BUSY_WAIT}")
        write_ahead(self._db, BUSY_WAIT / 1000)
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._lock = threading.Lock()
        try:
            self._migrate()
        except BaseException:
            self._db.close()
            raise

    def _migrate(self) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")  # one process at a time: the others wait, then find it done
        try:
            migrate(lambda sql, params: db.execute(sql, params).fetchall(), real="REAL", blob="BLOB")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        with self._lock:
            try:
                return self._db.execute(sql, tuple(params)).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"the store ({self.location}) failed: {exc}") from exc

    async def _execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        with self._lock:
            try:
                return self._db.execute(sql, tuple(params)).rowcount
            except sqlite3.Error as exc:
                raise StoreError(f"the store ({self.location}) failed: {exc}") from exc

    async def _atomic(self, statements: list[tuple[str, Sequence[Any]]]) -> list[list[tuple]]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    found = [self._db.execute(sql, tuple(params)).fetchall() for sql, params in statements]
                    self._db.execute("COMMIT")
                    return found
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise StoreError(f"the store ({self.location}) failed: {exc}") from exc

    async def close(self) -> None:
        await self._purge_ended()
        with self._lock:
            self._db.close()

