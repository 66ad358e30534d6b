"""The audit page: recent executions, filters, and one execution in full, for people.

Server-rendered HTML, no front-end build. Served under /toolkeeper/audit when
an admin token is set, behind it: a person signs in once with the token (the
page sets an HttpOnly, SameSite=Strict cookie holding an HMAC of it, so the
server keeps no sessions); a script sends `Authorization: Bearer`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from datetime import datetime
from html import escape
from typing import Any

from aiohttp import web

from proxy.audit import SQLAudit

PREFIX = "/toolkeeper/audit"
STATUSES = ("ok", "failed", "invalid", "denied", "timeout", "running")
SINCE = {"1h": 3600, "24h": 86400, "7d": 604800, "30d": 2592000}

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


def _decided_by(record: dict[str, Any]) -> str:
    return record.get("decision_rule") or record.get("decision_source") or ""


COOKIE = "toolkeeper_audit"


def add_audit_page(app: web.Application, audit: SQLAudit, token: str) -> None:
    session = hmac.new(token.encode(), b"toolkeeper audit page", hashlib.sha256).hexdigest()

    def authorized(request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            return hmac.compare_digest(header[7:].strip().encode(), token.encode())
        return hmac.compare_digest(request.cookies.get(COOKIE, "").encode(), session.encode())

    def refuse(message: str = "The audit page needs the admin token.") -> web.Response:
        form = (f"<p class=refused>{escape(message)}</p><form method=post action='{PREFIX}/sign-in'>"
                "<label>admin token<input type=password name=token autofocus></label>"
                "<button type=submit>Sign in</button></form>")
        response = _page("sign in", form)
        response.set_status(401)
        return response

    async def sign_in(request: web.Request) -> web.Response:
        given = str((await request.post()).get("token", ""))
        if not hmac.compare_digest(given.encode(), token.encode()):
            return refuse("That is not the admin token.")
        response = web.HTTPSeeOther(PREFIX)
        response.set_cookie(COOKIE, session, httponly=True, samesite="Strict", path=PREFIX,
                            secure=request.secure)
        raise response

    async def listing(request: web.Request) -> web.Response:
        if not authorized(request):
            return refuse()
        query = request.query
        filters = {"tool": query.get("tool") or None, "status": query.get("status") or None,
                   "agent": query.get("agent") or None}
        since = SINCE.get(query.get("since", ""))
        records = audit.records(since=time.time() - since if since else None, **filters)[-500:][::-1]
        tools = sorted({r.get("tool", "") for r in audit.records()} - {""})
        options = "".join(f"<option{' selected' if query.get('status') == s else ''}>{s}</option>" for s in STATUSES)
        tool_options = "".join(f"<option{' selected' if query.get('tool') == t else ''}>{escape(t)}</option>"
                               for t in tools)
        since_options = "".join(f"<option{' selected' if query.get('since') == s else ''}>{s}</option>" for s in SINCE)
        form = (f"<form method=get action='{PREFIX}'>"
                f"<label>tool<select name=tool><option value=''>any</option>{tool_options}</select></label>"
                f"<label>status<select name=status><option value=''>any</option>{options}</select></label>"
                f"<label>agent<input name=agent value='{escape(query.get('agent', ''))}' size=18></label>"
                f"<label>since<select name=since><option value=''>ever</option>{since_options}</select></label>"
                f"<button type=submit>Filter</button></form>")
        rows = "".join(
            f"<tr class=record><td><a href='{PREFIX}/{escape(r['record_id'])}'>{escape(_when(r.get('time')))}</a></td>"
            f"<td class='{escape(str(r.get('status')))} status'>{escape(str(r.get('status')))}</td>"
            f"<td class=tool>{escape(str(r.get('tool')))}</td>"
            f"<td>{(r.get('duration_ms') or 0):.1f} ms</td>"
            f"<td>{escape(str(r.get('decision') or ''))} <small>{escape(_decided_by(r))}</small></td>"
            f"<td><code>{escape(str(r.get('agent', '')))}</code></td></tr>"
            for r in records)
        table = ("<table><thead><tr><th>time</th><th>status</th><th>tool</th><th>duration</th><th>decision</th>"
                 f"<th>agent</th></tr></thead><tbody>{rows}</tbody></table>")
        return _page("toolkeeper audit", f"{form}<p>{len(records)} executions</p>{table}")

    async def detail(request: web.Request) -> web.Response:
        if not authorized(request):
            return refuse()
        record = audit.record(request.match_info["id"])
        if record is None:
            return _page("not found", "<p>No such execution.</p>")

        def field(name: str, value: Any, block: bool = False) -> str:
            if value is None or value == "" or value == []:
                return ""
            if isinstance(value, (dict, list)):
                value, block = json.dumps(value, indent=2, ensure_ascii=False), True
            shown = f"<pre>{escape(str(value))}</pre>" if block else escape(str(value))
            return f"<dt>{escape(name)}</dt><dd id='{escape(name)}'>{shown}</dd>"

        fields = "".join([
            field("tool", f"{record.get('tool')} ({record.get('runner')})"),
            field("status", record.get("status")),
            field("time", _when(record.get("time"))),
            field("agent", record.get("agent")),
            field("arguments as sent", record.get("arguments_sent")),
            field("arguments as coerced", record.get("arguments")),
            field("argv", record.get("argv")),
            field("decision", f"{record.get('decision')} by {_decided_by(record)}" if record.get("decision") else ""),
            field("reason", record.get("decision_reason")),
            field("policy revision", record.get("policy_revision")),
            field("approver", record.get("approver")),
            field("exit status", record.get("exit_code")),
            field("trap", record.get("trap")),
            field("duration", f"{record.get('duration_ms') or 0:.1f} ms"),
            field("output", f"{record.get('output_bytes')} bytes, sha256 {record.get('output_sha256')}"
                  if record.get("output_sha256") else ""),
            field("answer (excerpt)", record.get("answer"), block=True),
            field("redacted", ", ".join(record.get("redacted") or [])),
            field("record id", record.get("record_id")),
        ])
        return _page(f"{record.get('tool')} {record.get('status')}", f"<dl>{fields}</dl>")

    app.router.add_get(PREFIX, listing)
    app.router.add_post(PREFIX + "/sign-in", sign_in)
    app.router.add_get(PREFIX + "/{id}", detail)
