"""Who may talk to toolkeeper: no web page unless allowed, and known agents when toolkeeper holds the key.

- **Web pages.** A browser adds `Origin` to every cross-site POST, even one a
  page sends with `mode: "no-cors"` and `Content-Type: text/plain` (no
  preflight). Any request that carries an `Origin` not on the allow-list
  (`--allow-origin`, empty by default) is refused, preflights included; a
  page served by toolkeeper itself (the console, on a loopback address)
  is its own origin; a console served under another name needs that name's
  origin on the list (a DNS-rebinding page has its own name in `Host`, so a
  loopback-only rule keeps it from even trying tokens). Non-browser clients
  send no `Origin`.
- **Agent keys.** With `api_key_env`, toolkeeper holds the upstream key, so
  any local process could spend it. The operator then lists agents and the
  SHA-256 of their keys (`agents:` in the agent file, or `--agent-keys`); a
  request without a known key is a 401 in the OpenAI error shape, and the
  agent's name becomes the record's `agent`.
- **Agent tokens.** With `auth.agents.jwt`, an agent may present a JWT from
  that issuer instead (as its API key): checked (identity/tokens.py), it names
  the agent and the user the call is for. A bad or expired token is a 401, an
  issuer that cannot be reached a 503, each in the API's own error shape. The
  token goes no further: the header that carried it is not forwarded (a model
  server could replay it here as the user), and a token whose agent claim is a
  listed agent's name is refused (it would pass for that key's holder).
- **Identity header.** `--identity-header` is believed only from a trusted
  peer (`--trusted-proxy`, loopback by default), and only once; otherwise the
  request is refused, intercepted ones too.

Who called, as the engine sees it, is the request's `PRINCIPAL`.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Mapping

from aiohttp import web

from toolkeeper.common import is_loopback, printable, sha256_hex
from toolkeeper.identity import Identity, IdentityError, IssuerUnavailable, Principal, TokenRefused, looks_like_jwt
from toolkeeper.wire.admin import PREFIX as ADMIN_PREFIX
from toolkeeper.wire.errors import shape_of
from toolkeeper.wire.upstream import ROUTED

log = logging.getLogger("toolkeeper")

AGENT_NAME = web.RequestKey("agent_name", str)
PRINCIPAL = web.RequestKey("principal", Principal)  # who the request is for, once a key, a token or a header said
# The JWT an agent presented, once checked: an MCP server with `token_exchange` gets one of its own made from it
# (never this one); kept with the request only, never logged or recorded.
SUBJECT_TOKEN = web.RequestKey("subject_token", str)
# Paths that are not the agent API: no agent key (the admin API has its own token), probes for orchestrators.
# /mcp's resource metadata (RFC 9728) is open too: an MCP client reads it to find where to get a token.
OPEN_PATHS = ("/healthz", "/readyz", "/metrics", "/.well-known/oauth-protected-resource",
              "/.well-known/oauth-protected-resource/mcp")


def is_json(content_type: str) -> bool:
    """application/json, or any application/*+json."""
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


class OriginGuard:
    def __init__(self, allowed: tuple[str, ...]):
        self.allowed = frozenset(origin.rstrip("/") for origin in allowed)

    def allows(self, request: web.Request) -> bool:
        origin = request.headers.get("Origin")
        if origin is None:
            return True
        return origin in self.allowed or _own_page(origin, request)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin is None:
            return await handler(request)
        if not self.allows(request):
            return shape_of(request.path).refusal(
                403, f"requests from web pages are refused: the origin {origin!r} is not allowed (toolkeeper "
                     "serve --allow-origin)", "origin_not_allowed")
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            return web.Response(status=204, headers={
                "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                "Access-Control-Allow-Headers": request.headers.get("Access-Control-Request-Headers", ""),
                "Access-Control-Max-Age": "600"})
        return await handler(request)

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """An allowed origin may read the answer (streamed answers too: headers go out at prepare)."""
        origin = request.headers.get("Origin")
        if origin is not None and origin in self.allowed:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Vary"] = "Origin"


def _own_page(origin: str, request: web.Request) -> bool:
    """A page toolkeeper served on a loopback address posting back to it (the console's sign-in).

    The host must be a loopback name or address: a DNS-rebinding page has its own name in `Host`.
    """
    if origin != f"{request.scheme}://{request.host}":
        return False
    return is_loopback(request.url.host or "")


def presented_key(headers: Mapping[str, str]) -> str:
    """The key an agent presents: `Authorization: Bearer`, Anthropic's `x-api-key`, or Azure's `api-key`."""
    header = headers.get("Authorization", "")
    if header[:7].lower() == "bearer ":
        return header[7:].strip()
    return (headers.get("x-api-key") or headers.get("api-key") or "").strip()


class AgentKeys:
    """The agents toolkeeper knows: by the SHA-256 of their keys, or by a JWT from the configured issuer;
    `required`: a request must present one."""

    def __init__(self, keys: Mapping[str, str], *, required: bool, identity: Identity | None = None,
                 identity_header: str | None = None):
        self.keys = {digest.lower(): name for digest, name in keys.items()}
        self.identity = identity
        self.tokens = identity.agents if identity is not None else None
        self.identity_header = identity_header
        self.required = required or bool(keys) or self.tokens is not None

    @property
    def checks(self) -> bool:
        """Whether any request needs this guard: a credential required, or an identity header to vet."""
        return self.required or self.identity_header is not None

    def name_of(self, key: str) -> str | None:
        digest = sha256_hex(key.encode())
        for known, name in self.keys.items():
            if hmac.compare_digest(known, digest):
                return name
        return None

    async def identify(self, request: web.Request, *, required: bool | None = None) -> Principal | str | None:
        """Who the request is for (a Principal), None when it need not say, or why it is refused (a text, with
        `request["refusal_status"]`). A listed key wins over reading it as a token. `required`: whether this door
        needs a credential, when it is not the model API's rule."""
        required = self.required if required is None else required
        refused = self.header_refusal(request)
        if refused is not None:
            request["refusal_status"] = 403
            return refused
        header = (self.identity_header and request.headers.get(self.identity_header, "").strip()) or None
        key = presented_key(request.headers)
        name = self.name_of(key) if key and self.keys else None
        principal: Principal | None = None
        if name is not None:
            principal = Principal(agent=name, user=header)
        elif key and self.tokens is not None and looks_like_jwt(key):
            try:
                principal = self.not_a_listed_name(await self.tokens.principal(key))
                request[SUBJECT_TOKEN] = key
            except IdentityError as exc:
                request["refusal_status"] = 503 if isinstance(exc, IssuerUnavailable) else 401
                log.warning("an agent's token was refused: %s", exc)
                return f"toolkeeper refused the agent's token: {exc}"
        if principal is None and required:
            request["refusal_status"] = 401
            return ("toolkeeper does not know this agent's key: ask its operator to list the key's SHA-256 under "
                    "`agents:`" + (", or present a token from its issuer" if self.tokens else ""))
        if principal is None and header:
            principal = Principal(agent="", user=header)
        return principal

    def header_refusal(self, request: web.Request) -> str | None:
        """Why the identity header refuses the request: sent by a peer that is not a trusted proxy, or sent twice
        (a proxy that appends its own would leave the client's first); None when it may be read."""
        if not self.identity_header:
            return None
        values = request.headers.getall(self.identity_header, [])
        if not values:
            return None
        if self.identity is None or not self.identity.trusted.believes(request.remote):
            return (f"the identity header {self.identity_header} is only believed from a trusted proxy "
                    f"(--trusted-proxy), not from {printable(request.remote or 'this peer')}")
        if len(values) > 1:
            return f"the identity header {self.identity_header} is sent {len(values)} times: once, or not at all"
        return None

    def not_a_listed_name(self, principal: Principal) -> Principal:
        """A token's principal, unless its agent claim names an agent listed with a key: a rule or a record that
        says `desk` means the holder of desk's key, not any client the provider let take that name."""
        if principal.agent in self.keys.values():
            raise TokenRefused(f"the token names the agent {printable(principal.agent)!r}, which is listed under "
                               "`agents:` with a key: a token cannot pass for a listed agent")
        return principal

    @web.middleware
    async def middleware(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        if not self.checks or request.path.startswith(ADMIN_PREFIX + "/"):
            return await handler(request)
        if request.path in OPEN_PATHS and request.method in ("GET", "HEAD"):  # a POST there falls to the catch-all
            return await handler(request)
        if ROUTED in request:  # intercepted: it goes to its own server with its own key, never toolkeeper's
            refused = self.header_refusal(request)  # the header it carries is read as `agent.header` all the same
            if refused is not None:
                return shape_of(request.path).refusal(403, refused, "identity_header_untrusted")
            return await handler(request)
        if request.path == "/mcp" and self.identity is not None and self.identity.mcp is not None:
            return await handler(request)  # an OAuth protected resource: its door checks its own tokens
        who = await self.identify(request)
        if isinstance(who, str):
            status = request.get("refusal_status", 401)
            code = {401: "invalid_api_key", 403: "identity_header_untrusted"}.get(status, "identity_unavailable")
            return shape_of(request.path).refusal(status, who, code)
        if who is not None:
            request[PRINCIPAL] = who
            if who.agent:
                request[AGENT_NAME] = who.agent
        if SUBJECT_TOKEN in request:  # the agent's JWT is toolkeeper's to check, never the model server's to see
            request = without_token(request, request[SUBJECT_TOKEN])
        return await handler(request)


def without_token(request: web.Request, token: str) -> web.Request:
    """The request as the doors forward it: without the header that carried the agent's token (an agent that
    also holds a key of the model server's sends it in another key header, which goes on)."""
    headers = request.headers.copy()
    for name in ("Authorization", "x-api-key", "api-key"):
        if any(token in value for value in headers.getall(name, [])):
            del headers[name]
    return request.clone(headers=headers)
