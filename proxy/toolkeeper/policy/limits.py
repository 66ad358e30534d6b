"""Limits: how many calls, model tokens or seconds of run time, per person, agent, group or tool, in a window.

    limits:
      - id: ticket-deletes
        counts: calls                # calls (the default) | tokens | run_time
        when: {tool: delete_ticket}  # which calls it counts (any condition a rule has)
        max: 20
        per: 1h                      # the window, sliding: 90s, 15m, 1h, 1d (at most 31d)
        scope: user                  # global (the default) | user | agent | group | tool, or a list: [user, tool]
        effect: deny                 # deny (the default) | ask: what a call past it gets
        reason: At most 20 ticket deletions an hour per person.
        notify: [security-oncall]    # an ask's channels (else the policy's `notify:`)

A limit of calls is checked and taken before a call runs, and given back when
the call did not run (denied, refused, unrecorded), so only calls that ran
count; run time is counted once a declared tool has run, tokens once a model
round has answered, each checked before the next call or round. The counts
are the store's (store/limits.py); this module says which counts a call
touches and what a count past the maximum decides. Each call's policy input
carries the counts of the limits that select it (`limits.<id>.used`), so a rule
can ask before a limit denies.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from toolkeeper.common import Strict
from toolkeeper.policy.decision import Decision, most_restrictive
from toolkeeper.policy.when import When

log = logging.getLogger("toolkeeper")

Scope = Literal["global", "user", "agent", "group", "tool"]
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
LONGEST = 31 * 86400  # seconds: the longest window (the store keeps a bucket 32 days)
WINDOW = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*")
NOUNS = {"calls": "calls", "tokens": "model tokens", "run_time": "seconds of run time"}
MAX_GROUPS = 32  # a group-scoped limit counts a call under at most this many of its user's groups (the first)


def window_seconds(value: Any) -> float:
    """`90s`, `15m`, `1h`, `1d` (or a number of seconds) as seconds."""
    if isinstance(value, bool):
        raise ValueError("a window is written like 90s, 15m, 1h or 1d")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        found = WINDOW.fullmatch(str(value))
        if found is None:
            raise ValueError(f"{value!r} is not a window: write it like 90s, 15m, 1h or 1d")
        seconds = float(found.group(1)) * UNITS[found.group(2)]
    if not 1 <= seconds <= LONGEST:
        raise ValueError("a window is at least 1s and at most 31d")
    return seconds


def amount_text(value: float) -> str:
    """A count as people read it: 1843200, not 1.8432e+06; run time to the millisecond."""
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}".rstrip("0")


def window_text(seconds: float) -> str:
    """A window as the policy file writes it."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


class Limit(Strict):
    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$")  # a rule reads `limits.<id>.used`: no dots in it
    counts: Literal["calls", "tokens", "run_time"] = "calls"
    when: When | None = None  # which calls it counts: every one when absent
    max: float = Field(gt=0)
    per: float  # seconds
    scope: tuple[Scope, ...] = ("global",)
    effect: Literal["deny", "ask"] = "deny"
    reason: str = ""
    notify: tuple[str, ...] | None = None  # an ask's channels; None: the policy's default

    @field_validator("per", mode="before")
    @classmethod
    def _window(cls, value: Any) -> float:
        return window_seconds(value)

    @field_validator("scope", "notify", mode="before")
    @classmethod
    def _one(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _coherent(self) -> Limit:
        if self.counts != "run_time" and self.max != int(self.max):
            raise ValueError(f"max: {self.counts} are counted whole: {self.max} is not a whole number")
        if len(set(self.scope)) != len(self.scope) or ("global" in self.scope and len(self.scope) > 1):
            raise ValueError("scope: global, or each of user, agent, group and tool at most once")
        if self.counts == "tokens":
            if "tool" in self.scope:
                raise ValueError("scope: a model round's tokens belong to no tool (counts: tokens)")
            if self.when is not None and not self.when.only_who:
                raise ValueError("when: a token limit tests who and when (agent, principal, time), not a call")
        if self.counts == "tokens" and self.effect != "deny":
            raise ValueError("effect: a token budget denies (no one is asked before a model round)")
        if self.notify is not None and self.effect != "ask":
            raise ValueError("notify: is for an ask (effect: ask): a deny asks no one")
        return self

    @property
    def most(self) -> int:
        """The maximum in the store's unit: calls, tokens, milliseconds."""
        return round(self.max * 1000) if self.counts == "run_time" else int(self.max)

    def shown(self, amount: int) -> float | int:
        """A stored amount in the limit's own unit (run time in seconds)."""
        return amount / 1000 if self.counts == "run_time" else amount

    def selects(self, document: dict[str, Any]) -> bool:
        """This limit counts the call (or round) the document describes. A `when:` that cannot be evaluated
        selects it: a limit only ever stops more."""
        if self.counts == "run_time" and document["tool"].get("source") != "declared":
            return False  # run time is a declared tool's: toolkeeper runs it, and knows how long it ran
        if self.when is None:
            return True
        try:
            return self.when.holds(document, restricts=True)
        except Exception:
            log.exception("limit %s could not be evaluated: it counts the call", self.id)
            return True

    def scopes(self, document: dict[str, Any]) -> list[str]:
        """The counts a call touches: one per scope value (a user in three groups: three, under `group`)."""
        keys = [""]
        for part in (part for part in self.scope if part != "global"):
            values = self._values(part, document)
            keys = [f"{key},{part}={value}" if key else f"{part}={value}" for key in keys for value in values]
        return ["global" if key == "" else key for key in keys]

    @staticmethod
    def _values(part: str, document: dict[str, Any]) -> list[str]:
        principal = document.get("principal") or {}
        if part == "tool":
            return [document["tool"]["name"]]
        if part == "agent":
            return [str(principal.get("agent") or document["agent"]["id"])]
        if part == "user":  # an agent that acts for no one is its own user
            user = principal.get("user")
            return [str(user) if user else f"agent:{principal.get('agent') or document['agent']['id']}"]
        groups = [group for group in principal.get("groups") or () if isinstance(group, str)]
        return list(dict.fromkeys(groups))[:MAX_GROUPS] or ["(none)"]

    def past(self, used: int, amount: int) -> bool:
        """Whether `amount` more would take a count past the maximum (tokens and run time: whether it is spent)."""
        return used + amount > self.most if self.counts == "calls" else used >= self.most

    def decision(self, scope: str, used: int, revision: str | None) -> Decision:
        """What a call past this limit gets: the limit's effect, and the reason the model reads."""
        return Decision(self.effect, "limits", self.reason or self.default_reason(scope, used), self.id, revision)

    def default_reason(self, scope: str, used: int) -> str:
        whose = "in all" if scope == "global" else f"for {scope}"
        return (f"limit {self.id}: {amount_text(self.shown(used))} of {amount_text(self.max)} {NOUNS[self.counts]} "
                f"{whose} in the last {window_text(self.per)} are used")

    def entry(self, scope: str, used: int) -> dict[str, Any]:
        """The limit as the policy input's `limits.<id>` shows it, for the count a call touches."""
        return {"used": self.shown(used), "max": self.max, "remaining": max(self.shown(self.most - used), 0),
                "per": window_text(self.per), "scope": scope, "counts": self.counts}


def assess(found: list[tuple[Limit, str, int]], document: dict[str, Any], revision: str | None,
           amount: int = 1) -> Decision | None:
    """`found`: each count a call touches, (limit, scope, used before the call). Fills the document's `limits`
    (a limit counted under several scopes shows its most used) and returns the strictest decision of the
    limits the call would take past their maximum (deny before ask), None when it takes none past."""
    shown: dict[str, tuple[str, int]] = {}
    past: list[Decision] = []
    for limit, scope, used in found:
        if limit.id not in shown or used > shown[limit.id][1]:
            shown[limit.id] = (scope, used)
        if limit.past(used, amount if limit.counts == "calls" else 0):
            past.append(limit.decision(scope, used, revision))
    limits = {limit.id: limit for limit, _, _ in found}
    document["limits"] = {name: limits[name].entry(scope, used) for name, (scope, used) in shown.items()}
    if not past:
        return None
    return max(past, key=lambda decision: decision.effect == "deny")


def on_call(limits: tuple[Limit, ...], document: dict[str, Any]) -> list[Limit]:
    """The limits a call's counts are taken from, as serve takes them: each that selects it, but a token budget
    (a model round's, checked before each round, not each call)."""
    return [limit for limit in limits if limit.counts != "tokens" and limit.selects(document)]


def with_limits(decided: Decision, limited: Decision | None) -> Decision:
    """The policy's decision and the limits' (`assess`) in one, as serve makes it: the most restrictive, the
    policy's first among equals, and what the shadow rules said of the call kept whichever decides. Two asks:
    the limit's, unless a rule's (or OPA's) asked too, so that the person asked reads the limit, and an "always"
    answer for a gated tool (yolo's ask) cannot let calls past it."""
    if limited is None:
        return decided
    first = limited if limited.effect == decided.effect == "ask" and decided.source not in ("rules", "opa") \
        else decided
    chosen = most_restrictive(first, limited if first is decided else decided)
    return dataclasses.replace(chosen, shadow=decided.shadow)
