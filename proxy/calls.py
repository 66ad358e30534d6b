"""One declared call, from the model's arguments to the answer it reads.

    loop detector -> parse and check arguments -> render argv -> a retry's stored
    result? -> policy -> consent -> run -> record

Every step can answer instead of going on: an invalid call is answered with
what to fix, a repeated one with a stop notice, a denied one with the reason.
Each call leaves one ExecutionRecord for the observers.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.agentfile import DeclaredTool
from proxy.arguments import check_arguments, invalid_call_answer, parse_arguments
from proxy.audit import AuditError, SQLAudit
from proxy.consent import Consent, ConsentRequest
from proxy.policy import Decision, Policy, policy_input
from proxy.records import CallStatus, ExecutionRecord, Observer
from proxy.rounds import ToolCall
from proxy.runners import Runner
from proxy.store import Store
from proxy.templates import RenderError

log = logging.getLogger("toolkeeper")

LOOP_NOTICE_AT = 3  # the same call this many times in a turn: answered with a stop notice
LOOP_END_AT = 5  # ... and this many times: the turn ends
# Seconds a call's result answers an identical request (same credentials, same
# body). The openai client retries within seconds; an attempt whose client
# timed out was disconnected, and its tool cancelled, so a long window would
# only replay for requests meant as new ones.
RETRY_WINDOW = 60.0


@dataclass
class TurnContext:
    """Who is asking: one agent request, as the protocol adapter saw it."""

    request_id: str = ""
    agent: str = ""  # a short hash of the credentials: for records and logs
    tenant: str = ""  # the full hash of the credentials: whose stored history this is
    request_key: str = ""  # the credentials and the exact body: a retried request has the same
    agent_header: str | None = None  # the identity header the deployment sets, if it names one


@dataclass
class CallContext:
    """Who is calling, and the turn's memory of earlier calls."""

    turn: TurnContext
    seen: Counter[str] = field(default_factory=Counter)


@dataclass
class Outcome:
    answer: str
    ends_turn: str = ""  # the final message, when this call ends the turn
    ran: bool = False  # the tool ran: its record is completed, not refused
    unrecorded: bool = False  # the audit trail could not take it


class DeclaredCalls:
    def __init__(self, *, runners: Mapping[str, Runner], consent: Consent, policy: Policy,
                 store: Store | None = None, observers: Iterable[Observer] = (), retry_window: float = RETRY_WINDOW,
                 audit: SQLAudit | None = None):
        self.runners = runners  # by the tool's runner: "argv", "wasm"
        self.consent = consent
        self.policy = policy
        self.store = store
        self.observers = list(observers)
        self.retry_window = retry_window
        self.audit = audit
        self._running: dict[str, asyncio.Future[tuple[str, CallStatus]]] = {}

    async def handle(self, call: ToolCall, tool: DeclaredTool, context: CallContext, *,
                     truncated: bool = False) -> Outcome:
        spec = tool.spec
        record = ExecutionRecord(request_id=context.turn.request_id, agent=context.turn.agent, tool=spec.name,
                                 runner=spec.runner, call_id=call.id, arguments_sent=call.arguments, status="invalid")
        outcome = await self._handle(call, tool, context, truncated, record)
        record.answer = outcome.answer
        if self.audit is not None and not outcome.unrecorded:
            try:
                await self._audit(self.audit.completed if outcome.ran else self.audit.refused, record)
            except AuditError:
                log.exception("the audit trail lost the outcome of %s (record %s)", spec.name, record.record_id)
        log.info("declared call %s: %s (%s) in %.1f ms", spec.name, record.status, record.decision_source or "-",
                 record.duration_ms)
        for observer in self.observers:
            try:
                observer(record)
            except Exception:
                log.exception("an observer failed on the record of %s", spec.name)
        return outcome

    async def _handle(self, call: ToolCall, tool: DeclaredTool, context: CallContext, truncated: bool,
                      record: ExecutionRecord) -> Outcome:
        spec = tool.spec
        arguments, problem = parse_arguments(call.arguments, truncated=truncated)
        signature = spec.name + "\x00" + (_canonical(arguments) if arguments is not None else call.arguments_text)
        context.seen[signature] += 1
        repeats = context.seen[signature]
        if repeats >= LOOP_NOTICE_AT:
            record.status, record.decision, record.decision_source = "denied", "deny", "loop_detector"
            record.decision_reason = f"the same call {repeats} times in one turn"
            if repeats >= LOOP_END_AT:
                return Outcome(
                    f"Stopped: {spec.name} was called with the same arguments {repeats} times; the turn ends.",
                    ends_turn=(f"toolkeeper ended this turn: the model called {spec.name} with the same arguments "
                               f"{repeats} times in a row without making progress."),
                )
            return Outcome(
                f"Stop: you have called {spec.name} with these same arguments {repeats} times in this turn, and "
                "it will not run again. Do not repeat it: change the arguments, or answer the user with what you "
                "have and say what went wrong."
            )

        if problem:
            return Outcome(invalid_call_answer(spec, call.arguments, [problem]))
        checked = check_arguments(spec, arguments)
        if not checked.ok:
            return Outcome(invalid_call_answer(spec, arguments, checked.problems))
        record.arguments = checked.values
        try:
            argv = tool.template.render(checked.values)
        except RenderError as exc:
            return Outcome(invalid_call_answer(spec, arguments, [str(exc)]))
        record.argv = argv

        # A retried request (the openai client retries twice by default) gets the
        # result of the call it already ran: a side effect happens once.
        memo_key = _digest(context.turn.request_key, signature, str(repeats)) if context.turn.request_key else ""
        replayed = await self._replay(memo_key)
        if replayed is not None:
            record.decision, record.decision_source = "allow", "retry"
            record.decision_reason = "a retry of a request that already ran this call"
            record.answer, record.status = replayed
            return Outcome(replayed[0])

        document = policy_input(tool, checked.values, argv, agent_id=context.turn.agent,
                                agent_header=context.turn.agent_header, request_id=context.turn.request_id,
                                yolo=self.policy.yolo, interactive=self.consent.can_ask)
        decision = await self.policy.decide(document)
        record.policy_input = document
        record.decision_rule, record.policy_revision = decision.rule_id, decision.revision
        record.decision_id = decision.decision_id
        if decision.effect == "ask":
            decision = await self._ask(tool, checked.values, argv, record, context.turn.agent)
        record.decision, record.decision_source, record.decision_reason = (
            decision.effect, decision.source, decision.reason)
        if decision.effect != "allow":
            record.status = "denied"
            return Outcome(
                f"Not run: {spec.name} was not allowed ({decision.reason}). Do not call it again unless the user "
                "asks you to; tell the user it was not allowed."
            )

        if self.audit is not None:
            try:
                await self._audit(self.audit.decided, record)  # no record, no run
            except AuditError as exc:
                log.error("%s not run: %s", spec.name, exc)
                record.status = "failed"
                return Outcome(f"Not run: {spec.name} could not be recorded in the audit trail, and nothing runs "
                               f"unrecorded ({exc}). Tell the user; do not retry.", unrecorded=True)

        running = asyncio.get_running_loop().create_future()
        if memo_key:
            self._running[memo_key] = running
        try:
            result = await self.runners[spec.runner].run(tool, argv, checked.values)
        except BaseException:
            running.cancel()
            raise
        finally:
            self._running.pop(memo_key, None)
        record.status = "ok" if result.status == "ok" else ("timeout" if result.status == "timeout" else "failed")
        record.exit_code = result.exit_code
        record.trap = result.trap
        record.duration_ms = round(result.duration * 1000, 3)
        record.output_bytes = result.stdout.total
        record.output_sha256 = ExecutionRecord.digest(result.stdout.bytes())
        answer = result.answer()
        running.set_result((answer, record.status))
        if memo_key and self.store is not None:
            self.store.put_call_result(memo_key, orjson.dumps([answer, record.status]).decode(), self.retry_window)
        return Outcome(answer, ran=True)

    async def _audit(self, write: Callable[[ExecutionRecord], None], record: ExecutionRecord) -> None:
        """A local SQLite write is quicker than a hop to a thread; a PostgreSQL one is not, and waits on the network."""
        if self.audit is not None and self.audit.remote:
            await asyncio.to_thread(write, record)
        else:
            write(record)

    async def _replay(self, memo_key: str) -> tuple[str, CallStatus] | None:
        if not memo_key:
            return None
        running = self._running.get(memo_key)
        if running is not None:  # the first attempt is still running it: wait for its result
            try:
                return await asyncio.shield(running)
            except asyncio.CancelledError:
                if not running.cancelled():
                    raise  # this request was cancelled, not the first
                return None  # the first attempt was cancelled (its agent left): run it here
        if self.store is not None:
            stored = self.store.get_call_result(memo_key)
            if stored is not None:
                answer, status = orjson.loads(stored)
                return answer, status
        return None

    async def _ask(self, tool: DeclaredTool, values: dict[str, Any], argv: list[str],
                   record: ExecutionRecord, agent: str) -> Decision:
        started = time.monotonic()
        answer = await self.consent.ask(ConsentRequest(tool.name, values, argv, agent))
        log.info("consent for %s: %s by %s in %.1f s", tool.name, "yes" if answer.allowed else "no",
                 answer.approver, time.monotonic() - started)
        record.consent = "approved" if answer.allowed else "denied"
        record.approver = answer.approver
        if answer.allowed:
            return Decision("allow", "consent", f"approved by {answer.approver}")
        return Decision("deny", "consent", answer.reason or "the user did not approve it")


def _canonical(arguments: dict[str, Any]) -> str:
    return orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()
