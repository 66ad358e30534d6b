"""What a `policy test` scenario (or `policy explain --limit ID=USED`) says of the limits' counts, put in its
call's policy input as `serve` puts them there: each limit that selects the call (policy/limits.py), its count
before the call as the scenario gives it, and the limit's decision when the call would take it past its
maximum, beside the rules' (the most restrictive wins, the rules' first among equals).

    - name: the twentieth ticket deletion of the hour is denied
      principal: {user: ada@example.com}
      limits: {ticket-deletes: 19}       # used before this call, in the limit's unit (run_time: seconds)
      call: {tool: delete_ticket, arguments: {ticket: T-1}}
      expect: deny
      rule: ticket-deletes

A limit the scenario does not name counts 0. A count is one number for every
scope the call touches, or one per scope (`{group=sre: 9, group=dev: 2}`, the
others 0). The calls of `after:` are decided with every count at 0.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from toolkeeper.common import printable
from toolkeeper.policy import (
    Decision,
    Limit,
    Rules,
    RulesError,
    amount_text,
    assess_limits,
    limits_on_call,
    window_text,
)

Count = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Counts = dict[str, Count | dict[str, Count]]  # limit id -> used before the call (or scope -> used)


def problems(counts: Counts, rules: Rules | None) -> list[str]:
    """What is wrong with a scenario's `limits:` against the policy's limits: an unknown id, a token budget (a
    model round's, never a call's), a count of calls or tokens that is not whole."""
    limits = {limit.id: limit for limit in rules.limits} if rules is not None else {}
    found = []
    for name, given in counts.items():
        limit = limits.get(name)
        if limit is None:
            known = ", ".join(limits) or "none"
            found.append(f"limits: no limit {name!r} in the policy (its limits: {known})")
        elif limit.counts == "tokens":
            found.append(f"limits: {name!r} counts model tokens, checked before each model round, not each call: "
                         "a scenario's call cannot show it")
        elif limit.counts == "calls" and any(value != int(value) for value in _values(given)):
            found.append(f"limits: {name!r} counts calls, a whole number: {given!r}")
    return found


def _values(given: float | dict[str, float]) -> list[float]:
    return list(given.values()) if isinstance(given, dict) else [given]


def stored(limit: Limit, amount: float) -> int:
    """A count in the limit's unit as the store keeps it (run time in milliseconds)."""
    return round(amount * 1000) if limit.counts == "run_time" else int(amount)


def take(document: dict[str, Any], rules: Rules | None, counts: Counts) -> Decision | None:
    """The counts of the limits that select the call in its policy input (`limits.<id>`), as `serve` reads them
    before the rules; the decision of a limit the call would take past its maximum (None: none)."""
    selected = limits_on_call(rules.limits, document) if rules is not None else []
    if not selected:
        return None
    found: list[tuple[Limit, str, int]] = []
    for limit in selected:
        given = counts.get(limit.id, 0)
        scopes = limit.scopes(document)
        if isinstance(given, dict):
            stray = sorted(set(given) - set(scopes))
            if stray:
                raise RulesError(f"limits: {limit.id!r}: the call is not counted under {', '.join(stray)} "
                                 f"(it is under {', '.join(scopes)})")
            found += [(limit, scope, stored(limit, given.get(scope, 0))) for scope in scopes]
        else:
            found += [(limit, scope, stored(limit, given)) for scope in scopes]
    return assess_limits(found, document, rules.revision if rules is not None else None)


def parse(pairs: list[str]) -> Counts:
    """`--limit ID=USED` options (USED a number): the counts, as a scenario's `limits:`."""
    counts: Counts = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        try:
            used = float(value) if sep and name.strip() else -1
        except ValueError:
            used = -1
        if not 0 <= used < float("inf"):  # NaN fails this too
            raise ValueError(f"--limit is ID=USED, a limit's id and how much of it was used before the call "
                             f"(a number); got {pair!r}")
        counts[name.strip()] = used
    return counts


def lines(rules: Rules, document: dict[str, Any]) -> list[str]:
    """Each limit of the policy, for `explain`: the count the call reads (escaped: a scope names a user), or that
    it does not select the call."""
    shown = document.get("limits") or {}
    found = []
    for limit in rules.limits:
        entry = shown.get(limit.id)
        if entry is None:
            why = "model tokens, counted by round" if limit.counts == "tokens" else "does not select this call"
            found.append(f"        {printable(limit.id)}: {why}")
            continue
        past = limit.past(stored(limit, entry["used"]), 1 if limit.counts == "calls" else 0)
        noun = "seconds of run time" if limit.counts == "run_time" else "calls"
        found.append(f"  {'PAST ' if past else 'COUNT'} {printable(limit.id)}: {amount_text(entry['used'])} of "
                     f"{amount_text(limit.max)} {noun} in the last {window_text(limit.per)} for "
                     f"{printable(entry['scope'])}"
                     + (f": this call {'is denied' if limit.effect == 'deny' else 'asks'}" if past else ""))
    return found
