"""People's console sessions and the sign-ins under way (mixed into SQLStore).

A session is kept here, not in its cookie, so that every replica sees it and
signing out ends it everywhere at once. It is found by the SHA-256 of its
cookie: whoever reads the database holds no cookie that opens one. The
refresh and ID tokens are kept `sealed` by the caller, with a key only the
cookie gives.

A sign-in under way (between the redirect to the provider and its callback)
is found by the SHA-256 of its `state`, and taken once: a callback replayed,
or one whose state this toolkeeper never sent, finds nothing.
"""

from __future__ import annotations

from typing import Any

import orjson

SESSION_FIELDS = "issuer, subject, person, sealed, created, refreshed, refreshing, expires"


def _session(row: tuple) -> dict[str, Any]:
    issuer, subject, person, sealed, created, refreshed, refreshing, expires = row
    return {"issuer": issuer, "subject": subject, "person": orjson.loads(person),
            "sealed": bytes(sealed) if sealed is not None else None, "created": created, "refreshed": refreshed,
            "refreshing": refreshing, "expires": expires}


class PeopleSessions:
    async def add_sign_in(self: Any, state_sha256: str, body: dict[str, Any], ttl: float) -> None:
        now = self.now()
        await self._atomic([
            ("DELETE FROM console_sign_ins WHERE expires <= ?", (now,)),  # abandoned ones go as new ones come
            ("INSERT INTO console_sign_ins (state_sha256, body, expires) VALUES (?, ?, ?)",
             (state_sha256, orjson.dumps(body), now + ttl)),
        ])

    async def take_sign_in(self: Any, state_sha256: str) -> dict[str, Any] | None:
        """The sign-in with this state, removed: the first callback that brings it has it, no later one."""
        rows = await self._fetch("DELETE FROM console_sign_ins WHERE state_sha256 = ? RETURNING body, expires",
                                 (state_sha256,))
        if not rows or rows[0][1] <= self.now():
            return None
        return orjson.loads(rows[0][0])

    async def open_console_session(self: Any, key_sha256: str, person: dict[str, Any], sealed: bytes | None,
                                   ttl: float) -> None:
        now = self.now()
        await self._execute(f"INSERT INTO console_sessions (key_sha256, {SESSION_FIELDS}) "  # noqa: S608
                            "VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?)",
                            (key_sha256, person["issuer"], person["subject"], orjson.dumps(person), sealed, now, now,
                             now + ttl))
        await self._wrote()

    async def console_session(self: Any, key_sha256: str) -> dict[str, Any] | None:
        """A session in force (not ended, not expired)."""
        rows = await self._fetch(f"SELECT {SESSION_FIELDS} FROM console_sessions "  # noqa: S608
                                 "WHERE key_sha256 = ? AND expires > ?", (key_sha256, self.now()))
        return _session(rows[0]) if rows else None

    async def claim_session_refresh(self: Any, key_sha256: str, due: float, lease: float) -> bool:
        """Whether this process is the one to read the person's groups again: the session's were read at or
        before `due`, and no other process holds the lease (one refresh token redeemed once, not by each)."""
        now = self.now()
        return await self._execute(
            "UPDATE console_sessions SET refreshing = ? WHERE key_sha256 = ? AND refreshed <= ? AND expires > ? "
            "AND (refreshing IS NULL OR refreshing < ?)", (now + lease, key_sha256, due, now, now)) == 1

    async def refreshed_console_session(self: Any, key_sha256: str, person: dict[str, Any],
                                        sealed: bytes | None) -> None:
        await self._execute("UPDATE console_sessions SET person = ?, sealed = COALESCE(?, sealed), refreshed = ?, "
                            "refreshing = NULL WHERE key_sha256 = ?",
                            (orjson.dumps(person), sealed, self.now(), key_sha256))

    async def release_session_refresh(self: Any, key_sha256: str) -> None:
        """The refresh could not be done now (the provider did not answer): the next request tries again."""
        await self._execute("UPDATE console_sessions SET refreshing = NULL WHERE key_sha256 = ?", (key_sha256,))

    async def end_console_session(self: Any, key_sha256: str) -> dict[str, Any] | None:
        """The session, ended: it was in force (what it held, for the provider's sign-out), or None."""
        rows = await self._fetch(f"DELETE FROM console_sessions WHERE key_sha256 = ? "  # noqa: S608
                                 f"RETURNING {SESSION_FIELDS}", (key_sha256,))
        return _session(rows[0]) if rows else None
