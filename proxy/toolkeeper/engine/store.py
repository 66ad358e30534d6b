"""The store: what toolkeeper must remember between requests.

Two kinds of entries, both with a time to live (approvals keep their own
tables, in the policy layer):

- hidden exchanges, so that the agent's next request can be given back the
  declared calls and results it never saw;
- results of declared calls, keyed by the request that ran them, so that a
  retried request does not run a side-effecting tool twice.

The embedded store is SQLite next to the agent file. It is called straight
from the event loop: in WAL mode with synchronous=NORMAL a write is a few tens
of microseconds with no fsync (the WAL is synced at checkpoints), cheaper than
a hop to a thread; a crash can lose the last moments of hidden history, which
degrades to forwarding the agent's history as it is. Nothing here is the audit
trail, whose durability is its own.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Protocol

import orjson

SCHEMA = """
CREATE TABLE IF NOT EXISTS exchanges (
    key TEXT PRIMARY KEY,       -- tenant, conversation and the message the agent received
    loose_key TEXT NOT NULL,    -- tenant and the message alone: tells an edited history from none
    body BLOB,                  -- NULL once expired: kept a while longer so a miss can be told
    expires REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS exchanges_loose ON exchanges (loose_key);
CREATE TABLE IF NOT EXISTS links (
    key TEXT PRIMARY KEY,       -- tenant and an id the agent received (a response id)
    value BLOB NOT NULL,        -- what it stands for upstream
    expires REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS call_results (
    key TEXT PRIMARY KEY,       -- tenant, request body and the call
    answer TEXT NOT NULL,
    expires REAL NOT NULL
);
"""
PURGE_EVERY = 200  # writes


class Store(Protocol):
    def put_exchange(self, key: str, loose_key: str, exchange: dict, ttl: float) -> None: ...

    def find_exchanges(self, loose_keys: list[str]) -> dict[str, list[tuple[str, dict | None]]]:
        """loose key -> [(full key, exchange or None when expired)]."""
        ...

    def put_call_result(self, key: str, answer: str, ttl: float) -> None: ...

    def get_call_result(self, key: str) -> str | None: ...

    def put_link(self, key: str, value: dict, ttl: float) -> None: ...

    def get_link(self, key: str) -> dict | None: ...

    def take_link(self, key: str) -> dict | None:
        """The link, removed: whoever takes it first has it."""
        ...

    def take_expired_links(self) -> list[dict]:
        """The links whose time ran out, removed."""
        ...

    def close(self) -> None: ...


class SQLiteStore:
    def __init__(self, path: str | Path):
        self.path = str(path)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()
        self._writes = 0

    def put_exchange(self, key: str, loose_key: str, exchange: dict, ttl: float) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO exchanges VALUES (?, ?, ?, ?)",
                             (key, loose_key, orjson.dumps(exchange), time.time() + ttl))
            self._wrote()

    def find_exchanges(self, loose_keys: list[str]) -> dict[str, list[tuple[str, dict | None]]]:
        if not loose_keys:
            return {}
        found: dict[str, list[tuple[str, dict | None]]] = {}
        now = time.time()
        with self._lock:
            for start in range(0, len(loose_keys), 500):
                batch = loose_keys[start:start + 500]
                marks = ",".join("?" * len(batch))
                rows = self._db.execute(
                    f"SELECT loose_key, key, body, expires FROM exchanges WHERE loose_key IN ({marks})",  # noqa: S608
                    batch).fetchall()
                for loose, key, body, expires in rows:
                    exchange = orjson.loads(body) if body is not None and expires > now else None
                    found.setdefault(loose, []).append((key, exchange))
        return found

    def put_call_result(self, key: str, answer: str, ttl: float) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO call_results VALUES (?, ?, ?)", (key, answer, time.time() + ttl))
            self._wrote()

    def get_call_result(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT answer FROM call_results WHERE key = ? AND expires > ?",
                                   (key, time.time())).fetchone()
        return row[0] if row else None

    def put_link(self, key: str, value: dict, ttl: float) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO links VALUES (?, ?, ?)", (key, orjson.dumps(value),
                                                                             time.time() + ttl))
            self._wrote()

    def get_link(self, key: str) -> dict | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM links WHERE key = ? AND expires > ?",
                                   (key, time.time())).fetchone()
        return orjson.loads(row[0]) if row else None

    def take_link(self, key: str) -> dict | None:
        with self._lock:
            row = self._db.execute("DELETE FROM links WHERE key = ? AND expires > ? RETURNING value",
                                   (key, time.time())).fetchone()
        return orjson.loads(row[0]) if row else None

    def take_expired_links(self) -> list[dict]:
        with self._lock:
            rows = self._db.execute("DELETE FROM links WHERE expires <= ? RETURNING value", (time.time(),)).fetchall()
        return [orjson.loads(row[0]) for row in rows]

    def _wrote(self) -> None:
        self._writes += 1
        if self._writes % PURGE_EVERY == 0:
            self.purge()

    def purge(self, now: float | None = None) -> None:
        """Expired exchanges lose their body at once, and their keys a day later."""
        now = now or time.time()
        self._db.execute("UPDATE exchanges SET body = NULL WHERE expires <= ? AND body IS NOT NULL", (now,))
        self._db.execute("DELETE FROM exchanges WHERE body IS NULL AND expires <= ? - 86400", (now,))
        self._db.execute("DELETE FROM call_results WHERE expires <= ?", (now,))
        self._db.execute("DELETE FROM links WHERE expires <= ? - 86400", (now,))  # a day to be taken

    def close(self) -> None:
        with self._lock:
            self._db.close()

