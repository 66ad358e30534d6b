"""The approvals channel: a gated call waits for a person, who answers from anywhere.

    toolkeeper approvals                  what waits: tool, arguments, argv, agent, age
    toolkeeper approve ap_7KQ2M4XD [--always]
    toolkeeper deny ap_7KQ2M4XD [--reason "not today"]

The commands call the admin API (`/toolkeeper/approvals`, on toolkeeper's own
port, behind the token in TOOLKEEPER_ADMIN_TOKEN). Waiting calls and "always"
answers live in the store, so a restart loses nothing: an approval given after
the call's request died is used by the same agent's next identical call.

An approval is for one agent, one tool and the SHA-256 of its canonical
arguments: approving one call never approves different arguments. "Always"
grants one agent one tool ("always allow this script"), whatever its
arguments, until revoked (`toolkeeper approvals --always`, `toolkeeper revoke
ID`); it never lifts a security rule's ask: approved --always, such a call is
approved once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from toolkeeper.common import canonical_json, sha256_hex
from toolkeeper.policy.consent import ConsentAnswer, ConsentRequest

log = logging.getLogger("toolkeeper")

ID_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I: read aloud and typed by people


def arguments_hash(arguments: dict[str, Any]) -> str:
    return sha256_hex(canonical_json(arguments))


def new_approval_id() -> str:
    return "ap_" + "".join(secrets.choice(ID_ALPHABET) for _ in range(8))


class ApprovalsConsent:
    can_ask = True

    def __init__(self, store: ApprovalsStore, timeout: float = 300, poll: float = 0.25):
        self.store = store
        self.timeout = timeout
        self.poll = poll
        self._answered: dict[str, asyncio.Event] = {}  # wakes a waiting call at once when this process answers

    async def ask(self, request: ConsentRequest) -> ConsentAnswer:
        grant = None if request.rule_asks else self.store.grant_for(request.agent, request.tool)
        if grant:
            return ConsentAnswer(True, grant["approver"], f"{request.tool} is always allowed for {request.agent} "
                                                          f"({grant['id']})", always=True)
        given = self.store.find_approval(request.agent, request.tool, request.args_hash, ("approved",))
        if given and self.store.settle_approval(given["id"], "used", None, None, only_from=("approved",)):
            return ConsentAnswer(True, given["approver"] or "approvals", "approved while no request waited")
        approval = self.store.find_approval(request.agent, request.tool, request.args_hash, ("waiting",))
        if approval is None:
            approval = {"id": new_approval_id(), "agent": request.agent, "tool": request.tool,
                        "args_hash": request.args_hash, "arguments": request.arguments, "argv": request.argv,
                        "created": time.time(), "status": "waiting", "why": request.reason, "rule": request.rule,
                        "source": request.source, "agent_header": request.agent_header}
            self.store.add_approval(approval)
        log.warning("waiting for approval %s: %s, because %s (toolkeeper approve %s, or deny)", approval["id"],
                    request.summary(), request.why(), approval["id"])
        return await self._wait(approval["id"])

    async def _wait(self, approval_id: str) -> ConsentAnswer:
        deadline = time.monotonic() + self.timeout
        event = self._answered.setdefault(approval_id, asyncio.Event())
        try:
            while True:
                current = self.store.get_approval(approval_id)
                if current is None:
                    return ConsentAnswer(False, "approvals", "the approval disappeared from the store")
                if current["status"] == "approved":
                    self.store.settle_approval(approval_id, "used", None, None, only_from=("approved",))
                    return ConsentAnswer(True, current["approver"] or "approvals", f"approved ({approval_id})",
                                         always=bool(current.get("granted")))
                if current["status"] in ("denied", "expired", "used"):
                    return ConsentAnswer(False, current["approver"] or "approvals",
                                         current["reason"] or f"the request was {current['status']}")
                left = deadline - time.monotonic()
                if left <= 0:
                    self.store.settle_approval(approval_id, "expired", None, f"no answer within {self.timeout:g} s")
                    return ConsentAnswer(False, "approvals", f"no one answered within {self.timeout:g} s")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(event.wait(), min(self.poll, left))  # other replicas: the poll
                event.clear()
        finally:
            self._answered.pop(approval_id, None)

    def answered(self, approval_id: str) -> None:
        event = self._answered.get(approval_id)
        if event is not None:
            event.set()


SCHEMA = """
CREATE TABLE IF NOT EXISTS approvals (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    tool TEXT NOT NULL,
    args_hash TEXT NOT NULL,    -- SHA-256 of the canonical arguments: an approval is for these only
    body BLOB NOT NULL,         -- what the person is shown: arguments, argv, why it asks, created
    status TEXT NOT NULL,       -- waiting | approved | denied | expired | used
    approver TEXT,
    reason TEXT,                -- the approver's, when denied
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS approvals_call ON approvals (agent, tool, args_hash, status);
CREATE TABLE IF NOT EXISTS always_grants (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    tool TEXT NOT NULL,
    approver TEXT NOT NULL,
    created REAL NOT NULL,
    revoked REAL                -- a grant answers calls until revoked
);
"""
APPROVAL_FIELDS = "id, agent, tool, args_hash, body, status, approver, reason, updated"
BODY_FIELDS = ("arguments", "argv", "created", "why", "rule", "source", "agent_header", "granted")
GRANT_FIELDS = ("id", "agent", "tool", "approver", "created")


class ApprovalsStore:
    """Waiting calls and "always" grants, in SQLite: they survive a restart."""

    def __init__(self, path: str | Path):
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    def _rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def add_approval(self, approval: dict) -> None:
        with self._lock:
            self._db.execute(f"INSERT INTO approvals ({APPROVAL_FIELDS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
                             _approval_row(approval))

    def get_approval(self, approval_id: str) -> dict | None:
        rows = self._rows(f"SELECT {APPROVAL_FIELDS} FROM approvals WHERE id = ?", (approval_id,))  # noqa: S608
        return _approval(rows[0]) if rows else None

    def find_approval(self, agent: str, tool: str, args_hash: str, statuses: tuple[str, ...]) -> dict | None:
        marks = ",".join("?" * len(statuses))
        rows = self._rows(f"SELECT {APPROVAL_FIELDS} FROM approvals WHERE agent = ? AND tool = ? "  # noqa: S608
                          f"AND args_hash = ? AND status IN ({marks}) ORDER BY updated DESC LIMIT 1",
                          (agent, tool, args_hash, *statuses))
        return _approval(rows[0]) if rows else None

    def list_approvals(self, status: str = "waiting") -> list[dict]:
        rows = self._rows(f"SELECT {APPROVAL_FIELDS} FROM approvals WHERE status = ? ORDER BY updated",  # noqa: S608
                          (status,))
        return [_approval(row) for row in rows]

    def settle_approval(self, approval_id: str, status: str, approver: str | None, reason: str | None,
                        only_from: tuple[str, ...] = ("waiting",), granted: str | None = None) -> bool:
        """Move an approval on, if it is still in one of `only_from`: True when it moved."""
        marks = ",".join("?" * len(only_from))
        with self._lock:
            row = self._db.execute("SELECT body FROM approvals WHERE id = ?", (approval_id,)).fetchone()
            body = {**orjson.loads(row[0]), "granted": granted} if row and granted else None
            moved = self._db.execute(
                f"UPDATE approvals SET status = ?, approver = COALESCE(?, approver), reason = COALESCE(?, reason), "  # noqa: S608
                f"body = COALESCE(?, body), updated = ? WHERE id = ? AND status IN ({marks})",
                (status, approver, reason, orjson.dumps(body) if body else None, time.time(), approval_id,
                 *only_from)).rowcount
        return moved == 1

    # -- always grants: one agent, one tool, until revoked ---------------------------------

    def grant(self, agent: str, tool: str, approver: str) -> str:
        grant_id = "al_" + "".join(secrets.choice(ID_ALPHABET) for _ in range(8))
        with self._lock:
            self._db.execute("UPDATE always_grants SET revoked = ? WHERE agent = ? AND tool = ? AND revoked IS NULL",
                             (time.time(), agent, tool))
            self._db.execute("INSERT INTO always_grants (id, agent, tool, approver, created) VALUES (?, ?, ?, ?, ?)",
                             (grant_id, agent, tool, approver, time.time()))
        return grant_id

    def grant_for(self, agent: str, tool: str) -> dict | None:
        rows = self._rows(f"SELECT {', '.join(GRANT_FIELDS)} FROM always_grants "  # noqa: S608
                          "WHERE agent = ? AND tool = ? AND revoked IS NULL", (agent, tool))
        return dict(zip(GRANT_FIELDS, rows[0], strict=True)) if rows else None

    def grants(self) -> list[dict]:
        rows = self._rows(f"SELECT {', '.join(GRANT_FIELDS)} FROM always_grants "  # noqa: S608
                          "WHERE revoked IS NULL ORDER BY created")
        return [dict(zip(GRANT_FIELDS, row, strict=True)) for row in rows]

    def revoke(self, grant_id: str) -> bool:
        with self._lock:
            return self._db.execute("UPDATE always_grants SET revoked = ? WHERE id = ? AND revoked IS NULL",
                                    (time.time(), grant_id)).rowcount == 1

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _approval_row(approval: dict) -> tuple:
    body = {key: approval.get(key) for key in BODY_FIELDS}
    return (approval["id"], approval["agent"], approval["tool"], approval["args_hash"], orjson.dumps(body),
            approval["status"], approval.get("approver"), approval.get("reason"), approval.get("updated", time.time()))


def _approval(row: tuple) -> dict:
    approval_id, agent, tool, args_hash, body, status, approver, reason, updated = row
    return {"id": approval_id, "agent": agent, "tool": tool, "args_hash": args_hash, **orjson.loads(body),
            "status": status, "approver": approver, "reason": reason, "updated": updated}
