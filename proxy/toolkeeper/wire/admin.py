"""Everything under /toolkeeper/: one sub-app, one check of the admin token, answered here.

    GET  /toolkeeper/approvals                    the calls waiting for a person
    POST /toolkeeper/approvals/{id}/approve|deny  an answer ({"always", "reason", "approver"})
    /toolkeeper/queue, /toolkeeper/audit, ...      the console, for people (wire/console/)

No /toolkeeper/ request is ever forwarded to the model server: one that no
route serves (a wrong method, an unknown path, no token configured) is
answered here, so the admin token can never leave toolkeeper. A script sends
`Authorization: Bearer $TOOLKEEPER_ADMIN_TOKEN` (or a named token); a person
signs in to the console once, which opens a browser session (sessions.py).
A request that a session cookie authenticates and that changes anything must
carry the session's CSRF key and come from toolkeeper's own origin.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import orjson
from aiohttp import web

from toolkeeper.audit import AuditError
from toolkeeper.common import printable
from toolkeeper.policy import RULE_SOURCES
from toolkeeper.settings import TOKEN_VARIABLE
from toolkeeper.store import Store, StoreError
from toolkeeper.wire.sessions import SESSION_COOKIE, Sessions, same

log = logging.getLogger("toolkeeper")

PREFIX = "/toolkeeper"
SAFE_METHODS = ("GET", "HEAD")

Refusal = Callable[[web.Request], Awaitable[web.StreamResponse | None]]  # None: the guard's own 401


def json_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


# Who may reach what: a named token's role (`toolkeeper tokens add NAME --role ROLE`); the admin token is `admin`.
ROLES = {PREFIX + "/approvals": {"approver", "admin"}, PREFIX + "/queue": {"approver", "admin"},
         PREFIX + "/audit": {"auditor", "admin"}}
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
                    return json_error(403, f"{who[0]} ({who[1]}) may not reach {request.path}: it needs the "
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


def admin_app(guard: AdminGuard, *parts: Callable[[web.Application], None]) -> web.Application:
    """The sub-app mounted at /toolkeeper, with each part's routes: every path under it is answered here."""
    app = web.Application(middlewares=[guard.middleware])
    for add_routes in parts:
        add_routes(app)

    async def not_found(request: web.Request) -> web.Response:
        return json_error(404, f"no {request.method} {request.path} in toolkeeper's admin API")

    app.router.add_route("*", "/{tail:.*}", not_found)  # last, after every real route
    return app


def approvals_api(store: Store) -> Callable[[web.Application], None]:
    """The approvals API, for the admin sub-app (behind its guard).

        GET  /approvals                       waiting calls: tool, arguments (redacted), argv, why, agent, age
        POST /approvals/{id}/approve|deny     {"always": true} grants the agent the tool; {"reason": "..."}
        GET  /approvals/always                the always grants in force
        POST /approvals/always/{id}/revoke
    """

    async def listing(request: web.Request) -> web.Response:
        now = time.time()
        waiting = [{**a, "age": round(now - a["created"], 1),
                    "left": round(a["expires"] - now, 1) if a.get("expires") else None}
                   for a in await store.list_approvals("waiting")]
        return web.json_response({"approvals": waiting})  # ASCII JSON: control characters arrive escaped

    async def answer(request: web.Request) -> web.Response:
        approval_id, verb = request.match_info["id"], request.match_info["verb"]
        body = await _json_object(request)
        if isinstance(body, web.Response):
            return body
        who = request.get("identity") or MASTER
        # a named token records its own name, whatever its role; the admin token, whom the caller says (--as)
        approver = str(body.get("approver") or "admin") if who == MASTER else who[0]
        status, said = await answer_approval(store, approval_id, approver, verb == "approve",
                                             always=bool(body.get("always")), reason=str(body.get("reason") or ""))
        return web.json_response(said, status=status) if status == 200 else json_error(status, said["error"])

    async def grants(request: web.Request) -> web.Response:
        return web.json_response({"grants": await store.grants()})

    async def revoke(request: web.Request) -> web.Response:
        grant_id = request.match_info["id"]
        if not await store.revoke(grant_id):
            return json_error(404, f"no always grant {grant_id} in force")
        log.info("always grant %s revoked", grant_id)
        return web.json_response({"id": grant_id, "revoked": True})

    def add_routes(app: web.Application) -> None:
        app.router.add_get("/approvals", listing)
        app.router.add_get("/approvals/always", grants)
        app.router.add_post("/approvals/always/{id}/revoke", revoke)
        app.router.add_post("/approvals/{id}/{verb:approve|deny}", answer)

    return add_routes


async def answer_approval(store: Store, approval_id: str, approver: str, approve: bool, *, always: bool = False,
                          reason: str = "") -> tuple[int, dict]:
    """Approve (once, or always: the agent may use the tool from now on) or deny a waiting call, as `approver`:
    (200, the approval) or (404 or 409, {"error": why})."""
    approval = await store.get_approval(approval_id)
    if approval is None:
        return 404, {"error": f"no approval {approval_id}"}
    note = ""
    if approve:
        if always and approval.get("source") in RULE_SOURCES:
            always, note = False, "approved once: a security rule asked, and an always answer cannot lift it"
        moved = await store.settle_approval(approval_id, "approved", approver, None,
                                            granted="pending" if always else None)
        if moved and always:
            grant = await store.grant(approval["agent"], approval["tool"], approver)
            await store.settle_approval(approval_id, "approved", None, None, only_from=("approved",), granted=grant)
    else:
        moved = await store.settle_approval(approval_id, "denied", approver, reason or "denied by " + approver)
    if not moved:
        return 409, {"error": f"{approval_id} is {approval['status']}, not waiting"}
    log.info("approval %s: %s by %s", approval_id, "approved" if approve else "denied", printable(approver))
    return 200, {**(await store.get_approval(approval_id) or {}), **({"note": note} if note else {})}


async def _json_object(request: web.Request) -> dict | web.Response:
    """The body as a JSON object, or the 400 that says why not."""
    try:
        body = orjson.loads(await request.read()) if request.body_exists else {}
    except orjson.JSONDecodeError:
        return json_error(400, "the body must be JSON")
    if not isinstance(body, dict):
        return json_error(400, "the body must be a JSON object")
    return body
