"""Everything under /toolkeeper/: one sub-app, one check of the admin token, answered here.

    GET  /toolkeeper/approvals                    the calls waiting for a person
    POST /toolkeeper/approvals/{id}/approve|deny  an answer ({"always", "reason", "approver"})
    /toolkeeper/queue, /toolkeeper/audit, ...      the console, for people (console/)

No /toolkeeper/ request is ever forwarded to the model server: one that no
route serves (a wrong method, an unknown path, no token configured) is
answered here, so the admin token can never leave toolkeeper. A script sends
`Authorization: Bearer $TOOLKEEPER_ADMIN_TOKEN` (or a named token); a person
signs in to the console once, through the OpenID provider (people.py) or with
a token (sessions.py), which opens a browser session.
A request that a session cookie authenticates and that changes anything must
carry the session's CSRF key and come from toolkeeper's own origin.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import orjson
from aiohttp import web

from toolkeeper.audit import SQLAudit
from toolkeeper.common import printable
from toolkeeper.engine import approve_definition, changed_fields, definition_diff
from toolkeeper.policy import RULE_SOURCES, four_eyes_refusal
from toolkeeper.store import Store
from toolkeeper.wire.admin.guard import MASTER, AdminGuard, Holder, json_error

log = logging.getLogger("toolkeeper")


def admin_app(guard: AdminGuard, *parts: Callable[[web.Application], None]) -> web.Application:
    """The sub-app mounted at /toolkeeper, with each part's routes: every path under it is answered here."""
    app = web.Application(middlewares=[guard.middleware])
    for add_routes in parts:
        add_routes(app)

    async def not_found(request: web.Request) -> web.Response:
        return json_error(404, f"no {request.method} {request.path} in toolkeeper's admin API")

    app.router.add_route("*", "/{tail:.*}", not_found)  # last, after every real route
    return app


def tools_api(names: Callable[[], list[str]]) -> Callable[[web.Application], None]:
    """GET /tools: the declared tools in force, by name (behind the admin token, not on /healthz)."""

    async def listing(request: web.Request) -> web.Response:
        return web.json_response({"tools": names()})

    def add_routes(app: web.Application) -> None:
        app.router.add_get("/tools", listing)

    return add_routes


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
        who: Holder = request.get("identity") or MASTER
        status, said = await answer_approval(store, approval_id, _approver(request, body), verb == "approve",
                                             always=bool(body.get("always")), reason=str(body.get("reason") or ""),
                                             identity=who.identity)
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


def pins_api(store: Store, audit: SQLAudit) -> Callable[[web.Application], None]:
    """The pinned definitions of the agent's MCP servers' tools (admin role).

        GET  /mcp/pins                          each tool seen: its pinned definition, and the one served now
        POST /mcp/pins/{server}/{tool}/approve  take the definition served now in force (`toolkeeper mcp approve`)
    """

    async def listing(request: web.Request) -> web.Response:
        pins = await store.pins()
        return web.json_response({"pins": [{**pin, **_what_changed(pin)} for pin in pins]})

    async def approve(request: web.Request) -> web.Response:
        server, tool = request.match_info["server"], request.match_info["tool"]
        body = await _json_object(request)
        if isinstance(body, web.Response):
            return body
        pin = await approve_definition(store, audit, server, tool, _approver(request, body))
        if pin is None:
            return json_error(404, f"no tool {tool!r} of an MCP server {server!r} has been seen")
        return web.json_response(pin)

    def add_routes(app: web.Application) -> None:
        app.router.add_get("/mcp/pins", listing)
        app.router.add_post("/mcp/pins/{server}/{tool}/approve", approve)

    return add_routes


def _what_changed(pin: dict) -> dict:
    """A pin's change, for a person: the fields that differ, and the diff of the whole definition."""
    if not pin["changed"]:
        return {"changed_fields": [], "diff": ""}
    return {"changed_fields": changed_fields(pin["definition"], pin["seen_definition"]),
            "diff": definition_diff(pin["definition"], pin["seen_definition"])}


async def answer_approval(store: Store, approval_id: str, approver: str, approve: bool, *, always: bool = False,
                          reason: str = "", identity: dict | None = None) -> tuple[int, dict]:
    """Approve (once, or always: the agent may use the tool from now on) or deny a waiting call, as `approver`
    (`identity`: as a person the provider vouched for): (200, the approval) or (403 when the call was asked for
    on the approver's own behalf, 404 or 409, {"error": why})."""
    approval = await store.get_approval(approval_id)
    if approval is None:
        return 404, {"error": f"no approval {approval_id}"}
    note = ""
    if approve:
        if approval["status"] == "waiting" and (own := four_eyes_refusal(approval, approver, identity)):
            log.warning("approval %s refused: %s", approval_id, printable(own))
            return 403, {"error": own}
        if always and approval.get("source") in RULE_SOURCES:
            always, note = False, "approved once: a security rule asked, and an always answer cannot lift it"
        moved = await store.settle_approval(approval_id, "approved", approver, None,
                                            granted="pending" if always else None, identity=identity)
        if moved and always:
            grant = await store.grant(approval["agent"], approval["tool"], approver, identity)
            await store.settle_approval(approval_id, "approved", None, None, only_from=("approved",), granted=grant)
    else:
        moved = await store.settle_approval(approval_id, "denied", approver, reason or "denied by " + approver,
                                            identity=identity)
    if not moved:
        return 409, {"error": f"{approval_id} is {approval['status']}, not waiting"}
    log.info("approval %s: %s by %s", approval_id, "approved" if approve else "denied", printable(approver))
    return 200, {**(await store.get_approval(approval_id) or {}), **({"note": note} if note else {})}


def _approver(request: web.Request, body: dict) -> str:
    """A named token records its own name, whatever its role, and a person their email (else username); the admin
    token, whom the caller says (--as)."""
    who: Holder = request.get("identity") or MASTER
    return str(body.get("approver") or "admin") if who.master else who.approver


async def _json_object(request: web.Request) -> dict | web.Response:
    """The body as a JSON object, or the 400 that says why not."""
    try:
        body = orjson.loads(await request.read()) if request.body_exists else {}
    except orjson.JSONDecodeError:
        return json_error(400, "the body must be JSON")
    if not isinstance(body, dict):
        return json_error(400, "the body must be a JSON object")
    return body
