"""The engine: one agent turn, as many model rounds as the declared tools need.

It knows nothing of HTTP. A protocol adapter hands it the agent's request (in
Chat Completions form) and a `Model` to call; the engine yields what the agent
may see as it comes (`Visible`), says when a tool starts (`Working`, so the
adapter can keep the connection alive), and ends with one `TurnResult` that
keeps what the agent sees apart from the hidden exchange it did not.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from proxy.agentfile import Agent, DeclaredTool
from proxy.arguments import check_arguments, invalid_call_answer, parse_arguments
from proxy.consent import Consent, ConsentRequest
from proxy.discovery import (
    SEARCH_BUDGET,
    SEARCH_SCHEMA,
    SEARCH_TOOL,
    ToolIndex,
    budget_answer,
    not_found_yet_answer,
    search_answer,
)
from proxy.policy import Decision, TierPolicy
from proxy.records import ExecutionRecord, Observer
from proxy.rounds import Round, ToolCall, add_usage
from proxy.runners import Runner
from proxy.schemas import tool_schema
from proxy.templates import RenderError

log = logging.getLogger("toolkeeper")

MAX_ROUNDS = 16
LOOP_NOTICE_AT = 3  # the same call this many times in a turn: answered with a stop notice
LOOP_END_AT = 5  # ... and this many times: the turn ends


@dataclass(frozen=True)
class Visible:
    """Text the agent may read now (`content`, `reasoning_content`, ...).

    `head` carries the id, created and model of the turn's first round, so an
    adapter can stamp the first piece it sends with them.
    """

    delta: dict[str, str]
    head: dict[str, Any] | None = None


@dataclass(frozen=True)
class Working:
    """A declared call is being decided or run; nothing else will come for a while."""

    tool: str


@dataclass
class TurnResult:
    head: dict[str, Any]  # id, created, model of the first round: one for the whole answer
    text: dict[str, str]  # every round's visible text, joined, per field
    tool_calls: list[ToolCall]  # the agent's own calls, for the agent to run
    finish_reason: str
    usage: dict[str, Any] | None  # summed over every round
    rounds: int
    last: Round
    hidden: list[dict[str, Any]]  # the messages the model saw and the agent did not

    @property
    def passthrough(self) -> bool:
        """Nothing happened in between: the upstream's own response can go back as it is."""
        return self.rounds == 1 and not self.hidden and not self.last.normalized and self.last.raw is not None


Event = Visible | Working | TurnResult


class Model(Protocol):
    def round(self, body: dict[str, Any]) -> AsyncIterator[Visible | Round]:
        """Stream one model response: Visible pieces as they come, then the Round."""
        ...


@dataclass
class TurnContext:
    request_id: str = ""
    agent: str = ""


@dataclass
class _Outcome:
    answer: str
    ends_turn: str = ""  # the final message, when this call ends the turn


@dataclass
class _Turn:
    """What one agent turn accumulates across rounds."""

    text: dict[str, list[str]] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    head: dict[str, Any] | None = None
    calls_seen: Counter[str] = field(default_factory=Counter)
    discovered: set[str] = field(default_factory=set)
    searches: int = 0

    def see(self, delta: dict[str, str]) -> None:
        for key, value in delta.items():
            self.text.setdefault(key, []).append(value)

    def say(self, text: str) -> Visible:
        """A message of toolkeeper's own, shown to the agent as part of the answer."""
        if self.text.get("content"):
            text = "\n\n" + text
        self.see({"content": text})
        return Visible({"content": text}, self.head)


class Engine:
    def __init__(
        self,
        agent: Agent,
        *,
        runner: Runner,
        consent: Consent,
        policy: TierPolicy | None = None,
        observers: Iterable[Observer] = (),
        max_rounds: int = MAX_ROUNDS,
    ):
        self.agent = agent
        self.runner = runner
        self.consent = consent
        self.policy = policy or TierPolicy(agent.config.yolo)
        self.observers = list(observers)
        self.max_rounds = max_rounds
        style = agent.config.schema_style
        self.schemas = {name: tool_schema(tool.spec, style) for name, tool in agent.tools.items()}
        self.index = ToolIndex(agent.tools.values())
        self._warned_shadowed: set[str] = set()

    def active_tools(self, request: dict[str, Any]) -> dict[str, DeclaredTool]:
        """The declared tools of this request: none under tool_choice none; an agent's tool of the same name wins."""
        if request.get("tool_choice") == "none":
            return {}
        agent_names = {_tool_name(tool) for tool in request.get("tools") or []}
        active = {}
        for name, tool in self.agent.tools.items():
            if name in agent_names:
                if name not in self._warned_shadowed:
                    self._warned_shadowed.add(name)
                    log.warning("the agent sends its own tool %r; it wins over the declared tool of that name", name)
                continue
            active[name] = tool
        return active

    async def run(self, request: dict[str, Any], model: Model,
                  context: TurnContext | None = None) -> AsyncIterator[Event]:
        context = context or TurnContext()
        active = self.active_tools(request)
        messages = list(request.get("messages") or [])
        agent_tools = list(request.get("tools") or [])
        turn = _Turn()
        searchable = {name for name, tool in active.items() if tool.spec.visibility == "discoverable"}
        can_search = bool(searchable) and SEARCH_TOOL not in {_tool_name(t) for t in agent_tools}
        # found in an earlier turn (the model called it), or no way to search: offered like an inline tool
        turn.discovered = searchable if not can_search else searchable & _names_called(messages)
        body = dict(request)
        hidden: list[dict[str, Any]] = []
        last: Round | None = None

        for number in range(1, self.max_rounds + 1):
            offered = [name for name in active if name not in searchable or name in turn.discovered]
            tools = agent_tools + [self.schemas[name] for name in offered] + ([SEARCH_SCHEMA] if can_search else [])
            if tools:
                body["tools"] = tools
            else:
                body.pop("parallel_tool_calls", None)
            body["messages"] = messages + hidden
            last = None
            async for event in model.round(body):
                if isinstance(event, Round):
                    last = event
                else:
                    turn.see(event.delta)
                    yield event
            if last is None:  # a Model must end with its Round
                raise RuntimeError("the model adapter ended a round without a result")
            turn.usage = add_usage(turn.usage, last.usage)
            turn.head = turn.head or last.head
            hidden_names = active.keys() | ({SEARCH_TOOL} if can_search else set())
            declared = [call for call in last.tool_calls if call.name in hidden_names]
            own = [call for call in last.tool_calls if call.name not in hidden_names]
            if not declared:
                yield self._result(turn, last, own, hidden, number)
                return

            truncated = last.finish_reason == "length"
            results, ending = [], ""
            for call in declared:
                if call.name == SEARCH_TOOL:
                    outcome = self._search(call, turn, searchable, offered)
                elif call.name in searchable and call.name not in turn.discovered:
                    outcome = _Outcome(not_found_yet_answer(call.name, offered))
                else:
                    yield Working(call.name)
                    outcome = await self._execute(call, active[call.name], truncated, turn, context)
                results.append({"role": "tool", "tool_call_id": call.id, "content": outcome.answer})
                ending = ending or outcome.ends_turn
            hidden.append(last.assistant_message())
            hidden.extend(results)
            if ending or own:
                if ending:
                    own = []
                    yield turn.say(ending)
                yield self._result(turn, last, own, hidden, number)
                return
            if _forces_a_call(body.get("tool_choice"), active):
                body["tool_choice"] = "auto"  # or the model is forced into endless calls

        notice = (f"toolkeeper stopped this turn: the model was still calling tools after {self.max_rounds} "
                  "rounds without an answer.")
        yield turn.say(notice)
        yield self._result(turn, last, [], hidden, self.max_rounds, finish_reason="stop")  # type: ignore[arg-type]

    def _search(self, call: ToolCall, turn: _Turn, searchable: set[str], offered: list[str]) -> _Outcome:
        arguments, problem = parse_arguments(call.arguments)
        query = (arguments or {}).get("query")
        if problem or not isinstance(query, str) or not query.strip():
            return _Outcome(f"Error: {SEARCH_TOOL} needs one field, query: a few words saying what you want to "
                            f"do. You sent: {SEARCH_TOOL}({call.arguments_text})")
        turn.searches += 1
        if turn.searches > SEARCH_BUDGET:
            return _Outcome(budget_answer())
        found = self.index.search(query, among=searchable)
        # Found tools join the offer here, inside the search itself, so the
        # very next round already carries them.
        turn.discovered |= set(found)
        return _Outcome(search_answer(query, [self.agent.tools[name] for name in found], offered))

    def _result(self, turn: _Turn, last: Round, own: list[ToolCall], hidden: list[dict[str, Any]],
                rounds: int, finish_reason: str | None = None) -> TurnResult:
        if finish_reason is None:
            # Some servers (Ollama, gpt-4o at times) say "stop" beside tool calls; agents loop on "tool_calls".
            finish_reason = last.finish_reason or "stop"
            if own and finish_reason != "length":
                finish_reason = "tool_calls"
            elif not own and finish_reason == "tool_calls":
                finish_reason = "stop"
        return TurnResult(
            head=turn.head or last.head,
            text={key: "".join(parts) for key, parts in turn.text.items()},
            tool_calls=own,
            finish_reason=finish_reason,
            usage=turn.usage,
            rounds=rounds,
            last=last,
            hidden=hidden,
        )

    async def _execute(self, call: ToolCall, tool: DeclaredTool, truncated: bool, turn: _Turn,
                       context: TurnContext) -> _Outcome:
        spec = tool.spec
        record = ExecutionRecord(
            request_id=context.request_id, agent=context.agent, tool=spec.name, runner=spec.runner,
            call_id=call.id, arguments_sent=call.arguments, status="invalid",
        )
        outcome = await self._decide_and_run(call, tool, truncated, turn, record)
        record.answer = outcome.answer
        log.info("declared call %s: %s (%s) in %.1f ms", spec.name, record.status, record.decision_source or "-",
                 record.duration_ms)
        for observer in self.observers:
            try:
                observer(record)
            except Exception:
                log.exception("an observer failed on the record of %s", spec.name)
        return outcome

    async def _decide_and_run(self, call: ToolCall, tool: DeclaredTool, truncated: bool, turn: _Turn,
                              record: ExecutionRecord) -> _Outcome:
        spec = tool.spec
        arguments, problem = parse_arguments(call.arguments, truncated=truncated)

        key = spec.name + "\x00" + (_canonical(arguments) if arguments is not None else call.arguments_text)
        turn.calls_seen[key] += 1
        repeats = turn.calls_seen[key]
        if repeats >= LOOP_NOTICE_AT:
            record.status, record.decision, record.decision_source = "denied", "deny", "loop_detector"
            record.decision_reason = f"the same call {repeats} times in one turn"
            if repeats >= LOOP_END_AT:
                return _Outcome(
                    f"Stopped: {spec.name} was called with the same arguments {repeats} times; the turn ends.",
                    ends_turn=(f"toolkeeper ended this turn: the model called {spec.name} with the same arguments "
                               f"{repeats} times in a row without making progress."),
                )
            return _Outcome(
                f"Stop: you have called {spec.name} with these same arguments {repeats} times in this turn, and "
                "it will not run again. Do not repeat it: change the arguments, or answer the user with what you "
                "have and say what went wrong."
            )

        if problem:
            return _Outcome(invalid_call_answer(spec, call.arguments, [problem]))
        checked = check_arguments(spec, arguments)
        if not checked.ok:
            return _Outcome(invalid_call_answer(spec, arguments, checked.problems))
        record.arguments = checked.values
        try:
            argv = tool.template.render(checked.values)
        except RenderError as exc:
            return _Outcome(invalid_call_answer(spec, arguments, [str(exc)]))
        record.argv = argv

        decision = self.policy.decide(tool)
        if decision.effect == "ask":
            decision = await self._ask(tool, checked.values, argv, record)
        record.decision, record.decision_source, record.decision_reason = (
            decision.effect, decision.source, decision.reason)
        if decision.effect != "allow":
            record.status = "denied"
            return _Outcome(
                f"Not run: {spec.name} was not allowed ({decision.reason}). Do not call it again unless the user "
                "asks you to; tell the user it was not allowed."
            )

        result = await self.runner.run(tool, argv, checked.values)
        record.status = "ok" if result.status == "ok" else ("timeout" if result.status == "timeout" else "failed")
        record.exit_code = result.exit_code
        record.duration_ms = round(result.duration * 1000, 3)
        record.output_bytes = result.stdout.total
        record.output_sha256 = ExecutionRecord.digest(result.stdout.bytes())
        return _Outcome(result.answer())

    async def _ask(self, tool: DeclaredTool, values: dict[str, Any], argv: list[str],
                   record: ExecutionRecord) -> Decision:
        started = time.monotonic()
        answer = await self.consent.ask(ConsentRequest(tool.name, values, argv))
        log.info("consent for %s: %s by %s in %.1f s", tool.name, "yes" if answer.allowed else "no",
                 answer.approver, time.monotonic() - started)
        record.consent = "approved" if answer.allowed else "denied"
        record.approver = answer.approver
        if answer.allowed:
            return Decision("allow", "consent", f"approved by {answer.approver}")
        return Decision("deny", "consent", answer.reason or "the user did not approve it")


def _tool_name(tool: Any) -> str | None:
    if isinstance(tool, dict):
        function = tool.get("function")
        if isinstance(function, dict):
            return function.get("name")
        return tool.get("name")
    return None


def _names_called(messages: list[dict[str, Any]]) -> set[str]:
    names = set()
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "assistant":
            for entry in message.get("tool_calls") or []:
                if isinstance(entry, dict) and isinstance(entry.get("function"), dict):
                    names.add(entry["function"].get("name"))
    return names


def _canonical(arguments: dict[str, Any]) -> str:
    return orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()


def _forces_a_call(tool_choice: Any, active: dict[str, DeclaredTool]) -> bool:
    if tool_choice == "required":
        return True
    if isinstance(tool_choice, dict):
        return _tool_name(tool_choice) in active
    return False


