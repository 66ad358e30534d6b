"""`/mcp` as an OAuth 2.1 protected resource, as the MCP authorization specification says (RFC 9728, RFC 6750).

    GET /.well-known/oauth-protected-resource[/mcp] -> {resource, authorization_servers, bearer_methods_supported,
                                                        scopes_supported}: open, it is how a client finds the flow
    a request to /mcp with
      no credential                        -> 401  WWW-Authenticate: Bearer resource_metadata="…", scope="…"
      a token refused (another audience, another key, expired, `alg: none`...)
                                           -> 401  the same, error="invalid_token", error_description=why
      a token without the listed scopes    -> 403  error="insufficient_scope" (a client asks again, for more)
      a token while the issuer is down     -> 503  (nothing it signed can be checked: fail closed)
      a key listed under `agents:`         -> that agent, as without OAuth (no user)
      an access token for this resource    -> its user is the principal of every call it makes

Tokens are checked for this resource's audience alone (RFC 8707): a token the
provider made for another service is refused, whoever it names. The token is
kept with the request only to be exchanged for another server's (RFC 8693); it
is never logged, recorded, or sent on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from toolkeeper.common import printable
from toolkeeper.identity import Identity, IdentityError, IssuerUnavailable, Principal
from toolkeeper.wire.guard import AgentKeys, presented_key

log = logging.getLogger("toolkeeper")

METADATA_PATH = "/.well-known/oauth-protected-resource"
METADATA_PATHS = (METADATA_PATH, METADATA_PATH + "/mcp")  # RFC 9728's, for the root and for /mcp's own path


@dataclass(frozen=True)
class McpCaller:
    """Who a request to /mcp is from: the principal, and the access token it presented (None for a listed key)."""

    principal: Principal
    token: str | None = field(default=None, repr=False)


class ProtectedResource:
    """/mcp's resource metadata and the check of each request's credential."""

    def __init__(self, identity: Identity, scopes: tuple[str, ...], keys: AgentKeys):
        assert identity.mcp is not None
        self.identity = identity
        self.checker = identity.mcp
        self.scopes = scopes
        self.keys = keys
        self.metadata_url = f"{identity.public_url}{METADATA_PATH}/mcp"

    def document(self) -> dict[str, object]:
        document: dict[str, object] = {"resource": self.identity.mcp_resource,
                                       "authorization_servers": [self.checker.issuer.url],
                                       "bearer_methods_supported": ["header"], "resource_name": "toolkeeper"}
        if self.scopes:
            document["scopes_supported"] = list(self.scopes)
        return document

    async def metadata(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(self.document()), content_type="application/json",
                            headers={"Cache-Control": "max-age=300"})

    def challenge(self, status: int, error: str | None = None, description: str = "") -> web.Response:
        """The answer that tells a client where the flow starts (and, with `error`, what was wrong)."""
        parts = [f'resource_metadata="{self.metadata_url}"']
        if self.scopes:
            parts.append(f'scope="{" ".join(self.scopes)}"')
        if error:
            parts += [f'error="{error}"', f'error_description="{_quotable(description)}"']
        body = {"error": error or "invalid_request",
                "error_description": description or "/mcp needs an access token from its authorization server: "
                                                    f"the resource metadata at {self.metadata_url} says which"}
        return web.Response(status=status, body=orjson.dumps(body), content_type="application/json",
                            headers={"WWW-Authenticate": "Bearer " + ", ".join(parts)})

    async def caller(self, request: web.Request) -> McpCaller | web.Response:
        """Who the request is from, or the answer that refuses it."""
        refused = self.keys.header_refusal(request)
        if refused is not None:
            return web.json_response({"error": "identity_header_untrusted", "error_description": refused},
                                     status=403)
        header = (self.keys.identity_header and request.headers.get(self.keys.identity_header, "").strip()) or None
        key = presented_key(request.headers)
        name = self.keys.name_of(key) if key and self.keys.keys else None
        if name is not None:
            return McpCaller(Principal(agent=name, user=header))
        authorization = request.headers.get("Authorization", "")
        token = authorization[7:].strip() if authorization[:7].lower() == "bearer " else ""
        if not token:
            return self.challenge(401)
        return await self._checked(token)

    async def _checked(self, token: str) -> McpCaller | web.Response:
        try:
            claims = await self.checker.claims(token)
            principal = self.keys.not_a_listed_name(self.checker.read(claims))
        except IssuerUnavailable as exc:
            log.warning("MCP: an access token could not be checked: %s", exc)
            return web.json_response({"error": "temporarily_unavailable", "error_description": (
                f"toolkeeper cannot check access tokens now: {exc}")}, status=503, headers={"Retry-After": "10"})
        except IdentityError as exc:
            log.warning("MCP: an access token was refused: %s", exc)
            return self.challenge(401, "invalid_token", str(exc))
        missing = [scope for scope in self.scopes if scope not in _scopes_of(claims)]
        if missing:
            log.warning("MCP: %s's access token lacks the scopes %s", printable(principal.user or ""),
                        ", ".join(missing))
            return self.challenge(403, "insufficient_scope", f"the access token lacks the scope "
                                                             f"{' '.join(missing)}")
        return McpCaller(principal, token)


def _scopes_of(claims: dict[str, object]) -> set[str]:
    """A token's scopes: RFC 9068's `scope` (space-separated), or the `scp` list some providers send."""
    scope, scp = claims.get("scope"), claims.get("scp")
    found = set(scope.split()) if isinstance(scope, str) else set()
    if isinstance(scp, list):
        found |= {item for item in scp if isinstance(item, str)}
    return found


def _quotable(text: str) -> str:
    """A text inside a quoted-string of a header: ASCII, without the quote and backslash it would end at."""
    return printable(text).encode("ascii", "replace").decode().replace("\\", "/").replace('"', "'")[:300]
