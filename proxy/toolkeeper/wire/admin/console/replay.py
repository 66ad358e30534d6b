"""Replay in the console: paste candidate rules, see what they would have done to the trail's calls.

    GET  /toolkeeper/audit/replay     the form: the candidate rules (YAML), a time range, a tool
    POST /toolkeeper/audit/replay     the chain verified, then each call decided again (policy/replay.py)

The same report `toolkeeper policy replay` prints: the outcomes now and under
the candidate, the candidate's rules that decided, the shadow rules that
matched, each call that would change, and each call that cannot be judged
from the trail (a candidate rule tests a value the trail redacted), linked to
its record; and for a candidate with limits, what each would have done (the
calls it selected, those it would have denied or asked, the first, and the
scopes that reached it).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from toolkeeper.audit import SQLAudit
from toolkeeper.policy import Replayed, Report, RulesError, load_rules, replay_trail, window_text
from toolkeeper.wire.admin.console.layout import csrf_field, link, page, show, when
from toolkeeper.wire.admin.console.trail import typed_time

SHOWN = 500  # changed calls listed on the page
MAX_RULES = 1 << 20  # bytes of candidate rules


class ReplayPage:
    def __init__(self, audit: SQLAudit):
        self.audit = audit

    def __call__(self, app: web.Application) -> None:
        app.router.add_get("/audit/replay", self.form)
        app.router.add_post("/audit/replay", self.run)

    def _form(self, request: web.Request, values: dict[str, str]) -> str:
        def text(name: str, label: str, kind: str = "text") -> str:
            return f"<label>{label}<input type={kind} name={name} value='{show(values.get(name, ''))}'></label>"

        return (f"<form class=filters method=post action='{link('/audit/replay')}'>{csrf_field(request)}"
                "<label>candidate rules (YAML)<textarea name=candidate rows=14 cols=90 spellcheck=false>"
                f"{show(values.get('candidate', ''), block=True)}</textarea></label>"
                f"{text('since', 'from', 'datetime-local')}{text('until', 'to', 'datetime-local')}"
                f"{text('tool', 'tool')}<button type=submit>Replay</button></form>")

    async def form(self, request: web.Request) -> web.Response:
        intro = ("<p>Each recorded call's policy input is decided again under the candidate rules and compared with "
                 "what was decided then. Nothing is enforced or written.</p>")
        return page(request, "Replay the trail", intro + self._form(request, {}))

    async def run(self, request: web.Request) -> web.Response:
        posted = await request.post()
        values = {name: str(posted.get(name, "")) for name in ("candidate", "since", "until", "tool")}
        if not values["candidate"].strip():  # a form sent empty, or a body that is no form (JSON): nothing to replay
            problem = "<p id=problems class=failed>No candidate rules were sent: paste them in the form.</p>"
            return page(request, "Replay the trail", problem + self._form(request, values), status=400)
        window: dict[str, Any] = {"tool": values["tool"] or None}
        for name in ("since", "until"):
            window[name] = typed_time(values[name]) if values[name] else None
        try:
            started = time.monotonic()
            intact, what, report = await asyncio.to_thread(self._replay, values["candidate"], window)
        except RulesError as exc:
            problem = f"<p id=problems class=failed>The candidate rules do not load: {show(exc)}</p>"
            return page(request, "Replay the trail", problem + self._form(request, values), status=400)
        if not intact or report is None:
            return page(request, "Chain broken", f"<p id=verdict class=failed>The trail does not verify, so a "
                        f"replay of it proves nothing: {show(what)}</p>", status=409)
        took = f"<p><small>{show(what)}; replayed in {time.monotonic() - started:.2f} s</small></p>"
        return page(request, "Replay the trail", _report(report) + took + self._form(request, values))

    def _replay(self, text: str, window: dict[str, Any]) -> tuple[bool, str, Report | None]:
        if len(text.encode()) > MAX_RULES:
            raise RulesError("the candidate rules are larger than 1 MiB")
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "candidate.yaml"
            path.write_text(text)
            try:
                candidate = load_rules(path)
            except RulesError as exc:
                raise RulesError(str(exc).replace(str(path.resolve()), "candidate")) from None
        what, report = replay_trail(self.audit, candidate, **window)
        return report is not None, what, report


def _report(report: Report) -> str:
    tightened = report.tightened
    unjudged = (f" <strong id=unjudged>{len(report.unjudged)}</strong> cannot be judged from the trail (a candidate "
                f"rule tests a value the trail redacted), <strong id=may-tighten>{report.may_tighten}</strong> of "
                "them allowed now and maybe denied or asked under the candidate." if report.unjudged else "")
    summary = (f"<p id=summary class={'failed' if tightened or report.may_tighten else 'ok'}>{report.replayed} "
               f"calls replayed under revision {show(report.revision)}: <strong id=changed>{len(report.changes)}"
               f"</strong> would change, <strong id=tightened>{tightened}</strong> of them allowed now and denied or "
               f"asked under the candidate.{unjudged} {report.skipped} no policy decided were left out.</p>")
    outcomes = "".join(f"<tr><td>{show(now)}</td><td>{show(then)}</td><td>{count}</td></tr>"
                       for (now, then), count in sorted(report.transitions.items()))
    rules = "".join(f"<tr><td>{show(rule)}</td><td>{show(effect)}</td><td>{count}</td></tr>"
                    for (rule, effect), count in sorted(report.by_rule.items()))
    shadow = "".join(f"<tr><td>{show(rule)}</td><td>would {show(effect)}</td><td>{count}</td></tr>"
                     for (rule, effect), count in sorted(report.shadow.items()))
    changes = "".join(
        f"<tr class=change>{_call_cells(c)}<td>{show(c.candidate)} <small>{show(c.candidate_rule or '')}</small>"
        f"</td><td>{show(c.reason)}</td></tr>" for c in report.changes[:SHOWN])
    more = _more(report.changes)
    return (f"{summary}<h2>Outcomes</h2><table id=outcomes><tr><th>now</th><th>candidate</th><th>calls</th></tr>"
            f"{outcomes}</table><h2>Candidate rules that decided</h2><table id=rules><tr><th>rule</th>"
            f"<th>effect</th><th>calls</th></tr>{rules}</table>"
            + (f"<h2>Shadow rules that matched</h2><table id=shadow>{shadow}</table>" if shadow else "")
            + f"<h2>Calls that would change</h2><table id=changes><tr><th>time</th><th>tool</th><th>now</th>"
            f"<th>candidate</th><th>reason</th></tr>{changes}</table>{more}" + _unjudged(report) + _limits(report))


def _limits(report: Report) -> str:
    """What each of the candidate's limits would have done over the calls (nothing when it has none)."""
    if report.limits is None:
        return ""
    rows = ""
    for tally in report.limits.tallies:
        limit = tally.limit
        reached = ", ".join(f"{show(scope)} ({calls})" for scope, calls in tally.top())
        denied, asked = (tally.past, 0) if limit.effect == "deny" else (0, tally.past)
        noun = "seconds of run time" if limit.counts == "run_time" else "calls"
        rows += (f"<tr class=limit><td>{show(limit.id)}</td><td>{limit.max:g} {noun} per "
                 f"{show(window_text(limit.per))} by {show(', '.join(limit.scope))}</td><td>{tally.selected}</td>"
                 f"<td>{denied}</td><td>{asked}</td><td>{show(when(tally.first))}</td><td>{reached}</td></tr>")
    rows += "".join(f"<tr class=limit><td>{show(limit.id)}</td><td>model tokens</td><td colspan=5>not replayed: the "
                    "trail records no model round's usage</td></tr>" for limit in report.limits.tokens)
    since = report.limits.since
    counted = (f"Each call counted in time order, as the store counts it, from {show(when(since))}."
               if since is not None else "No call was read.")
    return (f"<h2>Candidate limits</h2><p>{counted}</p>"
            "<table id=limits><tr><th>limit</th><th>max</th><th>calls "
            "selected</th><th>would be denied</th><th>would ask</th><th>first</th><th>reached by</th></tr>"
            f"{rows}</table>")


def _unjudged(report: Report) -> str:
    """The calls the trail cannot tell: the outcomes they may have, and the redacted values that hide it."""
    if not report.unjudged:
        return ""
    rows = "".join(
        f"<tr class=unjudged>{_call_cells(c)}<td>{show(' or '.join(c.outcomes))}</td>"
        f"<td>{show(', '.join(c.rules))} tests {show(', '.join(c.redacted))}, redacted</td></tr>"
        for c in report.unjudged[:SHOWN])
    more = _more(report.unjudged)
    return ("<h2>Calls that cannot be judged from the trail</h2><table id=unjudged-calls><tr><th>time</th>"
            f"<th>tool</th><th>now</th><th>candidate: one of</th><th>why</th></tr>{rows}</table>{more}")


def _call_cells(call: Replayed) -> str:
    """A replayed call's first cells: when (a link to it in the trail), the tool, and what decided it now."""
    return (f"<td><a href='{link('/audit/' + call.record_id)}'>{show(when(call.time))}</a></td>"
            f"<td>{show(call.tool)} <small>{show(call.source)}</small></td><td>{show(call.current)} "
            f"<small>{show(call.current_rule or '')}</small></td>")


def _more(calls: Sequence[Replayed]) -> str:
    return f"<p>... and {len(calls) - SHOWN} more.</p>" if len(calls) > SHOWN else ""
