"""The store: what toolkeeper remembers between requests, written once over two databases.

- hidden exchanges, so the agent's next request is given back the declared calls
  and results it never saw;
- links: an id the agent received (a response id, a forwarded call) and what it
  stands for;
- the retry memo: the result of a declared call, by the request that ran it, so a
  retried request never runs a side effect twice; while the first attempt runs,
  its row says so (an owner and a lease it renews), and a retry arriving at any
  process waits for the result; a lease not renewed (its process died) lapses
  within `LEASE` seconds and the retry runs the call;
- approvals and always grants, with a wake-up when one is answered (at once in
  this process; through the database for the others);
- the agents' sessions: the labels each conversation's calls brought (sessions.py);
- what the limits counted (limits.py);
- where each ask was sent, and whether it arrived (deliveries.py).

`SQLStore` holds every statement; a dialect (sqlite.py, postgres.py) says how
to run one. The statements use `?` and portable SQL (ON CONFLICT, RETURNING).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from toolkeeper.store.deliveries import Deliveries
from toolkeeper.store.limits import KEPT as LIMITS_KEPT
from toolkeeper.store.limits import PURGE as LIMITS_PURGE
from toolkeeper.store.limits import LimitCounts
from toolkeeper.store.people import PeopleSessions
from toolkeeper.store.pins import Pins
from toolkeeper.store.sessions import PURGE as SESSIONS_PURGE
from toolkeeper.store.sessions import Sessions

log = logging.getLogger("toolkeeper")

LEASE = 5.0  # seconds an unfinished attempt holds its call without renewing
PURGE_EVERY = 200  # writes
APPROVAL_FIELDS = "id, agent, tool, args_hash, body, status, approver, reason, updated, granted, approver_identity"
# `principal_user`, `principal_issuer`: the person the call was asked for on behalf of (four eyes: never its
# approver), and who vouched for them
BODY_FIELDS = ("arguments", "argv", "created", "expires", "why", "rule", "source", "agent_header", "principal_user",
               "principal_issuer")
GRANT_FIELDS = ("id", "agent", "tool", "approver", "created", "approver_identity")
ID_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I: read aloud and typed by people


class StoreError(Exception):
    """The store did not answer (or refused): the request is refused rather than half done."""


@dataclass(frozen=True)
class Claim:
    """A retry memo lookup: `owner` when this attempt may run the call, `answer` when one already did."""

    owner: str | None = None
    answer: str | None = None

    @property
    def running_elsewhere(self) -> bool:
        return self.owner is None and self.answer is None


def new_id(prefix: str) -> str:
    return prefix + "".join(secrets.choice(ID_ALPHABET) for _ in range(8))


class Tokens:
    """Named tokens, each with a role, kept as the SHA-256 of the token (mixed into SQLStore)."""

    async def add_token(self: Any, name: str, role: str) -> str:
        """A new token for `name`, returned once; a name already in force is refused (revoke it first)."""
        token = "tk_" + secrets.token_urlsafe(24)
        taken = await self._fetch(  # one statement: two adds at once cannot both win
            "INSERT INTO tokens (name, role, token_sha256, created) VALUES (?, ?, ?, ?) ON CONFLICT (name) DO UPDATE "
            "SET role = excluded.role, token_sha256 = excluded.token_sha256, created = excluded.created, "
            "revoked = NULL WHERE tokens.revoked IS NOT NULL RETURNING name",
            (name, role, hashlib.sha256(token.encode()).hexdigest(), self.now()))
        if not taken:
            raise StoreError(f"a token named {name!r} is in force: revoke it first")
        return token

    async def token_holder(self: Any, token: str) -> tuple[str, str] | None:
        """(name, role) of a token in force."""
        rows = await self._fetch("SELECT name, role FROM tokens WHERE token_sha256 = ? AND revoked IS NULL",
                                 (hashlib.sha256(token.encode()).hexdigest(),))
        return (rows[0][0], rows[0][1]) if rows else None

    async def token_named(self: Any, name: str) -> tuple[str, str] | None:
        """(role, SHA-256 of the token) of the token in force under `name`: a browser session is bound to it."""
        rows = await self._fetch("SELECT role, token_sha256 FROM tokens WHERE name = ? AND revoked IS NULL", (name,))
        return (rows[0][0], rows[0][1]) if rows else None

    async def list_tokens(self: Any) -> list[dict]:
        rows = await self._fetch("SELECT name, role, created FROM tokens WHERE revoked IS NULL ORDER BY name")
        return [{"name": name, "role": role, "created": created} for name, role, created in rows]

    async def revoke_token(self: Any, name: str) -> bool:
        return await self._execute("UPDATE tokens SET revoked = ? WHERE name = ? AND revoked IS NULL",
                                   (self.now(), name)) == 1


class SQLStore(Tokens, Pins, PeopleSessions, Sessions, LimitCounts, Deliveries):
    """Every operation, as SQL; the dialects implement `_fetch`, `_execute` and `_atomic`."""

    location = ""
    poll = 0.1  # seconds between looks at an approval answered by another process

    def __init__(self) -> None:
        self._writes = 0
        self._watchers: dict[str, set[asyncio.Event]] = {}
        self._purging: asyncio.Task[None] | None = None

    def now(self) -> float:
        """The time leases are written and read in (a dialect may follow the database's clock)."""
        return time.time()

    # -- the dialect's part -------------------------------------------------------------

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        raise NotImplementedError

    async def _execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """A statement that changes rows: how many it changed."""
        raise NotImplementedError

    async def _atomic(self, statements: list[tuple[str, Sequence[Any]]]) -> list[list[tuple]]:
        """The statements in one transaction: each one's rows (none for a statement that returns none)."""
        raise NotImplementedError

    async def _announce(self, approval_id: str) -> None:
        """Tell the other processes an approval moved (PostgreSQL: NOTIFY; SQLite: they poll)."""

    async def check(self) -> None:
        """For /readyz: raises when the store does not answer."""
        await self._fetch("SELECT 1")

    async def close(self) -> None:
        raise NotImplementedError

    # -- hidden exchanges ---------------------------------------------------------------

    async def put_exchange(self, key: str, loose_key: str, exchange: dict, ttl: float) -> None:
        await self._execute("INSERT INTO exchanges (key, loose_key, body, expires) VALUES (?, ?, ?, ?) "
                            "ON CONFLICT (key) DO UPDATE SET loose_key = excluded.loose_key, body = excluded.body, "
                            "expires = excluded.expires", (key, loose_key, orjson.dumps(exchange), self.now() + ttl))
        await self._wrote()

    async def find_exchanges(self, loose_keys: list[str]) -> dict[str, list[tuple[str, dict | None]]]:
        """loose key -> [(full key, exchange or None when expired)]."""
        found: dict[str, list[tuple[str, dict | None]]] = {}
        now = self.now()
        for start in range(0, len(loose_keys), 500):
            batch = loose_keys[start:start + 500]
            rows = await self._fetch("SELECT loose_key, key, body, expires FROM exchanges "  # noqa: S608
                                     f"WHERE loose_key IN ({marks(batch)})", batch)
            for loose, key, body, expires in rows:
                exchange = orjson.loads(body) if body is not None and expires > now else None
                found.setdefault(loose, []).append((key, exchange))
        return found

    # -- links ----------------------------------------------------------------------------

    async def put_link(self, key: str, value: dict, ttl: float) -> None:
        await self._execute("INSERT INTO links (key, value, expires) VALUES (?, ?, ?) ON CONFLICT (key) DO UPDATE "
                            "SET value = excluded.value, expires = excluded.expires",
                            (key, orjson.dumps(value), self.now() + ttl))
        await self._wrote()

    async def get_links(self, keys: list[str]) -> dict[str, dict]:
        if not keys:
            return {}
        rows = await self._fetch(f"SELECT key, value FROM links WHERE key IN ({marks(keys)}) "  # noqa: S608
                                 "AND expires > ?", (*keys, self.now()))
        return {key: orjson.loads(value) for key, value in rows}

    async def get_link(self, key: str) -> dict | None:
        return (await self.get_links([key])).get(key)

    async def take_link(self, key: str) -> dict | None:
        """The link, removed: whoever takes it first has it."""
        rows = await self._fetch("DELETE FROM links WHERE key = ? AND expires > ? RETURNING value", (key, self.now()))
        return orjson.loads(rows[0][0]) if rows else None

    async def take_expired_links(self) -> list[dict]:
        """The links whose time ran out, removed."""
        rows = await self._fetch("DELETE FROM links WHERE expires <= ? RETURNING value", (self.now(),))
        return [orjson.loads(row[0]) for row in rows]

    # -- the retry memo -------------------------------------------------------------------

    async def claim_call(self, key: str, window: float) -> Claim:
        """Run it here (a claim), take the answer an earlier attempt left, or learn it still runs elsewhere."""
        owner, now = secrets.token_hex(8), self.now()
        taken = await self._fetch(
            "INSERT INTO call_results (key, answer, owner, lease, expires) VALUES (?, NULL, ?, ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET answer = NULL, owner = excluded.owner, lease = excluded.lease, "
            "expires = excluded.expires WHERE (call_results.answer IS NULL AND call_results.lease < ?) "
            "OR (call_results.answer IS NOT NULL AND call_results.expires < ?) RETURNING owner",
            (key, owner, now + LEASE, now + window, now, now))
        if taken and taken[0][0] == owner:
            await self._wrote()
            return Claim(owner=owner)
        rows = await self._fetch("SELECT answer FROM call_results WHERE key = ?", (key,))
        return Claim(answer=rows[0][0] if rows else None)

    async def renew_claim(self, key: str, owner: str) -> bool:
        return await self._execute("UPDATE call_results SET lease = ? WHERE key = ? AND owner = ? AND answer IS NULL",
                                   (self.now() + LEASE, key, owner)) == 1

    async def finish_call(self, key: str, owner: str, answer: str, window: float) -> None:
        await self._execute("UPDATE call_results SET answer = ?, expires = ? WHERE key = ? AND owner = ?",
                            (answer, self.now() + window, key, owner))

    async def release_call(self, key: str, owner: str) -> None:
        """The attempt ended without an answer to keep (cancelled, denied): a retry runs it afresh."""
        await self._execute("DELETE FROM call_results WHERE key = ? AND owner = ? AND answer IS NULL", (key, owner))

    async def _wrote(self) -> None:
        """Every PURGE_EVERY writes, a purge in the background: no request waits for it or fails with it."""
        self._writes += 1
        if self._writes % PURGE_EVERY == 0 and self._purging is None:
            self._purging = asyncio.get_running_loop().create_task(self._purge_quietly())

    async def _purge_quietly(self) -> None:
        try:
            await self.purge()
        except StoreError as exc:
            log.warning("the store's purge of expired entries failed (tried again later): %s", exc)
        finally:
            self._purging = None

    async def _purge_ended(self) -> None:
        """Before the store closes: a purge under way is let finish (a few statements), so none runs on a closed
        database."""
        if self._purging is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._purging)

    async def purge(self, now: float | None = None) -> None:
        """Expired exchanges lose their body at once, and their keys a day later."""
        now = now or self.now()
        await self._atomic([
            ("UPDATE exchanges SET body = NULL WHERE expires <= ? AND body IS NOT NULL", (now,)),
            ("DELETE FROM exchanges WHERE body IS NULL AND expires <= ?", (now - 86400,)),
            ("DELETE FROM call_results WHERE expires <= ? AND (answer IS NOT NULL OR lease <= ?)", (now, now)),
            ("DELETE FROM links WHERE expires <= ?", (now - 86400,)),  # a day to be taken
            ("DELETE FROM console_sessions WHERE expires <= ?", (now,)),
            ("DELETE FROM console_sign_ins WHERE expires <= ?", (now,)),
            *((statement, (now,)) for statement in SESSIONS_PURGE),
            *((statement, (now - LIMITS_KEPT,)) for statement in LIMITS_PURGE),
            ("DELETE FROM notify_deliveries WHERE updated <= ?", (now - LIMITS_KEPT,)),
        ])

    # -- approvals ------------------------------------------------------------------------

    async def add_approval(self, approval: dict) -> None:
        body = {key: approval.get(key) for key in BODY_FIELDS}
        await self._execute(f"INSERT INTO approvals ({APPROVAL_FIELDS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
                            (approval["id"], approval["agent"], approval["tool"], approval["args_hash"],
                             orjson.dumps(body), approval["status"], approval.get("approver"),
                             approval.get("reason"), approval.get("updated", self.now()), None, None))

    async def get_approval(self, approval_id: str) -> dict | None:
        rows = await self._fetch(f"SELECT {APPROVAL_FIELDS} FROM approvals WHERE id = ?", (approval_id,))  # noqa: S608
        return _approval(rows[0]) if rows else None

    async def find_approval(self, agent: str, tool: str, args_hash: str, statuses: tuple[str, ...]) -> dict | None:
        rows = await self._fetch(f"SELECT {APPROVAL_FIELDS} FROM approvals WHERE agent = ? AND tool = ? "  # noqa: S608
                                 f"AND args_hash = ? AND status IN ({marks(statuses)}) ORDER BY updated DESC LIMIT 1",
                                 (agent, tool, args_hash, *statuses))
        return _approval(rows[0]) if rows else None

    async def list_approvals(self, status: str = "waiting") -> list[dict]:
        rows = await self._fetch(f"SELECT {APPROVAL_FIELDS} FROM approvals WHERE status = ? "  # noqa: S608
                                 "ORDER BY updated", (status,))
        return [_approval(row) for row in rows]

    async def settle_approval(self, approval_id: str, status: str, approver: str | None, reason: str | None,
                              only_from: tuple[str, ...] = ("waiting",), granted: str | None = None,
                              identity: dict[str, Any] | None = None) -> bool:
        """Move an approval on, if it is still in one of `only_from`: True when it moved (and waiters are woken).
        `identity`: the approver as a person signed in through the provider."""
        moved = await self._execute(
            "UPDATE approvals SET status = ?, approver = COALESCE(?, approver), reason = COALESCE(?, reason), "  # noqa: S608
            "granted = COALESCE(?, granted), approver_identity = COALESCE(?, approver_identity), updated = ? "
            f"WHERE id = ? AND status IN ({marks(only_from)})",
            (status, approver, reason, granted, _json(identity), self.now(), approval_id, *only_from)) == 1
        if moved:
            self.wake(approval_id)
            with contextlib.suppress(StoreError):  # the others still poll
                await self._announce(approval_id)
        return moved

    async def approval_moved(self, approval_id: str, timeout: float) -> None:
        """Return when the approval may have moved: at once when it moves, at worst after `timeout` or a poll."""
        event = asyncio.Event()
        self._watchers.setdefault(approval_id, set()).add(event)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(timeout, self.poll)):  # not wait_for: see wire/server.py
                    await event.wait()
        finally:
            watchers = self._watchers.get(approval_id, set())
            watchers.discard(event)
            if not watchers:
                self._watchers.pop(approval_id, None)

    def wake(self, approval_id: str) -> None:
        for event in self._watchers.get(approval_id, ()):
            event.set()

    # -- always grants: one agent, one tool, until revoked --------------------------------

    async def grant(self, agent: str, tool: str, approver: str, identity: dict[str, Any] | None = None) -> str:
        grant_id, now = new_id("al_"), self.now()
        await self._atomic([
            ("UPDATE always_grants SET revoked = ? WHERE agent = ? AND tool = ? AND revoked IS NULL",
             (now, agent, tool)),
            ("INSERT INTO always_grants (id, agent, tool, approver, created, approver_identity) "
             "VALUES (?, ?, ?, ?, ?, ?)", (grant_id, agent, tool, approver, now, _json(identity))),
        ])
        return grant_id

    async def grant_for(self, agent: str, tool: str) -> dict | None:
        rows = await self._fetch(f"SELECT {', '.join(GRANT_FIELDS)} FROM always_grants "  # noqa: S608
                                 "WHERE agent = ? AND tool = ? AND revoked IS NULL", (agent, tool))
        return _grant(rows[0]) if rows else None

    async def grants(self) -> list[dict]:
        rows = await self._fetch(f"SELECT {', '.join(GRANT_FIELDS)} FROM always_grants "  # noqa: S608
                                 "WHERE revoked IS NULL ORDER BY created")
        return [_grant(row) for row in rows]

    async def revoke(self, grant_id: str) -> bool:
        return await self._execute("UPDATE always_grants SET revoked = ? WHERE id = ? AND revoked IS NULL",
                                   (self.now(), grant_id)) == 1


def marks(values: Sequence[Any]) -> str:
    return ",".join("?" * len(values))


def _json(value: dict[str, Any] | None) -> bytes | None:
    return orjson.dumps(value) if value is not None else None


def _approval(row: tuple) -> dict:
    approval_id, agent, tool, args_hash, body, status, approver, reason, updated, granted, identity = row
    shown = orjson.loads(body)
    return {"id": approval_id, "agent": agent, "tool": tool, "args_hash": args_hash, **shown, "status": status,
            "approver": approver, "reason": reason, "updated": updated,
            "granted": granted or shown.get("granted"),  # before schema 2, in the body
            "approver_identity": orjson.loads(identity) if identity is not None else None}


def _grant(row: tuple) -> dict:
    grant = dict(zip(GRANT_FIELDS, row, strict=True))
    identity = grant["approver_identity"]
    return {**grant, "approver_identity": orjson.loads(identity) if identity is not None else None}
