"""The audit trail's two databases: SQLite (embedded, the default) and PostgreSQL (several replicas).

SQLite: its own file in WAL mode with synchronous=FULL, so a record
acknowledged before a run survives a power loss; a write costs an fsync
(measure it with bench/audit.py).

PostgreSQL: appends take turns on a transaction-scoped advisory lock, so
replicas never race for the chain's head (the unique previous hash is the
safety net). Connecting and a statement wait at
most `WRITE_WAIT` (toolkeeper/database.py); a connection the server dropped (a restart) is opened
again on the next use, and one stuck on a server that does not answer is cut.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from toolkeeper.audit.calls import ADDED_COLUMNS, ADDED_INDEXES
from toolkeeper.audit.events import AuditError
from toolkeeper.audit.redaction import Redactor
from toolkeeper.audit.trail import SCHEMA, WRITE_WAIT, SQLAudit
from toolkeeper.database import connect_arguments, cut, is_postgres_url, private_file, without_password, write_ahead

OPEN_WAIT = 15.0  # seconds a process starting waits for another one creating or indexing the trail
SCHEMA_LOCK = 7335002  # an advisory lock: replicas starting together create the schema one at a time


class SQLiteAudit(SQLAudit):
    begin = "BEGIN IMMEDIATE"  # take the write lock before reading the head
    conflict = (sqlite3.IntegrityError,)
    failure = (sqlite3.Error,)

    def __init__(self, path: str | Path, redactor: Redactor | None = None):
        super().__init__(redactor)
        self.path = str(path)
        private_file(self.path)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=WRITE_WAIT)
        # at start, workers opening one new file wait for each other longer than a call waits for a write
        self._db.execute(f"PRAGMA busy_timeout={int(OPEN_WAIT * 1000)}")
        write_ahead(self._db, OPEN_WAIT)
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA.format(serial="INTEGER PRIMARY KEY AUTOINCREMENT", key="INTEGER PRIMARY KEY",
                                             real="REAL", blob="BLOB"))
        have = {row[1] for row in self._db.execute("PRAGMA table_info(audit_calls)")}
        for name, kind in ADDED_COLUMNS:
            if name not in have:
                try:
                    self._db.execute(f"ALTER TABLE audit_calls ADD COLUMN {name} {kind}")
                except sqlite3.OperationalError as exc:  # another process starting added it first
                    if "duplicate column" not in str(exc):
                        raise
        for statement in ADDED_INDEXES:
            self._db.execute(statement)
        if self.path == ":memory:":  # another connection would open another, empty database
            self._reader, self._read_lock = self._db, self._lock
        else:  # WAL: this one reads while the other writes
            self._reader = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                           timeout=WRITE_WAIT)
        self.catch_up()
        self._db.execute(f"PRAGMA busy_timeout={int(WRITE_WAIT * 1000)}")

    def connection(self) -> sqlite3.Connection:
        return self._db

    def snapshot(self) -> sqlite3.Connection | None:
        if self.path == ":memory:":
            return None
        return sqlite3.connect(self.path, isolation_level=None, timeout=WRITE_WAIT, check_same_thread=False)

    def read_connection(self) -> sqlite3.Connection:
        return self._reader

    def close(self) -> None:
        super().close()
        if self._reader is not self._db:
            self._reader.close()


class PostgresAudit(SQLAudit):
    floor = "CAST(FLOOR({}) AS INTEGER)"
    # one snapshot for the whole walk, with no statement timeout: a large trail takes longer than a write may
    snapshot_begin = ("BEGIN ISOLATION LEVEL REPEATABLE READ", "SET LOCAL statement_timeout = 0")
    like = "ILIKE"
    lock_chain = "SELECT pg_advisory_xact_lock(7335001)"
    remote = True
    placeholder = "%s"

    def __init__(self, url: str, redactor: Redactor | None = None):
        import psycopg  # only for deployments that use it

        super().__init__(redactor)
        self.path = url
        self._psycopg = psycopg
        self.conflict = (psycopg.errors.UniqueViolation,)
        self.failure = (psycopg.Error,)
        self._db: Any = None
        self._reader: Any = None
        self.connection()
        self.catch_up()

    def connection(self) -> Any:
        """The connection, opened again when the server dropped it."""
        if not self.dropped():
            return self._db
        self._db = self._open(schema=True)
        return self._db

    def read_connection(self) -> Any:
        if self._reader is None or self._reader.closed or self._reader.broken:
            self._reader = self._open(schema=False)
        return self._reader

    def _open(self, schema: bool) -> Any:
        psycopg = self._psycopg
        try:
            db = psycopg.connect(self.path, autocommit=True, **connect_arguments(self.path, WRITE_WAIT))
            if schema:
                with db.transaction():
                    db.execute(f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK})")
                    db.execute(SCHEMA.format(serial="BIGSERIAL PRIMARY KEY", key="BIGINT PRIMARY KEY",
                                             real="DOUBLE PRECISION", blob="BYTEA"))
                    for name, kind in ADDED_COLUMNS:
                        db.execute(f"ALTER TABLE audit_calls ADD COLUMN IF NOT EXISTS {name} {kind}")
                    for statement in ADDED_INDEXES:
                        db.execute(statement)
        except psycopg.Error as exc:
            raise AuditError(f"cannot open the audit trail at {without_password(self.path)}: {exc}") from exc
        return db

    def dropped(self) -> bool:
        return self._db is None or self._db.closed or self._db.broken

    def snapshot(self) -> Any:
        return self._open(schema=False)

    def close(self) -> None:
        super().close()
        if self._reader is not None:
            self._reader.close()

    def abandon(self) -> None:
        """Cut the socket under a connection stuck waiting: the stuck write fails, the next one reconnects."""
        cut(self._db)
        cut(self._reader)


def open_audit(location: str | Path, redactor: Redactor | None = None) -> SQLAudit:
    """A path is an SQLite file; a postgresql:// URL a PostgreSQL database."""
    text = str(location)
    if is_postgres_url(text):
        return PostgresAudit(text, redactor)
    return SQLiteAudit(text, redactor)
