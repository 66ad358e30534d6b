"""What every console page shares: the frame, the style, and showing a value safely.

Every value from a call (a tool's name, an argument, a header) is shown
through `show`: control and bidirectional characters written as escapes
first, then HTML-escaped, so a value can neither inject markup nor reorder
what a person reads. Pages are served with a Content-Security-Policy that
allows only toolkeeper's own script, and may not be framed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from toolkeeper.common import printable
from toolkeeper.wire.admin.guard import PREFIX

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; connect-src 'self'; style-src "
                               "'unsafe-inline'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; "
                               "base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # not no-referrer: a form's post would then say `Origin: null`
    "Cache-Control": "no-store",
}

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0; color: #1d232a; }
header { display: flex; gap: 1.4em; align-items: center; padding: .7em 2em; background: #1d232a; color: #fff; }
header a { color: #fff; } header .who { margin-left: auto; } header form { margin: 0; }
main { padding: 1em 2em; } h1 { font-size: 1.35em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
table { border-collapse: collapse; width: 100%; } th, td { padding: .35em .6em; text-align: left; vertical-align: top; }
tr:nth-child(even) { background: #f4f6f8; } th { border-bottom: 2px solid #c9d1d9; }
.ok, .approved { color: #1a7f37; } .failed, .timeout { color: #cf222e; } .denied, .invalid { color: #9a6700; }
form.filters { display: flex; flex-wrap: wrap; gap: .6em 1em; align-items: end; margin: 1em 0; }
label { display: flex; flex-direction: column; font-size: .9em; }
pre { background: #f4f6f8; padding: .6em; overflow: auto; white-space: pre-wrap; margin: .2em 0; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: .3em 1.2em; } dt { font-weight: 600; }
.approval { border: 1px solid #c9d1d9; border-radius: 6px; padding: .8em 1.2em; margin: 1em 0; }
.approval .actions { display: flex; gap: .8em; align-items: end; flex-wrap: wrap; }
.approval .actions form { display: flex; gap: .5em; align-items: end; margin: 0; }
a.button { display: inline-block; padding: .5em 1.2em; border-radius: 6px; background: #1f6feb; color: #fff; }
.notice { background: #ddf4ff; padding: .5em 1em; border-radius: 6px; } .refused { color: #cf222e; }
.paging { display: flex; gap: 1.5em; margin: 1em 0; } small { color: #57606a; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(460px, 1fr)); gap: 1.5em; }
svg text { font: 11px system-ui, sans-serif; fill: #57606a; }
"""


def show(value: Any, block: bool = False) -> str:
    """HTML for a value: control and bidi characters escaped first, so a value cannot reorder what is read."""
    return escape(printable(str(value), keep_newlines=block))


def when(seconds: float | None) -> str:
    """A time with its zone: 2026-12-01 09:14:03 +01:00."""
    if not seconds:
        return ""
    return datetime.fromtimestamp(seconds).astimezone().isoformat(sep=" ", timespec="seconds")


def field(name: str, value: Any, block: bool = False) -> str:
    """One line of a definition list (its dd's id is the name), or nothing for an empty value."""
    if value is None or value == "" or value == []:
        return ""
    if isinstance(value, (dict, list)):
        value, block = json.dumps(value, indent=2, ensure_ascii=False), True
    shown = f"<pre>{show(value, block)}</pre>" if block else show(value)
    return f"<dt>{escape(name)}</dt><dd id='{escape(name)}'>{shown}</dd>"


def options(values: Iterable[str], selected: str | None, anything: str = "any") -> str:
    chosen = [f"<option value=''>{escape(anything)}</option>"]
    chosen += [f"<option value='{show(v)}'{' selected' if selected == v else ''}>{show(v)}</option>" for v in values]
    return "".join(chosen)


def url(path: str, query: dict[str, Any] | None = None) -> str:
    """A URL under the console, with the non-empty values of `query` (a redirect's Location)."""
    kept = {key: value for key, value in (query or {}).items() if value not in (None, "")}
    return PREFIX + path + (f"?{urlencode(kept)}" if kept else "")


def link(path: str, query: dict[str, Any] | None = None) -> str:
    """The same, escaped for an href."""
    return escape(url(path, query))


def csrf_field(request: web.Request) -> str:
    key = request.get("csrf", "")
    return f"<input type=hidden name=csrf value='{escape(key)}'>"


def page(request: web.Request, title: str, body: str, status: int = 200) -> web.Response:
    """A whole page: the header with what this person may open and who they are, then `body`."""
    who = request.get("identity")
    nav = ""
    if who is not None:
        places = [("/queue", "Approvals", {"approver", "admin"}), ("/audit", "Trail", {"auditor", "admin"}),
                  ("/audit/charts", "Charts", {"auditor", "admin"}), ("/audit/replay", "Replay", {"auditor", "admin"}),
                  ("/limits", "Limits", {"auditor", "approver", "admin"})]
        nav = "".join(f"<a href='{link(path)}'>{name}</a>" for path, name, roles in places if who.may(roles))
        email = who.person.email if who.person is not None else None
        nav += (f"<span class=who><span id=who-name>{show(who.name)}</span>"
                f"{f' <small id=who-email>{show(email)}</small>' if email else ''}"
                f" <small id=who-roles>({show(who.role)})</small></span>"
                f"<form method=post action='{link('/sign-out')}'>{csrf_field(request)}"
                "<button type=submit id=sign-out>Sign out</button></form>")
    html = (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{show(title)} · toolkeeper</title>"
            f"<style>{STYLE}</style><script src='{PREFIX}/console.js' defer></script></head><body>"
            f"<header><strong>toolkeeper</strong>{nav}</header><main><h1>{show(title)}</h1>{body}</main></body></html>")
    return web.Response(text=html, content_type="text/html", status=status, headers=SECURITY_HEADERS)
