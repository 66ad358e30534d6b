"""The security team's rules, in YAML: allow, deny (with a reason) or ask.

    rules:
      - id: no-stable-release-on-friday
        effect: deny
        reason: Releases to stable are frozen on Fridays.
        when:
          tool: release                      # a glob, or a list of globs
          arguments: {channel: {equals: stable}}
          time: {weekdays: [fri]}

A rule matches when every condition under `when` holds; with no `when` it
matches every call. Of the rules that match, the most restrictive decides
(deny > ask > allow; the first in the file among equals). A call no rule
matches gets no decision from here: yolo and the tiers decide. The rules read
the policy input document (docs/reference/policy-input.md), the same one OPA
gets.

Rules are validated once, at load; an error names the file, the rule and the key.
"""

from __future__ import annotations

import fnmatch
import logging
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from toolkeeper.common import Strict
from toolkeeper.policy.channels import Channel
from toolkeeper.policy.conditions import ValueTest
from toolkeeper.policy.decision import Decision, most_restrictive
from toolkeeper.policy.flows import flow, label_names, strictest
from toolkeeper.policy.limits import Limit
from toolkeeper.policy.when import When, globs_of
from toolkeeper.tools import Agent

log = logging.getLogger("toolkeeper")


class RulesError(Exception):
    """The rules file cannot be used; the message names the file, the rule and the key."""


def _outside_enums(test: ValueTest, parameters: list[Any]) -> bool:
    """An `equals` or `in` no declared enum of the argument admits (every tool the rule names has one)."""
    wanted = [test.equals] if "equals" in test.model_fields_set else list(test.one_of or [])
    enums = [p.enum for p in parameters if p is not None]
    if not wanted or not enums or any(not enum for enum in enums):
        return False
    return not any(value in enum for value in wanted for enum in enums)


class Rule(Strict):
    id: str
    effect: Literal["allow", "deny", "ask", "label"]  # label: never decides, only gives the call `labels`
    reason: str = ""
    when: When = Field(default_factory=When)
    mode: Literal["enforce", "shadow"] = "enforce"  # shadow: evaluated and recorded, never deciding
    labels: tuple[str, ...] = ()  # effect label: the labels it gives the calls it matches
    secrets: Literal["redact", "block", "allow"] | None = None  # a secret in a matching call's result
    notify: tuple[str, ...] | None = None  # effect ask: the channels the ask goes to (None: the policy's default)

    @field_validator("labels", mode="before")
    @classmethod
    def _labels(cls, value: Any) -> Any:
        return label_names([value] if isinstance(value, str) else value)

    @field_validator("notify", mode="before")
    @classmethod
    def _channels(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _deny_says_why(self) -> Rule:
        if self.effect == "deny" and not self.reason.strip():
            raise ValueError("a deny rule needs a reason: the model reads it")
        if self.effect == "label" and not self.labels and self.secrets is None:
            raise ValueError("a label rule needs labels: [...] (or secrets:): what it gives the calls it matches")
        if self.effect != "label" and self.labels:
            raise ValueError("labels: is for effect: label; a rule that decides tests them with when: {labels: ...}")
        if self.effect == "label" and (self.when.session is not None or self.when.secret is not None):
            raise ValueError("a label rule cannot test session: or arguments: {secret: ...}: a call is labelled "
                             "before its session is read and its arguments scanned")
        if self.notify is not None and self.effect != "ask":
            raise ValueError("notify: is for an ask (effect: ask): no one is asked about what the rule decides")
        if self.effect == "label" and self.mode == "shadow":
            raise ValueError("a label rule cannot be a shadow rule: it decides nothing, and the labels it gives "
                             "change what the session's later calls are decided")
        return self


class RulesFile(Strict):
    include: tuple[str, ...] = ()  # other rule files, relative to this one (or toolkeeper:NAME, one it ships)
    rules: tuple[Rule, ...] = ()
    limits: tuple[Limit, ...] = ()
    channels: dict[str, Channel] = Field(default_factory=dict)
    notify: tuple[str, ...] = ()  # the channels of an ask no rule or limit names its own for

    @field_validator("include", "notify", mode="before")
    @classmethod
    def _one(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _unique_ids(self) -> RulesFile:
        for what, ids in (("rule", [rule.id for rule in self.rules]), ("limit", [limit.id for limit in self.limits])):
            twice = sorted({one for one in ids if ids.count(one) > 1})
            if twice:
                raise ValueError(f"{what} id {twice[0]!r} is used twice")
        return self


class Rules:
    """The loaded rules, and the revision that identifies them in every record."""

    def __init__(self, path: Path, parsed: RulesFile, revision: str):
        self.path = path
        self.rules = parsed.rules
        self.limits = parsed.limits
        self.channels = parsed.channels
        self.notify = parsed.notify
        self.revision = revision

    def channels_for(self, decided_by: str | None) -> tuple[str, ...]:
        """The channels an ask goes to: those of the rule or limit that asked, else the policy's default."""
        for one in (*self.rules, *self.limits):
            if one.id == decided_by and one.notify is not None:
                return one.notify
        return self.notify

    def warnings(self, agent: Agent) -> list[str]:
        """What in these rules cannot be meant for this agent file: said at start and by `policy test`."""
        if not self.rules:
            return [f"{self.path}: no rules: only yolo and the tiers decide"]
        return [f"{self.path}: {text}" for _, _, text in self.problems(agent)]

    def named_groups(self) -> set[str]:
        """The groups (and group patterns) the rules test in `principal.groups`: what /metrics counts calls by."""
        tests = [rule.when.principal.groups for rule in self.rules
                 if rule.when.principal is not None and rule.when.principal.groups is not None]
        return {glob for test in tests for glob in (*(test.any or ()), *(test.all or ()), *(test.none or ()))}

    def problems(self, agent: Agent) -> list[tuple[str, str, str]]:
        """(code, rule id, what): R001 a rule naming a tool the file does not declare, R002 one testing an
        argument no tool it names declares, R003 one testing a value the argument's enum never takes (both can
        never match), R004 one testing the arguments of a tool the model server runs (unknown when it is offered:
        the tool is withheld whole)."""
        found = []
        for rule in self.rules:
            if rule.when.source == "hosted" and (rule.when.arguments or rule.when.secret is not None) \
                    and rule.effect in ("deny", "ask") and rule.mode == "enforce":
                found.append(("R004", rule.id, f"rule {rule.id!r} tests the arguments of a tool the model server "
                              "runs, which are not known when the tool is offered: it withholds the tool whole, "
                              "whatever the arguments would have been"))
            if rule.when.source in ("agent", "hosted", "mcp"):
                continue  # the agent's own tools, the model server's and MCP servers': not in the agent file
            globs = globs_of(rule.when.tool)
            tools = [t for t in agent.tools.values() if globs is None or any(fnmatch.fnmatchcase(t.name, g)
                                                                             for g in globs)]
            if globs is not None and all(glob.startswith("mcp__") for glob in globs):
                continue  # an MCP server's tools, named as Claude Code names them
            if globs is not None and not tools:
                found.append(("R001", rule.id, f"rule {rule.id!r} names tool {', '.join(globs)}, which "
                              f"{agent.path.name} does not declare: it matches only an agent's own tool of that name "
                              "(say `source: agent` if that is what it is for)"))
                continue
            known = {name for tool in tools for name in tool.spec.parameters}
            for name, test in rule.when.arguments.items():
                names = [one.strip() for part in name.split(" from ") for one in part.split("|")]  # `a|b from c`
                if not any(one.split(".")[0] in known for one in names):
                    found.append(("R002", rule.id, f"rule {rule.id!r} tests argument {name!r}, which no tool it "
                                  "names declares: it can never match"))
                elif _outside_enums(test, [t.spec.parameters.get(name) for t in tools]):
                    found.append(("R003", rule.id, f"rule {rule.id!r} tests argument {name!r} for a value its "
                                  "enum never takes: it can never match"))
        return found

    def matching(self, document: dict[str, Any], notes: dict[str, list[str]] | None = None,
                 *, shadow: bool = False) -> list[Rule]:
        """The rules in force (or, with `shadow`, the shadow rules) that match; `notes`: per rule, why it matched
        without knowing (a command it could not resolve)."""
        found = []
        for rule in self.rules:
            if (rule.mode == "shadow") != shadow or rule.effect == "label":
                continue
            said: list[str] = []
            if rule.when.holds(document, restricts=rule.effect != "allow", notes=said):
                found.append(rule)
                if notes is not None:
                    notes[rule.id] = said
        return found

    def outright(self, document: dict[str, Any]) -> Decision | None:
        """The deny of a rule that matches this tool without testing its arguments or argv; None when none does."""
        for rule in self.rules:
            if rule.effect == "deny" and rule.mode == "enforce" and not rule.when.tests_arguments \
                    and rule.when.holds(document, restricts=True):
                return self._decision(rule, document, None)
        return None

    def decide(self, document: dict[str, Any]) -> Decision | None:
        """The most restrictive matching rule's decision; None when no rule in force matches."""
        try:
            notes: dict[str, list[str]] = {}
            matched = self.matching(document, notes)
        except Exception as exc:  # a rule that cannot be evaluated decides nothing but a deny
            return Decision("deny", "rules", f"the policy could not be evaluated ({exc})", None, self.revision)
        if not matched:
            return None
        # among rules of one effect, one that matched outright says why before one that matched for want of knowing
        matched.sort(key=lambda rule: bool(notes.get(rule.id)))
        return most_restrictive(*(self._decision(rule, document, notes.get(rule.id)) for rule in matched))

    def _decision(self, rule: Rule, document: dict[str, Any], notes: list[str] | None) -> Decision:
        """A matching rule's decision; one that tests the session carries the flow that led to it, in its
        reason too (the model, and the person asked, read why a call alone allowed every day is stopped here)."""
        ids, words = flow(rule.when.session, document) if rule.when.session is not None else ((), "")
        reason = rule.reason or f"rule {rule.id}"
        return Decision(rule.effect, "rules", _reason(reason, [words] if words else [], notes), rule.id,
                        self.revision, flow=ids)

    def labelling(self, document: dict[str, Any]) -> list[Rule]:
        """The label rules that match this call, as a rule that restricts matches (a command toolkeeper cannot
        read has every label a rule could have given it). One that cannot be evaluated counts as matching: its
        labels only ever make a later call more likely to be asked."""
        found = []
        for rule in self.rules:
            if rule.effect != "label":
                continue
            try:
                matched = rule.when.holds(document, restricts=True)
            except Exception:
                log.exception("label rule %s could not be evaluated: its labels are given", rule.id)
                matched = True
            if matched:
                found.append(rule)
        return found

    def labels(self, document: dict[str, Any]) -> tuple[frozenset[str], tuple[str, ...]]:
        """The labels the label rules give this call, and those rules' ids."""
        matched = [rule for rule in self.labelling(document) if rule.labels]
        return frozenset(label for rule in matched for label in rule.labels), tuple(rule.id for rule in matched)

    def secrets_mode(self, document: dict[str, Any]) -> str | None:
        """The strictest `secrets:` of the rules in force that match this call (block > redact > allow); None
        when none says one. One that cannot be evaluated counts as `block`."""
        modes = []
        for rule in self.rules:
            if rule.secrets is None or rule.mode != "enforce":
                continue
            try:
                matched = rule.when.holds(document, restricts=rule.effect != "allow")
            except Exception:
                log.exception("rule %s could not be evaluated: a secret in the result is withheld", rule.id)
                modes.append("block")
                continue
            if matched:
                modes.append(rule.secrets)
        return strictest(modes)

    def shadow(self, document: dict[str, Any]) -> tuple[dict[str, str], ...]:
        """What each shadow rule that matches would have done: [{rule, effect}]. They never decide, so one that
        cannot be evaluated is left out (and said in the log)."""
        if not any(rule.mode == "shadow" for rule in self.rules):
            return ()
        try:
            return tuple({"rule": rule.id, "effect": rule.effect} for rule in self.matching(document, shadow=True))
        except Exception:
            log.exception("a shadow rule could not be evaluated")
            return ()


def _reason(reason: str, *notes: list[str] | None) -> str:
    """The rule's reason, then what led to it, each in parentheses: the flow, then what could not be read."""
    for said in notes:
        if said:
            reason += f" ({'; '.join(dict.fromkeys(said))})"
    return reason
