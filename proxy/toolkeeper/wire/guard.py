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
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping

from aiohttp import web

from toolkeeper.common import is_loopback, sha256_hex
from toolkeeper.wire.admin import PREFIX as ADMIN_PREFIX
from toolkeeper.wire.errors import shape_of
from toolkeeper.wire.upstream import ROUTED

AGENT_NAME = web.RequestKey("agent_name", str)
# Paths that are not the agent API: no agent key (the admin API has its own token), probes for orchestrators.
OPEN_PATHS = ("/healthz", "/readyz", "/metrics")


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
    """The agents toolkeeper knows, by the SHA-256 of their keys; `required`: a request must present one."""

    def __init__(self, keys: Mapping[str, str], *, required: bool):
        self.keys = {digest.lower(): name for digest, name in keys.items()}
        self.required = required or bool(keys)

    def name_of(self, key: str) -> str | None:
        digest = sha256_hex(key.encode())
        for known, name in self.keys.items():
            if hmac.compare_digest(known, digest):
                return name
        return None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        if not self.required or request.path in OPEN_PATHS or request.path.startswith(ADMIN_PREFIX + "/"):
            return await handler(request)
        if ROUTED in request:  # intercepted: it goes to its own server with its own key, never toolkeeper's
            return await handler(request)
        key = presented_key(request.headers)
        name = self.name_of(key) if key else None
        if name is None:
            return shape_of(request.path).refusal(401, "toolkeeper does not know this agent's key: ask its "
                                                       "operator to list the key's SHA-256 under `agents:`",
                                                  "invalid_api_key")
        request[AGENT_NAME] = name
        return await handler(request)
