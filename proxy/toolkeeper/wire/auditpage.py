"""The audit page: recent executions, filters, and one execution in full, for people.

Server-rendered HTML, no front-end build, on the admin sub-app
(/toolkeeper/audit) behind its guard: a person signs in once with the admin
token, a script sends `Authorization: Bearer` (wire/admin.py).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import Iterable
from datetime import datetime
from html import escape
from typing import Any

from aiohttp import web

from toolkeeper.audit import STATUSES, AuditEntry, SQLAudit
from toolkeeper.common import printable
from toolkeeper.wire.admin import COOKIE, AdminGuard
from toolkeeper.wire.admin import PREFIX as ADMIN_PREFIX

PREFIX = ADMIN_PREFIX + "/audit"
PAGE = 500
SINCE = {"1h": 3600, "24h": 86400, "7d": 604800, "30d": 2592000}
SOURCES = ("declared", "agent")  # declared calls, or the agent's own

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em; color: #1d232a; }
h1 { font-size: 1.4em; } h1 a { color: inherit; text-decoration: none; }
table { border-collapse: collapse; width: 100%; } th, td { padding: .35em .6em; text-align: left; }
tr:nth-child(even) { background: #f4f6f8; } th { border-bottom: 2px solid #c9d1d9; }
.ok { color: #1a7f37; } .failed, .timeout { color: #cf222e; } .denied, .invalid { color: #9a6700; }
form { margin: 1em 0; display: flex; gap: .8em; align-items: end; } label { display: flex; flex-direction: column; }
pre { background: #f4f6f8; padding: .8em; overflow: auto; white-space: pre-wrap; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: .3em 1.2em; } dt { font-weight: 600; }
"""


def _page(title: str, body: str) -> web.Response:
    html = (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1><a href='{PREFIX}'>toolkeeper audit</a></h1>{body}</body></html>")
    return web.Response(text=html, content_type="text/html")


def _when(seconds: float | None) -> str:
    if not seconds:
        return ""
    return datetime.fromtimestamp(seconds).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _decided_by(record: AuditEntry) -> str:
    return record.decision_rule or record.decision_source or ""


def _sign_in_form(message: str = "The audit page needs the admin token.") -> web.Response:
    form = (f"<p class=refused>{escape(message)}</p><form method=post action='{PREFIX}/sign-in'>"
            "<label>admin token<input type=password name=token autofocus></label>"
            "<button type=submit>Sign in</button></form>")
    response = _page("sign in", form)
    response.set_status(401)
    return response


def _show(value: Any, block: bool = False) -> str:
    """HTML for a value: control and bidi characters escaped first, so a value cannot reorder what is read."""
    return escape(printable(str(value), keep_newlines=block))


def _field(name: str, value: Any, block: bool = False) -> str:
    if value is None or value == "" or value == []:
        return ""
    if isinstance(value, (dict, list)):
        value, block = json.dumps(value, indent=2, ensure_ascii=False), True
    shown = f"<pre>{_show(value, block)}</pre>" if block else _show(value)
    return f"<dt>{escape(name)}</dt><dd id='{escape(name)}'>{shown}</dd>"


def _options(values: Iterable[str], selected: str | None) -> str:
    return "".join(f"<option{' selected' if selected == v else ''}>{_show(v)}</option>" for v in values)


class AuditPage:
    """The page's routes, for the admin sub-app; its sign-in form is the one path open to anyone."""

    def __init__(self, audit: SQLAudit, guard: AdminGuard):
        self.audit = audit
        self.guard = guard

    def __call__(self, app: web.Application) -> None:
        self.guard.public.add(PREFIX + "/sign-in")
        self.guard.refusals.append((PREFIX, self.refused))
        app.router.add_get("/audit", self.listing)
        app.router.add_post("/audit/sign-in", self.sign_in)
        app.router.add_get("/audit/{id}", self.detail)

    async def refused(self, request: web.Request) -> web.Response:
        return _sign_in_form()

    async def sign_in(self, request: web.Request) -> web.Response:
        given = str((await request.post()).get("token", ""))
        if not hmac.compare_digest(given.encode(), (self.guard.token or "").encode()):
            return _sign_in_form("That is not the admin token.")
        response = web.HTTPSeeOther(PREFIX)
        response.set_cookie(COOKIE, self.guard.session or "", httponly=True, samesite="Strict", path=PREFIX,
                            secure=request.secure)
        raise response

    async def listing(self, request: web.Request) -> web.Response:
        query = request.query
        filters = {"tool": query.get("tool") or None, "status": query.get("status") or None,
                   "agent": query.get("agent") or None}
        since = SINCE.get(query.get("since", ""))
        filters["since"] = time.time() - since if since else None
        source = query.get("source") if query.get("source") in SOURCES else None
        # paged and counted in SQL, off the event loop: a large trail or a slow database never stalls the proxy
        records, total, tools = await asyncio.to_thread(self._page_of, filters, source)
        form = (f"<form method=get action='{PREFIX}'>"
                f"<label>tool<select name=tool><option value=''>any</option>"
                f"{_options(tools, query.get('tool'))}</select></label>"
                f"<label>status<select name=status><option value=''>any</option>"
                f"{_options(STATUSES, query.get('status'))}</select></label>"
                f"<label>source<select name=source><option value=''>any</option>"
                f"{_options(SOURCES, query.get('source'))}</select></label>"
                f"<label>agent<input name=agent value='{_show(query.get('agent', ''))}' size=18></label>"
                f"<label>since<select name=since><option value=''>ever</option>"
                f"{_options(SINCE, query.get('since'))}</select></label>"
                f"<button type=submit>Filter</button></form>")
        rows = "".join(
            f"<tr class=record><td><a href='{PREFIX}/{escape(r.record_id)}'>{escape(_when(r.time))}</a></td>"
            f"<td class='{escape(r.status)} status'>{_show(r.status)}</td>"
            f"<td class=tool>{_show(r.tool)}{' <small>agent</small>' if r.source == 'agent' else ''}</td>"
            f"<td>{r.duration_ms:.1f} ms</td>"
            f"<td>{_show(r.decision)} <small>{_show(_decided_by(r))}</small></td>"
            f"<td><code>{_show(r.agent)}</code></td></tr>"
            for r in records)
        table = ("<table><thead><tr><th>time</th><th>status</th><th>tool</th><th>duration</th><th>decision</th>"
                 f"<th>agent</th></tr></thead><tbody>{rows}</tbody></table>")
        shown = f"the latest {len(records)} of {total}" if total > len(records) else f"{total}"
        return _page("toolkeeper audit", f"{form}<p>{shown} executions</p>{table}")

    def _page_of(self, filters: dict, source: str | None) -> tuple[list, int, list[str]]:
        """The newest records first, their total, and the tools to filter by."""
        if source:  # not a column: every matching record read, then paged
            matching = self.audit.records(source=source, **filters)
            return matching[-PAGE:][::-1], len(matching), self.audit.tools()
        return self.audit.records(limit=PAGE, **filters)[::-1], self.audit.count(**filters), self.audit.tools()

    async def detail(self, request: web.Request) -> web.Response:
        record = await asyncio.to_thread(self.audit.record, request.match_info["id"])
        if record is None:
            return _page("not found", "<p>No such execution.</p>")
        ran_by_the_agent = "one of the agent's own tools"
        fields = "".join([
            _field("tool", f"{record.tool} ({record.runner or ran_by_the_agent})"),
            _field("status", record.status),
            _field("time", _when(record.time)),
            _field("agent", record.agent),
            _field("arguments as sent", record.arguments_sent),
            _field("arguments as coerced", record.arguments),
            _field("argv", record.argv),
            _field("decision", f"{record.decision} by {_decided_by(record)}" if record.decision else ""),
            _field("reason", record.decision_reason),
            _field("policy revision", record.policy_revision),
            _field("approver", record.approver),
            _field("exit status", record.exit_code),
            _field("trap", record.trap),
            _field("duration", f"{record.duration_ms:.1f} ms"),
            _field("output", f"{record.output_bytes} bytes, sha256 {record.output_sha256}"
                   if record.output_sha256 else ""),
            _field("answer (excerpt)", record.answer, block=True),
            _field("redacted", ", ".join(record.redacted)),
            _field("record id", record.record_id),
        ])
        return _page(f"{record.tool} {record.status}", f"<dl>{fields}</dl>")
