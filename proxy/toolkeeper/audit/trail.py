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
column to hide a record from `audit list --tool ...` shows as tampering. The
index of calls the pages and filters read (calls.py) is checked the same way.
`verify(expect_head=...)` also tells a trail whose tail was cut off.

Reads (pages, exports, verify) go through their own connection, so a long
read never holds up the write a call waits on. Reading is in reading.py.

Faults never freeze the proxy or run a call unrecorded: a write waits at most
`WRITE_WAIT` seconds (for the database, or for another write still stuck on
it), then the call is refused; a call cancelled while it ran is closed as
`cancelled`, and `close_interrupted` closes, at start, the calls a crashed
process left `running`. The databases themselves are in `databases.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Iterable, Iterator
from typing import Any, Literal

from toolkeeper.audit.calls import CALLS_SCHEMA, NEWEST_INDEXED, UNINDEXED, UPSERT, call_row
from toolkeeper.audit.events import GENESIS, INDEXED_FIELDS, AuditError, alive, chain_hash, event_body
from toolkeeper.audit.reading import TrailReader
from toolkeeper.audit.record import ExecutionRecord
from toolkeeper.audit.redaction import Redactor
from toolkeeper.common import canonical_json

log = logging.getLogger("toolkeeper")

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
""" + CALLS_SCHEMA


class SQLAudit(TrailReader):
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
        self._read_lock = threading.Lock()
        self.last_failure: str | None = None  # why the last write failed, until one succeeds: for /readyz
        self._pending: set[asyncio.Task[None]] = set()

    # -- the connection: the dialects open and reopen it ------------------------------

    def connection(self) -> Any:
        raise NotImplementedError

    def read_connection(self) -> Any:
        """The connection reads use: its own, so a long page never holds up a write."""
        raise NotImplementedError

    def abandon(self) -> None:
        """Give up a connection stuck on a database that does not answer (a dialect may cut it)."""

    def dropped(self) -> bool:
        """The database dropped the connection (a restart): the next use opens a new one."""
        return False

    @contextlib.contextmanager
    def _locked(self, lock: threading.Lock | None = None) -> Iterator[None]:
        lock = lock or self._lock
        if not lock.acquire(timeout=WRITE_WAIT):
            raise AuditError(f"the audit database has not answered for {WRITE_WAIT:g} s")
        try:
            yield
        finally:
            lock.release()

    def _execute(self, sql: str, params: Iterable[Any] = (), connection: Any = None) -> Any:
        if self.placeholder != "?":
            sql = sql.replace("?", self.placeholder)
        return (connection or self.connection()).execute(sql, tuple(params))

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple]:
        with self._locked(self._read_lock):
            try:
                return self._execute(sql, params, self.read_connection()).fetchall()
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
        """An agent's own call handed to it: allowed (`forwarded`), or, on the hooks door, left to the agent's own
        permission flow (`deferred`); `completed` follows when its result comes back."""
        self._append("forwarded", record, DECIDED_FIELDS, status="deferred" if record.status == "deferred"
                     else "forwarded")

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
                        (seq,) = self._execute(
                            "INSERT INTO audit_events (record_id, kind, time, tool, agent, status, body, prev_hash, "
                            "hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING seq",
                            (*(event[k] for k in INDEXED_FIELDS), body, prev, chain_hash(prev, body))).fetchone()
                        # from the body as verify will read it back (a big integer becomes a float there)
                        self._execute(UPSERT, call_row(event_body(body), seq))
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
        rows = self._query("SELECT body FROM audit_events WHERE seq IN "
                           "(SELECT last_seq FROM audit_calls WHERE status = 'running')")
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

    def catch_up(self) -> int:
        """Index the events the index does not reflect (a trail from before it, an older release writing beside
        this one, in turns with it): how many events. A look without the write lock first: processes starting
        together on an indexed trail never queue for it. Events that do not fit the index (one forged into the
        chain, its neighbours renumbered) leave it as it was: the transaction rolls back, and `verify` names
        the tampering."""
        if not self._query(UNINDEXED + " LIMIT 1"):
            return 0
        with self._locked():
            self._execute(self.begin)
            try:
                if self.lock_chain:
                    self._execute(self.lock_chain)
                rows = self._execute(UNINDEXED).fetchall()
                for seq, body in rows:
                    self._execute(UPSERT, call_row(event_body(body), seq))
                self._execute("COMMIT")
            except self.conflict as exc:
                with contextlib.suppress(*self.failure):
                    self._execute("ROLLBACK")
                log.warning("the trail's index cannot take its events (%s): the trail may have been altered; "
                            "`toolkeeper audit verify` says where", exc)
                return 0
            except BaseException:
                with contextlib.suppress(*self.failure):
                    self._execute("ROLLBACK")
                raise
        return len(rows)

    def check(self) -> None:
        """For /readyz: raises when the trail cannot be read, or its last write failed. One lookup of the newest
        event (a verify reads on a connection of its own, so it never makes a replica look down); when an older
        release wrote it (a rolling upgrade), what the index lacks is indexed here."""
        newest = self._query(f"{NEWEST_INDEXED} ORDER BY e.seq DESC LIMIT 1")
        if newest and (newest[0][1] is None or newest[0][1] < newest[0][0]):
            self.catch_up()
        if self.last_failure:
            raise AuditError(f"the last record could not be written: {self.last_failure}")

    def snapshot(self) -> Any:
        """A connection of its own for one long read (verify), closed after it: it holds no lock the pages or
        writes wait on; None when there can be no other (an in-memory database)."""
        raise NotImplementedError

    def close(self) -> None:
        with contextlib.suppress(AuditError), self._locked(), contextlib.suppress(*self.failure):
            self.connection().close()
