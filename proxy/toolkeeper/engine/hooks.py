"""The agents' own hooks: a call the agent is about to run, decided by the same rules, consent and record.

    before (PreToolUse, BeforeTool) -> rules -> allow: recorded `forwarded`, the agent runs it
                                              deny: recorded `denied`, the agent is told why
                                              ask: the consent channel when one can ask; else the agent's own
                                                   prompt asks its user (recorded `forwarded`, consent `delegated`)
                                     no rule decides -> `hooks_undecided`: defer (the default: no decision, the
                                                   agent's own permission flow applies; recorded `deferred`),
                                                   allow, or ask
    after (PostToolUse, AfterTool)  -> the forwarded (or deferred) record completed with the tool's output

`api: hook`, `tool.source: agent`: the same policy input as the agent's own
call on the model wire, so one rule governs both doors. On the model wire a
call no rule decides is passed to the agent, which still asks its user as it
would; here an allow would skip that question, so only a rule's allow is one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from toolkeeper.audit import ExecutionRecord
from toolkeeper.engine.agents import AgentCalls
from toolkeeper.engine.calls import CallContext, CallState, Outcome
from toolkeeper.engine.types import ToolCall, TurnContext
from toolkeeper.policy import Decision
from toolkeeper.settings import HOOKS_UNDECIDED

# Whose allow is a decision a rule made: the YAML rules' and OPA's, when it names the rule that allowed. Any other
# allow is no decision, and fails toward deferring, never toward granting: the agent's-own-tool default, a source
# added later, and OPA's catch-all (Rego must always answer, or the call is denied, so a policy ends with
# `default decision := {"effect": "allow", "rule": null, ...}`, as policies/default.rego does).
GRANTING_SOURCES = ("rules", "opa")


@dataclass(frozen=True)
class HookDecision:
    effect: str  # allow | deny | ask (the agent asks its own user) | defer (no decision: the agent's own flow)
    reason: str


def decided_by_a_rule(decision: Decision) -> bool:
    """A rule decided the call: any deny or ask, or an allow that names its YAML or Rego rule. Any other allow is
    the absence of a decision."""
    return decision.effect != "allow" or (decision.source in GRANTING_SOURCES and bool(decision.rule_id))


class HookCalls:
    def __init__(self, agent_calls: AgentCalls, undecided: str = "defer"):
        """`undecided`: what a call no rule decides is answered (settings' `hooks_undecided`)."""
        if undecided not in HOOKS_UNDECIDED:
            raise ValueError(f"hooks_undecided must be defer, allow or ask, not {undecided!r}")
        self.agent_calls = agent_calls
        self.handler = agent_calls.handler
        self.undecided = undecided

    async def before(self, turn: TurnContext, call: ToolCall, *, agent_asks: bool = True) -> HookDecision:
        """`agent_asks`: the agent can put a question to its user (an ask no channel here can take goes there);
        else such an ask is asked here, which with no one to ask is a deny."""
        handler = self.handler
        values = call.arguments if isinstance(call.arguments, dict) else {"arguments": call.arguments_text}
        record = ExecutionRecord(request_id=turn.request_id, agent=turn.agent, api="hook", tool=call.name, runner="",
                                 call_id=call.id, arguments_sent=call.arguments, arguments=values, source="agent",
                                 status="denied", policy_revision=handler.policy.revision,
                                 session=turn.session or None)
        decision = await handler.judge(record, handler.document(call.name, call.arguments, None, turn,
                                                                source="agent"), turn)
        if not decided_by_a_rule(decision):
            if self.undecided == "defer":
                return await self._defer(record, decision, turn)
            if self.undecided == "ask":
                decision = dataclasses.replace(decision, effect="ask", reason="no rule decided this call, and "
                                               "hooks_undecided is ask: a person decides")
        record.decided_by(decision)
        delegated = decision.effect == "ask" and agent_asks and not handler.consent_for(turn).can_ask
        if decision.effect == "ask" and not delegated:
            state = CallState(call, None, CallContext(turn), record, False, values=values)  # type: ignore[arg-type]
            record.decided_by(await handler.ask(state, decision))
        await handler.noted(record, turn, passed=record.decision == "allow" or delegated)
        delegated = delegated and record.decision != "deny"  # the session could not keep what it brings
        if record.decision == "allow" or delegated:
            record.status = "forwarded"
            record.consent = "delegated" if delegated else record.consent
            if await self.agent_calls.write_forwarded(record, turn):
                return HookDecision("ask" if delegated else "allow", record.decision_reason)
            return self._unrecorded(call.name)
        record.answer = f"Not allowed by toolkeeper: {record.decision_reason}"
        await handler.settle(record, Outcome(record.answer))
        return HookDecision("deny", record.decision_reason)

    async def _defer(self, record: ExecutionRecord, undecided: Decision, turn: TurnContext) -> HookDecision:
        """No rule decided: the agent's own permission flow decides, as it would without toolkeeper. Recorded
        `deferred` (the policy's own verdict, the default allow, stays the record's decision, so that replay
        compares a candidate with it); the post event completes the record if the agent ran the call."""
        reason = "no rule decided this call: the agent's own permission flow decides"
        record.decided_by(dataclasses.replace(undecided, reason=reason))
        record.status = "deferred"
        record.consent = "deferred"  # kept when the post event completes the record: the agent's own flow decided
        await self.handler.noted(record, turn, passed=True)  # the agent may well run it: taken to, as if allowed
        if record.decision == "deny":  # the session could not keep what it brings
            record.answer = f"Not allowed by toolkeeper: {record.decision_reason}"
            record.status = "denied"
            await self.handler.settle(record, Outcome(record.answer))
            return HookDecision("deny", record.decision_reason)
        if await self.agent_calls.write_forwarded(record, turn):
            return HookDecision("defer", reason)
        return self._unrecorded(record.tool)

    @staticmethod
    def _unrecorded(tool: str) -> HookDecision:
        return HookDecision("deny", f"{tool} could not be recorded in the audit trail, so toolkeeper does not let "
                                    "it run")

    async def after(self, turn: TurnContext, call_id: str, output: Any, error: str | None = None) -> bool:
        """The tool's output (or its error) completes its record; False when no forwarded record waits for it."""
        if error is not None:
            return await self.agent_calls.completed(turn, call_id, error, status="failed")
        return await self.agent_calls.completed(turn, call_id, output)
