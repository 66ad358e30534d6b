"""Everything under /toolkeeper/: one sub-app, one check of the admin token, answered here.

    GET  /toolkeeper/approvals                    the calls waiting for a person
    POST /toolkeeper/approvals/{id}/approve|deny  an answer ({"always", "reason", "approver"})
    GET  /toolkeeper/audit[/{id}]                 the audit page (wire/auditpage.py)

No /toolkeeper/ request is ever forwarded to the model server: one that no
route serves (a wrong method, an unknown path, no token configured) is
answered here, so the admin token can never leave toolkeeper. A script sends
`Authorization: Bearer $TOOLKEEPER_ADMIN_TOKEN`; a person signs in to the
page once, which sets an HttpOnly, SameSite=Strict cookie holding an HMAC of
the token (the server keeps no sessions).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from toolkeeper.common import printable
from toolkeeper.policy import RULE_SOURCES
from toolkeeper.settings import TOKEN_VARIABLE
from toolkeeper.store import Store, StoreError

log = logging.getLogger("toolkeeper")

PREFIX = "/toolkeeper"
COOKIE = "toolkeeper_audit"

Refusal = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


# Who may reach what: a named token's role (`toolkeeper tokens add NAME --role ROLE`); the admin token is `admin`.
ROLES = {PREFIX + "/approvals": {"approver", "admin"}, PREFIX + "/audit": {"auditor", "admin"}}
MASTER = ("admin", "admin")  # the admin token (TOOLKEEPER_ADMIN_TOKEN): `tokens add` never gives out this name


class AdminGuard:
    """The one check of who calls: the admin token or a named token (a bearer header), or the audit page's session
    cookie; then whether that role may reach the path."""

    def __init__(self, token: str | None, store: Store | None = None):
        self.token = token
        self.store = store
        self.session = (hmac.new(token.encode(), b"toolkeeper audit page", hashlib.sha256).hexdigest()
                        if token else None)
        self.public: set[str] = set()  # paths anyone may reach: the sign-in form
        self.refusals: list[tuple[str, Refusal]] = []  # a page's own way of saying "sign in first"

    def bearer(self, request: web.Request) -> bool:
        return bool(self.token) and hmac.compare_digest(given_token(request).encode(), self.token.encode())  # type: ignore[union-attr]

    async def identity(self, request: web.Request) -> tuple[str, str] | None:
        """(name, role) of who calls, or None; the admin token's holder is MASTER (it may say who it answers
        for, as `--as`); a named token is its own name."""
        if self.bearer(request):
            return MASTER
        given = given_token(request)
        if given and self.store is not None:
            return await self.store.token_holder(given)
        if self.session and hmac.compare_digest(request.cookies.get(COOKIE, "").encode(), self.session.encode()):
            return MASTER
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
                request["identity"] = who
                return await handler(request)
        except StoreError as exc:
            return json_error(503, f"the store did not answer: {exc}")
        for prefix, refuse in self.refusals:
            if request.path.startswith(prefix):
                return await refuse(request)
        return json_error(401, f"a valid token is required (Authorization: Bearer ${TOKEN_VARIABLE}, or a named "
                               "token from `toolkeeper tokens add`)")


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
        waiting = [{**a, "age": round(now - a["created"], 1)} for a in await store.list_approvals("waiting")]
        return web.json_response({"approvals": waiting})  # ASCII JSON: control characters arrive escaped

    async def answer(request: web.Request) -> web.Response:
        approval_id, verb = request.match_info["id"], request.match_info["verb"]
        body = await _json_object(request)
        if isinstance(body, web.Response):
            return body
        approval = await store.get_approval(approval_id)
        if approval is None:
            return json_error(404, f"no approval {approval_id}")
        who = request.get("identity") or MASTER
        # a named token records its own name, whatever its role; the admin token, whom the caller says (--as)
        approver = str(body.get("approver") or "admin") if who == MASTER else who[0]
        note = ""
        if verb == "approve":
            always = bool(body.get("always"))
            if always and approval.get("source") in RULE_SOURCES:
                always, note = False, "approved once: a security rule asked, and an always answer cannot lift it"
            moved = await store.settle_approval(approval_id, "approved", approver, None,
                                          granted="pending" if always else None)
            if moved and always:
                grant = await store.grant(approval["agent"], approval["tool"], approver)
                await store.settle_approval(approval_id, "approved", None, None, only_from=("approved",), granted=grant)
        else:
            reason = str(body.get("reason") or "denied by " + approver)
            moved = await store.settle_approval(approval_id, "denied", approver, reason)
        if not moved:
            return json_error(409, f"{approval_id} is {approval['status']}, not waiting")
        log.info("approval %s: %s by %s", approval_id, verb, printable(approver))
        return web.json_response({**(await store.get_approval(approval_id) or {}), **({"note": note} if note else {})})

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


async def _json_object(request: web.Request) -> dict | web.Response:
    """The body as a JSON object, or the 400 that says why not."""
    try:
        body = orjson.loads(await request.read()) if request.body_exists else {}
    except orjson.JSONDecodeError:
        return json_error(400, "the body must be JSON")
    if not isinstance(body, dict):
        return json_error(400, "the body must be a JSON object")
    return body
