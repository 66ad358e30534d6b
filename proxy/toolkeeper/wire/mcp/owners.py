"""Who opened each MCP session on `/mcp`: a session answers only to the credential that opened it.

The credential is the agent's key, and the person the calls are for: with
OAuth at /mcp, the token's issuer, user and client (not the token itself, which
the client refreshes within a session), so another person's token, however
valid, cannot use someone's session.

A session id travels in a header (`Mcp-Session-Id`) and is all the SDK needs to
find a session: without this, another agent holding the id could read the
session's stream (elicitations carry a call's arguments), answer for it, or end
it. A request for a session from any other credential is answered 404, as for a
session that does not exist (nothing says it does), and logged.

Two checks, one rule: the bridge checks first, because it knows the agents'
names and can say in the log who tried; the SDK checks too (it compares the
ASGI scope's `user` with the one that opened the session), so a session this
record has forgotten (past `SESSIONS_KEPT`, the least recently used first) is
still refused.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from toolkeeper.common import printable, sha256_hex
from toolkeeper.identity import Principal
from toolkeeper.wire.guard import PRINCIPAL, presented_key

log = logging.getLogger("toolkeeper")

SESSION_HEADER = "Mcp-Session-Id"
SESSIONS_KEPT = 20_000  # twice the SDK's own limit of open sessions (10,000): a live session is rarely forgotten
# The SDK's answer for a session it does not know, copied so a refused session looks like no session at all.
NOT_FOUND = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Session not found"}}


@dataclass(frozen=True)
class Credential:
    """What a request to `/mcp` was made with: an agent's key (known by its SHA-256, never kept itself) or an
    access token (known by who it names), and the user the calls are for; or no key at all where none is asked
    for (toolkeeper on loopback with no `agents:` listed: anyone on this machine)."""

    agent: str
    key_sha256: str = ""
    issuer: str | None = None
    user: str | None = None

    @classmethod
    def of(cls, request: web.Request, principal: Principal | None = None, *, token: bool = False) -> Credential:
        """`principal`: who the request is for (the guard's, unless /mcp checked an access token: `token`)."""
        principal = principal if principal is not None else request.get(PRINCIPAL)
        if principal is None or not (principal.agent or principal.user):
            return OPEN
        key = "" if token else sha256_hex(presented_key(request.headers).encode())
        return cls(principal.agent, key, principal.issuer, principal.user)

    def as_scope_user(self) -> Any:
        """The same credential as the SDK's session manager reads it (the ASGI scope's `user`: its client id,
        issuer and subject)."""
        from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
        from mcp.server.auth.provider import AccessToken

        return AuthenticatedUser(AccessToken(token="", client_id=f"{self.agent}:{self.key_sha256}", scopes=[],
                                             subject=self.user, claims={"iss": self.issuer} if self.issuer else None))

    def __str__(self) -> str:
        if self is OPEN:
            return "a client without a key"
        user = f" for {printable(self.user)!r}" if self.user else ""
        return f"agent {printable(self.agent)!r}{user}"


OPEN = Credential("", "")


class SessionOwners:
    """The credential that opened each session, for the sessions used most recently."""

    def __init__(self, kept: int = SESSIONS_KEPT):
        self.kept = kept
        self.owners: OrderedDict[str, Credential] = OrderedDict()

    def refusal(self, request: web.Request, credential: Credential) -> web.Response | None:
        """A 404 when the request names a session that another credential opened; None when it may go on."""
        session_id = request.headers.get(SESSION_HEADER)
        owner = self.owners.get(session_id) if session_id else None
        if owner is None or owner == credential:
            return None
        log.warning("MCP: %s sent %s for a session that %s opened (session %s…): refused, answered 404 as for an "
                    "unknown session", credential, request.method, owner, printable(session_id[:8]))
        return web.json_response(NOT_FOUND, status=404)

    def note(self, request: web.Request, credential: Credential, response: web.StreamResponse) -> None:
        """What the SDK's answer says about the session: opened (by this credential), used, or gone."""
        asked_for = request.headers.get(SESSION_HEADER)
        if asked_for is None:
            opened = response.headers.get(SESSION_HEADER)
            if opened and response.status < 400:
                self._keep(opened, credential)
        elif response.status == 404 or (request.method == "DELETE" and response.status < 400):
            self.owners.pop(asked_for, None)
        elif asked_for in self.owners:
            self.owners.move_to_end(asked_for)

    def _keep(self, session_id: str, credential: Credential) -> None:
        self.owners[session_id] = credential
        if len(self.owners) > self.kept:
            self.owners.popitem(last=False)
