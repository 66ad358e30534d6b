"""The limits page: what each limit of the policy in force has counted in its window, scope by scope.

    GET  /toolkeeper/limits               this page, for a browser (JSON for a script: ../limits.py)
    POST /toolkeeper/limits/{id}/reset    its Reset forms (admins): one scope's count, or every scope's

Each limit shows its window, its most used scopes with what they used of the
maximum (a bar, and the numbers), the full ones marked. An admin sees a Reset
form per scope and per limit, posted with the session's CSRF key; after a
reset the page says what the trail recorded of it. Every value is shown
through `show`: a scope holds a user's name, which came from outside.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from aiohttp import web

from toolkeeper.common import counted
from toolkeeper.wire.admin.console.layout import csrf_field, link, page, show

NOUNS = {"calls": "calls", "tokens": "model tokens", "run_time": "seconds of run time"}
STYLE = ("<style>.limit { border: 1px solid #c9d1d9; border-radius: 6px; padding: .2em 1.2em 1em; margin: 1em 0; }"
         " .limit meter { width: 14em; } tr.full td { background: #ffebe9; } .tag { color: #cf222e; font-weight: 600; }"
         " .limit form { margin: 0; } .limit .all { margin-top: .8em; }</style>")


def amount(value: float) -> str:
    """An amount as people read it: 1843200, not 1.8432e+06; 1.5 seconds, not 1.500."""
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}".rstrip("0")


def _number(value: Any, unit: str = "") -> str:
    return (amount(value) if isinstance(value, int | float) else show(value)) + unit


def _reset_form(request: web.Request, limit_id: str, scope: str | None) -> str:
    """A Reset button: one scope's count (`scope`), or every scope's."""
    action = link(f"/limits/{quote(limit_id, safe='')}/reset")
    field = f"<input type=hidden name=scope value='{show(scope)}'>" if scope is not None else ""
    label = "Reset" if scope is not None else "Reset every scope"
    return (f"<form method=post action='{action}'{'' if scope is not None else ' class=all'}>{csrf_field(request)}"
            f"{field}<button type=submit>{label}</button></form>")


def _scope_row(request: web.Request, state: dict[str, Any], scope: dict[str, Any], may_reset: bool) -> str:
    full, unit = scope["full"], " s" if state["counts"] == "run_time" else ""
    return (f"<tr class='scope{' full' if full else ''}' data-scope='{show(scope['scope'])}'>"
            f"<td><code>{show(scope['scope'])}</code></td>"
            f"<td class=used>{_number(scope['used'], unit)} / {_number(state['max'], unit)}</td>"
            f"<td><meter min=0 max='{_number(state['max'])}' value='{_number(scope['used'])}'></meter></td>"
            f"<td>{'<span class=tag>full</span>' if full else _number(scope['remaining'], unit) + ' left'}</td>"
            + (f"<td>{_reset_form(request, state['id'], scope['scope'])}</td>" if may_reset else "") + "</tr>")


def _limit_html(request: web.Request, state: dict[str, Any], may_reset: bool) -> str:
    noun = NOUNS.get(state["counts"], state["counts"])
    scopes = " and ".join(show(scope) for scope in state["scope"])
    heading = (f"<h2>{show(state['id'])} <small>at most {_number(state['max'])} {show(noun)} per "
               f"{show(state['per'])}, by {scopes}; past it: {show(state['effect'])}</small></h2>")
    reason = f"<p class=reason>{show(state['reason'])}</p>" if state["reason"] else ""
    full = sum(1 for scope in state["scopes"] if scope["full"])
    shown = len(state["scopes"])
    summary = (f"<p class=summary>{counted(state['scopes_counted'], 'scope')} with a count in the window, "
               f"{_number(state['used_total'])} {show(noun)} used in all, {full} full"
               + (f" (the {shown} most used shown)" if shown < state["scopes_counted"] else "") + "</p>")
    if not shown:
        summary, table = "", "<p class=empty>Nothing counted in the window.</p>"
    else:
        rows = "".join(_scope_row(request, state, scope, may_reset) for scope in state["scopes"])
        table = ("<table><thead><tr><th>scope</th><th>used</th><th></th><th>left</th>"
                 f"{'<th></th>' if may_reset else ''}</tr></thead><tbody>{rows}</tbody></table>")
    everything = _reset_form(request, state["id"], None) if may_reset and shown else ""
    return (f"<section class=limit id='{show(state['id'])}' data-limit='{show(state['id'])}'>{heading}{reason}"
            f"{summary}{table}{everything}</section>")


def limits_page(request: web.Request, states: list[dict[str, Any]], may_reset: bool, notice: str) -> web.Response:
    """The page: a notice of the reset just made (what the trail recorded), then each limit."""
    said = f"<p class=notice role=status>{show(notice)}</p>" if notice else ""
    intro = ("<p>The limits of the policy in force, as the store has counted them: every replica's calls. A count "
             "leaves its window as the window slides on.</p>")
    if not states:
        body = ("<p id=no-limits>The policy in force declares no limits (<code>limits:</code> in the policy "
                "file).</p>")
    else:
        body = "".join(_limit_html(request, state, may_reset) for state in states)
    return page(request, "Limits", STYLE + said + intro + body)
