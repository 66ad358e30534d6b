"""The agents' own hooks: a call the agent is about to run, decided by the same rules, consent and record.

    before (PreToolUse, BeforeTool) -> rules -> allow: recorded `forwarded`, the agent runs it
                                              deny: recorded `denied`, the agent is told why
                                              ask: the consent channel when one can ask; else the agent's own
                                                   prompt asks its user (recorded `forwarded`, consent `delegated`)
    after (PostToolUse, AfterTool)  -> the forwarded record completed with the tool's output

`api: hook`, `tool.source: agent`: the same policy input as the agent's own
call on the model wire, so one rule governs both doors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolkeeper.audit import ExecutionRecord
from toolkeeper.engine.agents import AgentCalls
from toolkeeper.engine.calls import CallContext, CallState, Outcome
from toolkeeper.engine.types import ToolCall, TurnContext


@dataclass(frozen=True)
class HookDecision:
    effect: str  # allow | deny | ask (the agent asks its own user)
    reason: str


class HookCalls:
    def __init__(self, agent_calls: AgentCalls):
        self.agent_calls = agent_calls
        self.handler = agent_calls.handler

    async def before(self, turn: TurnContext, call: ToolCall, *, agent_asks: bool = True) -> HookDecision:
        """`agent_asks`: the agent can put a question to its user (an ask no channel here can take goes there);
        else such an ask is asked here, which with no one to ask is a deny."""
        handler = self.handler
        values = call.arguments if isinstance(call.arguments, dict) else {"arguments": call.arguments_text}
        record = ExecutionRecord(request_id=turn.request_id, agent=turn.agent, api="hook", tool=call.name, runner="",
                                 call_id=call.id, arguments_sent=call.arguments, arguments=values, source="agent",
                                 status="denied", policy_revision=handler.policy.revision)
        record.policy_input = handler.document(call.name, call.arguments, None, turn, source="agent")
        decision = await handler.policy.decide(record.policy_input)
        record.decided_by(decision)
        delegated = decision.effect == "ask" and agent_asks and not handler.consent_for(turn).can_ask
        if decision.effect == "ask" and not delegated:
            state = CallState(call, None, CallContext(turn), record, False, values=values)  # type: ignore[arg-type]
            record.decided_by(await handler.ask(state, decision))
        if record.decision == "allow" or delegated:
            record.status = "forwarded"
            record.consent = "delegated" if delegated else record.consent
            if await self.agent_calls.write_forwarded(record, turn):
                return HookDecision("ask" if delegated else "allow", record.decision_reason)
            return HookDecision("deny", f"{call.name} could not be recorded in the audit trail, so toolkeeper "
                                        "does not let it run")
        record.answer = f"Not allowed by toolkeeper: {record.decision_reason}"
        await handler.settle(record, Outcome(record.answer))
        return HookDecision("deny", record.decision_reason)

    async def after(self, turn: TurnContext, call_id: str, output: Any, error: str | None = None) -> bool:
        """The tool's output (or its error) completes its record; False when no forwarded record waits for it."""
        if error is not None:
            return await self.agent_calls.completed(turn, call_id, error, status="failed")
        return await self.agent_calls.completed(turn, call_id, output)
