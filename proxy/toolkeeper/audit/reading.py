"""Reading the trail back: calls by filter, keyset pages, one call, the chart aggregates, and `verify`.

A mixin of SQLAudit (trail.py), which gives `_query`: every read goes through
the read connection. Filters and pages read the index of calls (calls.py), one
row per call; the entries handed back are the call's events merged, so what a
reader sees is what the hashed chain says.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from toolkeeper.audit.calls import FIRST_COLUMNS, PAGE_SIZE, chart_queries, page_query, rows_of_chain, where
from toolkeeper.audit.events import (
    GENESIS,
    INDEXED_FIELDS,
    UNHASHED,
    AuditError,
    chain_hash,
    entry_of,
    event_body,
    hashed_columns,
)
from toolkeeper.audit.formats import render
from toolkeeper.audit.record import AuditEntry


@dataclass
class Page:
    """One page of calls, newest first, with the cursors of its neighbours (None: there is none)."""

    entries: list[AuditEntry]
    older: int | None  # pass as `before` for the next page down
    newer: int | None  # pass as `after` for the page above


class TrailReader:
    """Needs of SQLAudit: _query, _execute, _locked, connection, snapshot, failure."""

    floor = "CAST({} AS INTEGER)"  # SQLite's cast truncates; PostgreSQL's rounds, so its dialect says FLOOR
    snapshot_begin: tuple[str, ...] = ("BEGIN",)  # SQLite: the first read fixes what the transaction sees
    like = "LIKE"  # case-insensitive for ASCII letters on SQLite
    failure: tuple[type[Exception], ...] = ()

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple]:
        raise NotImplementedError

    def events(self, *, after_seq: int = 0) -> list[dict[str, Any]]:
        rows = self._query("SELECT seq, body FROM audit_events WHERE seq > ? ORDER BY seq", (after_seq,))
        return [{"seq": seq, **event_body(body)} for seq, body in rows]

    def head(self) -> tuple[int, str]:
        """The last event's sequence number and hash: (0, GENESIS) for an empty trail."""
        rows = self._query("SELECT seq, hash FROM audit_events ORDER BY seq DESC LIMIT 1")
        return (rows[0][0], rows[0][1]) if rows else (0, GENESIS)

    def records(self, *, limit: int | None = None, **filters: Any) -> list[AuditEntry]:
        """One entry per call, its events merged, oldest first; `limit`: only the newest that many. Filters:
        calls.where's (tool, status, agent, user, source, approver, rule, header, since, until, search, ...)."""
        clause, params = where(filters, self.like)
        query = f"SELECT record_id FROM audit_calls WHERE {clause} ORDER BY first_seq DESC"  # noqa: S608
        if limit is not None:
            query += f" LIMIT {int(limit)}"
        return self._entries([row[0] for row in self._query(query, params)][::-1])

    def page(self, filters: dict[str, Any], before: int | None = None, after: int | None = None,
             size: int = PAGE_SIZE) -> Page:
        """One keyset page of the calls that match, newest first."""
        sql, params = page_query(filters, before, after, size, self.like)
        rows = self._query(sql, params)
        more = len(rows) > size
        rows = rows[:size]
        if after is not None:
            rows = rows[::-1]
        if not rows:
            return Page([], None, None)
        entries = self._entries([record_id for record_id, _ in rows][::-1])[::-1]
        first, last = rows[0][1], rows[-1][1]
        older_exists = more if after is None else self._any(filters, "first_seq < ?", last)
        newer_exists = more if after is not None else before is not None and self._any(filters, "first_seq > ?", first)
        return Page(entries, last if older_exists else None, first if newer_exists else None)

    def _any(self, filters: dict[str, Any], test: str, seq: int) -> bool:
        clause, params = where(filters, self.like)
        return bool(self._query(f"SELECT 1 FROM audit_calls WHERE {clause} AND {test} LIMIT 1", [*params, seq]))  # noqa: S608

    def _entries(self, ids: list[str]) -> list[AuditEntry]:
        merged: dict[str, dict[str, Any]] = {record_id: {} for record_id in ids}
        for start in range(0, len(ids), 500):
            batch = ids[start:start + 500]
            marks = ",".join("?" * len(batch))
            for seq, body in self._query(f"SELECT seq, body FROM audit_events WHERE record_id IN ({marks}) "  # noqa: S608
                                         "ORDER BY seq", batch):
                parsed = event_body(body)
                merged[parsed["record_id"]].update(parsed, seq=seq)
        return [entry_of(row) for row in merged.values() if row]

    def count(self, **filters: Any) -> int:
        clause, params = where(filters, self.like)
        return self._query(f"SELECT COUNT(*) FROM audit_calls WHERE {clause}", params)[0][0]  # noqa: S608

    def distinct(self, column: str) -> list[str]:
        """The values a filter can choose from: tool, agent, rule, approver, header, decision_source."""
        if column not in FIRST_COLUMNS:
            raise ValueError(f"no column {column}")
        return [row[0] for row in self._query(f"SELECT DISTINCT {column} FROM audit_calls "  # noqa: S608
                                              f"WHERE {column} IS NOT NULL AND {column} != '' ORDER BY 1")]

    def tools(self) -> list[str]:
        return self.distinct("tool")

    def charts(self, since: float, until: float, buckets: int) -> dict[str, list[tuple]]:
        """The aggregates the console draws (calls.chart_queries), each as rows."""
        queries = chart_queries(since, until, buckets, self.floor)
        return {name: self._query(sql, params) for name, (sql, params) in queries.items()}

    def record(self, record_id: str) -> AuditEntry | None:
        entries = self._entries([record_id])
        return entries[0] if entries else None

    def record_by_prefix(self, prefix: str) -> AuditEntry | None:
        """The record whose id starts with `prefix`; raises LookupError when it names more than one."""
        found = self._query("SELECT record_id FROM audit_calls WHERE substr(record_id, 1, ?) = ? LIMIT 2",
                            (len(prefix), prefix.lower()))
        if len(found) > 1:
            raise LookupError(f"{prefix} names more than one record: give more of its id")
        return self.record(found[0][0]) if found else None

    def export(self, fmt: str, **filters: Any) -> str:
        """jsonl, csv, opa (decision log events) or otel (OTLP/JSON spans): see formats.py."""
        return render(self.records(**filters), fmt)

    def follow(self, poll: float = 0.5, after_seq: int = 0) -> Iterator[dict[str, Any]]:
        last = after_seq
        while True:
            for event in self.events(after_seq=last):
                last = event["seq"]
                yield event
            time.sleep(poll)

    def verify(self, expect_head: str | None = None) -> tuple[bool, str]:
        """Walk the chain from the start, each event's columns against its hashed body, then the index of calls
        against the chain: (intact, what was found).

        `expect_head`: the head hash (or its start) noted earlier; a trail that ends before it lost its tail.
        """
        with self._snapshot() as read:  # the chain and its index as of one moment, writes going on meanwhile
            rows = read(f"SELECT seq, {', '.join(INDEXED_FIELDS)}, body, prev_hash, hash FROM audit_events "  # noqa: S608
                        "ORDER BY seq")
            index = read(f"SELECT {', '.join(FIRST_COLUMNS)} FROM audit_calls")  # noqa: S608
        prev, walked = GENESIS, []
        for seq, *columns, body, prev_hash, stored in rows:
            body = body.encode() if isinstance(body, str) else bytes(body)  # a tampered row may change type
            broken = _broken_event(seq, columns, body, prev, prev_hash, stored)
            if broken:
                return False, broken
            walked.append((seq, event_body(body)))
            prev = stored
        broken = _broken_index(rows_of_chain(walked), index)
        if broken:
            return False, broken
        if expect_head and not prev.startswith(expect_head.lower()):
            seen = self._query("SELECT COUNT(*) FROM audit_events WHERE hash LIKE ?", (expect_head.lower() + "%",))
            where_it_is = ("is no longer in the trail: its tail was cut off" if not seen[0][0]
                           else "is not the last event")
            return False, f"the expected head {expect_head} {where_it_is} (the head is {prev[:16]})"
        return True, f"{len(walked)} events, chain intact, head {prev[:16]}"

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[Callable[..., list[tuple]]]:
        """A function reading through one transaction on a connection of its own (SQLAudit.snapshot)."""
        own = self.snapshot()
        shared = own is None  # an in-memory trail has one connection: writes wait meanwhile
        with self._locked() if shared else contextlib.nullcontext():
            db = self.connection() if shared else own
            try:
                for statement in self.snapshot_begin:
                    self._execute(statement, (), db)
                yield lambda sql, params=(): self._execute(sql, params, db).fetchall()
                self._execute("COMMIT", (), db)
            except self.failure as exc:
                raise AuditError(f"the audit trail cannot be read: {exc}") from exc
            finally:
                if not shared:
                    db.close()


def _broken_index(expected: dict[str, tuple], index: list[tuple]) -> str | None:
    """What differs between the index of calls and what the chain says it should hold."""
    found = {row[0]: row for row in index}
    for record_id, row in expected.items():
        held = found.pop(record_id, None)
        if held is None:
            return f"record {record_id} is missing from the index of calls: it was hidden from the pages"
        for name, want, have in zip(FIRST_COLUMNS, row, held, strict=True):
            if want != have and not (isinstance(want, float) and isinstance(have, float) and abs(want - have) < 1e-6):
                return (f"record {record_id} was altered in the index of calls: its {name} says {have!r}, the "
                        f"chain {want!r}")
    if found:
        return f"the index of calls holds record {next(iter(found))}, which is not in the chain"
    return None


def _broken_event(seq: int, columns: list, body: bytes, prev: str, prev_hash: str, stored: str) -> str | None:
    if prev_hash != prev:
        return f"event {seq} (record {columns[0]}) does not follow the event before it"
    if chain_hash(prev_hash, body) != stored:
        return f"event {seq} (record {columns[0]}) was altered: its content does not match its hash"
    for name, column, value in zip(INDEXED_FIELDS, columns, hashed_columns(body), strict=True):
        if value is not UNHASHED and column != value:
            return (f"event {seq} (record {columns[0]}) was altered: its {name} column says {column!r}, its hashed "
                    f"content {value!r}")
    return None
