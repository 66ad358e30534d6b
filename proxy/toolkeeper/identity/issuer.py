"""An OpenID provider or OAuth authorization server as toolkeeper reads it: its metadata and its signing keys.

Discovery reads `{issuer}/.well-known/openid-configuration` (falling back to
RFC 8414's `oauth-authorization-server`), and refuses a document whose
`issuer` is not the configured one, as OpenID Connect Discovery requires.
The keys (JWKS) are cached; a token signed with a key id the cache does not
hold makes one refetch (at most one every `REFETCH_EVERY` seconds, so a flood
of made-up key ids cannot turn into a flood of fetches), which is how a key
the provider has rotated in is picked up. When the provider does not answer,
keys fetched within `STALE_FOR` keep serving; past that, or with none, every
token is refused as unchecked (fail closed) with `IssuerUnavailable`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
import orjson

log = logging.getLogger("toolkeeper")

FETCH_TIMEOUT = 5.0
KEYS_FRESH_FOR = 600.0  # seconds before the keys are fetched again on use
STALE_FOR = 3600.0  # seconds cached keys keep serving while the provider does not answer
REFETCH_EVERY = 5.0  # the least time between two fetches unknown key ids cause
MAX_DOCUMENT_BYTES = 1024 * 1024


class IdentityError(Exception):
    """A token or a sign-in toolkeeper refuses; the message says why, for the person or the agent."""


class IssuerUnavailable(IdentityError):
    """The issuer did not answer (or answered nonsense): nothing it vouches for can be checked, so it is refused."""


class Issuer:
    def __init__(self, url: str, *, jwks_url: str | None = None):
        self.url = url  # exactly as configured: `iss` and discovery's `issuer` must equal it, trailing slash and all
        self.jwks_url = jwks_url
        self._metadata: dict[str, Any] | None = None
        self._keys: list[dict[str, Any]] = []
        self._fetched = 0.0  # when the keys were last fetched (monotonic); 0: never
        self._tried = 0.0  # when a fetch was last tried
        self._lock = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None

    async def _get(self, url: str) -> dict[str, Any]:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT))
        try:
            async with self._session.get(url, headers={"Accept": "application/json"}) as response:
                body = await response.content.read(MAX_DOCUMENT_BYTES + 1)
                if response.status != 200:
                    raise IssuerUnavailable(f"the identity provider answered {response.status} for {url}")
            document = orjson.loads(body)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise IssuerUnavailable(f"the identity provider at {self.url} did not answer ({type(exc).__name__})") \
                from None
        except orjson.JSONDecodeError:
            raise IssuerUnavailable(f"the identity provider's {url} is not JSON") from None
        if not isinstance(document, dict) or len(body) > MAX_DOCUMENT_BYTES:
            raise IssuerUnavailable(f"the identity provider's {url} is not a JSON object under 1 MiB")
        return document

    async def metadata(self) -> dict[str, Any]:
        """The provider's discovery document, read once (a provider moves its endpoints with a restart of ours)."""
        if self._metadata is not None:
            return self._metadata
        try:
            document = await self._get(f"{self.url.rstrip('/')}/.well-known/openid-configuration")
        except IssuerUnavailable:
            document = await self._get(f"{self.url.rstrip('/')}/.well-known/oauth-authorization-server")
        if document.get("issuer") != self.url:
            raise IssuerUnavailable(f"the discovery document at {self.url} names another issuer "
                                    f"({str(document.get('issuer'))[:200]!r}): refused, as OpenID Connect requires")
        self._metadata = document
        return document

    async def endpoint(self, name: str) -> str:
        """One of the provider's endpoints (`token_endpoint`, ...), or IssuerUnavailable saying it has none."""
        value = (await self.metadata()).get(name)
        if not isinstance(value, str) or not value.startswith(("https://", "http://")):
            raise IssuerUnavailable(f"the identity provider at {self.url} names no {name}")
        return value

    async def key(self, kid: str | None, alg: str) -> dict[str, Any] | None:
        """The JWK that signed a token with this key id (or the one key for `alg` when the token names none).

        An unknown key id waits for its turn to refetch rather than being refused at once: a key the provider
        rotated in just after a fetch is found a few seconds later, and a flood of made-up ids still costs at
        most one fetch every REFETCH_EVERY seconds."""
        if not self._fetched or time.monotonic() - self._fetched > KEYS_FRESH_FOR:
            await self._fresh()
        found = self._match(kid, alg)
        if found is not None:
            return found
        wait = self._tried + REFETCH_EVERY - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait + 0.01)  # an event loop's timer may fire a millisecond early (uvloop's does)
        async with self._lock:
            if self._match(kid, alg) is None and time.monotonic() - self._tried >= REFETCH_EVERY - 0.05:
                await self._refetch(time.monotonic())
        return self._match(kid, alg)

    async def _fresh(self) -> None:
        """The keys fetched again when due. A provider that just failed to answer is not asked again for
        REFETCH_EVERY seconds: meanwhile the keys it gave within STALE_FOR serve, or, with none, the token is
        refused at once (without this, each waiting request tried in turn, FETCH_TIMEOUT each, one after the
        other, while a provider hung)."""
        async with self._lock:
            now = time.monotonic()
            if self._fetched and now - self._fetched <= KEYS_FRESH_FOR:
                return  # another request fetched them while this one waited
            if self._tried and now - self._tried < REFETCH_EVERY:
                if self._fetched and now - self._fetched < STALE_FOR:
                    return
                raise IssuerUnavailable(f"the identity provider at {self.url} did not answer a moment ago")
            await self._refetch(now)

    def _match(self, kid: str | None, alg: str) -> dict[str, Any] | None:
        usable = [key for key in self._keys if key.get("use", "sig") == "sig" and key.get("alg", alg) == alg]
        if kid is not None:
            return next((key for key in usable if key.get("kid") == kid), None)
        return usable[0] if len(usable) == 1 else None

    async def _refetch(self, now: float) -> None:
        self._tried = now
        try:
            url = self.jwks_url or await self.endpoint("jwks_uri")
            document = await self._get(url)
        except IssuerUnavailable as exc:
            if self._fetched and now - self._fetched < STALE_FOR:
                log.warning("%s; the keys fetched %.0f s ago serve meanwhile", exc, now - self._fetched)
                return
            raise
        keys = document.get("keys")
        if not isinstance(keys, list):
            raise IssuerUnavailable(f"the identity provider's keys at {url} hold no `keys` list")
        self._keys = [key for key in keys if isinstance(key, dict)]
        self._fetched = now

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
