"""The trail's index of calls: one row per call, its current state, for pages, filters and charts.

The chain (`audit_events`) is the record. This table is derived from it, in
the same transaction as each append, so that a page of 50 calls, a filter on
the approver or a chart reads one indexed row per call instead of merging
every event of the trail. It holds nothing the chain does not: `verify`
derives it again from the chain and compares, so editing it to hide a call
from a page shows as tampering. A trail written before the table existed is
indexed when it is opened (`catch_up`).

Pages are keyset pages (`first_seq < cursor`, newest first), never OFFSET:
the hundredth page costs what the first does.
"""

from __future__ import annotations

from typing import Any

from toolkeeper.common import canonical_json

CALLS_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit_calls (
    first_seq {key},                    -- the call's first event: pages are keyed on it, newest first
    record_id TEXT NOT NULL UNIQUE,
    last_seq BIGINT NOT NULL,           -- its last event: the state below is that event's
    time {real} NOT NULL,
    tool TEXT NOT NULL,
    agent TEXT NOT NULL,
    status TEXT NOT NULL,
    source TEXT NOT NULL DEFAULT '',    -- declared | agent
    decision_source TEXT NOT NULL DEFAULT '',
    rule TEXT,                          -- the security team's rule that decided
    approver TEXT,
    header TEXT,                        -- the identity header the deployment set
    request_id TEXT NOT NULL DEFAULT '',
    waited_ms {real},                   -- how long a person took to answer
    arguments TEXT NOT NULL DEFAULT '', -- as sent and as coerced (redacted), for the search
    shadow TEXT,                        -- the strongest effect a shadow rule would have had (deny, ask, allow)
    principal_user TEXT                 -- whom it was for: principal.user (`user` is a word PostgreSQL reserves)
);
CREATE INDEX IF NOT EXISTS audit_calls_time ON audit_calls (time);
CREATE INDEX IF NOT EXISTS audit_calls_request ON audit_calls (request_id);
"""

# Set by the call's first event (decided, refused or forwarded); later events move its state on.
FIRST_COLUMNS = ("record_id", "first_seq", "last_seq", "time", "tool", "agent", "status", "source",
                 "decision_source", "rule", "approver", "header", "request_id", "waited_ms", "arguments", "shadow",
                 "principal_user")
# Columns added to the index after its first release: (name, type); a trail opened without one gets it, NULL
# for the calls before (their events have no such field, so NULL is what the chain says).
ADDED_COLUMNS = (("shadow", "TEXT"), ("principal_user", "TEXT"))
# Indexes on added columns: made once the columns are there (CALLS_SCHEMA runs before they are, on an old trail).
# "What did the agents do for Ada" is asked of a large trail, for a user among many: a page reads her rows alone.
ADDED_INDEXES = ("CREATE INDEX IF NOT EXISTS audit_calls_user ON audit_calls (principal_user, first_seq)",)
STATE_COLUMNS = ("last_seq", "status")
UPSERT = (f"INSERT INTO audit_calls ({', '.join(FIRST_COLUMNS)}) VALUES ({', '.join('?' * len(FIRST_COLUMNS))}) "  # noqa: S608
          f"ON CONFLICT (record_id) DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in STATE_COLUMNS)} "
          "WHERE audit_calls.last_seq < excluded.last_seq")

# Each event beside the index row of its call (NULL: none); the events the index does not reflect yet.
NEWEST_INDEXED = "SELECT e.seq, c.last_seq FROM audit_events e LEFT JOIN audit_calls c ON c.record_id = e.record_id"
UNINDEXED = ("SELECT e.seq, e.body FROM audit_events e LEFT JOIN audit_calls c ON c.record_id = e.record_id "
             "WHERE c.last_seq IS NULL OR c.last_seq < e.seq ORDER BY e.seq")

# A filter's name, and the SQL test of one row it adds (one `?` each).
EQUALS = ("tool", "status", "agent", "source", "decision_source", "rule", "approver", "header", "request_id",
          "shadow")
COLUMN_OF = {"user": "principal_user"}  # filters named apart from their column: each an equality too
BOUNDS = {"since": "time >= ?", "until": "time < ?", "until_seq": "last_seq <= ?"}
PAGE_SIZE = 50


def call_row(event: dict[str, Any], seq: int) -> tuple:
    """The row one event writes (a first event fills it; a later one only moves last_seq and status on)."""
    header = ((event.get("policy_input") or {}).get("agent") or {}).get("header")
    arguments = "" if event.get("arguments_sent") is None and event.get("arguments") is None else (
        canonical_json([event.get("arguments_sent"), event.get("arguments")]).decode())
    return (event["record_id"], seq, seq, event["time"], event["tool"], event["agent"], event["status"],
            event.get("source", ""), event.get("decision_source", ""), event.get("decision_rule"),
            event.get("approver"), header if isinstance(header, str) else None, event.get("request_id", ""),
            event.get("waited_ms"), arguments, strongest_shadow(event.get("shadow")),
            principal_user(event.get("policy_input")))


def principal_user(document: Any) -> str | None:
    """Who a call was for, as its policy input says (`principal.user`); None when no token or header named one."""
    principal = document.get("principal") if isinstance(document, dict) else None
    user = principal.get("user") if isinstance(principal, dict) else None
    return user if isinstance(user, str) and user else None


def strongest_shadow(shadow: Any) -> str | None:
    """The most restrictive effect among the shadow rules that matched a call: what the console filters on."""
    effects = {entry.get("effect") for entry in shadow or () if isinstance(entry, dict)}
    return next((effect for effect in ("deny", "ask", "allow") if effect in effects), None)


def rows_of_chain(events: list[tuple[int, dict[str, Any]]]) -> dict[str, tuple]:
    """What the table should hold for these (seq, event) pairs, in order: verify compares it with the table."""
    rows: dict[str, tuple] = {}
    for seq, event in events:
        row = call_row(event, seq)
        known = rows.get(row[0])
        rows[row[0]] = row if known is None else (*known[:2], seq, *known[3:6], row[6], *known[7:])
    return rows


def where(filters: dict[str, Any], like: str = "LIKE") -> tuple[str, list[Any]]:
    """The WHERE clause choosing calls by their current state, and its parameters. `like`: the dialect's
    case-insensitive LIKE (SQLite's LIKE folds ASCII letters; PostgreSQL's ILIKE)."""
    tests, params = ["1 = 1"], []
    for name in (*EQUALS, *COLUMN_OF):
        if filters.get(name) is not None:
            tests.append(f"{COLUMN_OF.get(name, name)} = ?")
            params.append(filters[name])
    for name, test in BOUNDS.items():
        if filters.get(name) is not None:
            tests.append(test)
            params.append(filters[name])
    if filters.get("search"):
        # in the JSON of the arguments; LIKE's own wildcards in the text are taken literally
        text = str(filters["search"]).replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        tests.append(f"arguments {like} ? ESCAPE '\\'")
        params.append(f"%{text}%")
    return " AND ".join(tests), params


def page_query(filters: dict[str, Any], before: int | None, after: int | None, size: int,
               like: str = "LIKE") -> tuple[str, list]:
    """The record ids of one page, newest first: older than `before`, or newer than `after` (read upwards)."""
    clause, params = where(filters, like)
    if after is not None:
        return (f"SELECT record_id, first_seq FROM audit_calls WHERE {clause} AND first_seq > ? "  # noqa: S608
                f"ORDER BY first_seq ASC LIMIT {int(size) + 1}", [*params, after])
    if before is not None:
        clause, params = f"{clause} AND first_seq < ?", [*params, before]
    return (f"SELECT record_id, first_seq FROM audit_calls WHERE {clause} "  # noqa: S608
            f"ORDER BY first_seq DESC LIMIT {int(size) + 1}", params)


def chart_queries(since: float, until: float, buckets: int, floor: str) -> dict[str, tuple[str, list]]:
    """The charts' aggregates over [since, until): calls by time bucket and status, denials by rule, top tools,
    and each answered approval's wait. `floor`: the dialect's integer floor of `{}`."""
    span = (until - since) / buckets
    window, bounds = "time >= ? AND time < ?", [since, until]
    bucket = floor.format("(time - ?) / ?")
    return {
        "calls": (f"SELECT {bucket}, status, COUNT(*) FROM audit_calls WHERE {window} "  # noqa: S608
                  "GROUP BY 1, 2", [since, span, *bounds]),
        "denials": ("SELECT COALESCE(rule, decision_source), COUNT(*) FROM audit_calls WHERE status = 'denied' AND "  # noqa: S608
                    f"{window} GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 10", bounds),
        "tools": (f"SELECT tool, COUNT(*) FROM audit_calls WHERE {window} GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 10",  # noqa: S608
                  bounds),
        "waits": (f"SELECT time, waited_ms FROM audit_calls WHERE waited_ms IS NOT NULL AND {window} "  # noqa: S608
                  "ORDER BY first_seq DESC LIMIT 500", bounds),
    }
