"""The approvals queue, for approvers: what waits, answered in a click, live.

    GET  /toolkeeper/queue                          the waiting calls and the always grants
    GET  /toolkeeper/queue/live                     server-sent events: the queue as it changes
    GET  /toolkeeper/queue/{id}                     one call: the page the `notify:` channels' links open
    POST /toolkeeper/queue/{id}/approve|always|deny  an answer (form: csrf, and a reason to deny)
    POST /toolkeeper/queue/grants/{id}/revoke        ends an always grant

Each waiting call shows what a person needs to decide: the tool, its
arguments (secrets already redacted by the engine) and argv, the rule and
reason that asked, the agent and its identity header, the user the call is
for (when serve noted one), how long it has waited and how long it has left.
The live stream sends each waiting call's HTML
(rendered and escaped here), so the page's script only adds and removes rows
and never builds markup from a value; a row being answered is left as it is.

Each call also shows where its ask was sent (the policy's `notify:` channels:
delivered, still trying and why, given up), and the queue says when a
channel is failing. A call's own page is what a channel's link opens: it
shows the call and the same forms, and opening it answers nothing. The
session cookie is SameSite=Strict, so a link followed from another site (a
chat message) arrives without it: that request is answered with a page that
opens the same address again, now from this site, with the cookie
(`reopen_here`); signed out, the second look is the sign-in form, which comes
back to the call.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from toolkeeper.identity import IssuerUnavailable
from toolkeeper.policy import four_eyes_refusal
from toolkeeper.store import Store
from toolkeeper.wire.admin.api import answer_approval
from toolkeeper.wire.admin.console.layout import csrf_field, field, link, page, show, url, when
from toolkeeper.wire.admin.guard import MASTER, PREFIX, Holder
from toolkeeper.wire.admin.sessions import SESSION_COOKIE

# What a page says after an answer: fixed sentences, so a link cannot make the page say anything else.
NOTICES = {
    "approved": "{id} ({tool}) approved by {approver}",
    "always": "{id} ({tool}) approved by {approver}, always: {agent} may use {tool} until the grant is revoked",
    "once": "{id} ({tool}) approved by {approver}, once: a security rule asked, and an always answer cannot lift it",
    "denied": "{id} ({tool}) denied by {approver}: {reason}",
    "gone": "{id} is not waiting any more: answered, expired, or unknown",
    "own": "{id} ({tool}) was asked for on your behalf: another approver must approve it (four eyes); you may deny it",
    "revoked": "always grant {id} revoked",
    "no-grant": "no always grant {id} in force",
}
# What a settled call's page says of it
SETTLED = {"approved": "approved by {approver}; the call has not run yet", "used": "approved by {approver}",
           "denied": "denied by {approver}: {reason}", "expired": "denied: {reason}"}
FAILING_SINCE = 86400.0  # seconds: a channel whose latest delivery in this window failed is said to be failing
LIVE_POLL = 1.0  # seconds between looks at the store for the live stream
IDLE_CHECK = 5.0  # seconds between looks at who holds a stream that sends nothing: a revoked token ends it
KEEPALIVE = 15.0
VERBS = ("approve", "always", "deny")


def _approval_html(approval: dict, request: web.Request, deliveries: list[dict] | None = None) -> str:
    approval_id = approval["id"]
    why = approval.get("why") or ""
    rule = approval.get("rule") or approval.get("source") or ""
    details = "".join([
        field("agent", approval.get("agent")),
        field("identity header", approval.get("agent_header")),
        field("for user", _user_of(approval)),
        field("asked by", rule),
        field("why", why),
        field("arguments", approval.get("arguments"), block=True),
        field("argv", approval.get("argv")),
        field("asked at", when(approval.get("created"))),
        _deliveries_html(deliveries or []),
    ])
    expires = approval.get("expires")
    who: Holder = request.get("identity") or MASTER
    own = four_eyes_refusal(approval, who.approver, who.identity)  # four eyes: the button says so, the answer too
    forms = "".join(
        f"<form method=post action='{link(f'/queue/{approval_id}/{verb}')}'>{csrf_field(request)}{extra}"
        f"<button type=submit name=verb value={verb}{' disabled' if own and verb != 'deny' else ''}>{label}</button>"
        "</form>"
        for verb, label, extra in (
            ("approve", "Approve", ""), ("always", "Approve always", ""),
            ("deny", "Deny", "<label>reason<input name=reason size=28 maxlength=500></label>")))
    if own:
        forms += f"<p class=own>{show(own)}</p>"
    created, expires = _number(approval.get("created")), _number(expires) if expires else ""
    return (f"<section class=approval data-approval='{show(approval_id)}' data-created='{created}'"
            f" data-expires='{expires}'><h2>{show(approval['tool'])} <small>{show(approval_id)} · "
            f"waiting <span class=age></span>{' · <span class=left></span> left' if expires else ''}</small></h2>"
            f"<dl>{details}</dl><div class=actions>{forms}</div></section>")


def _delivery_text(delivery: dict) -> str:
    tries = f"attempt {delivery['attempts']}"
    if delivery["status"] == "delivered":
        return f"{delivery['channel']}: delivered ({tries})"
    if delivery["status"] == "sending":
        return (f"{delivery['channel']}: not delivered yet, {tries} failed: {delivery['error']}; trying again"
                if delivery["error"] else f"{delivery['channel']}: sending")
    return f"{delivery['channel']}: not delivered: {delivery['error']}"


def _deliveries_html(deliveries: list[dict]) -> str:
    """Where the ask was sent, one line per channel (a failing one marked)."""
    if not deliveries:
        return ""
    lines = "".join(f"<li class='delivery {'ok' if d['status'] == 'delivered' else 'failed' if d['error'] else ''}'"
                    f" data-channel='{show(d['channel'])}'>{show(_delivery_text(d))}</li>" for d in deliveries)
    return f"<dt>sent to</dt><dd id=deliveries><ul>{lines}</ul></dd>"


def _failing_html(failing: list[dict]) -> str:
    """A note for each channel whose latest delivery failed: people may not know a call waits."""
    return "".join(
        f"<p class=refused data-failing='{show(d['channel'])}'>{show(d['channel'])} is not being reached: "
        f"{show(d['error'])} ({show(when(d['updated']))}). Calls still wait here, and are denied when their time "
        "runs out.</p>" for d in failing)


def reopen_here(request: web.Request) -> web.Response | None:
    """A call's page followed from another site (a channel's link) without a session cookie: the browser held
    it back (SameSite=Strict), so the page opens itself once more, from this site, which sends it. Asked again
    from here, it is not answered so: no loop."""
    if (request.method != "GET" or request.headers.get("Sec-Fetch-Site") != "cross-site"
            or SESSION_COOKIE in request.cookies or not request.path.startswith(PREFIX + "/queue/")):
        return None
    here = request.path_qs
    return page(request, "Opening the call", f"<meta http-equiv=refresh content='0;url={show(here)}'>"
                                             f"<p><a id=continue href='{show(here)}'>Open the call</a></p>")


def _settled_html(approval: dict, deliveries: list[dict]) -> str:
    """A call that no longer waits: what became of it, and what it was."""
    given = {key: value for key, value in approval.items() if value is not None}
    said = SETTLED.get(approval["status"], "{status}").format_map({"approver": "", "reason": "", **given})
    details = "".join([field("agent", approval.get("agent")), field("for user", _user_of(approval)),
                       field("asked by", approval.get("rule") or approval.get("source")),
                       field("why", approval.get("why")), field("arguments", approval.get("arguments"), block=True),
                       field("argv", approval.get("argv")), field("asked at", when(approval.get("created"))),
                       _deliveries_html(deliveries)])
    return (f"<p class=notice role=status id=settled>{show(approval['id'])} no longer waits: {show(said)}.</p>"
            f"<section class=approval><h2>{show(approval['tool'])} <small>{show(approval['id'])}</small></h2>"
            f"<dl>{details}</dl></section>")


def _user_of(approval: dict) -> str | None:
    """Whom the call is for, when the approval holds it (`principal_user`, or the call's `principal`)."""
    principal = approval.get("principal")
    return approval.get("principal_user") or (principal.get("user") if isinstance(principal, dict) else None)


def _number(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "0"


def _grants_html(grants: list[dict], request: web.Request) -> str:
    if not grants:
        return "<p>No always grants in force.</p>"
    rows = "".join(
        f"<tr class=grant><td>{show(g['agent'])}</td><td>{show(g['tool'])}</td><td>{show(g['approver'])}</td>"
        f"<td>{show(when(g['created']))}</td><td><form method=post action='{link('/queue/grants/' + g['id'])}"
        f"/revoke'>{csrf_field(request)}<button type=submit>Revoke</button></form></td></tr>" for g in grants)
    return ("<table><thead><tr><th>agent</th><th>tool</th><th>granted by</th><th>since</th><th></th></tr></thead>"
            f"<tbody>{rows}</tbody></table>")


class QueuePage:
    def __init__(self, store: Store, identity: Callable[[web.Request], Awaitable[Holder | None]],
                 closing: asyncio.Event):
        self.store = store
        self.identity = identity  # who holds a request: its bearer token, or its session, looked up anew
        self.closing = closing  # set when toolkeeper stops: live streams end rather than hold the stop up

    def __call__(self, app: web.Application) -> None:
        app.router.add_get("/queue", self.queue)
        app.router.add_get("/queue/live", self.live)
        app.router.add_get("/queue/{id}", self.call)  # after /queue/live
        app.router.add_post("/queue/grants/{id}/revoke", self.revoke)
        app.router.add_post("/queue/{id}/{verb:approve|always|deny}", self.answer)

    async def queue(self, request: web.Request) -> web.Response:
        waiting = await self.store.list_approvals("waiting")
        grants = await self.store.grants()
        notice = await self._notice(request.query.get("said", ""), request.query.get("id", ""))
        sent = await self.store.deliveries([a["id"] for a in waiting])
        failing = await self.store.failing_channels(time.time() - FAILING_SINCE)
        rows = "".join(_approval_html(a, request, sent.get(a["id"])) for a in waiting)
        body = (f"{notice}{_failing_html(failing)}<p id=empty{' hidden' if waiting else ''}>No call is waiting.</p>"
                f"<div id=queue data-live='{link('/queue/live')}'>{rows}</div>"
                f"<h2>Always grants</h2><div id=grants>{_grants_html(grants, request)}</div>")
        return page(request, "Calls waiting for approval", body)

    async def call(self, request: web.Request) -> web.Response:
        """One call, waiting (with the queue's forms) or settled. Reading it changes nothing."""
        approval_id = request.match_info["id"]
        approval = await self.store.get_approval(approval_id)
        back = f"<p><a href='{link('/queue')}'>All the calls waiting</a></p>"
        if approval is None:
            return page(request, "No such call", f"<p class=refused>No call {show(approval_id)} waits or waited for "
                                                 f"approval here.</p>{back}", status=404)
        deliveries = (await self.store.deliveries([approval_id])).get(approval_id, [])
        shown = (_approval_html(approval, request, deliveries) if approval["status"] == "waiting"
                 else _settled_html(approval, deliveries))
        return page(request, f"Call {approval_id}", shown + back)

    async def live(self, request: web.Request) -> web.StreamResponse:
        """The queue as server-sent events: one `queue` event at once, then one each time it changes."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                                "Cache-Control": "no-store"})
        await response.prepare(request)
        last, quiet, checked = b"", 0.0, 0.0
        while not self.closing.is_set():
            waiting, grants = await self.store.list_approvals("waiting"), await self.store.grants()
            sent = await self.store.deliveries([a["id"] for a in waiting])
            event = orjson.dumps({"rows": [{"id": a["id"], "html": _approval_html(a, request, sent.get(a["id"]))}
                                           for a in waiting],
                                  "grants": _grants_html(grants, request)})
            due = event != last or quiet >= KEEPALIVE
            # Who holds the stream is looked up before each event it sends, after the queue is read: a token revoked
            # (or a role changed) a moment ago never receives one more call's arguments. One store read per event
            # (events come only when the queue changes), and one every IDLE_CHECK seconds to end a quiet stream.
            if due or time.monotonic() - checked > IDLE_CHECK:
                if not await self._may_watch(request):
                    break
                checked = time.monotonic()
            if due:
                await response.write(b"event: queue\ndata: " + event + b"\n\n" if event != last else
                                     b": keep-alive\n\n")
                last, quiet = event, 0.0
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LIVE_POLL):
                    await self.closing.wait()
            quiet += LIVE_POLL
        return response

    async def _may_watch(self, request: web.Request) -> bool:
        """Whether the stream's holder (its bearer token, or its session's) is still an approver or an admin."""
        try:
            holder = await self.identity(request)
        except IssuerUnavailable:  # a person's roles that cannot be read again: the stream ends, as pages refuse
            return False
        return holder is not None and holder.may(("approver", "admin"))

    async def answer(self, request: web.Request) -> web.Response:
        approval_id, verb = request.match_info["id"], request.match_info["verb"]
        form = await request.post()
        who: Holder = request.get("identity") or MASTER
        status, said = await answer_approval(self.store, approval_id, who.approver, verb != "deny",
                                             always=verb == "always", reason=str(form.get("reason", ""))[:500],
                                             identity=who.identity)
        code = "own" if status == 403 else "gone" if status != 200 else "denied" if verb == "deny" else (
            "once" if said.get("note") else "always" if verb == "always" else "approved")
        raise web.HTTPSeeOther(url("/queue", {"said": code, "id": approval_id}))

    async def revoke(self, request: web.Request) -> web.Response:
        grant_id = request.match_info["id"]
        code = "revoked" if await self.store.revoke(grant_id) else "no-grant"
        raise web.HTTPSeeOther(url("/queue", {"said": code, "id": grant_id}))

    async def _notice(self, code: str, subject: str) -> str:
        if code not in NOTICES:
            return ""
        approval = (await self.store.get_approval(subject)
                    if code in ("approved", "always", "once", "denied", "own") else None)
        given = {key: value for key, value in (approval or {}).items() if value is not None}
        values = {"tool": "", "approver": "", "agent": "", "reason": "", **given, "id": subject}
        return f"<p class=notice role=status>{show(NOTICES[code].format_map(values))}</p>"
