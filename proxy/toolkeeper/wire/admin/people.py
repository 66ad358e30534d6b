"""Console sessions for people signed in through the OpenID provider, kept in the store.

The cookie is 256 random bits (`tkp_...`); the store keeps its SHA-256, the
person (subject, name, email, groups, roles), and the refresh and ID tokens
sealed (AES-GCM) with a key derived from the cookie: a copy of the database
opens no session and redeems no refresh token. Every replica sharing the
store sees a session, and signing out deletes it, so it ends everywhere.

Past the refresh window (`auth.oidc.refresh`), the next request reads the
person's groups again with the refresh token, before it is served: one
process does (a lease in the store), the others wait for its answer. A person
whose groups no longer give a role, or whose provider refuses the refresh,
is signed out; a provider that does not answer is said so (IssuerUnavailable:
nothing is served on roles that could not be checked again).

A sign-in under way is kept in the store under the SHA-256 of its `state`,
with its nonce and PKCE verifier and the SHA-256 of a random value the
browser holds in a cookie of its own: a callback is served only once, in the
browser that began it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import secrets

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from toolkeeper.common import printable
from toolkeeper.identity import Grant, IdentityError, IssuerUnavailable, OidcClient, Person, SignIn, SignInRefused
from toolkeeper.store import Store

log = logging.getLogger("toolkeeper")

PERSON_PREFIX = "tkp_"  # a person's session cookie; a token session's is `payload.signature`
SIGN_IN_COOKIE = "toolkeeper_sign_in"
SIGN_IN_SECONDS = 600.0  # from the redirect to the provider to its callback
PERSON_SECONDS = 8 * 3600  # a session's whole life, refreshed or not: then the person signs in again
REFRESH_LEASE = 15.0  # seconds a process holds a session's refresh
REFRESH_WAIT = 0.1  # seconds between looks while another process refreshes


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def _cookie_key(cookie: str, purpose: bytes) -> bytes:
    return hmac.new(cookie.encode("utf-8", "surrogateescape"), purpose, hashlib.sha256).digest()


def is_person_cookie(cookie: str) -> bool:
    return cookie.startswith(PERSON_PREFIX)


class PersonSessions:
    def __init__(self, client: OidcClient, store: Store):
        self.client = client
        self.store = store

    # -- signing in -----------------------------------------------------------------------------

    async def begin(self, goto: str) -> tuple[str, str]:
        """A sign-in: the provider's URL to send the browser to, and the value of its binding cookie."""
        sign_in = await self.client.start()
        binding = secrets.token_urlsafe(32)
        await self.store.add_sign_in(_sha256(sign_in.state), {
            "nonce": sign_in.nonce, "verifier": sign_in.verifier, "binding": _sha256(binding), "next": goto,
        }, SIGN_IN_SECONDS)
        return sign_in.url, binding

    async def finish(self, state: str, code: str, binding: str, replacing: str = "") -> tuple[str, Person, str]:
        """The callback's code redeemed for the sign-in its state names: the new session's cookie, the person,
        and where they were going. SignInRefused (NoRole among them) or IssuerUnavailable otherwise. `replacing`:
        the browser's session until now, which ends (a session is never carried over a sign-in)."""
        pending = await self.store.take_sign_in(_sha256(state)) if state else None
        if pending is None:
            raise SignInRefused("this sign-in is unknown to toolkeeper: it was already used, it expired, or its "
                                "`state` is not one toolkeeper sent. Start again from the sign-in page.")
        if not binding or not hmac.compare_digest(_sha256(binding), str(pending.get("binding", ""))):
            raise SignInRefused("this sign-in was begun in another browser (or its cookie is gone): start again "
                                "from the sign-in page, in this browser.")
        grant = await self.client.redeem(code, SignIn(state, pending["nonce"], pending["verifier"]))
        if is_person_cookie(replacing):
            await self.store.end_console_session(_sha256(replacing))
        cookie = PERSON_PREFIX + secrets.token_urlsafe(32)
        await self.store.open_console_session(_sha256(cookie), grant.person.document(), self._seal(cookie, grant),
                                              PERSON_SECONDS)
        log.info("%s signed in to the console (%s)", printable(grant.person.handle), ", ".join(grant.person.roles))
        return cookie, grant.person, str(pending.get("next") or "")

    async def abandon(self, state: str) -> None:
        """The provider refused the sign-in: its state is spent."""
        if state:
            await self.store.take_sign_in(_sha256(state))

    # -- a session in force ---------------------------------------------------------------------

    async def person(self, cookie: str) -> Person | None:
        """Who holds this session, their groups read again when the refresh window has passed; None when it is
        not (or no longer) in force. IssuerUnavailable when it needed the provider, and the provider is away."""
        key = _sha256(cookie)
        session = await self.store.console_session(key)
        if session is None:
            return None
        due = self.store.now() - self.client.refresh_every
        while session["refreshed"] <= due:
            if await self.store.claim_session_refresh(key, due, REFRESH_LEASE):
                return await self._refresh(cookie, key, session)
            await asyncio.sleep(REFRESH_WAIT)  # another process refreshes it: its answer is the one to serve
            session = await self.store.console_session(key)
            if session is None:
                return None
            if session["refreshing"] is None and session["refreshed"] <= due:  # it could not: the provider is away
                raise IssuerUnavailable(f"the identity provider at {self.client.issuer.url} could not be asked "
                                        "whether this session still holds")
        return Person.from_document(session["person"])

    async def _refresh(self, cookie: str, key: str, session: dict) -> Person | None:
        person = Person.from_document(session["person"])
        tokens = self._unseal(cookie, session["sealed"])
        try:
            if not tokens.get("refresh_token"):
                raise SignInRefused("the provider gave this session no refresh token")
            grant = await self.client.refresh(tokens["refresh_token"], person)
        except IssuerUnavailable:
            await self.store.release_session_refresh(key)
            raise
        except IdentityError as exc:  # refused by the provider, or its answer refused here: the session is over
            log.info("%s's console session ended: %s", printable(person.handle), printable(str(exc)))
            await self.store.end_console_session(key)
            return None
        if not grant.person.roles:
            log.info("%s's console session ended: their groups (%s) no longer give a role",
                     printable(person.handle), printable(", ".join(grant.person.groups)))
            await self.store.end_console_session(key)
            return None
        kept = Grant(grant.person, grant.refresh_token, grant.id_token or tokens.get("id_token"))
        await self.store.refreshed_console_session(key, grant.person.document(), self._seal(cookie, kept))
        return grant.person

    async def end(self, cookie: str) -> str | None:
        """Signs the session out everywhere: the ID token it was opened with (the provider's sign-out hint)."""
        session = await self.store.end_console_session(_sha256(cookie))
        if session is None:
            return None
        return self._unseal(cookie, session["sealed"]).get("id_token")

    def csrf(self, cookie: str) -> str:
        """The key a session's forms send back: derived from the cookie, which another site cannot read."""
        return base64.urlsafe_b64encode(_cookie_key(cookie, b"toolkeeper csrf")).decode().rstrip("=")[:32]

    def csrf_holds(self, cookie: str, given: str) -> bool:
        return bool(cookie) and hmac.compare_digest(given.encode("utf-8", "surrogateescape"),
                                                    self.csrf(cookie).encode())

    # -- the sealed tokens ----------------------------------------------------------------------

    @staticmethod
    def _seal(cookie: str, grant: Grant) -> bytes:
        nonce = secrets.token_bytes(12)
        body = orjson.dumps({"refresh_token": grant.refresh_token, "id_token": grant.id_token})
        return nonce + AESGCM(_cookie_key(cookie, b"toolkeeper sealed tokens")).encrypt(nonce, body, None)

    @staticmethod
    def _unseal(cookie: str, sealed: bytes | None) -> dict:
        if not sealed:
            return {}
        try:
            opened = AESGCM(_cookie_key(cookie, b"toolkeeper sealed tokens")).decrypt(sealed[:12], sealed[12:], None)
        except (InvalidTag, ValueError):
            return {}  # a row that is not this cookie's: nothing to refresh with, so the session ends
        return orjson.loads(opened)
