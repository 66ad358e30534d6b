"""Tokens for the agent's MCP servers that need OAuth (`auth:` of a `url:` server), sent as `Authorization: Bearer`.

    client_credentials: toolkeeper's own token for the server, one for every caller
    token_exchange:     the caller's token exchanged (RFC 8693) for one made for the server, with toolkeeper as
                        the actor; a caller with no token of its own is refused, never served with another token

Each token is kept until `EARLY` seconds before it expires, then fetched again;
a 401 from the server makes one fresh token and one retry. The caller's token
travels only to the authorization server, as the exchange's `subject_token`:
no MCP server ever receives it, and no token is logged or recorded.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from toolkeeper.common import printable
from toolkeeper.tools import OAuthClient

TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"  # noqa: S105 - a grant type, not a secret
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"  # noqa: S105 - a token type
EARLY = 30.0  # seconds before its expiry a token is fetched again: one sent just in time may expire on the way
UNDATED = 60.0  # seconds a token whose answer gives no `expires_in` is kept
EXCHANGED_KEPT = 1024  # exchanged tokens kept, by their subject token's digest, the least recent forgotten first
REQUEST_TIMEOUT = 10.0


class TokenUnavailable(Exception):
    """No token for the server: the authorization server refused or did not answer, or no caller token to exchange."""


@dataclass
class Caller:
    """Whom a call acts for, as the MCP servers' connections need it: a key naming the person (never the token),
    and the token the caller presented to toolkeeper, to exchange (never to send on)."""

    key: str
    token: str | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, principal: dict[str, Any] | None, token: str | None) -> Caller | None:
        if not token:
            return None
        principal = principal or {}
        if principal.get("user"):
            # as JSON: the claims are the provider's strings, any character among them (a newline too)
            key = json.dumps([str(principal.get(name) or "") for name in ("issuer", "user", "agent")])
        else:  # a token that named no user: its own digest keeps it apart from everyone else's
            key = "token:" + hashlib.sha256(token.encode()).hexdigest()
        return cls(key, token)


_ACTING_FOR: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("toolkeeper_mcp_caller", default=None)


@contextlib.contextmanager
def acting_for(caller: Caller | None) -> Iterator[None]:
    """The caller a declared tool run by an MCP server's tool acts for, while it runs (the runner is not told the
    turn; a server with `token_exchange` needs the caller's token all the same)."""
    reset = _ACTING_FOR.set(caller)
    try:
        yield
    finally:
        _ACTING_FOR.reset(reset)


def current_caller() -> Caller | None:
    return _ACTING_FOR.get()


@dataclass
class _Kept:
    token: str
    until: float  # monotonic


class ServerTokens:
    """The tokens of one server's `auth:`: fetched, kept until shortly before they expire, forgotten on a 401."""

    def __init__(self, server: str, client: OAuthClient, exchange: bool):
        self.server = server
        self.client = client
        self.exchange = exchange
        self._endpoint: str | None = client.token_url
        self._own: _Kept | None = None
        self._exchanged: OrderedDict[str, _Kept] = OrderedDict()

    async def token(self, caller: Caller | None) -> str:
        key = self._key(caller)
        kept = self._exchanged.get(key) if self.exchange else self._own
        if kept is not None and time.monotonic() < kept.until:
            if self.exchange:
                self._exchanged.move_to_end(key)
            return kept.token
        fresh = await self._fetch(caller)
        if self.exchange:
            self._exchanged[key] = fresh
            if len(self._exchanged) > EXCHANGED_KEPT:
                self._exchanged.popitem(last=False)
        else:
            self._own = fresh
        return fresh.token

    def forget(self, caller: Caller | None) -> None:
        """The server refused the token: the next request gets a fresh one."""
        if self.exchange:
            self._exchanged.pop(self._key(caller), None)
        else:
            self._own = None

    def _key(self, caller: Caller | None) -> str:
        if not self.exchange:
            return ""
        if caller is None or not caller.token:
            raise TokenUnavailable(no_caller_token(self.server))
        return hashlib.sha256(caller.token.encode()).hexdigest()

    async def _fetch(self, caller: Caller | None) -> _Kept:
        client = self.client
        form = {"scope": client.scope, "resource": client.resource, "audience": client.audience}
        if self.exchange:
            assert caller is not None and caller.token  # _key checked it
            form |= {"grant_type": TOKEN_EXCHANGE, "subject_token": caller.token,
                     "subject_token_type": ACCESS_TOKEN_TYPE, "requested_token_type": ACCESS_TOKEN_TYPE}
        else:
            form["grant_type"] = "client_credentials"
        answer = await self._post({name: value for name, value in form.items() if value})
        token, expires_in = answer.get("access_token"), answer.get("expires_in")
        if not isinstance(token, str) or not token or str(answer.get("token_type", "Bearer")).lower() != "bearer":
            raise TokenUnavailable(f"the authorization server's answer for the MCP server {self.server} holds no "
                                   "bearer access_token")
        lifetime = float(expires_in) if isinstance(expires_in, (int, float)) and expires_in > 0 else UNDATED
        early = EARLY if lifetime > 2 * EARLY else lifetime / 2
        return _Kept(token, time.monotonic() + lifetime - early)

    async def _post(self, form: dict[str, str]) -> dict[str, Any]:
        import httpx2

        headers = {"Accept": "application/json"}
        secret = self._secret()
        if secret is None:
            form["client_id"] = self.client.client_id  # a public client names itself
        else:  # client_secret_basic, its parts form-encoded first (RFC 6749, 2.3.1)
            pair = f"{quote(self.client.client_id, safe='')}:{quote(secret, safe='')}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        try:
            async with httpx2.AsyncClient(timeout=REQUEST_TIMEOUT, follow_redirects=False) as http:
                response = await http.post(await self._token_endpoint(), data=form, headers=headers)
                answer = response.json()
        except (httpx2.HTTPError, ValueError) as exc:
            raise TokenUnavailable(f"the authorization server of the MCP server {self.server} did not answer "
                                   f"({type(exc).__name__})") from None
        if response.status_code != 200 or not isinstance(answer, dict):
            error = answer.get("error") if isinstance(answer, dict) else None
            described = answer.get("error_description") if isinstance(answer, dict) else None
            raise TokenUnavailable(f"the authorization server refused a token for the MCP server {self.server} "
                                   f"({response.status_code} {printable(str(error or ''))[:80]}"
                                   f"{': ' + printable(str(described))[:200] if described else ''})")
        return answer

    def _secret(self) -> str | None:
        try:
            return self.client.secret()
        except KeyError as exc:
            raise TokenUnavailable(str(exc.args[0])) from None

    async def _token_endpoint(self) -> str:
        if self._endpoint is None:
            from toolkeeper.identity import IdentityError, Issuer

            issuer = Issuer(self.client.issuer or "")
            try:
                self._endpoint = await issuer.endpoint("token_endpoint")
            except IdentityError as exc:
                raise TokenUnavailable(str(exc)) from None
            finally:
                await issuer.close()
        return self._endpoint


def no_caller_token(server: str) -> str:
    return (f"the MCP server {server} takes the caller's own token, exchanged for one made for it, and this call "
            f"came with none to exchange (a static agent key, or no key): toolkeeper sends neither its own nor a "
            f"caller's token in its place")


def bearer_auth(tokens: ServerTokens, caller: Caller | None) -> Any:
    """An httpx2 auth for a connection: the token on every request, and one retry with a fresh one on a 401."""
    import httpx2

    class BearerAuth(httpx2.Auth):
        async def async_auth_flow(self, request: Any) -> AsyncGenerator[Any, Any]:
            request.headers["Authorization"] = f"Bearer {await tokens.token(caller)}"
            response = yield request
            if response.status_code == 401:
                tokens.forget(caller)
                request.headers["Authorization"] = f"Bearer {await tokens.token(caller)}"
                yield request

    return BearerAuth()
