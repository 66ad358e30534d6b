"""One declared call, from the model's arguments to the answer it reads.

    loop detector -> parse and check arguments -> render argv -> a retry's stored
    result? -> policy -> consent -> audit (no record, no run) -> run

Each step either answers (an invalid call with what to fix, a repeated one with
a stop notice, a denied one with the reason) or lets the call go on. Each call
leaves one ExecutionRecord for the audit trail and the observers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from toolkeeper.audit import AuditError, ExecutionRecord, Observer, Redactor, SQLAudit
from toolkeeper.common import canonical_json, digest, printable
from toolkeeper.engine.flows import Flows
from toolkeeper.engine.history import DEFAULT_TTL
from toolkeeper.engine.limits import Limiter
from toolkeeper.engine.memo import Attempt, RetryMemo
from toolkeeper.engine.secrets import arguments_found, declared_result
from toolkeeper.engine.types import ToolCall, TurnContext
from toolkeeper.metrics import Metrics
from toolkeeper.policy import Consent, ConsentRequest, Decision, Policy, arguments_hash, policy_input, with_limits
from toolkeeper.runners import Caller, Runner, acting_for
from toolkeeper.store import Store, StoreError, empty_session
from toolkeeper.tools import DeclaredTool, check_call, invalid_call_answer, parse_arguments

log = logging.getLogger("toolkeeper")

LOOP_NOTICE_AT = 3  # the same call this many times in a turn: answered with a stop notice
LOOP_END_AT = 5  # ... and this many times: the turn ends
# Seconds a call's result answers an identical request (same credentials, same
# body). The openai client retries within seconds; an attempt whose client
# timed out was disconnected, and its tool cancelled, so a long window would
# only replay for requests meant as new ones.
RETRY_WINDOW = 60.0
SWEEP_EVERY = 60.0  # seconds between looks for forwarded calls whose result never came
ANSWER_EXCERPT = 2000  # characters of an agent's tool result kept in its record (its size and digest: all of it)


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
    detail: str = ""  # why it failed, for the operator's log
    status: str = ""  # the record's status once settled (ok: the tool ran and succeeded)


@dataclass
class CallState:
    """One call on its way through the steps: what each step found, for the next."""

    call: ToolCall
    tool: DeclaredTool
    context: CallContext
    record: ExecutionRecord
    truncated: bool
    arguments: dict[str, Any] | None = None
    signature: str = ""
    repeats: int = 0
    values: dict[str, Any] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    attempt: Attempt | None = None  # this attempt's claim in the retry memo

    @property
    def name(self) -> str:
        return self.tool.name


Step = Callable[[CallState], Awaitable[Outcome | None]]


class CallHandler:
    def __init__(self, *, runners: Mapping[str, Runner], consent: Consent, policy: Policy,
                 store: Store | None = None, observers: Iterable[Observer] = (), retry_window: float = RETRY_WINDOW,
                 audit: SQLAudit | None = None, forwarded_ttl: float = 24 * 3600, metrics: Metrics | None = None,
                 session_ttl: float = DEFAULT_TTL):
        self.runners = runners  # by the tool's runner: "argv", "wasm"
        self.consent = consent
        self.policy = policy
        self.store = store
        self.observers = list(observers)
        self.memo = RetryMemo(store, retry_window) if store is not None else None
        self.forwarded_ttl = forwarded_ttl  # how long a forwarded call waits for its result to be recorded
        self.audit = audit
        self.metrics = metrics or Metrics()
        self.redactor = audit.redactor if audit is not None else Redactor()
        self.flows = Flows(store, session_ttl, self.metrics)  # each call's session: what it had already done
        self.limiter = Limiter(lambda: self.policy, store, self.metrics)  # the policy's limits, counted in the store
        # The steps in order; each answers, or returns None to go on. The run comes last.
        self.steps: tuple[Step, ...] = (self._detect_loop, self._check, self._replay, self._decide,
                                        self.record_before_run)

    def reload(self, *, policy: Policy, runners: Mapping[str, Runner]) -> None:
        """The policy and runners for the calls that begin after (SIGHUP). Runners are added to, never taken
        away: a turn begun before may still run an old tool."""
        self.policy = policy
        self.runners = {**self.runners, **runners}

    def document(self, tool: DeclaredTool | str, arguments: Any, argv: list[str] | None, turn: TurnContext, *,
                 interactive: bool | None = None, now: datetime | None = None, kind: str = "function",
                 source: str = "agent", tier: str | None = None, labels: Iterable[str] = ()) -> dict[str, Any]:
        """The policy input of one call (a declared tool, or the name of one of the agent's own or of a hosted
        one), as every policy source reads it; `interactive` defaults to whether the consent channel can ask.
        Its `labels`: the tool's own (a declared tool's, or `labels` given: an MCP server's) and the label
        rules'; its `session` empty until `judge` reads it."""
        own = {*labels, *(tool.spec.labels if isinstance(tool, DeclaredTool) else ())}
        document = policy_input(tool, arguments, argv, agent_id=turn.agent, agent_header=turn.agent_header,
                                request_id=turn.request_id, yolo=self.policy.yolo,
                                interactive=self.consent_for(turn).can_ask if interactive is None else interactive,
                                now=now, kind=kind, source=source, tier=tier, workdir=turn.workdir,
                                principal=turn.principal, labels=own, session=empty_session(turn.session))
        document["labels"] = sorted(own | self.policy.labels(document)[0])  # label rules may read the tool's own
        return document

    async def judge(self, record: ExecutionRecord | None, document: dict[str, Any], turn: TurnContext, *,
                    instead: Decision | None = None) -> Decision:
        """The policy's decision on one call in its session (read into `document` first), kept in the record
        (None: an offer, recorded only when withheld) with the call's labels and session; a rule on the session's
        labels names the flow that led to it. `instead`: toolkeeper's own refusal, made before any rule is read.
        The limits that select the call take their counts first (`Limiter.check`): the rules read them, and a
        limit past its maximum decides beside them (the most restrictive wins)."""
        if record is not None:
            record.policy_input, record.labels = document, list(document["labels"])
            record.session = turn.session or None
        refused = instead or await self.flows.read(document, turn)
        if refused:
            return refused
        limited = await self.limiter.check(record, document)
        try:
            decided = self.flows.counted(await self.policy.decide(document))
        except BaseException:  # cancelled while OPA decided: what the limits took, given back
            if record is not None:
                await self.limiter.forget(record)
            raise
        return with_limits(decided, limited)

    async def noted(self, record: ExecutionRecord, turn: TurnContext, passed: bool | None = None) -> None:
        """The call's final decision taken into its session (`Flows.add`); a call let through whose labels the
        session could not keep is denied after all. The secrets in an egress call's arguments: recorded and
        counted, with whether they went out. The limits' counts of a call that will not run: given back."""
        try:
            refused = await self.flows.add(record, turn, passed)
        except BaseException:
            await self.limiter.forget(record)
            raise
        if refused is not None:
            record.decided_by(refused)
        goes = refused is None and (record.decision == "allow" if passed is None else passed)
        await self.limiter.settle(record, goes)  # a call that will not run gives its counts back
        arguments_found(record, self.metrics)

    def consent_for(self, turn: TurnContext) -> Consent:
        """Who is asked about this turn's calls: the door's own channel when it has one, else the configured."""
        return turn.consent or self.consent

    async def handle(self, call: ToolCall, tool: DeclaredTool, context: CallContext, *,
                     truncated: bool = False) -> Outcome:
        record = ExecutionRecord(request_id=context.turn.request_id, agent=context.turn.agent, api=context.turn.api,
                                 tool=tool.name,
                                 runner=tool.spec.runner, call_id=call.id, arguments_sent=call.arguments,
                                 status="invalid", policy_revision=self.policy.revision,
                                 agent_revision=context.turn.agent_revision or None,
                                 session=context.turn.session or None)
        state = CallState(call, tool, context, record, truncated)
        outcome = None
        try:
            for step in self.steps:
                outcome = await step(state)
                if outcome is not None:
                    break
            else:
                outcome = await self._run(state)
        finally:
            if state.attempt is not None:
                await state.attempt.end()
            await self.limiter.forget(record)  # a call that never started gives back the counts it took
        record.answer = outcome.answer
        outcome.status = record.status
        await self.settle(record, outcome)
        if context.turn.trace is not None:  # tracing on: the call's span, under its request's
            context.turn.trace.tool(record)
        return outcome

    async def settle(self, record: ExecutionRecord, outcome: Outcome) -> None:
        """The record's second event, the log line, and the observers (which must not fail the call)."""
        if self.audit is not None and not outcome.unrecorded:
            try:
                await self.audit.write("completed" if outcome.ran else "refused", record)
            except AuditError as exc:
                self.audit_failed()
                log.error("the audit trail lost the outcome of %s (record %s): %s", record.tool, record.record_id,
                          exc)
        why = f": {outcome.detail}" if outcome.detail else ""
        whose = {"declared": "declared call", "agent": "the agent's call of", "hosted": "the model server's call of",
                 "mcp": "the MCP call of"}
        log.info("%s %s: %s (%s) in %.1f ms%s", whose.get(record.source, "call"), printable(record.tool),
                 record.status, record.decision_source or "-", record.duration_ms, why)
        for observer in self.observers:
            try:
                observer(record)
            except Exception:
                log.exception("an observer failed on the record of %s", record.tool)

    # -- the steps --------------------------------------------------------------------

    async def _detect_loop(self, state: CallState) -> Outcome | None:
        state.arguments, _ = parse_arguments(state.call.arguments, truncated=state.truncated)
        shown = canonical_json(state.arguments).decode() if state.arguments is not None else state.call.arguments_text
        state.signature = state.name + "\x00" + shown
        state.context.seen[state.signature] += 1
        repeats = state.repeats = state.context.seen[state.signature]
        if repeats < LOOP_NOTICE_AT:
            return None
        state.record.status = "denied"
        state.record.decided_by(Decision("deny", "loop_detector", f"the same call {repeats} times in one turn"))
        if repeats >= LOOP_END_AT:
            return Outcome(
                f"Stopped: {state.name} was called with the same arguments {repeats} times; the turn ends.",
                ends_turn=(f"toolkeeper ended this turn: the model called {state.name} with the same arguments "
                           f"{repeats} times in a row without making progress."),
            )
        return Outcome(
            f"Stop: you have called {state.name} with these same arguments {repeats} times in this turn, and "
            "it will not run again. Do not repeat it: change the arguments, or answer the user with what you "
            "have and say what went wrong."
        )

    async def _check(self, state: CallState) -> Outcome | None:
        checked = check_call(state.tool, state.call.arguments, truncated=state.truncated)
        if checked.values is not None:
            state.values = state.record.arguments = checked.values
        if checked.problems:
            return Outcome(invalid_call_answer(state.tool.spec, checked.quoted, checked.problems))
        state.argv = state.record.argv = checked.argv
        return None

    async def _replay(self, state: CallState) -> Outcome | None:
        """A retried request (the openai client retries twice by default) gets the result of the call it ran,
        wherever it ran; while that attempt still runs, the retry waits for it."""
        request_key = state.context.turn.request_key
        if not request_key or self.memo is None:
            return None
        try:
            replayed, state.attempt = await self.memo.lookup(digest(request_key, state.signature, str(state.repeats)))
        except StoreError as exc:
            state.record.status = "failed"
            state.record.decided_by(Decision("deny", "store", f"the store did not answer: {exc}"))
            return Outcome(f"Not run: toolkeeper could not tell whether this call already ran ({exc}), and runs "
                           "nothing twice. Tell the user; it may work again later.", detail=str(exc))
        if replayed is None:
            return None
        state.record.decided_by(Decision("allow", "retry", "a retry of a request that already ran this call"))
        state.record.answer, state.record.status = replayed
        return Outcome(replayed[0])

    async def _decide(self, state: CallState) -> Outcome | None:
        turn = state.context.turn
        decision = await self.judge(state.record, self.document(state.tool, state.values, state.argv, turn), turn)
        state.record.decided_by(decision)
        if decision.effect == "ask":
            state.record.decided_by(await self.ask(state, decision))
        await self.noted(state.record, turn)
        if state.record.decision == "allow":
            return None
        state.record.status = "denied"
        return Outcome(
            f"Not run: {state.name} was not allowed ({state.record.decision_reason}). Do not call it again unless "
            "the user asks you to; tell the user it was not allowed."
        )

    async def record_before_run(self, state: CallState) -> Outcome | None:
        """No record, no run."""
        if self.audit is None:
            return None
        try:
            await self.audit.write("decided", state.record)
        except AuditError as exc:
            self.audit_failed()
            log.error("%s not run: %s", state.name, exc)
            state.record.status = "failed"
            return Outcome(f"Not run: {state.name} could not be recorded in the audit trail, and nothing runs "
                           f"unrecorded ({exc}). Tell the user; do not retry.", unrecorded=True)
        return None

    async def _run(self, state: CallState) -> Outcome:
        record = state.record
        if state.attempt is not None:
            state.attempt.started()
        try:
            turn = state.context.turn
            self.limiter.started(record)
            with acting_for(Caller.of(turn.principal, turn.subject_token)):  # an MCP server may exchange its token
                result = await self.runners[state.tool.spec.runner].run(state.tool, state.argv, state.values)
        except BaseException as exc:
            self._closed_early(record, exc)
            raise
        record.status = result.status if result.status in ("ok", "timeout") else "failed"
        record.exit_code, record.trap = result.exit_code, result.trap
        record.duration_ms = round(result.duration * 1000, 3)
        await self.limiter.ran(record, record.duration_ms)
        record.output_bytes = result.stdout.total
        record.output_sha256 = result.stdout.digest()
        answer = declared_result(self, record, state.tool.spec.secrets, result.answer())  # no secret reaches the model
        detail = result.detail or result.trap or (f"exit status {result.exit_code}" if result.status == "failed"
                                                  else "")
        if state.attempt is not None:
            await state.attempt.finish(answer, record.status)
        return Outcome(answer, ran=True, detail=detail)

    # -- helpers ----------------------------------------------------------------------

    def audit_failed(self) -> None:
        self.metrics.count("toolkeeper_audit_write_failures_total")

    def _closed_early(self, record: ExecutionRecord, exc: BaseException) -> None:
        """A run that ended without a result (its agent left, or a bug) still gets its closing event."""
        record.status = "cancelled" if isinstance(exc, asyncio.CancelledError) else "failed"
        record.answer = ("(the agent disconnected; the tool was stopped)" if record.status == "cancelled"
                         else f"(toolkeeper failed while the tool ran: {exc!r})")
        log.info("declared call %s: %s", record.tool, record.status)
        if self.audit is not None:
            self.audit.write_later("completed", record)

    async def ask(self, state: CallState, asking: Decision) -> Decision:
        started = time.monotonic()
        turn = state.context.turn
        arguments, argv = self.redactor.shown(state.values, state.argv)  # what a person and the log may see
        principal = turn.principal or {}
        request = ConsentRequest(state.record.tool, arguments, argv, turn.agent, args_hash=arguments_hash(state.values),
                                 reason=asking.reason, rule=asking.rule_id, source=asking.source,
                                 agent_header=turn.agent_header, user=principal.get("user"),
                                 user_issuer=principal.get("issuer"))
        self.metrics.add("toolkeeper_approvals_waiting", 1)
        try:
            answer = await self.consent_for(turn).ask(request)
        except BaseException:  # cancelled while it waited (its agent left): what its limits took, given back
            await self.limiter.forget(state.record)
            raise
        finally:
            self.metrics.add("toolkeeper_approvals_waiting", -1)
            self.metrics.observe("toolkeeper_approval_wait_seconds", time.monotonic() - started)
        log.info("consent for %s: %s by %s in %.1f s", state.record.tool, "yes" if answer.allowed else "no",
                 printable(answer.approver), time.monotonic() - started)
        state.record.consent = "always" if answer.always else "approved" if answer.allowed else "denied"
        state.record.approver = answer.approver
        state.record.approver_identity = answer.approver_identity
        state.record.waited_ms = round((time.monotonic() - started) * 1000, 1)
        if answer.allowed:
            return Decision("allow", "consent", f"approved by {answer.approver}")
        return Decision("deny", "consent", answer.reason or "the user did not approve it")
