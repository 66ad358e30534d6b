"""The tools the model server runs itself: decided on the offer, recorded as observed.

    the agent offers web search (a server tool, hosted MCP, ...) -> the rules decide before the request leaves:
        allow: offered as it is     deny, ask: withheld from the request, recorded `withheld` with the rule
    the answer holds a call the server ran -> recorded `observed`: its arguments, its output's size and digest

An MCP connector server's tools that no one names are offered as one,
`mcp__<server>__*`: a rule in force that covers some of them by a pattern
(`mcp__github__delete_*`) withholds that offer, since which tools it covers
is not known before the server lists them (fail closed).

The server runs such a call inside one answer, so no call of it can be
stopped on its own. A rule that reads its arguments cannot be told them
before it runs: for the offer its arguments are unknown, so a deny or ask
rule with argument tests counts as matching (the tool is withheld whole),
and an allow rule with them does not.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from toolkeeper.audit import ExecutionRecord
from toolkeeper.common import canonical_json, sha256_hex
from toolkeeper.engine.calls import CallHandler, Outcome
from toolkeeper.engine.types import ToolCall, TurnContext
from toolkeeper.policy import Decision

log = logging.getLogger("toolkeeper")

UNKNOWN_ARGUMENTS = "(not known before the model server runs it)"  # not an object: argument tests cannot hold


class HostedTools:
    def __init__(self, handler: CallHandler):
        self.handler = handler

    async def offer(self, name: str, kind: str, config: Any, turn: TurnContext, *, unnamed: bool = False) -> bool:
        """Whether a tool the model server runs may be offered in this request; one withheld is recorded.
        `unnamed`: the offer (`mcp__<server>__*`) lets the server run tools no one names, so a rule that covers some
        of them by a pattern (`mcp__github__delete_*`) withholds it: which ones it covers is not known."""
        handler = self.handler
        document = handler.document(name, UNKNOWN_ARGUMENTS, None, turn, kind=kind, source="hosted")
        decision = await handler.judge(None, document, turn)  # the session's labels may withhold it too
        if decision.effect == "allow" and unnamed:
            decision = handler.policy.unnamed_restricted(document) or decision
            if decision.effect != "allow":
                log.warning("%s: not offered, %s", name, decision.reason)
        if decision.effect == "allow":
            handler.metrics.shadowed(decision.shadow)  # an offer is no call: its matches are counted, not recorded
            return True
        if decision.effect == "ask":  # nobody can be asked per call: the server runs them all at once
            decision = dataclasses.replace(decision, effect="deny", reason=f"{decision.reason} (a tool the model "
                                           "server runs cannot wait for a person's answer per call, so it was not "
                                           "offered)")  # the flow that asked, kept
        record = self._record(name, kind, config, turn, "withheld", f"{kind}:{name}")
        record.policy_input, record.labels = document, list(document["labels"])
        record.decided_by(decision)
        record.answer = f"withheld from the request: {decision.reason}"
        await handler.settle(record, Outcome(record.answer))
        self.handler.metrics.count("toolkeeper_hosted_tools_withheld_total", kind=kind)
        return False

    async def observe(self, call: ToolCall, turn: TurnContext) -> None:
        """A call the model server ran within an answer: recorded with what it gave, and what it brought
        (its labels) added to the session: it ran."""
        handler = self.handler
        record = self._record(call.name, call.kind, call.arguments, turn, "observed", call.id)
        output = call.extra.get("output")
        if output is not None:
            text = output if isinstance(output, str) else canonical_json(output).decode()
            record.output_bytes, record.output_sha256 = len(text.encode()), sha256_hex(text.encode())
        document = handler.document(call.name, call.arguments, None, turn, kind=call.kind, source="hosted")
        record.labels = list(document["labels"])
        record.decided_by(Decision("allow", "hosted", "run by the model server, within its answer",
                                   shadow=await self._shadow(document, turn)))
        await handler.flows.add(record, turn, passed=True)  # not to be refused: it has run
        await handler.settle(record, Outcome(""))  # one event: the server had run it before anyone knew

    async def _shadow(self, document: dict[str, Any], turn: TurnContext) -> tuple[dict[str, str], ...]:
        """The shadow rules that match a call the server ran, on the arguments it ran it with (they are known
        now) and in its session: recorded with it, as with every call. Nothing it decides: the call has run."""
        if await self.handler.flows.read(document, turn) is not None:
            return ()  # the session unread: no rule on it can say what it would have done
        return (await self.handler.policy.decide(document)).shadow

    def _record(self, name: str, kind: str, arguments: Any, turn: TurnContext, status: str,
                call_id: str) -> ExecutionRecord:
        return ExecutionRecord(request_id=turn.request_id, agent=turn.agent, api=turn.api, tool=name, runner="",
                               call_id=call_id, arguments_sent=arguments, source="hosted", status=status,
                               policy_revision=self.handler.policy.revision,
                               agent_revision=turn.agent_revision or None, session=turn.session or None)
