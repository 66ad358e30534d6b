"""Replay of a candidate's limits: the trail's calls counted in time order, as the store would have counted them.

Each limit of the candidate keeps, in memory, one sliding window per scope
(`user=ada@example.com`, `group=sre`, ...) in the buckets the store keeps
(store/limits.py: a sixtieth of the window, at least a second; a bucket
counts while its end is after the window's start). A recorded call is
checked as `serve` checks it: the limits that select it read their counts
into its policy input (the candidate's rules read `limits.<id>.used`), and a
limit it would take past its maximum decides beside the rules. It is counted
as the store counts it:

- calls: once the call ran (it was let through and ran, or was passed on to
  the agent, as its record says) and the candidate would not deny it; a call
  a limit would have stopped does not count, one asked past an ask-limit
  does when it ran (approved then);
- run time: a declared call's recorded duration, once it has run;
- model tokens are counted by round, and the trail records no round's usage:
  a token budget is not replayed, and the report says so.

The counts start at zero at the first call read (replay reads from the
longest window before `--since`, and every tool's calls, so that the calls it
reports are counted as they were).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from toolkeeper.common import printable
from toolkeeper.policy.decision import Decision
from toolkeeper.policy.limits import NOUNS, Limit, amount_text, assess, on_call, window_text
from toolkeeper.policy.rules import Rules

BUCKETS = 60  # a window in this many buckets, as the store keeps it (store/limits.py BUCKETS)
NOT_RUN = ("invalid", "denied", "withheld")  # a record's status when its call never ran (nothing to count)
TOP_SCOPES = 5  # the scopes listed that reached a limit, most stopped first
NOT_REPLAYED = "not replayed: the trail records no model round's usage"


class Window:
    """One count of one limit over its sliding window, kept as the store keeps it. Read and added to in time
    order only (replay goes through the calls in time order)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.width = max(1, int(seconds // BUCKETS))
        self.buckets: deque[list[int]] = deque()  # [end, amount], the oldest first
        self.total = 0

    def used(self, now: float) -> int:
        """The sum of the buckets that end after the window's start (the store's SUM ... WHERE ends > start)."""
        start = now - self.seconds
        while self.buckets and self.buckets[0][0] <= start:
            self.total -= self.buckets.popleft()[1]
        return self.total

    def add(self, now: float, amount: int) -> None:
        end = (int(now) // self.width + 1) * self.width
        if self.buckets and self.buckets[-1][0] == end:
            self.buckets[-1][1] += amount
        else:
            self.buckets.append([end, amount])
        self.total += amount


@dataclass
class Tally:
    """What one limit did over the replayed calls."""

    limit: Limit
    selected: int = 0
    past: int = 0  # calls past it: denied (effect deny) or asked (effect ask) by it
    first: float | None = None  # the first of them
    scopes: Counter[str] = field(default_factory=Counter)  # the scopes that reached it: calls past it in each

    def as_json(self) -> dict[str, Any]:
        limit = self.limit
        return {"id": limit.id, "counts": limit.counts, "max": limit.max, "per": window_text(limit.per),
                "scope": list(limit.scope), "effect": limit.effect, "replayed": True, "selected": self.selected,
                "stopped": self.past if limit.effect == "deny" else 0,
                "asked": self.past if limit.effect == "ask" else 0, "first": self.first,
                "scopes": [{"scope": scope, "calls": calls} for scope, calls in self.top()]}

    def top(self) -> list[tuple[str, int]]:
        return sorted(self.scopes.items(), key=lambda item: (-item[1], item[0]))[:TOP_SCOPES]

    def lines(self) -> list[str]:
        limit = self.limit
        said = (f"  {printable(limit.id)} ({amount_text(limit.max)} {NOUNS[limit.counts]} per "
                f"{window_text(limit.per)} by {', '.join(limit.scope)}, {limit.effect}): {self.selected} calls "
                "selected, ")
        if not self.past:
            return [said + "none past it"]
        done = "denied" if limit.effect == "deny" else "asked"
        lines = [said + f"{self.past} would have been {done}, the first at {moment(self.first)}"]
        more = len(self.scopes) - TOP_SCOPES
        lines.append("    reached by " + ", ".join(f"{printable(scope)} ({calls})" for scope, calls in self.top())
                     + (f" and {more} more scopes" if more > 0 else ""))
        return lines


@dataclass
class LimitsReport:
    tallies: list[Tally]
    tokens: list[Limit]  # token budgets: not replayed
    since: float | None = None  # the first call counted

    def as_json(self) -> list[dict[str, Any]]:
        return [tally.as_json() for tally in self.tallies] + [
            {"id": limit.id, "counts": limit.counts, "max": limit.max, "per": window_text(limit.per),
             "scope": list(limit.scope), "effect": limit.effect, "replayed": False, "why": NOT_REPLAYED}
            for limit in self.tokens]

    def lines(self) -> list[str]:
        start = f"from {moment(self.since)}" if self.since is not None else "no call read"
        lines = [f"\ncandidate limits (each call counted in time order, as the store counts it, {start}):"]
        lines += [line for tally in self.tallies for line in tally.lines()]
        lines += [f"  {printable(limit.id)} (model tokens): {NOT_REPLAYED}" for limit in self.tokens]
        return lines


def moment(seconds: float | None) -> str:
    return datetime.fromtimestamp(seconds or 0).astimezone().strftime("%Y-%m-%d %H:%M:%S")


class LimitsReplay:
    """The candidate's limits over the trail: `check` each call before its decision, `counted` after it."""

    def __init__(self, candidate: Rules):
        self.revision = candidate.revision
        self.limits = tuple(limit for limit in candidate.limits if limit.counts != "tokens")
        self.report = LimitsReport([Tally(limit) for limit in self.limits],
                                   [limit for limit in candidate.limits if limit.counts == "tokens"])
        self.tallies = {tally.limit.id: tally for tally in self.report.tallies}
        self.windows: dict[tuple[str, str], Window] = {}
        self.pending: list[tuple[float, int, str, str, int]] = []  # run time added when each run ended
        self.order = itertools.count()  # the runs that ended at once, in the order they were replayed
        self.found: list[tuple[Limit, str, int]] = []  # the counts the call being replayed read
        self.now = 0.0

    @classmethod
    def of(cls, candidate: Rules) -> LimitsReplay | None:
        return cls(candidate) if candidate.limits else None

    @property
    def longest(self) -> float:
        """The longest window of the limits replayed (0: none is)."""
        return max((limit.per for limit in self.limits), default=0.0)

    def window(self, limit: Limit, scope: str) -> Window:
        return self.windows.setdefault((limit.id, scope), Window(limit.per))

    def check(self, record: dict[str, Any], document: dict[str, Any], shown: bool) -> Decision | None:
        """The counts of the limits that select the call, read into its policy input at its time; the decision of
        a limit it would take past its maximum. `shown`: the call is reported (else only counted)."""
        self.now = float(record.get("time") or 0.0)
        self.report.since = self.now if self.report.since is None else self.report.since
        while self.pending and self.pending[0][0] <= self.now:
            ended, _, limit_id, scope, amount = heapq.heappop(self.pending)
            self.windows[(limit_id, scope)].add(ended, amount)
        document.pop("limits", None)  # the policy in force's counts, recorded: the candidate's are read again
        selected = on_call(self.limits, document)
        self.found = [(limit, scope, self.window(limit, scope).used(self.now)) for limit in selected
                      for scope in limit.scopes(document)]
        if not self.found:
            return None
        if shown:
            self._tally(selected)
        return assess(self.found, document, self.revision)

    def _tally(self, selected: list[Limit]) -> None:
        for limit in selected:
            tally = self.tallies[limit.id]
            tally.selected += 1
            reached = [scope for one, scope, used in self.found
                       if one is limit and limit.past(used, 1 if limit.counts == "calls" else 0)]
            if reached:
                tally.past += 1
                tally.first = self.now if tally.first is None else tally.first
                tally.scopes.update(reached)

    def counted(self, record: dict[str, Any], effect: str) -> None:
        """The call's counts, as the store would keep them: none when it did not run (its record says so) or the
        candidate denies it; a call once, run time when its run ended."""
        if not self.found or effect == "deny" or record.get("status") in NOT_RUN:
            return
        milliseconds = round(float(record.get("duration_ms") or 0.0))
        for limit, scope, _ in self.found:
            if limit.counts == "calls":
                self.window(limit, scope).add(self.now, 1)
            elif milliseconds > 0:
                heapq.heappush(self.pending, (self.now + milliseconds / 1000, next(self.order), limit.id, scope,
                                              milliseconds))
