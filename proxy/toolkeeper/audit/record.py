"""The record of one declared call: one shape that every consumer reads.

The audit trail stores it, the demo prints it, metrics count it. Each field is
declared once, here, with the phase that writes it: `decided` before the run
(who called what, and the decision), `completed` after it (what came out).
Readers (the CLI, the page, exports) get an `AuditEntry`, never string keys.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from typing import Any, Literal, Protocol, get_args

from pydantic import BaseModel, Field

# The outcome of a call: it ran (ok, failed, timeout), never ran (invalid, denied), its agent left while it ran
# (cancelled), or toolkeeper stopped while it ran (interrupted); an agent's own call handed to it (forwarded),
# whose result never came back (unanswered); one no rule decided, left by the hooks door to the agent's own
# permission flow (deferred); a tool the model server runs, withheld from its offer (withheld) or seen run in an
# answer (observed); and "running" while a declared call has not completed.
CallStatus = Literal["ok", "failed", "invalid", "denied", "timeout", "cancelled", "interrupted", "forwarded",
                     "deferred", "unanswered", "withheld", "observed"]
EntryStatus = Literal[CallStatus, "running"]
STATUSES: tuple[str, ...] = get_args(EntryStatus)
SOURCES = ("declared", "agent", "hosted", "mcp")  # who runs the call: toolkeeper, the agent, the model server, or
#                                                   one of the agent's MCP servers, through toolkeeper

Phase = Literal["decided", "completed"]


def _in(phase: Phase, default: Any = None, **kwargs: Any) -> Any:
    """A field written in `phase`: the trail's events carry exactly the fields of their phase."""
    if "default_factory" in kwargs:
        return Field(json_schema_extra={"phase": phase}, **kwargs)
    return Field(default, json_schema_extra={"phase": phase}, **kwargs)


class ExecutionRecord(BaseModel):
    version: int = _in("decided", 1)
    record_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    time: float = _in("decided", default_factory=time.time)
    request_id: str = _in("decided", "")
    agent: str = _in("decided", "")  # the agent's listed name, or a short hash of its credentials; never the key
    api: str = _in("decided", "chat")  # the door the call came in by: chat | responses | messages | mcp | hook
    source: str = _in("decided", "declared")  # declared (toolkeeper ran it) | agent (the agent's own) | hosted
    #                                            (the model server's: web search, code interpreter, server tools)
    #                                            | mcp (an agent's MCP server's, sent on by toolkeeper)
    tool: str = _in("decided", "")
    runner: str = _in("decided", "")
    call_id: str = _in("decided", "")
    arguments_sent: Any = _in("decided")
    arguments: dict[str, Any] | None = _in("decided")
    argv: list[str] | None = _in("decided")
    decision: str = _in("decided", "")  # allow | deny | ask
    decision_source: str = _in("decided", "")
    decision_reason: str = _in("decided", "")
    decision_rule: str | None = _in("decided")  # the rule that decided, when the security team's rules did
    policy_revision: str | None = _in("decided")  # which rules: a hash of the rules file, or OPA's bundle revision
    agent_revision: str | None = _in("decided")  # which declarations: a hash of the agent file
    decision_id: str | None = _in("decided")  # OPA's decision id
    policy_input: dict[str, Any] | None = _in("decided")  # the document the policy read
    shadow: list[dict[str, str]] = _in("decided", default_factory=list)  # shadow rules that matched: {rule, effect}
    labels: list[str] = _in("decided", default_factory=list)  # the call's: its tool's and the label rules'
    session: str | None = _in("decided")  # the session it was decided in (a hash its door made), when there was one
    # when a rule on the session decided: the records of the calls that brought the labels it tested
    flow: list[str] = _in("decided", default_factory=list)
    consent: str | None = _in("decided")  # approved | denied, when someone was asked
    approver: str | None = _in("decided")
    # the approver as the identity provider vouched for them: name, subject, issuer, email, username, groups, roles
    approver_identity: dict[str, Any] | None = _in("decided")
    waited_ms: float | None = _in("decided")  # how long the call waited for a person's answer
    redacted: list[str] = _in("decided", default_factory=list)  # which values were replaced before storing
    host: str = _in("decided", default_factory=socket.gethostname)  # where it ran: a crash's calls are closed
    pid: int = _in("decided", default_factory=os.getpid)  # ... by the next process on that host
    status: CallStatus = _in("completed", "invalid")
    exit_code: int | None = _in("completed")
    trap: str | None = _in("completed")  # why a wasm module was stopped, in words
    duration_ms: float = _in("completed", 0.0)
    output_bytes: int = _in("completed", 0)
    output_sha256: str | None = _in("completed")
    # secrets found in the call's result (or arguments): {kind, where, action}, never the value; action: what the
    # model was given (redact, block: withheld, allow: as it was) or, for arguments, whether the call went out
    secrets: list[dict[str, str]] = _in("completed", default_factory=list)
    answer: str = _in("completed", "")  # what the model was told

    def decided_by(self, decision: Decided) -> None:
        """The decision, as one change: who decided what, and why (a rule's revision is kept once known)."""
        self.decision, self.decision_source, self.decision_reason = (decision.effect, decision.source,
                                                                      decision.reason)
        self.decision_rule = decision.rule_id or self.decision_rule
        self.policy_revision = decision.revision or self.policy_revision
        self.decision_id = decision.decision_id or self.decision_id
        self.shadow = [dict(entry) for entry in decision.shadow] or self.shadow
        self.flow = list(decision.flow) or self.flow  # a person's answer to a flow's ask keeps the flow

    @classmethod
    def fields_of(cls, phase: Phase) -> tuple[str, ...]:
        return tuple(name for name, info in cls.model_fields.items()
                     if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("phase") == phase)


class AuditEntry(ExecutionRecord):
    """One call as the trail holds it: its events merged, the last event's kind and sequence number."""

    status: EntryStatus = "running"
    kind: str = ""  # decided | completed | refused: the last event of the call
    seq: int = 0


class Decided(Protocol):
    """What the record reads of a policy decision (the policy layer's `Decision`)."""

    effect: str
    source: str
    reason: str
    rule_id: str | None
    revision: str | None
    decision_id: str | None
    shadow: tuple[dict[str, str], ...]
    flow: tuple[str, ...]


class Observer(Protocol):
    def __call__(self, record: ExecutionRecord) -> None: ...
