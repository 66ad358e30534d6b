"""The trail, for auditors: every call, filtered, paged, opened, exported, and the chain verified.

    GET  /toolkeeper/audit                   calls, newest first, 50 a page (keyset: ?before=N / ?after=N)
    GET  /toolkeeper/audit/export            the current filter as JSONL or CSV (?format=jsonl|csv)
    POST /toolkeeper/audit/verify            walks the chain now and says what it found
    GET  /toolkeeper/audit/{id}              one call in full, with the other calls of its request and the
                                             calls of its session that led to its decision (its flow)

Filters: time range (since/until, or a preset), tool, status, source
(declared or the agent's own), decision source, rule, approver, agent,
identity header, the user a call was for, and a search in the arguments.
Every read runs in a thread on the trail's read connection, so a page never
stalls the proxy.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any
from urllib.parse import quote

from aiohttp import web

from toolkeeper.audit import SOURCES, STATUSES, AuditEntry, SQLAudit, principal_user
from toolkeeper.common import TIME_GRAMMAR, moment
from toolkeeper.wire.admin.console.layout import csrf_field, field, link, options, page, show, when

SHADOW = ("deny", "ask", "allow")  # what a shadow rule would have done: the trail filters on it
PRESETS = {"1h": 3600, "24h": 86400, "7d": 604800, "30d": 2592000}
CHOICES = ("tool", "decision_source", "rule", "approver", "header")  # filters offered as a list of what is there
TEXTS = ("agent", "user", "search", "request_id")  # typed: a trail's users may be too many for a list
EXPORTS = {"jsonl": "application/x-ndjson", "csv": "text/csv"}
CHOICES_FOR = 10.0
MAX_CHOICES = 500  # a list longer than this is no help: type in the search instead
FLOW_SHOWN = 20  # the calls of a flow a call's page lists


def typed_time(text: str) -> float | None:
    """A time a person typed, as the CLI's `--since` takes it: 7d, 12h, 30m (that long ago), or 2026-12-01T09:00
    (with or without a zone; none means the server's)."""
    return moment(text)


def _cursor(text: str) -> int | None:
    return int(text) if re.fullmatch(r"[0-9]{1,18}", text) else None


def filters_of(query: Any) -> tuple[dict[str, Any], list[str]]:
    """The trail's filters from a page's query string, and what does not parse: never left out silently (an
    export of a mistyped filter would be the whole trail)."""
    chosen: dict[str, Any] = {name: query.get(name) or None for name in (*CHOICES, *TEXTS)}
    problems = []
    for name, allowed in (("status", STATUSES), ("source", SOURCES), ("shadow", SHADOW), ("last", tuple(PRESETS))):
        given = query.get(name) or None
        if given is not None and given not in allowed:
            problems.append(f"{name}={given[:40]!r} is none of {', '.join(allowed)}")
        chosen[name] = given if given in allowed else None
    preset = PRESETS.get(chosen.pop("last") or "")
    for name in ("since", "until"):
        given = query.get(name) or ""
        chosen[name] = typed_time(given) if given else None
        if given and chosen[name] is None:
            problems.append(f"{name}={given[:40]!r} is not a time: give {TIME_GRAMMAR}")
    if preset:
        chosen["since"] = time.time() - preset
    return {name: value for name, value in chosen.items() if value is not None}, problems


def _decided_by(record: AuditEntry) -> str:
    return record.decision_rule or record.decision_source or ""


def _header_of(record: AuditEntry) -> str:
    return str(((record.policy_input or {}).get("agent") or {}).get("header") or "")


def _principal(record: AuditEntry) -> dict[str, Any]:
    principal = (record.policy_input or {}).get("principal")
    return principal if isinstance(principal, dict) else {}


def _groups_of(record: AuditEntry) -> list[str]:
    groups = _principal(record).get("groups")
    return [str(group) for group in groups] if isinstance(groups, list) else []


def _approver_identity(record: AuditEntry) -> str:
    """The approver as the identity provider vouched for them, when they signed in through it."""
    who = record.approver_identity or {}
    if not who:
        return ""
    groups, roles = ", ".join(map(str, who.get("groups") or [])), ", ".join(map(str, who.get("roles") or []))
    email = f" <{who['email']}>" if who.get("email") else ""
    return " · ".join(part for part in (
        f"{who.get('name') or ''}{email}", f"subject {who.get('subject')} at {who.get('issuer')}",
        f"groups {groups or 'none'}", f"roles {roles}" if roles else "") if part)


def _row(record: AuditEntry) -> str:
    agent_tool = " <small>agent</small>" if record.source == "agent" else ""
    shadow = "".join(f" <small class=shadow>shadow {show(s.get('rule'))}: {show(s.get('effect'))}</small>"
                     for s in record.shadow)
    return (f"<tr class=record><td><a href='{link('/audit/' + record.record_id)}'>{show(when(record.time))}</a></td>"
            f"<td class='{show(record.status)} status'>{show(record.status)}</td>"
            f"<td class=tool>{show(record.tool)}{agent_tool}</td><td>{record.duration_ms:.1f} ms</td>"
            f"<td>{show(record.decision)} <small>{show(_decided_by(record))}</small>{shadow}</td>"
            f"<td class=approver>{show(record.approver or '')}</td><td class=header>{show(_header_of(record))}</td>"
            f"<td class=user>{show(principal_user(record.policy_input) or '')}</td>"
            f"<td><code>{show(record.agent)}</code></td></tr>")


class TrailPages:
    def __init__(self, audit: SQLAudit):
        self.audit = audit
        self._chosen: tuple[float, dict[str, list[str]]] | None = None

    def __call__(self, app: web.Application) -> None:
        app.router.add_get("/audit", self.listing)
        app.router.add_get("/audit/export", self.export)
        app.router.add_post("/audit/verify", self.verify)
        app.router.add_get("/audit/{id}", self.detail)

    def _form(self, query: Any, choices: dict[str, list[str]]) -> str:
        def pick(name: str, label: str, values: Any) -> str:
            return f"<label>{label}<select name={name}>{options(values, query.get(name))}</select></label>"

        def text(name: str, label: str, size: int = 14, hint: str = "") -> str:
            value = show(query.get(name, ""))
            shown_hint = f" placeholder='{show(hint)}'" if hint else ""
            return f"<label>{label}<input type=text name={name} value='{value}' size={size}{shown_hint}></label>"

        # plain text, not a date picker: a time is also `7d` (that long ago), as the CLI's --since takes it
        time_hint = "7d, or 2026-12-01T09:00"

        return (f"<form class=filters method=get action='{link('/audit')}'>"
                f"<label>last<select name=last>{options(PRESETS, query.get('last'), 'any time')}</select></label>"
                f"{text('since', 'from', 16, time_hint)}{text('until', 'to', 16, time_hint)}"
                f"{pick('tool', 'tool', choices['tool'])}{pick('status', 'status', STATUSES)}"
                f"{pick('source', 'source', SOURCES)}{pick('shadow', 'a shadow rule would', SHADOW)}"
                f"{pick('decision_source', 'decided by', choices['decision_source'])}"
                f"{pick('rule', 'rule', choices['rule'])}{pick('approver', 'approver', choices['approver'])}"
                f"{pick('header', 'identity header', choices['header'])}{text('agent', 'agent')}"
                f"{text('user', 'for user')}"
                f"{text('search', 'arguments contain', 18)}<button type=submit>Filter</button>"
                f"<a href='{link('/audit')}'>clear</a></form>")

    def _read(self, filters: dict[str, Any], before: int | None, after: int | None) -> tuple:
        return (self.audit.page(filters, before, after), self.audit.count(**filters), self.audit.head(),
                self._choices())

    def _choices(self) -> dict[str, list[str]]:
        """What the filters' lists offer: read at most every CHOICES_FOR seconds (each is a scan of the index)."""
        now = time.monotonic()
        if self._chosen is None or now - self._chosen[0] > CHOICES_FOR:
            self._chosen = (now, {name: self.audit.distinct(name)[:MAX_CHOICES] for name in CHOICES})
        return self._chosen[1]

    async def listing(self, request: web.Request) -> web.Response:
        query = request.query
        filters, problems = filters_of(query)
        if problems:  # shown, never ignored: a list of a mistyped filter would be the whole trail
            refused = "".join(f"<li>{show(problem)}</li>" for problem in problems)
            return page(request, "Audit trail", f"{self._form(query, self._choices())}<div id=problems "
                        f"class=failed><p>These filters do not parse, so nothing is listed:</p><ul>{refused}</ul>"
                        "</div>", status=400)
        before, after = _cursor(query.get("before", "")), _cursor(query.get("after", ""))
        shown, total, (seq, head), choices = await asyncio.to_thread(self._read, filters, before, after)
        kept = {k: v for k, v in query.items() if k not in ("before", "after")}
        paging = "".join([
            f"<a href='{link('/audit', kept)}'>newest</a>" if (before, after) != (None, None) else "",
            f"<a rel=prev href='{link('/audit', {**kept, 'after': shown.newer})}'>newer</a>"
            if shown.newer is not None else "",
            f"<a rel=next href='{link('/audit', {**kept, 'before': shown.older})}'>older</a>"
            if shown.older is not None else ""])
        exports = " ".join(f"<a download href='{link('/audit/export', {**kept, 'format': f})}'>{f.upper()}</a>"
                           for f in EXPORTS)
        chain = (f"<form method=post action='{link('/audit/verify')}'>{csrf_field(request)}Chain head "
                 f"<code id=head>{show(head[:16])}</code> (event {show(seq)}) "
                 "<button type=submit>Verify now</button></form>")
        table = ("<table><thead><tr><th>time</th><th>status</th><th>tool</th><th>duration</th><th>decision</th>"
                 "<th>approver</th><th>identity header</th><th>for user</th><th>agent</th></tr></thead>"
                 f"<tbody>{''.join(_row(r) for r in shown.entries)}</tbody></table>")
        matches = "call matches" if total == 1 else "calls match"
        body = (f"{self._form(query, choices)}<p><span id=total>{total}</span> {matches} · export {exports}</p>"
                f"{chain}<nav class=paging>{paging}</nav>{table}<nav class=paging>{paging}</nav>")
        return page(request, "Audit trail", body)

    async def export(self, request: web.Request) -> web.Response:
        fmt = request.query.get("format", "jsonl")
        if fmt not in EXPORTS:
            raise web.HTTPBadRequest(text=f"format is one of {', '.join(EXPORTS)}")
        filters, problems = filters_of(request.query)
        if problems:
            raise web.HTTPBadRequest(text="the filters do not parse, so nothing is exported: " + "; ".join(problems))
        text = await asyncio.to_thread(self.audit.export, fmt, **filters)
        name = f"toolkeeper-audit-{time.strftime('%Y%m%d-%H%M%S')}.{fmt}"
        return web.Response(text=text, content_type=EXPORTS[fmt],
                            headers={"Content-Disposition": f'attachment; filename="{name}"'})

    async def verify(self, request: web.Request) -> web.Response:
        started = time.monotonic()
        intact, what = await asyncio.to_thread(self.audit.verify)
        verdict = "intact" if intact else "TAMPERED"
        body = (f"<p id=verdict class={'ok' if intact else 'failed'}>{verdict}: {show(what)}</p>"
                f"<p><small>walked in {time.monotonic() - started:.2f} s, {show(when(time.time()))}</small></p>"
                f"<p><a href='{link('/audit')}'>back to the trail</a></p>")
        return page(request, "Chain verified" if intact else "Chain broken", body)

    async def detail(self, request: web.Request) -> web.Response:
        record_id = request.match_info["id"]
        record = await asyncio.to_thread(self.audit.record, record_id)
        if record is None:
            return page(request, "Not found", "<p>No such call.</p>", status=404)
        siblings = await asyncio.to_thread(self.audit.records, request_id=record.request_id, limit=200) \
            if record.request_id else []
        ran_by_the_agent = "one of the agent's own tools"
        fields = "".join([
            field("tool", f"{record.tool} ({record.runner or ran_by_the_agent})"), field("status", record.status),
            field("time", when(record.time)), field("agent", record.agent),
            field("identity header", _header_of(record)), field("user", principal_user(record.policy_input)),
            field("groups", ", ".join(_groups_of(record))), field("issuer", _principal(record).get("issuer")),
            field("request", record.request_id),
            field("arguments as sent", record.arguments_sent), field("arguments as coerced", record.arguments),
            field("argv", record.argv),
            field("decision", f"{record.decision} by {_decided_by(record)}" if record.decision else ""),
            field("reason", record.decision_reason), field("policy revision", record.policy_revision),
            field("labels", ", ".join(record.labels)), field("session", record.session),
            field("shadow rules", "; ".join(f"{s.get('rule')} would {s.get('effect')}" for s in record.shadow)),
            field("approver", record.approver), field("approver identity", _approver_identity(record)),
            field("waited for the answer", f"{record.waited_ms / 1000:.1f} s" if record.waited_ms else ""),
            field("exit status", record.exit_code), field("trap", record.trap),
            field("duration", f"{record.duration_ms:.1f} ms"),
            field("output", f"{record.output_bytes} bytes, sha256 {record.output_sha256}"
                  if record.output_sha256 else ""),
            field("answer (excerpt)", record.answer, block=True), field("redacted", ", ".join(record.redacted)),
            field("record id", record.record_id),
        ])
        others = "".join(f"<li class=sibling><a href='{link('/audit/' + r.record_id)}'>{show(r.tool)}</a> "
                         f"{show(r.status)} <small>{show(when(r.time))}</small></li>"
                         for r in siblings if r.record_id != record.record_id)
        same = (f"<h2>Other calls of the same request</h2><ul id=siblings>{others}</ul>"
                f"<p><a href='{link('/audit', {'request_id': record.request_id})}'>all of them in the list</a></p>"
                if others else "")
        return page(request, f"{record.tool} {record.status}", f"<dl>{fields}</dl>{await self._flow(record)}{same}")

    async def _flow(self, record: AuditEntry) -> str:
        """The calls whose labels a rule on the session read to decide this one, each linked (one the trail no
        longer holds is named by its id; an id OPA named is quoted: the trail did not make it)."""
        if not record.flow:
            return ""
        shown = record.flow[:FLOW_SHOWN]
        found = await asyncio.to_thread(lambda: [self.audit.record(rid) for rid in shown])
        items = "".join(
            f"<li class=flow><a href='{link('/audit/' + quote(rid, safe=''))}'>{show(call.tool if call else rid)}</a>"
            + (f" <small>{show(', '.join(call.labels))}, {show(when(call.time))}</small>" if call else "") + "</li>"
            for rid, call in zip(shown, found, strict=True))
        more = len(record.flow) - len(shown)
        return (f"<h2>The calls of its session that led to this decision</h2><ul id=flow>{items}</ul>"
                + (f"<p><small>and {more} more</small></p>" if more else ""))
