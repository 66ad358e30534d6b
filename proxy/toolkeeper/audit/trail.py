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

Every column a filter reads (record, kind, time, tool, agent, status) is also
in the hashed body, and `verify` checks the columns against it, so editing a
column to hide a record from `audit list --tool ...` shows as tampering.
`verify(expect_head=...)` also tells a trail whose tail was cut off.

Faults never freeze the proxy or run a call unrecorded: a write waits at most
`WRITE_WAIT` seconds (for the database, or for another write still stuck on
it), then the call is refused; a call cancelled while it ran is closed as
`cancelled`, and `close_interrupted` closes, at start, the calls a crashed
process left `running`. The databases themselves are in `databases.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, Literal

from toolkeeper.audit.events import (
    INDEXED_FIELDS,
    UNHASHED,
    AuditError,
    alive,
    entry_of,
    event_body,
    hashed_columns,
)
from toolkeeper.audit.formats import BODY_FILTERS, matches, render
from toolkeeper.audit.record import AuditEntry, ExecutionRecord
from toolkeeper.audit.redaction import Redactor
from toolkeeper.common import canonical_json, sha256_hex

GENESIS = "0" * 64
DECIDED_FIELDS = ExecutionRecord.fields_of("decided")
COMPLETED_FIELDS = ExecutionRecord.fields_of("completed")
EXCERPT_BYTES = 1024
# How long a call waits for the audit database (another writer holding it,
# a database that does not answer) before it is refused: the call is held up,
# never run unrecorded.
WRITE_WAIT = 2.0
HOST = socket.gethostname()

Kind = Literal["decided", "completed", "refused", "forwarded"]

# One schema, two dialects: the column types are the only difference.
SCHEMA = """
CREATE TABLE IF NOT EXISTS audit_events (
    seq {serial},
    record_id TEXT NOT NULL,
    kind TEXT NOT NULL,            -- decided | completed | refused | forwarded
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
# The last event of each call: its current state.
LAST_EVENTS = "seq IN (SELECT MAX(seq) FROM audit_events GROUP BY record_id)"


def chain_hash(prev_hash: str, body: bytes) -> str:
    return sha256_hex(prev_hash.encode() + b"\x00" + body)


class SQLAudit:
    """The trail over a DB-API connection; the dialects (databases.py) give the connection and its SQL."""

    begin = "BEGIN"
    remote = False  # writes wait on a network round trip: run them off the event loop
    lock_chain: str | None = None  # a statement that makes appends take turns, where BEGIN alone does not
    conflict: tuple[type[Exception], ...] = ()  # another writer took the head
    failure: tuple[type[Exception], ...] = ()  # the database cannot take the write
    placeholder = "?"

    def __init__(self, redactor: Redactor | None = None):
        self.redactor = redactor or Redactor()
        self._lock = threading.Lock()
        self.last_failure: str | None = None  # why the last write failed, until one succeeds: for /readyz
        self._pending: set[asyncio.Task[None]] = set()

    # -- the connection: the dialects open and reopen it ------------------------------

    def connection(self) -> Any:
        raise NotImplementedError

    def abandon(self) -> None:
        """Give up a connection stuck on a database that does not answer (a dialect may cut it)."""

    def dropped(self) -> bool:
        """The database dropped the connection (a restart): the next use opens a new one."""
        return False

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if not self._lock.acquire(timeout=WRITE_WAIT):
            raise AuditError(f"the audit database has not answered for {WRITE_WAIT:g} s")
        try:
            yield
        finally:
            self._lock.release()

    def _execute(self, sql: str, params: Iterable[Any] = ()) -> Any:
        if self.placeholder != "?":
            sql = sql.replace("?", self.placeholder)
        return self.connection().execute(sql, tuple(params))

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple]:
        with self._locked():
            try:
                return self._execute(sql, params).fetchall()
            except self.failure as exc:
                raise AuditError(f"the audit trail cannot be read: {exc}") from exc

    # -- writing ------------------------------------------------------------------------

    def decided(self, record: ExecutionRecord) -> None:
        """Before the run; raises AuditError when it cannot be written (then nothing runs)."""
        self._append("decided", record, DECIDED_FIELDS, status="running")

    def completed(self, record: ExecutionRecord) -> None:
        self._append("completed", record, COMPLETED_FIELDS)

    def refused(self, record: ExecutionRecord) -> None:
        self._append("refused", record, DECIDED_FIELDS + COMPLETED_FIELDS)

    def forwarded(self, record: ExecutionRecord) -> None:
        """An agent's own call, allowed and handed to it; `completed` follows when its result comes back."""
        self._append("forwarded", record, DECIDED_FIELDS, status="forwarded")

    async def write(self, kind: Kind, record: ExecutionRecord) -> None:
        """From the event loop: a local SQLite write is quicker than a hop to a thread; a remote one runs in a
        thread, and one that has not finished within WRITE_WAIT is given up (AuditError)."""
        append = {"decided": self.decided, "completed": self.completed, "refused": self.refused,
                  "forwarded": self.forwarded}[kind]
        if not self.remote:
            append(record)
            return
        try:
            # the database's own timeouts answer first; this one is for a database that cannot answer at all
            await asyncio.wait_for(asyncio.to_thread(append, record), WRITE_WAIT + 1)
        except TimeoutError:
            self.abandon()
            self.last_failure = f"the audit database did not answer within {WRITE_WAIT + 1:g} s"
            raise AuditError(self.last_failure) from None

    def write_later(self, kind: Kind, record: ExecutionRecord) -> None:
        """A write that must outlive the task asking for it (a call being cancelled): done now when local."""
        if not self.remote:
            with contextlib.suppress(AuditError):
                self._append(kind, record, COMPLETED_FIELDS if kind == "completed" else DECIDED_FIELDS)
            return
        task = asyncio.get_running_loop().create_task(self.write(kind, record))
        self._pending.add(task)
        task.add_done_callback(lambda done: (self._pending.discard(done), done.exception()))

    def _append(self, kind: str, record: ExecutionRecord, fields: tuple[str, ...], status: str | None = None) -> None:
        clean = self.redactor.apply(record)
        event = {**{k: getattr(clean, k) for k in fields}, "kind": kind, "record_id": clean.record_id,
                 "time": clean.time, "tool": clean.tool, "agent": clean.agent, "status": status or clean.status}
        if isinstance(event.get("answer"), str) and len(event["answer"]) > EXCERPT_BYTES:
            event["answer"] = event["answer"][:EXCERPT_BYTES] + f"... ({len(event['answer']) - EXCERPT_BYTES} more)"
        try:
            self._insert(event, canonical_json(event))
        except AuditError as exc:
            self.last_failure = str(exc)
            raise
        self.last_failure = None

    def _insert(self, event: dict[str, Any], body: bytes) -> None:
        reconnected = False
        for _ in range(20):  # another writer took the head: retry on the new one
            try:
                with self._locked():
                    self._execute(self.begin)
                    try:
                        if self.lock_chain:
                            self._execute(self.lock_chain)
                        row = self._execute("SELECT hash FROM audit_events ORDER BY seq DESC LIMIT 1").fetchone()
                        prev = row[0] if row else GENESIS
                        self._execute(
                            "INSERT INTO audit_events (record_id, kind, time, tool, agent, status, body, prev_hash, "
                            "hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            (*(event[k] for k in INDEXED_FIELDS), body, prev, chain_hash(prev, body)))
                        self._execute("COMMIT")
                        return
                    except BaseException:
                        with contextlib.suppress(*self.failure):
                            self._execute("ROLLBACK")
                        raise
            except self.conflict:
                continue
            except self.failure as exc:
                if self.dropped() and not reconnected:  # the database restarted: once more, on a new connection
                    reconnected = True
                    continue
                raise AuditError(f"the audit record could not be written: {exc}") from exc
        raise AuditError("the audit record could not be written: the chain's head kept moving")

    def close_interrupted(self) -> int:
        """Close, as `interrupted`, the calls left `running` by a process of this host that is gone."""
        rows = self._query(f"SELECT body FROM audit_events WHERE kind = 'decided' AND {LAST_EVENTS}")  # noqa: S608
        closed = 0
        for (body,) in rows:
            record = ExecutionRecord.model_validate({**event_body(body), "status": "interrupted"})
            if record.host == HOST and alive(record.pid):
                continue
            if record.host not in ("", HOST):
                continue  # another machine's replica: only it can tell
            record.answer = "(toolkeeper stopped while this call ran; its outcome is unknown)"
            self.completed(record)
            closed += 1
        return closed

    def check(self) -> None:
        """For /readyz: raises when the trail cannot be read, or its last write failed."""
        self._query("SELECT 1")
        if self.last_failure:
            raise AuditError(f"the last record could not be written: {self.last_failure}")

    # -- reading ------------------------------------------------------------------------

    def events(self, *, after_seq: int = 0) -> list[dict[str, Any]]:
        rows = self._query("SELECT seq, body FROM audit_events WHERE seq > ? ORDER BY seq", (after_seq,))
        return [{"seq": seq, **event_body(body)} for seq, body in rows]

    def _filtered(self, filters: dict[str, Any]) -> tuple[str, list[Any]]:
        """The WHERE clause choosing calls by their current state (the last event of each)."""
        where, params = [LAST_EVENTS], []
        for column in ("tool", "status", "agent"):
            if filters.get(column) is not None:
                where.append(f"{column} = ?")
                params.append(filters[column])
        for bound, test in (("since", "time >= ?"), ("until", "time < ?"), ("until_seq", "seq <= ?")):
            if filters.get(bound) is not None:
                where.append(test)
                params.append(filters[bound])
        return " AND ".join(where), params

    def records(self, *, limit: int | None = None, **filters: Any) -> list[AuditEntry]:
        """One entry per call, its events merged, oldest first; `limit`: only the newest that many. Columns
        (tool, status, agent, since, until) are filtered in SQL; body fields (source, approver, rule, header)
        here, then the newest `limit` kept."""
        if not any(filters.get(name) is not None for name in BODY_FILTERS):
            return self._records(limit, filters)
        entries = [entry for entry in self._records(None, filters) if matches(entry, filters)]
        return entries[-limit:] if limit else entries

    def _records(self, limit: int | None, filters: dict[str, Any]) -> list[AuditEntry]:
        where, params = self._filtered(filters)
        query = f"SELECT record_id FROM audit_events WHERE {where} ORDER BY seq DESC"  # noqa: S608
        if limit is not None:
            query += f" LIMIT {int(limit)}"
        ids = [row[0] for row in self._query(query, params)][::-1]
        merged: dict[str, dict[str, Any]] = {record_id: {} for record_id in ids}
        for start in range(0, len(ids), 500):
            batch = ids[start:start + 500]
            marks = ",".join("?" * len(batch))
            for seq, body in self._query(f"SELECT seq, body FROM audit_events WHERE record_id IN ({marks}) "  # noqa: S608
                                         "ORDER BY seq", batch):
                parsed = event_body(body)
                merged[parsed["record_id"]].update(parsed, seq=seq)
        return [entry_of(row) for row in merged.values()]

    def count(self, **filters: Any) -> int:
        where, params = self._filtered(filters)
        return self._query(f"SELECT COUNT(*) FROM audit_events WHERE {where}", params)[0][0]  # noqa: S608

    def tools(self) -> list[str]:
        return [row[0] for row in self._query("SELECT DISTINCT tool FROM audit_events ORDER BY tool")]

    def record(self, record_id: str) -> AuditEntry | None:
        rows = self._query("SELECT seq, body FROM audit_events WHERE record_id = ? ORDER BY seq", (record_id,))
        if not rows:
            return None
        merged: dict[str, Any] = {}
        for seq, body in rows:
            merged.update(event_body(body), seq=seq)
        return entry_of(merged)

    def verify(self, expect_head: str | None = None) -> tuple[bool, str]:
        """Walk the chain from the start, each event's columns against its hashed body: (intact, what was found).

        `expect_head`: the head hash (or its start) noted earlier; a trail that ends before it lost its tail.
        """
        prev, count = GENESIS, 0
        rows = self._query(f"SELECT seq, {', '.join(INDEXED_FIELDS)}, body, prev_hash, hash FROM audit_events "  # noqa: S608
                           "ORDER BY seq")
        for seq, *columns, body, prev_hash, stored in rows:
            body = body.encode() if isinstance(body, str) else bytes(body)  # a tampered row may change type
            if prev_hash != prev:
                return False, f"event {seq} (record {columns[0]}) does not follow the event before it"
            if chain_hash(prev_hash, body) != stored:
                return False, f"event {seq} (record {columns[0]}) was altered: its content does not match its hash"
            hashed = hashed_columns(body)
            for name, column, value in zip(INDEXED_FIELDS, columns, hashed, strict=True):
                if value is not UNHASHED and column != value:
                    return False, (f"event {seq} (record {columns[0]}) was altered: its {name} column says "
                                   f"{column!r}, its hashed content {value!r}")
            prev = stored
            count += 1
        if expect_head and not prev.startswith(expect_head.lower()):
            seen = self._query("SELECT COUNT(*) FROM audit_events WHERE hash LIKE ?", (expect_head.lower() + "%",))
            where = "is no longer in the trail: its tail was cut off" if not seen[0][0] else "is not the last event"
            return False, f"the expected head {expect_head} {where} (the head is {prev[:16]})"
        return True, f"{count} events, chain intact, head {prev[:16]}"

    def export(self, fmt: str, **filters: Any) -> str:
        """jsonl, csv, opa (decision log events) or otel (OTLP/JSON spans): see formats.py."""
        return render(self.records(**filters), fmt)

    def record_by_prefix(self, prefix: str) -> AuditEntry | None:
        """The record whose id starts with `prefix`; DamagedTrail-free: raises LookupError when it is ambiguous."""
        found = self._query("SELECT DISTINCT record_id FROM audit_events WHERE substr(record_id, 1, ?) = ? LIMIT 2",
                            (len(prefix), prefix.lower()))
        if len(found) > 1:
            raise LookupError(f"{prefix} names more than one record: give more of its id")
        return self.record(found[0][0]) if found else None

    def follow(self, poll: float = 0.5, after_seq: int = 0) -> Iterator[dict[str, Any]]:
        last = after_seq
        while True:
            for event in self.events(after_seq=last):
                last = event["seq"]
                yield event
            time.sleep(poll)

    def close(self) -> None:
        with contextlib.suppress(AuditError), self._locked(), contextlib.suppress(*self.failure):
            self.connection().close()
