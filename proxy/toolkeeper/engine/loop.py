"""The engine: one agent turn, as many model rounds as the declared tools need.

It knows nothing of HTTP. A protocol adapter hands it the agent's request (in
Chat Completions form) and a `Model` to call; the engine yields what the agent
may see as it comes (`Visible`), says when a tool starts (`Working`, so the
adapter can keep the connection alive), and ends with one `TurnResult` that
keeps what the agent sees apart from the hidden exchange it did not.

    restore history -> round: call the model -> split its calls:
        none declared          -> the answer (or the agent's own calls): done
        declared (and own)     -> handle each declared call, then
                                  own calls too: return them; else: next round
    -> remember the hidden exchange for the agent's next request
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any

from toolkeeper.engine.agents import AgentCalls
from toolkeeper.engine.calls import CallContext, CallHandler, Outcome
from toolkeeper.engine.discovery import Discovery
from toolkeeper.engine.history import History
from toolkeeper.engine.hosted import HostedTools
from toolkeeper.engine.types import Event, Model, Round, ToolCall, TurnContext, TurnResult, Visible, Working, add_usage
from toolkeeper.metrics import Metrics
from toolkeeper.store import StoreError
from toolkeeper.tools import Agent, DeclaredTool, ToolIndex, tool_schema

log = logging.getLogger("toolkeeper")

MAX_ROUNDS = 16
PARALLEL_CALLS = 8  # declared calls of one response run at once, at most this many


@dataclass
class _Answered:
    """What a round's calls came to: the results toolkeeper gives the model, the closing words when a call
    ended the turn, and the agent's own calls that go to it."""

    results: list[dict[str, Any]]
    ending: str
    own: list[ToolCall]


@dataclass
class _Turn:
    """What one agent turn accumulates across rounds."""

    context: TurnContext
    agent_messages: list[dict[str, Any]]  # the history as the agent sent it
    discovery: Discovery
    call_context: CallContext
    text: dict[str, list[str]] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    head: dict[str, Any] | None = None
    hidden: list[dict[str, Any]] = field(default_factory=list)  # what the model saw and the agent did not
    hidden_round: Round | None = None  # the last round whose calls went into `hidden`
    rounds: int = 0

    def see_all(self, deltas: tuple[dict[str, str], ...]) -> None:
        """What one read brought: mostly pieces of the answer's text, kept in one loop."""
        text = self.text
        for delta in deltas:
            for key, value in delta.items():
                pieces = text.get(key)
                if pieces is None:
                    text[key] = [value]
                else:
                    pieces.append(value)

    def say(self, text: str) -> Visible:
        """A message of toolkeeper's own, shown to the agent as part of the answer."""
        if self.text.get("content"):
            text = "\n\n" + text
        self.see_all(({"content": text},))
        return Visible(({"content": text},), self.head)

    def hide(self, last: Round, results: list[dict[str, Any]]) -> None:
        self.hidden += [last.assistant_message(), *results]
        self.hidden_round = last

    def counted(self, last: Round) -> None:
        self.rounds += 1
        self.usage = add_usage(self.usage, last.usage)
        self.head = self.head or last.head

    def result(self, last: Round, own: list[ToolCall], said: str = "") -> TurnResult:
        """The turn's end: what the agent receives, and the exchange the model saw in its place."""
        if said:
            finish_reason = "stop"
        else:
            # Some servers (Ollama, gpt-4o at times) say "stop" beside tool calls; agents loop on "tool_calls".
            finish_reason = last.finish_reason or "stop"
            if own and finish_reason != "length":
                finish_reason = "tool_calls"
            elif not own and finish_reason == "tool_calls":
                finish_reason = "stop"
        exchange: list[dict[str, Any]] = []
        if self.hidden:
            exchange = list(self.hidden)
            if said:
                exchange.append({"role": "assistant", "content": said})
            elif last is not self.hidden_round:
                # the round the agent received (an answer, or calls of its own only), as the model wrote it
                exchange.append(last.assistant_message())
        return TurnResult(
            head=self.head or last.head,
            text={key: "".join(parts) for key, parts in self.text.items()},
            tool_calls=own,
            finish_reason=finish_reason,
            usage=self.usage,
            rounds=self.rounds,
            last=last,
            exchange=exchange,
            said=said,
        )


class Engine:
    def __init__(self, agent: Agent, handler: CallHandler, *, history: History | None = None,
                 max_rounds: int = MAX_ROUNDS, metrics: Metrics | None = None):
        self.handler = handler  # one call's path: declared calls run, the agent's own governed
        self.agent_calls = AgentCalls(handler)  # the calls the agent runs: the same rules, consent and record
        self.hosted = HostedTools(handler)  # the tools the model server runs: on the offer, and observed
        self.history = history
        self.max_rounds = max_rounds
        self.metrics = metrics
        self._warned_shadowed: set[str] = set()
        self.use(agent)

    def use(self, agent: Agent) -> None:
        """The declarations in force, at start and after a reload; a turn keeps those it began with."""
        style = agent.config.schema_style
        self.agent = agent
        self.schemas = {name: tool_schema(tool.spec, style) for name, tool in agent.tools.items()}
        self.index = ToolIndex(agent.tools.values())
        if self.metrics is not None:
            self.metrics.declared(agent.tools)

    def active_tools(self, request: dict[str, Any]) -> dict[str, DeclaredTool]:
        """The declared tools of this request: none under tool_choice none; an agent's tool of the same name wins."""
        if request.get("tool_choice") == "none":
            return {}
        agent_names = {tool_name(tool) for tool in request.get("tools") or []}
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
        active, schemas, index = self.active_tools(request), self.schemas, self.index
        context.agent_revision = self.agent.revision
        agent_messages = list(request.get("messages") or [])
        await self.agent_calls.collect(context, _trailing_results(agent_messages))
        messages = await self.history.restore(context.tenant, agent_messages) if self.history else agent_messages
        agent_tools = list(request.get("tools") or [])
        discovery = Discovery(index, active, {tool_name(t) for t in agent_tools}, messages)
        turn = _Turn(context, agent_messages, discovery, CallContext(context))
        body, hidden, last = dict(request), frozenset(discovery.hidden_names), None
        budgets = self._budgets(context, body)

        for _ in range(self.max_rounds):
            offered = discovery.offered()
            _offer(body, agent_tools + [schemas[name] for name in offered] + discovery.schemas())
            body["messages"] = messages + turn.hidden
            previous, last = last, None  # type: Round | None, Round | None
            started, traced = time.monotonic(), context.trace.round() if context.trace is not None else None
            async with self.handler.limiter.spending(budgets, body) as spent:  # a spent budget: no round
                async for event in model.round(body, hidden=hidden, previous=previous):
                    if type(event) is Visible:
                        turn.see_all(event.deltas)
                        yield event
                    else:
                        last = spent.answered = event
            last = self._counted(turn, last, started, traced)
            for observed in last.observed:
                await self.hosted.observe(observed, context)
            if not last.tool_calls:  # the usual answer: nothing to decide
                yield await self._finish(turn, last, [])
                return
            answered = _Answered([], "", [])
            async for event in self._answer(last, turn, discovery, active, offered):
                if isinstance(event, _Answered):
                    answered = event
                else:
                    yield event
            results, ending, own = answered.results, answered.ending, answered.own
            if not results:  # nothing to answer here: the round goes to the agent as it is
                yield await self._finish(turn, last, own)
                return
            turn.hide(last, results)
            if ending:
                yield turn.say(ending)
                yield await self._finish(turn, last, [], said=ending)
                return
            if own:  # a mixed response: the agent runs its own calls, and the model sees both on its next request
                yield await self._finish(turn, last, own)
                return
            if _forces_a_call(body.get("tool_choice"), active):
                body["tool_choice"] = "auto"  # or the model is forced into endless calls

        notice = (f"toolkeeper stopped this turn: the model was still calling tools after {self.max_rounds} "
                  "rounds without an answer.")
        yield turn.say(notice)
        yield await self._finish(turn, last, [], said=notice)  # type: ignore[arg-type]

    async def _answer(self, last: Round, turn: _Turn, discovery: Discovery, active: dict[str, DeclaredTool],
                      offered: list[str]) -> AsyncIterator[Working | _Answered]:
        """Answer the round's calls that are toolkeeper's to answer: the declared ones (run), and the agent's
        own that the rules deny; then say which of the agent's own calls go to it."""
        answers: dict[str, str] = {}
        declared = []
        for call in last.tool_calls:
            if call.name in discovery.hidden_names:
                answer = discovery.answer(call, offered)
                if answer is None:
                    declared.append(call)
                else:
                    answers[call.id] = answer
        ending = ""
        if declared:
            yield Working(declared[0].name, turn.head)
            truncated = last.finish_reason == "length"
            outcomes = await bounded_gather([self.handler.handle(call, active[call.name], turn.call_context,
                                                               truncated=truncated) for call in declared])
            for call, outcome in zip(declared, outcomes, strict=True):
                answers[call.id], ending = outcome.answer, ending or outcome.ends_turn
        for call in last.tool_calls:
            if call.id in answers:
                continue
            if ending:  # the turn ends here: the agent receives none of the round's calls, the model hears why
                answers[call.id] = f"Not passed on: {ending}"
                continue
            if self.handler.policy.governs_agents:  # the agent's own call, under the same rules
                yield Working(call.name, turn.head)  # an approver may be asked: keep the agent's connection alive
            refusal = await self.agent_calls.govern(call, turn.call_context)
            if refusal is not None:
                answers[call.id] = refusal
        results = [{"role": "tool", "tool_call_id": c.id, "content": answers[c.id]} for c in last.tool_calls
                   if c.id in answers]
        yield _Answered(results, ending, [c for c in last.tool_calls if c.id not in answers])

    def _budgets(self, context: TurnContext, body: dict[str, Any]) -> list[Any]:
        """The token limits that count this turn's rounds. A streamed Chat Completions round says its usage only
        when asked: asked for while a budget counts it (the agent's own writer says it only if the agent asked)."""
        budgets = self.handler.limiter.budgets(context)
        if budgets and body.get("stream"):
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        return budgets

    def _counted(self, turn: _Turn, last: Round | None, started: float, traced: Any) -> Round:
        """A model round's end: counted in the turn, the trace and the metrics."""
        if last is None:
            raise RuntimeError("the model adapter ended a round without a result")
        turn.counted(last)
        if traced is not None:
            traced.answered(last.head, last.usage)
        if self.metrics is not None:
            self.metrics.count("toolkeeper_model_rounds_total")
            self.metrics.observe("toolkeeper_upstream_seconds", time.monotonic() - started)
        return last

    async def _finish(self, turn: _Turn, last: Round, own: list[ToolCall], said: str = "") -> TurnResult:
        result = turn.result(last, own, said)
        if result.exchange and self.history is not None:
            try:
                await self.history.remember(turn.context.tenant, turn.agent_messages, result.received(),
                                            result.exchange)
            except StoreError as exc:  # the agent has its answer; its next request will miss this exchange
                log.error("the hidden exchange of this turn could not be stored: %s", exc)
        return result


async def bounded_gather(calls: list[Awaitable[Outcome]]) -> list[Outcome]:
    """A response's declared calls run together (four 100 ms tools take 100 ms), at most PARALLEL_CALLS at once,
    as a model that sends them in one response means them. One that fails (a bug of ours: a call's own failure
    is an answer) stops the others and is raised as itself."""
    if len(calls) == 1:
        return [await calls[0]]
    gate = asyncio.Semaphore(PARALLEL_CALLS)

    async def gated(call: Awaitable[Outcome]) -> Outcome:
        async with gate:
            return await call

    tasks = [asyncio.ensure_future(gated(call)) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        raise


def tool_name(tool: Any) -> str | None:
    """The name of a tool entry as an agent sends it (`{function: {name}}`, or a top-level `name`)."""
    if isinstance(tool, dict):
        function = tool.get("function")
        if isinstance(function, dict):
            return function.get("name")
        return tool.get("name")
    return None


def _trailing_results(messages: list[Any]) -> list[dict[str, Any]]:
    """The tool results after the last assistant message: the ones a forwarded call may be waiting for."""
    tail = []
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "assistant":
            break
        if isinstance(message, dict) and message.get("role") == "tool":
            tail.append(message)
    return tail[::-1]


def _offer(body: dict[str, Any], tools: list[Any]) -> None:
    """A round's tools in its request (without any, no `parallel_tool_calls`: servers refuse it alone)."""
    if tools:
        body["tools"] = tools
    else:
        body.pop("parallel_tool_calls", None)


def _forces_a_call(tool_choice: Any, active: dict[str, DeclaredTool]) -> bool:
    if tool_choice == "required":
        return True
    if isinstance(tool_choice, dict):
        return tool_name(tool_choice) in active
    return False
