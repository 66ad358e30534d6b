"""Replay: each recorded call's policy input decided again under candidate rules, and what would change.

The trail keeps the document every policy read (`policy_input`) and what it
decided. A candidate rules file is tried on those documents as `serve` would
decide them (the candidate's rules, then yolo and the tiers, the most
restrictive winning); the recorded outcome is the current policy's, as it
was: an ask is an ask even when a person then approved it. Calls no policy
decided (an invalid call, one the loop detector stopped, a definition change
withheld) are counted and left out. OPA is not asked again: a deployment that
decides with OPA replays its YAML candidate beside the recorded OPA outcome.
The candidate's label rules add their labels to those recorded; the session
is as it was recorded (what the earlier calls would have brought under the
candidate is not replayed).

A candidate's limits are replayed too (replay_limits.py): the calls in time
order, counted as the store counts them, each checked before it is decided;
a limit it would have been past decides beside the rules, and the report says
what each limit selected, stopped, when first, and for whom.

The trail's policy input is redacted: a secret-named argument reads
`[redacted]`, and a secret's text is erased from the argv and from every other
argument's text (`uses [redacted] here`). A candidate rule that tests such a
value (through any path its argument key names: `token|api_key`) cannot be
judged from the trail; "no change" would be a guess. Such a rule is left
out of the decision, and when it could have made the outcome stricter (it
matches but for the values it cannot read), the call is reported apart: it
cannot be judged from the trail, with the outcomes it may have, the rules
and the values. It is never counted as unchanged.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from toolkeeper.audit import REDACTED
from toolkeeper.policy.decision import Decision
from toolkeeper.policy.limits import with_limits
from toolkeeper.policy.policy import Policy
from toolkeeper.policy.replay_limits import LimitsReplay, LimitsReport
from toolkeeper.policy.rules import Rule, Rules, RulesFile

POLICY_SOURCES = ("rules", "opa", "tier", "yolo", "default", "policy", "consent", "limits")  # a policy decided
#                                                                                          these
RESTRICTS = ("deny", "ask")
STRICTNESS = ("allow", "ask", "deny")  # the least strict first, as the most restrictive wins


@dataclass(frozen=True)
class Replayed:
    """A recorded call as replay reports it: which, and what the policy in force decided."""

    record_id: str
    time: float
    tool: str
    source: str
    agent: str
    current: str  # allow | deny | ask, as recorded
    current_rule: str | None


@dataclass(frozen=True)
class Change(Replayed):
    """One call whose outcome the candidate would change."""

    candidate: str
    candidate_rule: str | None
    reason: str  # the candidate's

    @property
    def tightened(self) -> bool:
        """A call the current policy allowed that the candidate would deny or ask about."""
        return self.current == "allow" and self.candidate in RESTRICTS

    def as_json(self) -> dict[str, Any]:
        return {"record_id": self.record_id, "time": self.time, "tool": self.tool, "source": self.source,
                "agent": self.agent, "current": {"effect": self.current, "rule": self.current_rule},
                "candidate": {"effect": self.candidate, "rule": self.candidate_rule, "reason": self.reason}}


@dataclass(frozen=True)
class Unjudged(Replayed):
    """One call the candidate cannot be judged on from the trail: a rule tests a value the trail redacted."""

    outcomes: tuple[str, ...]  # what the candidate may decide, the least strict first: ("allow", "deny")
    rules: tuple[str, ...]  # the candidate's rules that test a redacted value
    redacted: tuple[str, ...]  # the values they test: `arguments.api_key`, `argv`

    @property
    def may_tighten(self) -> bool:
        """A call the current policy allowed that the candidate may deny or ask about."""
        return self.current == "allow" and any(outcome in RESTRICTS for outcome in self.outcomes)

    def as_json(self) -> dict[str, Any]:
        return {"record_id": self.record_id, "time": self.time, "tool": self.tool, "source": self.source,
                "agent": self.agent, "current": {"effect": self.current, "rule": self.current_rule},
                "candidate": {"effects": list(self.outcomes), "rules": list(self.rules)},
                "redacted": list(self.redacted)}


@dataclass
class Report:
    revision: str  # the candidate's
    replayed: int = 0
    skipped: int = 0  # no policy decided them
    by_rule: Counter[tuple[str, str]] = field(default_factory=Counter)  # (rule, effect): calls it decided
    shadow: Counter[tuple[str, str]] = field(default_factory=Counter)  # (rule, effect): calls a shadow rule matched
    transitions: Counter[tuple[str, str]] = field(default_factory=Counter)  # (current, candidate): calls
    changes: list[Change] = field(default_factory=list)
    unjudged: list[Unjudged] = field(default_factory=list)  # cannot be judged from the trail (redacted values)
    limits: LimitsReport | None = None  # what the candidate's limits did (None: it has none)

    @property
    def tightened(self) -> int:
        return sum(1 for change in self.changes if change.tightened)

    @property
    def may_tighten(self) -> int:
        return sum(1 for call in self.unjudged if call.may_tighten)

    def as_json(self) -> dict[str, Any]:
        return {"candidate_revision": self.revision, "replayed": self.replayed, "skipped": self.skipped,
                "changed": len(self.changes), "tightened": self.tightened,
                "unjudged": len(self.unjudged), "unjudged_may_tighten": self.may_tighten,
                "by_rule": [{"rule": rule, "effect": effect, "calls": count}
                            for (rule, effect), count in sorted(self.by_rule.items())],
                "shadow": [{"rule": rule, "effect": effect, "calls": count}
                           for (rule, effect), count in sorted(self.shadow.items())],
                "transitions": [{"current": current, "candidate": candidate, "calls": count}
                                for (current, candidate), count in sorted(self.transitions.items())],
                "changes": [change.as_json() for change in self.changes],
                "unjudged_calls": [call.as_json() for call in self.unjudged],
                **({"limits": self.limits.as_json()} if self.limits is not None else {})}


def current_effect(record: dict[str, Any]) -> str | None:
    """What the policy in force decided, as recorded (an ask a person answered is an ask); None when no policy
    decided the call."""
    source = record.get("decision_source") or ""
    if record.get("consent") or source == "consent":
        return "ask"
    if source not in POLICY_SOURCES or record.get("decision") not in ("allow", "deny", "ask"):
        return None
    return record["decision"]


def replay_calls(records: Iterable[dict[str, Any]], candidate: Rules, *,
                 shown: Callable[[dict[str, Any]], bool] | None = None) -> Report:
    """Decide each record's policy input under `candidate`: records are the trail's entries as dicts (at least
    record_id, time, tool, source, agent, decision, decision_source, decision_rule, consent, policy_input; status
    and duration_ms for the candidate's limits). `shown`: whether a record is reported; the others (read before
    the window, or of another tool) are only counted by the candidate's limits."""
    report = Report(candidate.revision)
    limits = LimitsReplay.of(candidate)
    if limits is not None:  # counted in time order, as the store counted them
        report.limits = limits.report
        records = sorted(records, key=lambda record: record.get("time") or 0.0)
    policies = {yolo: Policy(yolo, candidate) for yolo in (False, True)}
    loop = asyncio.new_event_loop()
    try:
        for record in records:
            _replay(report, record, candidate, policies, limits, loop, shown is None or shown(record))
    finally:
        loop.close()
    return report


def _replay(report: Report, record: dict[str, Any], candidate: Rules, policies: dict[bool, Policy],
            limits: LimitsReplay | None, loop: asyncio.AbstractEventLoop, shown: bool) -> None:
    """One record decided under the candidate: counted in the report when `shown`, and by its limits."""
    document, current = record.get("policy_input"), current_effect(record)
    if not isinstance(document, dict) or "tool" not in document or current is None:
        report.skipped += 1 if shown else 0
        return
    yolo = bool((document.get("mode") or {}).get("yolo"))
    document = {**document, "labels": sorted({*(document.get("labels") or ()), *candidate.labels(document)[0]})}
    record = {**record, "policy_input": document}
    limited = limits.check(record, document, shown) if limits is not None else None
    redacted = Redacted.of(document)
    stricter: list[Rule] = []
    if redacted:  # decided by the candidate's rules that read no redacted value
        blind = [rule for rule in candidate.rules if redacted.read_by(rule)]
        decided = loop.run_until_complete(Policy(yolo, _without(candidate, blind)).decide(document))
        decision = with_limits(decided, limited)
        stricter = [rule for rule in blind if _may_tighten(rule, decision, redacted, document)]
    else:
        decision = with_limits(loop.run_until_complete(policies[yolo].decide(document)), limited)
    if limits is not None:
        limits.counted(record, decision.effect)
    if not shown:
        return
    if stricter:  # a rule the trail cannot judge could have made the outcome stricter: reported apart
        report.replayed += 1
        report.unjudged.append(_unjudged(record, current, decision, stricter, redacted))
    else:
        _count(report, record, current, decision)


@dataclass(frozen=True)
class Redacted:
    """What of a policy input the trail redacted: argument paths (`headers.authorization`), and the argv."""

    arguments: tuple[str, ...]
    argv: bool

    @classmethod
    def of(cls, document: dict[str, Any]) -> Redacted:
        arguments = document.get("arguments")
        paths = tuple(_redacted_paths(arguments, "")) if isinstance(arguments, dict) else ()
        return cls(paths, any(REDACTED in entry for entry in document.get("argv") or () if isinstance(entry, str)))

    def __bool__(self) -> bool:
        return bool(self.arguments) or self.argv

    def hidden_from(self, name: str) -> list[str]:
        """The redacted values a rule's test of argument `name` reads: for each dotted path it names (`a|b`:
        either; `a from b`: both), the value itself, values inside it, or the redacted value it lies inside."""
        read = argument_paths(name)
        return [path for path in self.arguments
                if any(path == one or path.startswith((one + ".", one + "[")) or one.startswith(path + ".")
                       for one in read)]

    def read_by(self, rule: Rule) -> bool:
        return any(self.hidden_from(name) for name in rule.when.arguments) or (self.argv and
                                                                                rule.when.argv is not None)

    def read_by_all(self, rules: list[Rule]) -> tuple[str, ...]:
        """The redacted values these rules read, as the record names them (`arguments.api_key`, `argv`)."""
        read = [f"arguments.{path}" for rule in rules for name in rule.when.arguments
                for path in self.hidden_from(name)]
        if self.argv and any(rule.when.argv is not None for rule in rules):
            read.append("argv")
        return tuple(dict.fromkeys(read))

    def matches_but_for_them(self, rule: Rule, document: dict[str, Any]) -> bool:
        """The rule holds when the tests it cannot read are taken to hold: it may match this call."""
        readable = rule.when.model_copy(update={
            "arguments": {name: test for name, test in rule.when.arguments.items() if not self.hidden_from(name)},
            "argv": None if self.argv else rule.when.argv})
        return readable.holds(document, restricts=rule.effect != "allow")


def argument_paths(name: str) -> list[str]:
    """The dotted paths a rule's argument key reads: `token|api_key` either, `pattern from path` both."""
    return [one.strip() for part in name.split(" from ") for one in part.split("|") if one.strip()]


def _redacted_paths(value: Any, path: str) -> Iterable[str]:
    """The paths under `value` whose values the trail redacted: `[redacted]`, or a text a secret was erased from
    (`uses [redacted] here`): a test of it cannot be judged either."""
    if isinstance(value, dict):
        for name, member in value.items():
            yield from _redacted_paths(member, f"{path}.{name}" if path else str(name))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _redacted_paths(item, f"{path}[{index}]")
    elif isinstance(value, str) and REDACTED in value:
        yield path


def _without(candidate: Rules, left_out: list[Rule]) -> Rules:
    """The candidate without the rules it cannot read on this call (already validated: not checked again)."""
    ids = {rule.id for rule in left_out}
    kept = tuple(rule for rule in candidate.rules if rule.id not in ids)
    return Rules(candidate.path, RulesFile.model_construct(rules=kept), candidate.revision)


def _may_tighten(rule: Rule, readable: Decision, redacted: Redacted, document: dict[str, Any]) -> bool:
    """A rule the trail cannot judge could make the decision stricter than what the candidate decides on what it
    can read (the most restrictive wins: an allow rule, or a shadow one, never changes the outcome)."""
    return rule.mode == "enforce" and _strictness(rule.effect) > _strictness(readable.effect) \
        and redacted.matches_but_for_them(rule, document)


def _strictness(effect: str) -> int:
    return STRICTNESS.index(effect)


def _unjudged(record: dict[str, Any], current: str, readable: Decision, stricter: list[Rule],
              redacted: Redacted) -> Unjudged:
    outcomes = sorted({readable.effect, *(rule.effect for rule in stricter)}, key=_strictness)
    return Unjudged(record["record_id"], record.get("time", 0.0), record.get("tool", ""), record.get("source", ""),
                    record.get("agent", ""), current, record.get("decision_rule"), tuple(outcomes),
                    tuple(rule.id for rule in stricter), redacted.read_by_all(stricter))


class Trail(Protocol):
    """What replay reads of the audit trail (audit's SQLAudit): its chain checked, its calls in a window."""

    def verify(self) -> tuple[bool, str]: ...

    def records(self, **filters: Any) -> Iterable[Any]: ...


def replay_trail(trail: Trail, candidate: Rules, **window: Any) -> tuple[str, Report | None]:
    """The trail verified, then its calls in `window` (since, until, tool: None for any) replayed: (what the
    verification found, the report; None when the chain does not verify, for a replay would prove nothing).
    A candidate with limits reads the longest of their windows before `since`, and every tool's calls: they
    count, as they counted in the store, towards the limits of the calls reported."""
    intact, what = trail.verify()
    if not intact:
        return what, None
    since, tool = window.get("since"), window.get("tool")

    def in_window(entry: dict[str, Any]) -> bool:
        return (since is None or entry["time"] >= since) and (tool is None or entry["tool"] == tool)

    shown: Callable[[dict[str, Any]], bool] | None = None
    longest = max((limit.per for limit in candidate.limits if limit.counts != "tokens"), default=0.0)
    if longest and (since is not None or tool is not None):  # a limit counts what came before, of every tool
        shown, window = in_window, {**window, "since": None if since is None else since - longest, "tool": None}
    entries = trail.records(**{name: value for name, value in window.items() if value is not None})
    return what, replay_calls((vars(entry) for entry in entries), candidate, shown=shown)


def _count(report: Report, record: dict[str, Any], current: str, decision: Decision) -> None:
    report.replayed += 1
    if decision.rule_id and decision.source != "limits":  # a limit's calls: in the report's limits
        report.by_rule[(decision.rule_id, decision.effect)] += 1
    for shadow in decision.shadow:
        report.shadow[(shadow["rule"], shadow["effect"])] += 1
    report.transitions[(current, decision.effect)] += 1
    if decision.effect != current:
        report.changes.append(Change(record["record_id"], record.get("time", 0.0), record.get("tool", ""),
                                     record.get("source", ""), record.get("agent", ""), current,
                                     record.get("decision_rule"), decision.effect, decision.rule_id,
                                     decision.reason))


def text_report(report: Report, limit: int | None = None) -> str:
    """The report for a terminal: the transitions, the rules, then each changed call (the first `limit`)."""
    lines = [f"replayed {report.replayed} calls under the candidate (revision {report.revision}); "
             f"{report.skipped} no policy decided were left out",
             f"{len(report.changes)} would change, {report.tightened} of them allowed now and denied or asked "
             "under the candidate"]
    if report.unjudged:
        lines.append(f"{len(report.unjudged)} cannot be judged from the trail (a candidate rule tests a value the "
                     f"trail redacted), {report.may_tighten} of them allowed now and maybe denied or asked under "
                     "the candidate")
    if report.transitions:
        lines.append("\noutcomes (now -> candidate):")
        lines += [f"  {current:5} -> {candidate:5} {count}" for (current, candidate), count
                  in sorted(report.transitions.items())]
    if report.by_rule:
        lines.append("\ncandidate rules that decided:")
        lines += [f"  {rule}: {effect} {count}" for (rule, effect), count in sorted(report.by_rule.items())]
    if report.shadow:
        lines.append("\nshadow rules that matched (recorded, not deciding):")
        lines += [f"  {rule}: would {effect} {count}" for (rule, effect), count in sorted(report.shadow.items())]
    if report.limits is not None:
        lines += report.limits.lines()
    if report.changes:
        lines.append("\ncalls that would change:")
        for change in report.changes[:limit]:
            now = change.current + (f" ({change.current_rule})" if change.current_rule else "")
            then = change.candidate + (f" ({change.candidate_rule})" if change.candidate_rule else "")
            lines.append(f"  {change.record_id[:12]} {change.tool} [{change.source}]: {now} -> {then}")
        if limit is not None and len(report.changes) > limit:
            lines.append(f"  ... and {len(report.changes) - limit} more (--format json lists them all)")
    if report.unjudged:
        lines.append("\ncalls that cannot be judged from the trail:")
        for call in report.unjudged[:limit]:
            now = call.current + (f" ({call.current_rule})" if call.current_rule else "")
            lines.append(f"  {call.record_id[:12]} {call.tool} [{call.source}]: {now} -> "
                         f"{' or '.join(call.outcomes)}? ({', '.join(call.rules)} tests {', '.join(call.redacted)}, "
                         "redacted)")
        if limit is not None and len(report.unjudged) > limit:
            lines.append(f"  ... and {len(report.unjudged) - limit} more (--format json lists them all)")
    return "\n".join(lines)
