"""What the limits have counted, for people, and a count reset: the admin API, the console's page, /metrics.

    GET  /toolkeeper/limits              every limit of the policy in force, with its most used scopes (JSON; the
                                         console's page for a browser, console/limits.py)
    GET  /toolkeeper/limits/{id}         one limit
    POST /toolkeeper/limits/{id}/reset   {"scope": "user=ada@example.com"}: that scope's count cleared; {}: every
                                         scope's. A form from the console page, or JSON from a script

Reading is for the auditor, approver and admin roles, a reset for the admin
role only. A reset is written to the trail before the count is cleared (who,
which limit and scope, how much was used), so no reset goes unrecorded: a
trail that cannot be written refuses it.

The limits are those of the policy in force, read at each request (SIGHUP
replaces it); the counts are the store's, so every replica shows, and
resets, the same ones. /metrics gets them summed by limit (`gauges`), never
by scope: a scope names a person.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from aiohttp import web

from toolkeeper.audit import ExecutionRecord, SQLAudit
from toolkeeper.common import counted, printable
from toolkeeper.metrics import Metrics, Read
from toolkeeper.policy import Decision, Limit, Policy, window_text
from toolkeeper.store import Count, Store
from toolkeeper.wire.admin.api import _json_object
from toolkeeper.wire.admin.console.layout import url
from toolkeeper.wire.admin.console.limits import amount, limits_page
from toolkeeper.wire.admin.guard import MASTER, Holder, json_error, refused

log = logging.getLogger("toolkeeper")

READERS = frozenset({"auditor", "approver", "admin"})  # who may see the counts
RESETTERS = frozenset({"admin"})  # who may clear one
SHOWN = 100  # scopes listed per limit, the most used first
RESET_CALL = "limit-reset:"  # the call id's prefix of a reset's record
UNITS = {"calls": "calls", "tokens": "tokens", "run_time": "s of run time"}


class LimitsView:
    """The limits of the policy in force (`policy`: called each time, a reload replaces it) and their counts."""

    def __init__(self, policy: Callable[[], Policy], store: Store, audit: SQLAudit, metrics: Metrics | None = None):
        self.policy = policy
        self.store = store
        self.audit = audit
        self.metrics = metrics

    def limits(self) -> tuple[Limit, ...]:
        rules = self.policy().rules
        return rules.limits if rules is not None else ()

    def find(self, limit_id: str) -> Limit | None:
        return next((limit for limit in self.limits() if limit.id == limit_id), None)

    async def state(self, limit: Limit) -> dict[str, Any]:
        """A limit as the API shows it, amounts in its unit (run time in seconds): its most used scopes first."""
        scoped, total, highest = await self.store.limit_totals(limit.id, limit.per)
        usage = await self.store.limit_usage(limit.id, limit.per, SHOWN) if scoped else []
        return {"id": limit.id, "counts": limit.counts, "max": limit.shown(limit.most), "per": window_text(limit.per),
                "scope": list(limit.scope), "effect": limit.effect, "reason": limit.reason,
                "used_total": limit.shown(total), "used_highest": limit.shown(highest), "scopes_counted": scoped,
                "scopes": [scope_state(limit, scope, used) for scope, used in usage]}

    async def overview(self) -> list[dict[str, Any]]:
        return [await self.state(limit) for limit in self.limits()]

    async def reset(self, limit: Limit, scope: str | None, by: str, identity: dict | None) -> dict[str, Any]:
        """One scope's count cleared (`scope`), or every scope's (None), as `by`: recorded first, then cleared."""
        if scope is None:
            scoped, total, highest = await self.store.limit_totals(limit.id, limit.per)
            used: dict[str, Any] = {"scopes": scoped, "used_total": limit.shown(total),
                                    "used_highest": limit.shown(highest)}
            what = (f"every scope ({scoped} with a count, {amount(limit.shown(total))} {UNITS[limit.counts]} used in "
                    f"all, the most {amount(limit.shown(highest))} of {amount(limit.max)})")
        else:
            [used_now] = await self.store.used([Count(limit.id, scope, limit.per, limit.most)])
            used = {"used": limit.shown(used_now)}
            what = f"{scope} ({amount(limit.shown(used_now))} of {amount(limit.max)} {UNITS[limit.counts]} used)"
        reason = f"limit {limit.id} reset for {what} in the last {window_text(limit.per)}, by {by}"
        record = reset_record(limit, scope, by, identity, reason, used, self.policy().revision)
        await self.audit.write("refused", record)  # one event, every field; before the count goes
        cleared = await self.store.reset_limit(limit.id, scope)
        log.info("%s (%s cleared)", printable(reason), counted(cleared, "bucket"))
        return {"id": limit.id, "scope": scope, "cleared": cleared, **used, "record_id": record.record_id}

    async def gauges(self) -> Read:
        """/metrics' limit families, read from the store now: the same on every replica and worker."""
        read: Read = {name: [] for name in ("toolkeeper_limit_max", "toolkeeper_limit_used",
                                            "toolkeeper_limit_used_highest", "toolkeeper_limit_scopes",
                                            "toolkeeper_limit_scopes_full")}
        limits = self.limits()
        if self.metrics is not None:  # the counter's series of each limit, there at zero (before the store is read):
            for limit in limits:  # its effect, and a token budget's deny (a spent budget ends the turn)
                for effect in {limit.effect} | ({"deny"} if limit.counts == "tokens" else set()):
                    self.metrics.expect("toolkeeper_limit_stopped_total", effect=effect, limit=limit.id)
        for limit in limits:
            scoped, total, highest = await self.store.limit_totals(limit.id, limit.per)
            labels = {"limit": limit.id}
            for name, value in (("max", limit.shown(limit.most)), ("used", limit.shown(total)),
                                ("used_highest", limit.shown(highest)), ("scopes", scoped),
                                ("scopes_full", await self._full(limit, scoped))):
                read[f"toolkeeper_limit_{name}"].append((labels, value))
        return read if limits else {}

    async def _full(self, limit: Limit, scoped: int) -> int:
        """How many scopes are at or past the maximum: the most used come first, so the first SHOWN tell, unless
        every one of them is full."""
        if not scoped:
            return 0
        usage = await self.store.limit_usage(limit.id, limit.per, SHOWN)
        if scoped > SHOWN and usage and usage[-1][1] >= limit.most:
            usage = await self.store.limit_usage(limit.id, limit.per, scoped)
        return sum(1 for _, used in usage if used >= limit.most)


def scope_state(limit: Limit, scope: str, used: int) -> dict[str, Any]:
    return {"scope": scope, "used": limit.shown(used), "remaining": max(limit.shown(limit.most - used), 0),
            "full": used >= limit.most}


def reset_record(limit: Limit, scope: str | None, by: str, identity: dict | None, reason: str,
                 used: dict[str, Any], revision: str | None) -> ExecutionRecord:
    """A count reset by a person, for the trail: who, which limit and scope, and how much was used."""
    record = ExecutionRecord(api="admin", source="admin", tool=f"limit:{limit.id}", runner="", status="ok",
                             call_id=f"{RESET_CALL}{secrets.token_hex(4)}", approver=by, approver_identity=identity,
                             consent="approved", arguments={"limit": limit.id, "scope": scope, **used})
    record.decided_by(Decision("allow", "limits", reason, limit.id, revision))
    return record


def limits_api(view: LimitsView) -> Callable[[web.Application], None]:
    """The routes, for the admin sub-app (behind its guard)."""

    async def listing(request: web.Request) -> web.StreamResponse:
        if (refusal := _refusal(request, READERS)) is not None:
            return refusal
        states = await view.overview()
        if "text/html" in request.headers.get("Accept", ""):  # a person's browser: the console's page
            return limits_page(request, states, _may(request, RESETTERS), await _notice(view, request))
        return web.json_response({"limits": states})

    async def one(request: web.Request) -> web.StreamResponse:
        if (refusal := _refusal(request, READERS)) is not None:
            return refusal
        limit = view.find(request.match_info["id"])
        if limit is None:
            return _unknown(request.match_info["id"])
        return web.json_response(await view.state(limit))

    async def reset(request: web.Request) -> web.StreamResponse:
        if (refusal := _refusal(request, RESETTERS)) is not None:
            return refusal
        form = request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data")
        body = dict(await request.post()) if form else await _json_object(request)
        if isinstance(body, web.Response):
            return body
        scope = body.get("scope")  # none: every scope's count
        if scope is not None and (not isinstance(scope, str) or not scope):
            return json_error(400, "scope: a scope key, like user=ada@example.com (or none: every scope)")
        limit = view.find(request.match_info["id"])
        if limit is None:
            return _unknown(request.match_info["id"])
        who: Holder = request.get("identity") or MASTER
        by = str(body.get("approver") or "admin") if who.master else who.approver  # the admin token says whom
        done = await view.reset(limit, scope, by, who.identity)
        if form:
            raise web.HTTPSeeOther(url("/limits", {"reset": done["record_id"]}) + f"#{quote(limit.id, safe='')}")
        return web.json_response(done)

    def add_routes(app: web.Application) -> None:
        app.router.add_get("/limits", listing)
        app.router.add_get("/limits/{id}", one)
        app.router.add_post("/limits/{id}/reset", reset)

    return add_routes


def _may(request: web.Request, roles: frozenset[str]) -> bool:
    who: Holder | None = request.get("identity")
    return who is not None and who.may(roles)


def _refusal(request: web.Request, roles: frozenset[str]) -> web.Response | None:
    if _may(request, roles):
        return None
    who: Holder | None = request.get("identity")
    name = f"{who.name} ({who.role})" if who is not None else "no one"
    return refused(request, f"{name} may not reach {request.method} {request.path}: it needs the "
                            f"{' or '.join(sorted(roles))} role")


def _unknown(limit_id: str) -> web.Response:
    return json_error(404, printable(f"no limit {limit_id!r} in the policy in force"))


async def _notice(view: LimitsView, request: web.Request) -> str:
    """After a reset from the page: what the trail recorded of it (a link can show no other sentence)."""
    record_id = request.query.get("reset", "")
    if not record_id:
        return ""
    record = await asyncio.to_thread(view.audit.record, record_id[:64])
    if record is None or not record.call_id.startswith(RESET_CALL):
        return ""
    return record.decision_reason

