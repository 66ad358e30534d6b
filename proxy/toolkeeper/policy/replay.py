"""Replay: each recorded call's policy input decided again under candidate rules, and what would change.

The trail keeps the document every policy read (`policy_input`) and what it
decided. A candidate rules file is tried on those documents as `serve` would
decide them (the candidate's rules, then yolo and the tiers, the most
restrictive winning); the recorded outcome is the current policy's, as it
was: an ask is an ask even when a person then approved it. Calls no policy
decided (an invalid call, one the loop detector stopped, a definition change
withheld) are counted and left out. OPA is not asked again: a deployment that
decides with OPA replays its YAML candidate beside the recorded OPA outcome.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from toolkeeper.policy.decision import Decision
from toolkeeper.policy.policy import Policy
from toolkeeper.policy.rules import Rules

POLICY_SOURCES = ("rules", "opa", "tier", "yolo", "default", "policy", "consent")  # a policy decided these
RESTRICTS = ("deny", "ask")


@dataclass(frozen=True)
class Change:
    """One call whose outcome the candidate would change."""

    record_id: str
    time: float
    tool: str
    source: str
    agent: str
    current: str  # allow | deny | ask, as recorded
    current_rule: str | None
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


@dataclass
class Report:
    revision: str  # the candidate's
    replayed: int = 0
    skipped: int = 0  # no policy decided them
    by_rule: Counter[tuple[str, str]] = field(default_factory=Counter)  # (rule, effect): calls it decided
    shadow: Counter[tuple[str, str]] = field(default_factory=Counter)  # (rule, effect): calls a shadow rule matched
    transitions: Counter[tuple[str, str]] = field(default_factory=Counter)  # (current, candidate): calls
    changes: list[Change] = field(default_factory=list)

    @property
    def tightened(self) -> int:
        return sum(1 for change in self.changes if change.tightened)

    def as_json(self) -> dict[str, Any]:
        return {"candidate_revision": self.revision, "replayed": self.replayed, "skipped": self.skipped,
                "changed": len(self.changes), "tightened": self.tightened,
                "by_rule": [{"rule": rule, "effect": effect, "calls": count}
                            for (rule, effect), count in sorted(self.by_rule.items())],
                "shadow": [{"rule": rule, "effect": effect, "calls": count}
                           for (rule, effect), count in sorted(self.shadow.items())],
                "transitions": [{"current": current, "candidate": candidate, "calls": count}
                                for (current, candidate), count in sorted(self.transitions.items())],
                "changes": [change.as_json() for change in self.changes]}


def current_effect(record: dict[str, Any]) -> str | None:
    """What the policy in force decided, as recorded (an ask a person answered is an ask); None when no policy
    decided the call."""
    source = record.get("decision_source") or ""
    if record.get("consent") or source == "consent":
        return "ask"
    if source not in POLICY_SOURCES or record.get("decision") not in ("allow", "deny", "ask"):
        return None
    return record["decision"]


def replay_calls(records: Iterable[dict[str, Any]], candidate: Rules) -> Report:
    """Decide each record's policy input under `candidate`: records are the trail's entries as dicts (at least
    record_id, time, tool, source, agent, decision, decision_source, decision_rule, consent, policy_input)."""
    report = Report(candidate.revision)
    policies = {yolo: Policy(yolo, candidate) for yolo in (False, True)}
    loop = asyncio.new_event_loop()
    try:
        for record in records:
            document, current = record.get("policy_input"), current_effect(record)
            if not isinstance(document, dict) or "tool" not in document or current is None:
                report.skipped += 1
                continue
            yolo = bool((document.get("mode") or {}).get("yolo"))
            decision = loop.run_until_complete(policies[yolo].decide(document))
            _count(report, record, current, decision)
    finally:
        loop.close()
    return report


class Trail(Protocol):
    """What replay reads of the audit trail (audit's SQLAudit): its chain checked, its calls in a window."""

    def verify(self) -> tuple[bool, str]: ...

    def records(self, **filters: Any) -> Iterable[Any]: ...


def replay_trail(trail: Trail, candidate: Rules, **window: Any) -> tuple[str, Report | None]:
    """The trail verified, then its calls in `window` (since, until, tool: None for any) replayed: (what the
    verification found, the report; None when the chain does not verify, for a replay would prove nothing)."""
    intact, what = trail.verify()
    if not intact:
        return what, None
    entries = trail.records(**{name: value for name, value in window.items() if value is not None})
    return what, replay_calls((vars(entry) for entry in entries), candidate)


def _count(report: Report, record: dict[str, Any], current: str, decision: Decision) -> None:
    report.replayed += 1
    if decision.rule_id:
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
    if report.changes:
        lines.append("\ncalls that would change:")
        for change in report.changes[:limit]:
            now = change.current + (f" ({change.current_rule})" if change.current_rule else "")
            then = change.candidate + (f" ({change.candidate_rule})" if change.candidate_rule else "")
            lines.append(f"  {change.record_id[:12]} {change.tool} [{change.source}]: {now} -> {then}")
        if limit is not None and len(report.changes) > limit:
            lines.append(f"  ... and {len(report.changes) - limit} more (--format json lists them all)")
    return "\n".join(lines)
