"""Who may reach /toolkeeper/: the admin token or a named token (a bearer header), or a console session cookie;
then whether that role may reach the path, and, for a session's change, its CSRF key and toolkeeper's own origin.
"""

from __future__ import annotations

import html
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

from toolkeeper.audit import AuditError
from toolkeeper.common import printable
from toolkeeper.settings import TOKEN_VARIABLE
from toolkeeper.store import Store, StoreError
from toolkeeper.wire.admin.sessions import SESSION_COOKIE, Sessions, same

PREFIX = "/toolkeeper"
# What every page toolkeeper serves carries (the console's layout adds its own script's permission)
PAGE_HEADERS = {"Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'", "Cache-Control": "no-store",
                "X-Content-Type-Options": "nosniff"}
SAFE_METHODS = ("GET", "HEAD")

Refusal = Callable[[web.Request], Awaitable[web.StreamResponse | None]]  # None: the guard's own 401


def json_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def refused(request: web.Request, message: str) -> web.Response:
    """A 403: a page for a person's browser (it asks for HTML), JSON for a script."""
    if "text/html" not in request.headers.get("Accept", ""):
        return json_error(403, message)
    body = (f"<!doctype html><meta charset=utf-8><title>Not for this role</title><h1>Not for this role</h1>"
            f"<p>{html.escape(printable(message))}</p><p><a href='{PREFIX}/'>back</a></p>")
    return web.Response(status=403, text=body, content_type="text/html", headers=PAGE_HEADERS)


# Who may reach what: a named token's role (`toolkeeper tokens add NAME --role ROLE`); the admin token is `admin`.
ROLES = {PREFIX + "/approvals": {"approver", "admin"}, PREFIX + "/queue": {"approver", "admin"},
         PREFIX + "/audit": {"auditor", "admin"}, PREFIX + "/mcp": {"admin"}}
MASTER = ("admin", "admin")  # the admin token (TOOLKEEPER_ADMIN_TOKEN): `tokens add` never gives out this name


class AdminGuard:
    """The one check of who calls: the admin token or a named token (a bearer header), or a console session
    cookie; then whether that role may reach the path, and, for a session's change, its CSRF key."""

    def __init__(self, token: str | None, store: Store | None = None):
        self.token = token
        self.store = store
        self.sessions = Sessions(token, store) if token else None
        self.public: set[str] = set()  # paths anyone may reach: the sign-in form
        self.refusals: list[tuple[str, Refusal]] = []  # a page's own way of saying "sign in first"

    def bearer(self, request: web.Request) -> bool:
        return bool(self.token) and same(given_token(request), self.token)  # type: ignore[arg-type]

    async def identity(self, request: web.Request) -> tuple[str, str] | None:
        """(name, role) of who calls, or None; the admin token's holder is MASTER (it may say who it answers
        for, as `--as`); a named token is its own name."""
        if self.bearer(request):
            return MASTER
        given = given_token(request)
        if given:  # tokens are ASCII: anything else is no token, not a lookup
            return await self.store.token_holder(given) if self.store is not None and given.isascii() else None
        cookie = request.cookies.get(SESSION_COOKIE, "")
        if cookie and self.sessions is not None:
            request["session"] = cookie
            holder = await self.sessions.holder(cookie)
            if holder is not None:
                request["csrf"] = self.sessions.csrf(cookie)  # what the page's forms send back
            return MASTER if holder == MASTER else holder
        return None

    async def forged(self, request: web.Request) -> str | None:
        """Why a change a session cookie authenticates is refused: another site's origin, or no CSRF key."""
        if "session" not in request or request.method in SAFE_METHODS or self.sessions is None:
            return None
        if not same_origin(request):
            return f"a change from another origin ({printable(request.headers['Origin'])}) is refused"
        given = request.headers.get("X-CSRF-Token") or str((await request.post()).get("csrf", ""))
        if not self.sessions.csrf_holds(request["session"], given):
            return "the form's CSRF key is missing or stale: reload the page and try again"
        return None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        if self.token is None:
            return json_error(404, f"the admin API is off: start toolkeeper with {TOKEN_VARIABLE} set")
        try:
            who = None if request.path in self.public else await self.identity(request)
            if request.path in self.public or who is not None:
                allowed = next((roles for prefix, roles in ROLES.items() if request.path.startswith(prefix)), None)
                if who is not None and allowed is not None and who[1] not in allowed:
                    return refused(request, f"{who[0]} ({who[1]}) may not reach {request.path}: it needs the "
                                            f"{' or '.join(sorted(allowed))} role")
                if who is not None and (forged := await self.forged(request)):
                    return json_error(403, forged)
                request["identity"] = who
                return await handler(request)
        except StoreError as exc:
            return json_error(503, f"the store did not answer: {exc}")
        except AuditError as exc:
            return json_error(503, str(exc))
        for prefix, refuse in self.refusals:
            if request.path.startswith(prefix) and (answer := await refuse(request)) is not None:
                return answer
        return json_error(401, f"a valid token is required (Authorization: Bearer ${TOKEN_VARIABLE}, or a named "
                               "token from `toolkeeper tokens add`)")


def served_over_https(request: web.Request) -> bool:
    """HTTPS here, or at the TLS-terminating proxy in front (which says so): the cookie is then Secure."""
    return request.secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"


def same_origin(request: web.Request) -> bool:
    """No Origin (not a browser's cross-origin request), or this host's own, over HTTPS at a proxy in front too."""
    origin = request.headers.get("Origin")
    return origin is None or urlsplit(origin).netloc == request.host


def given_token(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    return header[7:].strip() if header.startswith("Bearer ") else ""
