"""Who opened each MCP session on `/mcp`: a session answers only to the credential that opened it.

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
from toolkeeper.wire.guard import AGENT_NAME, presented_key

log = logging.getLogger("toolkeeper")

SESSION_HEADER = "Mcp-Session-Id"
SESSIONS_KEPT = 20_000  # twice the SDK's own limit of open sessions (10,000): a live session is rarely forgotten
# The SDK's answer for a session it does not know, copied so a refused session looks like no session at all.
NOT_FOUND = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Session not found"}}


@dataclass(frozen=True)
class Credential:
    """What a request to `/mcp` was made with: an agent's key (known by its SHA-256, never kept itself), or no key
    at all where none is asked for (toolkeeper on loopback with no `agents:` listed: anyone on this machine)."""

    agent: str
    key_sha256: str = ""

    @classmethod
    def of(cls, request: web.Request) -> Credential:
        agent = request.get(AGENT_NAME)
        if agent is None:
            return OPEN
        return cls(agent, sha256_hex(presented_key(request.headers).encode()))

    def as_scope_user(self) -> Any:
        """The same credential as the SDK's session manager reads it (the ASGI scope's `user`)."""
        from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
        from mcp.server.auth.provider import AccessToken

        return AuthenticatedUser(AccessToken(token="", client_id=f"{self.agent}:{self.key_sha256}", scopes=[]))

    def __str__(self) -> str:
        return "a client without a key" if self is OPEN else f"agent {printable(self.agent)!r}"


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
