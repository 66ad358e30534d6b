"""The audit trail: every declared call recorded, hash-chained, written before it runs.

A call's record is written in two steps, as two chained events:

- `decided`, before the run: who called what, with which arguments (as sent and
  as coerced), the argv or module, the decision, its source and rule. If this
  cannot be written, the tool does not run and the model is told so;
- `completed`, after it: status, exit status or trap, duration, output size,
  digest and an excerpt.

A call that never runs (invalid, denied, stopped by the loop detector) leaves
one `refused` event. Each event carries the SHA-256 of its canonical content
and of the event before it; `verify` walks the chain and names the first event
that does not match. The chain's previous-hash column is unique, so two writers
that read the same head cannot both extend it: the second retries on the new
head, and the chain never forks.

Redaction happens before anything reaches the store: argument values whose
names match the configured patterns (default: key, token, secret, password,
authorization) are replaced, in the arguments, the policy input and the argv,
and the record lists what was redacted. The agent is a short hash of its
credentials, never the key.

Durability: the audit database is its own SQLite file in WAL mode with
synchronous=FULL, so a record acknowledged before a run survives a power loss;
a write costs an fsync (measure it with bench/audit.py).
"""

from __future__ import annotations

import csv
import io
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from toolkeeper.audit.record import AuditEntry, ExecutionRecord
from toolkeeper.audit.redaction import Redactor
from toolkeeper.common import canonical_json, sha256_hex

GENESIS = "0" * 64
DECIDED_FIELDS = ExecutionRecord.fields_of("decided")
COMPLETED_FIELDS = ExecutionRecord.fields_of("completed")
EXCERPT_BYTES = 1024
# How long a call waits for the audit database (another writer holding it)
# before it is refused: the call is held up, never run unrecorded.
LOCK_WAIT = 2.0

# One schema, two dialects: the column types are the only difference.
SCHEMA = """
CREATE TABLE IF NOT EXISTS audit_events (
    seq {serial},
    record_id TEXT NOT NULL,
    kind TEXT NOT NULL,            -- decided | completed | refused
    time {real} NOT NULL,
    tool TEXT NOT NULL,
    agent TEXT NOT NULL,
    status TEXT NOT NULL,
    body {blob} NOT NULL,          -- the event's canonical JSON: what the hash covers
    prev_hash TEXT NOT NULL UNIQUE,
    hash TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_record ON audit_events (record_id);
CREATE INDEX IF NOT EXISTS audit_time ON audit_events (time);
"""


class AuditError(Exception):
    """A record could not be written: the call it describes must not run."""


def chain_hash(prev_hash: str, body: bytes) -> str:
    return sha256_hex(prev_hash.encode() + b"\x00" + body)


class SQLAudit:
    """The trail over a DB-API connection; SQLiteAudit and PostgresAudit give the connection and dialect."""

    begin = "BEGIN"
    remote = False  # writes wait on a network round trip: run them off the event loop
    lock_chain: str | None = None  # a statement that makes appends take turns, where BEGIN alone does not
    conflict: tuple[type[Exception], ...] = ()  # another writer took the head
    failure: tuple[type[Exception], ...] = ()  # the database cannot take the write

    def __init__(self, connection: Any, redactor: Redactor | None = None, placeholder: str = "?"):
        self._db = connection
        self.redactor = redactor or Redactor()
        self._placeholder = placeholder
        self._lock = threading.Lock()

    def _execute(self, sql: str, params: Iterable[Any] = ()) -> Any:
        if self._placeholder != "?":
            sql = sql.replace("?", self._placeholder)
        return self._db.execute(sql, tuple(params))

    # -- writing ------------------------------------------------------------------------

    def decided(self, record: ExecutionRecord) -> None:
        """Before the run; raises AuditError when it cannot be written (then nothing runs)."""
        self._append("decided", record, DECIDED_FIELDS, status="running")

    def completed(self, record: ExecutionRecord) -> None:
        self._append("completed", record, COMPLETED_FIELDS)

    def refused(self, record: ExecutionRecord) -> None:
        self._append("refused", record, DECIDED_FIELDS + COMPLETED_FIELDS)

    def _append(self, kind: str, record: ExecutionRecord, fields: tuple[str, ...], status: str | None = None) -> None:
        clean = self.redactor.apply(record)
        event = {"kind": kind, "record_id": clean.record_id, **{k: getattr(clean, k) for k in fields}}
        if status:
            event["status"] = status
        if isinstance(event.get("answer"), str) and len(event["answer"]) > EXCERPT_BYTES:
            event["answer"] = event["answer"][:EXCERPT_BYTES] + f"... ({len(event['answer']) - EXCERPT_BYTES} more)"
        body = canonical_json(event)
        for _ in range(20):  # another writer took the head: retry on the new one
            try:
                with self._lock:
                    self._execute(self.begin)
                    try:
                        if self.lock_chain:
                            self._execute(self.lock_chain)
                        row = self._execute("SELECT hash FROM audit_events ORDER BY seq DESC LIMIT 1").fetchone()
                        prev = row[0] if row else GENESIS
                        self._execute(
                            "INSERT INTO audit_events (record_id, kind, time, tool, agent, status, body, prev_hash, "
                            "hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            (clean.record_id, kind, clean.time, clean.tool, clean.agent, event["status"], body,
                             prev, chain_hash(prev, body)))
                        self._execute("COMMIT")
                        return
                    except BaseException:
                        self._execute("ROLLBACK")
                        raise
            except self.conflict:
                continue
            except self.failure as exc:
                raise AuditError(f"the audit record could not be written: {exc}") from exc
        raise AuditError("the audit record could not be written: the chain's head kept moving")

    # -- reading ------------------------------------------------------------------------

    def events(self, *, since: float | None = None, tool: str | None = None, status: str | None = None,
               agent: str | None = None, after_seq: int = 0) -> list[dict[str, Any]]:
        query = "SELECT seq, body FROM audit_events WHERE seq > ?"
        params: list[Any] = [after_seq]
        for column, value in (("tool", tool), ("status", status), ("agent", agent)):
            if value is not None:
                query += f" AND {column} = ?"
                params.append(value)
        if since is not None:
            query += " AND time >= ?"
            params.append(since)
        with self._lock:
            rows = self._execute(query + " ORDER BY seq", params).fetchall()
        return [{"seq": seq, **orjson.loads(bytes(body))} for seq, body in rows]

    def records(self, **filters: Any) -> list[AuditEntry]:
        """One entry per call: its events merged (a call's outcome joins its decision)."""
        merged: dict[str, dict[str, Any]] = {}
        for event in self.events(**{k: v for k, v in filters.items() if k != "status"}):
            merged.setdefault(event["record_id"], {}).update(event)
        entries = [AuditEntry.model_validate(row) for row in merged.values()]
        if filters.get("status"):
            entries = [entry for entry in entries if entry.status == filters["status"]]
        return entries

    def record(self, record_id: str) -> AuditEntry | None:
        with self._lock:
            rows = self._execute("SELECT seq, body FROM audit_events WHERE record_id = ? ORDER BY seq",
                                 (record_id,)).fetchall()
        if not rows:
            return None
        merged: dict[str, Any] = {}
        for seq, body in rows:
            merged.update(orjson.loads(bytes(body)), seq=seq)
        return AuditEntry.model_validate(merged)

    def verify(self) -> tuple[bool, str]:
        """Walk the chain from the start: (intact, what was found)."""
        prev = GENESIS
        count = 0
        with self._lock:
            rows = self._execute("SELECT seq, record_id, body, prev_hash, hash FROM audit_events "
                                 "ORDER BY seq").fetchall()
        for seq, record_id, body, prev_hash, stored in rows:
            body = body.encode() if isinstance(body, str) else bytes(body)  # a tampered row may change type
            if prev_hash != prev:
                return False, f"event {seq} (record {record_id}) does not follow the event before it"
            if chain_hash(prev_hash, body) != stored:
                return False, f"event {seq} (record {record_id}) was altered: its content does not match its hash"
            prev = stored
            count += 1
        return True, f"{count} events, chain intact, head {prev[:16]}"

    def export(self, fmt: str, **filters: Any) -> str:
        rows = [entry.model_dump() for entry in self.records(**filters)]
        if fmt == "jsonl":
            return "".join(canonical_json(row).decode() + "\n" for row in rows)
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(AuditEntry.model_fields))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (orjson.dumps(v).decode() if isinstance(v, (dict, list)) else v)
                             for k, v in row.items()})
        return out.getvalue()

    def follow(self, poll: float = 0.5) -> Iterator[dict[str, Any]]:
        last = 0
        while True:
            for event in self.events(after_seq=last):
                last = event["seq"]
                yield event
            time.sleep(poll)

    def close(self) -> None:
        with self._lock:
            self._db.close()


class SQLiteAudit(SQLAudit):
    begin = "BEGIN IMMEDIATE"  # take the write lock before reading the head
    conflict = (sqlite3.IntegrityError,)
    failure = (sqlite3.Error,)

    def __init__(self, path: str | Path, redactor: Redactor | None = None):
        self.path = str(path)
        connection = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=LOCK_WAIT)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")
        connection.executescript(SCHEMA.format(serial="INTEGER PRIMARY KEY AUTOINCREMENT", real="REAL", blob="BLOB"))
        super().__init__(connection, redactor)


class PostgresAudit(SQLAudit):
    """The trail in PostgreSQL, shared by several replicas.

    Appends take turns on a transaction-scoped advisory lock, so replicas never
    race for the chain's head; the unique previous hash is the safety net.
    """

    lock_chain = "SELECT pg_advisory_xact_lock(7335001)"
    remote = True

    def __init__(self, url: str, redactor: Redactor | None = None):
        import psycopg  # only for deployments that use it

        self.path = url
        self.conflict = (psycopg.errors.UniqueViolation,)
        self.failure = (psycopg.Error,)
        try:
            connection = psycopg.connect(url, autocommit=True, connect_timeout=5)
            connection.execute(f"SET lock_timeout = '{int(LOCK_WAIT * 1000)}ms'")
            connection.execute(SCHEMA.format(serial="BIGSERIAL PRIMARY KEY", real="DOUBLE PRECISION", blob="BYTEA"))
        except psycopg.Error as exc:
            raise AuditError(f"cannot open the audit trail at {_without_password(url)}: {exc}") from exc
        super().__init__(connection, redactor, placeholder="%s")


def open_audit(location: str | Path, redactor: Redactor | None = None) -> SQLAudit:
    """A path is an SQLite file; a postgresql:// URL a PostgreSQL database."""
    text = str(location)
    if text.startswith(("postgresql://", "postgres://")):
        return PostgresAudit(text, redactor)
    return SQLiteAudit(text, redactor)


def _without_password(url: str) -> str:
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)

