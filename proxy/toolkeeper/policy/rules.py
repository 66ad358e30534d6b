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
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from toolkeeper.common import Strict, load_yaml_model, sha256_hex, shipped_file
from toolkeeper.policy.conditions import ArgvTest, Scope, ValueTest, dotted
from toolkeeper.policy.decision import Decision, most_restrictive
from toolkeeper.tools import Agent

log = logging.getLogger("toolkeeper")


class RulesError(Exception):
    """The rules file cannot be used; the message names the file, the rule and the key."""


class AgentTest(Strict):
    ids: tuple[str, ...] | None = None  # the short hashes of agents' credentials
    header: ValueTest | None = None  # the identity header the deployment sets

    def holds(self, agent: dict[str, Any]) -> bool:
        if self.ids is not None and agent.get("id") not in self.ids:
            return False
        return self.header is None or self.header.holds(agent.get("header"), agent.get("header") is not None)


class GroupsTest(Strict):
    """Tests on the principal's groups (globs): `any` of them, `all` of them, `none` of them; a list is `any`."""

    any: tuple[str, ...] | None = None
    all: tuple[str, ...] | None = None
    none: tuple[str, ...] | None = None

    @model_validator(mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        return {"any": [value] if isinstance(value, str) else value} if isinstance(value, (str, list, tuple)) \
            else value

    def holds(self, groups: list[str]) -> bool:
        def held(glob: str) -> bool:
            return any(fnmatch.fnmatchcase(group, glob) for group in groups)

        return ((self.any is None or any(held(glob) for glob in self.any))
                and (self.all is None or all(held(glob) for glob in self.all))
                and (self.none is None or not any(held(glob) for glob in self.none)))


class PrincipalTest(Strict):
    """Who the call is for (the policy input's `principal`): its user, groups, issuer, agent and chosen claims."""

    user: ValueTest | None = None
    agent: ValueTest | None = None
    issuer: ValueTest | None = None
    groups: GroupsTest | None = None
    claims: dict[str, ValueTest] = Field(default_factory=dict)

    def holds(self, principal: dict[str, Any]) -> bool:
        for name in ("user", "agent", "issuer"):
            test = getattr(self, name)
            if test is not None and not _held(test, principal.get(name), principal.get(name) is not None):
                return False
        groups = principal.get("groups")
        if self.groups is not None and not self.groups.holds(groups if isinstance(groups, list) else []):
            return False
        claims = principal.get("claims") or {}
        return all(_held(test, claims.get(name), name in claims) for name, test in self.claims.items())


def _held(test: ValueTest, value: Any, present: bool) -> bool:
    """A principal's field no token or header gave is read as null, not skipped: `user: {not_equals: ada}` holds for
    a call that names no user (a rule meant to stop everyone but Ada must stop the anonymous too); only `present:`
    asks whether it was given."""
    return test.holds(value, present if test.present is not None else True)


class TimeTest(Strict):
    weekdays: tuple[Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"], ...] | None = None
    hours: str | None = None  # "09-17": from 09:00 to 17:59, in the time zone of the request time

    @field_validator("hours")
    @classmethod
    def _hours(cls, value: str | None) -> str | None:
        if value is not None:
            match = re.fullmatch(r"(\d{1,2})-(\d{1,2})", value)
            if not match or int(match.group(1)) > 23 or int(match.group(2)) > 23:
                raise ValueError('hours are a range like "09-17" (from 09:00 to 17:59)')
        return value

    def holds(self, request: dict[str, Any]) -> bool:
        if self.weekdays is not None and request.get("weekday") not in self.weekdays:
            return False
        if self.hours is not None:
            start, end = (int(part) for part in self.hours.split("-"))
            hour = request.get("hour", -1)
            inside = start <= hour <= end if start <= end else (hour >= start or hour <= end)
            if not inside:
                return False
        return True


def _globs(value: str | tuple[str, ...] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return (value,) if isinstance(value, str) else tuple(value)


class When(Strict):
    tool: str | tuple[str, ...] | None = None
    source: Literal["declared", "agent", "hosted", "mcp"] | None = None  # declared, the agent's own, the model
    #                                                                       server's, an MCP server's
    kind: str | tuple[str, ...] | None = None  # the call's type, a glob: function, shell_call, apply_patch_call
    runner: Literal["argv", "wasm", "mcp"] | None = None
    tier: Literal["gated", "silent"] | None = None
    argv: ArgvTest | None = None
    arguments: dict[str, ValueTest] = Field(default_factory=dict)
    agent: AgentTest | None = None
    principal: PrincipalTest | None = None
    time: TimeTest | None = None

    def holds(self, document: dict[str, Any], *, restricts: bool = False, notes: list[str] | None = None) -> bool:
        """Every condition holds. Arguments that are not an object (an agent's call whose arguments are not
        JSON) cannot be tested: a rule that `restricts` (deny, ask) then counts as matching, so a malformed call
        cannot slip past it. `notes`: why a condition matched without knowing (a command it could not parse)."""
        tool = document["tool"]
        globs = _globs(self.tool)
        if globs is not None and not any(fnmatch.fnmatchcase(tool["name"], glob) for glob in globs):
            return False
        if self.source is not None and tool.get("source", "declared") != self.source:
            return False
        kinds = _globs(self.kind)
        if kinds is not None and not any(fnmatch.fnmatchcase(tool.get("kind", "function"), glob) for glob in kinds):
            return False
        if self.runner is not None and tool["runner"] != self.runner:
            return False
        if self.tier is not None and tool["tier"] != self.tier:
            return False
        scope = Scope(document.get("workdir"), tool.get("kind", "function"))
        if self.argv is not None and not self.argv.holds(document.get("argv") or [], restricts=restricts,
                                                         scope=scope):
            return False
        if self.arguments:
            arguments = document.get("arguments")
            readable = arguments is None or isinstance(arguments, dict)
            if not (self._arguments_hold(arguments or {}, restricts, scope) if readable else restricts):
                return False
        if self.agent is not None and not self.agent.holds(document.get("agent") or {}):
            return False
        if self.principal is not None and not self.principal.holds(document.get("principal") or {}):
            return False
        if self.time is not None and not self.time.holds(document.get("request") or {}):
            return False
        if notes is not None:
            notes.extend(scope.notes)
        return True

    def _arguments_hold(self, arguments: dict[str, Any], restricts: bool, scope: Scope) -> bool:
        for name, test in self.arguments.items():
            present, value = dotted(arguments, name)
            if not test.holds(value, present, restricts=restricts, scope=scope):
                return False
        return True


def _outside_enums(test: ValueTest, parameters: list[Any]) -> bool:
    """An `equals` or `in` no declared enum of the argument admits (every tool the rule names has one)."""
    wanted = [test.equals] if "equals" in test.model_fields_set else list(test.one_of or [])
    enums = [p.enum for p in parameters if p is not None]
    if not wanted or not enums or any(not enum for enum in enums):
        return False
    return not any(value in enum for value in wanted for enum in enums)


class Rule(Strict):
    id: str
    effect: Literal["allow", "deny", "ask"]
    reason: str = ""
    when: When = Field(default_factory=When)
    mode: Literal["enforce", "shadow"] = "enforce"  # shadow: evaluated and recorded, never deciding

    @model_validator(mode="after")
    def _deny_says_why(self) -> Rule:
        if self.effect == "deny" and not self.reason.strip():
            raise ValueError("a deny rule needs a reason: the model reads it")
        return self


class RulesFile(Strict):
    rules: tuple[Rule, ...] = ()

    @model_validator(mode="after")
    def _unique_ids(self) -> RulesFile:
        seen = set()
        for rule in self.rules:
            if rule.id in seen:
                raise ValueError(f"rule id {rule.id!r} is used twice")
            seen.add(rule.id)
        return self


class Rules:
    """The loaded rules, and the revision that identifies them in every record."""

    def __init__(self, path: Path, parsed: RulesFile, revision: str):
        self.path = path
        self.rules = parsed.rules
        self.revision = revision

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
            if rule.when.source == "hosted" and rule.when.arguments and rule.effect != "allow" \
                    and rule.mode == "enforce":
                found.append(("R004", rule.id, f"rule {rule.id!r} tests the arguments of a tool the model server "
                              "runs, which are not known when the tool is offered: it withholds the tool whole, "
                              "whatever the arguments would have been"))
            if rule.when.source in ("agent", "hosted", "mcp"):
                continue  # the agent's own tools, the model server's and MCP servers': not in the agent file
            globs = _globs(rule.when.tool)
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
            if (rule.mode == "shadow") != shadow:
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
            if rule.effect == "deny" and rule.mode == "enforce" and not rule.when.arguments \
                    and rule.when.argv is None and rule.when.holds(document, restricts=True):
                return Decision("deny", "rules", rule.reason, rule.id, self.revision)
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
        decisions = [Decision(r.effect, "rules", _reason(r, notes.get(r.id)), r.id, self.revision) for r in matched]
        return most_restrictive(*decisions)

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


def _reason(rule: Rule, notes: list[str] | None) -> str:
    reason = rule.reason or f"rule {rule.id}"
    return f"{reason} ({'; '.join(dict.fromkeys(notes))})" if notes else reason


def default_rules_path() -> Path:
    """The shipped default policy: policies/ in a checkout, toolkeeper/_policies/ in a wheel."""
    path = shipped_file("policies/default.yaml", "_policies/default.yaml")
    if path is None:
        raise RulesError("the default policy (policies/default.yaml) is not installed")
    return path


def load_rules(path: str | Path) -> Rules:
    path = Path(path).resolve()
    parsed, text, _ = load_yaml_model(path, RulesFile, RulesError, what="the rules file",
                                      entries="rules", entry="rule", name_key="id")
    return Rules(path, parsed, sha256_hex(text)[:12])


def rules_in_force(policy: str | None, opa_url: str | None = None) -> Rules | None:
    """The YAML rules that decide, as `serve` and `policy explain` read `--policy`: the shipped default unless
    it names a file; none for `none`, and none beside OPA unless one is named."""
    if policy == "none" or (opa_url and not policy):
        return None
    return load_rules(policy or default_rules_path())
