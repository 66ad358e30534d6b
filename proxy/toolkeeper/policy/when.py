"""A rule's `when:`: the conditions a call must meet, every one, for the rule (or a limit) to hold.

Each reads the policy input document (docs/reference/policy-input.md): the
tool, its arguments and argv, who calls and for whom, when, the call's labels,
its session's, what the scan of its arguments found, and the limits' counts.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Literal

from pydantic import Field, model_validator

from toolkeeper.common import Strict
from toolkeeper.policy.conditions import ArgvTest, Scope, ValueTest, dotted
from toolkeeper.policy.flows import LabelsTest, SessionTest, secrets_found
from toolkeeper.policy.situation import AgentTest, PrincipalTest, TimeTest


def globs_of(value: str | tuple[str, ...] | None) -> tuple[str, ...] | None:
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
    labels: LabelsTest | None = None  # the call's own labels (its tool's, and the label rules')
    session: SessionTest | None = None  # what its session has seen before it
    secret: bool | None = None  # written `arguments: {secret: true}`: the scan found one in the arguments
    limits: dict[str, ValueTest] = Field(default_factory=dict)  # `ticket-deletes.used: {above: 14}`

    @property
    def only_who(self) -> bool:
        """It tests only who calls and when (what a model round has: no tool, no arguments)."""
        return not (self.model_fields_set - {"agent", "principal", "time"})

    @model_validator(mode="before")
    @classmethod
    def _secret(cls, value: Any) -> Any:
        """`arguments: {secret: true}` tests the scan of the arguments, not an argument named `secret` (that is
        tested with a mapping: `secret: {present: true}`)."""
        if not isinstance(value, dict):
            return value
        if "secret" in value:
            raise ValueError("`secret:` is written under arguments: `arguments: {secret: true}`")
        arguments = value.get("arguments")
        if isinstance(arguments, dict) and isinstance(arguments.get("secret"), bool):
            rest = {name: test for name, test in arguments.items() if name != "secret"}
            return {**value, "arguments": rest, "secret": arguments["secret"]}
        return value

    def holds(self, document: dict[str, Any], *, restricts: bool = False, notes: list[str] | None = None) -> bool:
        """Every condition holds. Arguments that are not an object (an agent's call whose arguments are not
        JSON) cannot be tested: a rule that `restricts` (deny, ask) then counts as matching, so a malformed call
        cannot slip past it. `notes`: why a condition matched without knowing (a command it could not parse)."""
        tool = document["tool"]
        globs = globs_of(self.tool)
        if globs is not None and not any(fnmatch.fnmatchcase(tool["name"], glob) for glob in globs):
            return False
        if self.source is not None and tool.get("source", "declared") != self.source:
            return False
        kinds = globs_of(self.kind)
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
        if not self._flow_holds(document) or not self._limits_hold(document):
            return False
        if notes is not None:
            notes.extend(scope.notes)
        return True

    def _flow_holds(self, document: dict[str, Any]) -> bool:
        if self.labels is not None and not self.labels.holds(document.get("labels") or []):
            return False
        if self.session is not None and not self.session.holds(document.get("session")):
            return False
        return self.secret is None or secrets_found(document) == self.secret

    def _limits_hold(self, document: dict[str, Any]) -> bool:
        """`limits: {ID.used: {above: 14}}`: the counts of the limits that select the call (absent: not present)."""
        for name, test in self.limits.items():
            present, value = dotted(document.get("limits") or {}, name)
            if not test.holds(value, present):
                return False
        return True

    @property
    def tests_arguments(self) -> bool:
        """It reads what the call is given (its arguments, the secrets in them, its argv), not only its tool."""
        return bool(self.arguments) or self.secret is not None or self.argv is not None

    def _arguments_hold(self, arguments: dict[str, Any], restricts: bool, scope: Scope) -> bool:
        for name, test in self.arguments.items():
            present, value = dotted(arguments, name)
            if not test.holds(value, present, restricts=restricts, scope=scope):
                return False
        return True
