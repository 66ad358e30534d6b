"""The calls the agent runs (its function tools, its built-ins) and those the model server runs once answered
(a hosted MCP server's approval requests): the same rules and consent as a declared call, and a record.

    allow -> passed to the agent, recorded `forwarded`; the result it sends back completes the record
             (toolkeeper's own answer instead, for a call the agent did not ask to answer: recorded `ok`)
    deny  -> the model reads why, in a hidden round; recorded `denied`
    ask   -> the consent channel, then as allow or deny
    a kind of call toolkeeper does not know -> denied, whatever the rules say
"""

from __future__ import annotations

import logging
import time
from typing import Any

from toolkeeper.audit import AuditError, ExecutionRecord
from toolkeeper.common import canonical_json, digest, printable, sha256_hex
from toolkeeper.engine.calls import ANSWER_EXCERPT, SWEEP_EVERY, CallContext, CallHandler, CallState, Outcome
from toolkeeper.engine.types import ToolCall, TurnContext
from toolkeeper.policy import Decision
from toolkeeper.store import StoreError
from toolkeeper.tools import ambiguous_keys, parse_arguments

log = logging.getLogger("toolkeeper")


class AgentCalls:
    def __init__(self, handler: CallHandler):
        self.handler = handler
        self._swept = time.monotonic()  # when forwarded calls were last looked at for `unanswered`

    async def govern(self, call: ToolCall, context: CallContext) -> str | None:
        """One of the agent's own calls, under the same rules and consent: None when it may go to the agent
        (recorded `forwarded`), else the answer the model gets in its place (recorded `denied`)."""
        turn, handler = context.turn, self.handler
        arguments, _ = parse_arguments(call.arguments)
        record = ExecutionRecord(request_id=turn.request_id, agent=turn.agent, api=turn.api, tool=call.name,
                                 runner="", call_id=call.id, arguments_sent=call.arguments, arguments=arguments,
                                 source=call.source, status="denied", policy_revision=handler.policy.revision,
                                 agent_revision=turn.agent_revision or None, session=turn.session or None)
        # what an approver sees and an approval is bound to: the arguments, or their text when not an object
        values = arguments if isinstance(arguments, dict) else {"arguments": call.arguments_text}
        state = CallState(call, None, context, record, False, values=values)  # type: ignore[arg-type]
        document = handler.document(call.name, call.arguments_text if arguments is None else arguments, None, turn,
                                    kind=call.kind, source=call.source)
        ambiguous = ambiguous_keys(call.arguments)  # the agent might run other arguments than the rules read
        refused = None if call.known else self._unknown(call)
        if ambiguous is not None:
            refused = Decision("deny", "toolkeeper", f"{ambiguous}: the agent could run other arguments than the "
                                                     "rules read, so it was not passed on")
        decision = await handler.judge(record, document, turn, instead=refused)
        record.decided_by(decision)
        if decision.effect == "ask":
            record.decided_by(await handler.ask(state, decision))
        await handler.noted(record, turn)  # allowed: the agent is taken to run it
        if record.decision == "allow" and call.answer_if_allowed is not None:  # toolkeeper's to answer: done here
            record.status, record.answer = "ok", call.answer_if_allowed
            await handler.settle(record, Outcome(record.answer))
            return record.answer
        if record.decision == "allow":
            record.status = "forwarded"
            if await self.write_forwarded(record, turn):
                return None
            record.status, record.decision = "denied", "deny"  # no record, no call: as for a declared tool
            record.answer = (f"Not run: {call.name} could not be recorded in the audit trail, so it was not "
                             "passed on. Tell the user; it may work again later.")
            return record.answer
        record.answer = (f"Not run: {call.name} was not allowed ({record.decision_reason}). Do not call it again "
                         "unless the user asks you to; tell the user it was not allowed.")
        await handler.settle(record, Outcome(record.answer))
        return record.answer

    def _unknown(self, call: ToolCall) -> Decision:
        """A kind of call toolkeeper does not know: never passed on, whatever the rules say, and said."""
        self.handler.metrics.count("toolkeeper_unknown_calls_total", kind=call.kind)
        log.warning("the model made a %s call, a kind toolkeeper does not know: denied", printable(call.kind))
        return Decision("deny", "toolkeeper", f"toolkeeper does not know this kind of call ({call.kind}), so it "
                                              "cannot be governed and was not passed on")

    async def write_forwarded(self, record: ExecutionRecord, turn: TurnContext) -> bool:
        handler = self.handler
        if handler.audit is not None:
            try:
                await handler.audit.write("forwarded", record)
            except AuditError as exc:
                handler.audit_failed()
                log.error("the audit trail could not record the agent's call of %s: %s", record.tool, exc)
                return False
        if handler.store is not None:
            # kept until the result comes: redacted, as the trail has it (no secret waits in the store)
            try:
                await handler.store.put_link(digest(turn.tenant, "forwarded", record.call_id),
                                             handler.redactor.apply(record).model_dump(mode="json"),
                                             handler.forwarded_ttl)
            except StoreError as exc:  # the call goes on; its record will stay `forwarded`
                log.error("the agent's call of %s is forwarded, but its result cannot be awaited: %s", record.tool,
                          exc)
        for observer in handler.observers:
            observer(record)
        return True

    async def collect(self, turn: TurnContext, messages: list[dict[str, Any]]) -> None:
        """The results the agent sends back for its forwarded calls complete their records; the calls whose
        result never came within `forwarded_ttl` are closed `unanswered`."""
        store = self.handler.store
        if store is None or self.handler.audit is None:
            return
        for message in messages:
            if isinstance(message, dict) and message.get("role") == "tool":
                await self.completed(turn, str(message.get("tool_call_id")), message.get("content"))
        if time.monotonic() - self._swept > min(SWEEP_EVERY, self.handler.forwarded_ttl):
            self._swept = time.monotonic()
            for stored in await store.take_expired_links():
                # a `deferred` call (the hooks door left it to the agent's own permission flow) may well have
                # been refused by the agent, so no result is owed: its record stays `deferred`
                if stored.get("source") in ("agent", "hosted") and stored.get("status") == "forwarded":
                    record = ExecutionRecord.model_validate(stored)
                    record.status, record.answer = "unanswered", "(the agent never sent this call's result back)"
                    await self._complete(record)

    async def completed(self, turn: TurnContext, call_id: str, output: Any, status: str = "ok") -> bool:
        """A forwarded call's result: its record completed with the output's size, digest and excerpt. Taken from
        the store, so a replayed history (or a repeated hook event) completes nothing twice."""
        store = self.handler.store
        if store is None or self.handler.audit is None:
            return False
        stored = await store.take_link(digest(turn.tenant, "forwarded", call_id))
        if stored is None:
            return False
        record = ExecutionRecord.model_validate(stored)
        text = output if isinstance(output, str) else canonical_json(output).decode()
        record.status, record.answer = status, text[:ANSWER_EXCERPT]
        record.output_bytes, record.output_sha256 = len(text.encode()), sha256_hex(text.encode())
        record.secrets = turn.result_secrets.get(call_id, [])  # found as the request came in (engine/secrets.py)
        await self._complete(record)
        return True

    async def _complete(self, record: ExecutionRecord) -> None:
        try:
            await self.handler.audit.write("completed", record)  # type: ignore[union-attr]
        except AuditError as exc:
            self.handler.audit_failed()
            log.error("the audit trail lost the result of %s: %s", record.tool, exc)
