"""Browser sessions for the console: signed cookies that expire, die with their token, and carry a CSRF key.

A person signs in once with a token (the admin token, or a named one from
`toolkeeper tokens add`); the session cookie says who, with which role, until
when, and a fingerprint of the token, signed with a key derived from the
admin token. Nothing is kept per session, so every replica that shares the
admin token and the store accepts it; and since each use looks the named token
up again, revoking the token (`toolkeeper tokens revoke NAME`) ends its
sessions everywhere. The cookie is HttpOnly and SameSite=Strict.

Every form a signed-in page posts carries `csrf`, an HMAC of the session: a
post from another site has neither the cookie (SameSite) nor the key.
Failed sign-ins are counted per client address: past `MAX_FAILURES` in
`FAILURE_WINDOW` seconds, sign-in answers 429 until the window passes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections import deque

from toolkeeper.store import Store

SESSION_COOKIE = "toolkeeper_session"
SESSION_SECONDS = 8 * 3600
MAX_FAILURES = 10
FAILURE_WINDOW = 300.0
ADMIN = "admin"  # the admin token's holder: its name and role


def same(given: str, expected: str) -> bool:
    """A constant-time comparison that takes any text a client sent (undecodable bytes arrive as surrogates)."""
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode("utf-8", "surrogateescape"))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Attempts:
    """Attempts per client address in a sliding window: past `most` in `window` seconds, the address waits."""

    def __init__(self, most: int = MAX_FAILURES, window: float = FAILURE_WINDOW):
        self.most = most
        self.window = window
        self.failures: dict[str, deque[float]] = {}

    def refused_for(self, address: str) -> float:
        """Seconds `address` must wait before it may try to sign in again (0: it may)."""
        now = time.monotonic()
        failures = self.failures.get(address)
        while failures and failures[0] < now - self.window:
            failures.popleft()
        if not failures:
            self.failures.pop(address, None)
            return 0.0
        return failures[0] + self.window - now if len(failures) >= self.most else 0.0

    def attempt(self, address: str) -> float:
        """Count a sign-in attempt before its token is looked up (so parallel guesses all count): the seconds
        `address` must wait first, 0 when it may try. `succeeded` takes a good one back."""
        wait = self.refused_for(address)
        if wait:
            return wait
        if address not in self.failures and len(self.failures) >= 10_000:  # the least recent go, not everyone
            for stale in list(self.failures)[:1000]:
                del self.failures[stale]
        failures = self.failures.pop(address, deque())
        failures.append(time.monotonic())
        self.failures[address] = failures  # last in the dict's order: the most recent
        return 0.0

    def succeeded(self, address: str) -> None:
        failures = self.failures.get(address)
        if failures:
            failures.pop()


class Sessions(Attempts):
    def __init__(self, admin_token: str, store: Store | None):
        super().__init__()
        self.admin_token = admin_token
        self.store = store
        self.key = hmac.new(admin_token.encode(), b"toolkeeper console sessions", hashlib.sha256).digest()

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self.key, payload.encode("utf-8", "surrogateescape"), hashlib.sha256).digest())

    async def open(self, token: str) -> tuple[str, tuple[str, str]] | None:
        """The cookie value for a session of `token`'s holder, and who that is; None for an unknown token."""
        if same(token, self.admin_token):
            name, role, fingerprint = ADMIN, ADMIN, ADMIN
        elif self.store is not None and token.isascii() and (holder := await self.store.token_holder(token)):
            name, role = holder
            fingerprint = hashlib.sha256(token.encode()).hexdigest()[:16]
        else:
            return None
        payload = _b64(f"{name}\n{int(time.time() + SESSION_SECONDS)}\n{fingerprint}".encode())
        return f"{payload}.{self._sign(payload)}", (name, role)

    async def holder(self, cookie: str) -> tuple[str, str] | None:
        """(name, role) of a session still in force: signed, not expired, its token not revoked or replaced."""
        payload, _, signature = cookie.partition(".")
        if not payload or not same(signature, self._sign(payload)):
            return None
        try:
            name, expires, fingerprint = _unb64(payload).decode().split("\n")
        except (ValueError, UnicodeError):
            return None
        if int(expires) < time.time():
            return None
        if name == ADMIN and fingerprint == ADMIN:
            return ADMIN, ADMIN
        found = await self.store.token_named(name) if self.store is not None else None
        if found is None or not same(fingerprint, found[1][:16]):
            return None
        return name, found[0]  # the role as it is now

    def csrf(self, cookie: str) -> str:
        signed = b"csrf\n" + cookie.encode("utf-8", "surrogateescape")
        return _b64(hmac.new(self.key, signed, hashlib.sha256).digest())[:32]

    def csrf_holds(self, cookie: str, given: str) -> bool:
        return bool(cookie) and same(given, self.csrf(cookie))
