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

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.agentfile import Agent, DeclaredTool
from proxy.arguments import parse_arguments
from proxy.calls import CallContext, DeclaredCalls, Outcome, TurnContext
from proxy.discovery import (
    SEARCH_BUDGET,
    SEARCH_SCHEMA,
    SEARCH_TOOL,
    ToolIndex,
    budget_answer,
    not_found_yet_answer,
    search_answer,
)
from proxy.history import History
from proxy.metrics import Metrics
from proxy.rounds import Round, ToolCall, add_usage
from proxy.schemas import tool_schema

log = logging.getLogger("toolkeeper")

MAX_ROUNDS = 16


@dataclass(frozen=True)
class Visible:
    """Text the agent may read now (`content`, `reasoning_content`, ...).

    One delta per upstream event, so what the agent receives does not depend
    on how the network cut the stream; the deltas that arrived together are
    handed over together, so an adapter can send them in one write. `head`
    carries the id, created and model of the turn's first round.
    """

    deltas: tuple[dict[str, str], ...]
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
    exchange: list[dict[str, Any]]  # what the model saw, where the agent saw one message; [] if nothing hidden

    @property
    def passthrough(self) -> bool:
        """Nothing happened in between: the upstream's own response can go back as it is."""
        return self.rounds == 1 and not self.exchange and not self.last.normalized and self.last.raw is not None

    def received(self) -> dict[str, Any]:
        """The assistant message the agent receives (and will send back in its history)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text.get("content") or None}
        if self.tool_calls:
            message["tool_calls"] = [call.as_message_entry() for call in self.tool_calls]
        return message


Event = Visible | Working | TurnResult


class Model(Protocol):
    def round(self, body: dict[str, Any]) -> AsyncIterator[Visible | Round]:
        """Stream one model response: Visible pieces as they come, then the Round."""
        ...


@dataclass
class _Turn:
    """What one agent turn accumulates across rounds."""

    calls: CallContext
    text: dict[str, list[str]] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    head: dict[str, Any] | None = None
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
        return Visible(({"content": text},), self.head)


class Engine:
    def __init__(self, agent: Agent, calls: DeclaredCalls, *, history: History | None = None,
                 max_rounds: int = MAX_ROUNDS, metrics: Metrics | None = None):
        self.agent = agent
        self.calls = calls
        self.history = history
        self.max_rounds = max_rounds
        self.metrics = metrics
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
        agent_messages = list(request.get("messages") or [])
        messages = self.history.restore(context.tenant, agent_messages) if self.history else agent_messages
        agent_tools = list(request.get("tools") or [])
        turn = _Turn(CallContext(context))
        searchable = {name for name, tool in active.items() if tool.spec.visibility == "discoverable"}
        can_search = bool(searchable) and SEARCH_TOOL not in {_tool_name(t) for t in agent_tools}
        # found in an earlier turn (the model called it), or no way to search: offered like an inline tool
        turn.discovered = searchable if not can_search else searchable & _names_called(messages)
        hidden_names = active.keys() | ({SEARCH_TOOL} if can_search else set())
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
            started = time.monotonic()
            async for event in model.round(body):
                if isinstance(event, Round):
                    last = event
                else:
                    for delta in event.deltas:
                        turn.see(delta)
                    yield event
            if last is None:
                raise RuntimeError("the model adapter ended a round without a result")
            if self.metrics is not None:
                self.metrics.count("toolkeeper_model_rounds_total", "Model rounds: one upstream call each.")
                self.metrics.observe("toolkeeper_upstream_seconds", "One model round, request to last byte.",
                                     time.monotonic() - started)
            turn.usage = add_usage(turn.usage, last.usage)
            turn.head = turn.head or last.head
            declared = [call for call in last.tool_calls if call.name in hidden_names]
            own = [call for call in last.tool_calls if call.name not in hidden_names]
            if not declared:
                yield self._finish(turn, last, own, hidden, number, context, agent_messages)
                return

            results, ending = [], ""
            for call in declared:
                if call.name == SEARCH_TOOL:
                    outcome = self._search(call, turn, searchable, offered)
                elif call.name in searchable and call.name not in turn.discovered:
                    outcome = Outcome(not_found_yet_answer(call.name, offered))
                else:
                    yield Working(call.name)
                    outcome = await self.calls.handle(call, active[call.name], turn.calls,
                                                      truncated=last.finish_reason == "length")
                results.append({"role": "tool", "tool_call_id": call.id, "content": outcome.answer})
                ending = ending or outcome.ends_turn
            hidden.append(last.assistant_message())
            hidden.extend(results)
            if ending:
                yield turn.say(ending)
                yield self._finish(turn, last, [], hidden, number, context, agent_messages, said=ending)
                return
            if own:  # a mixed response: the agent runs its own calls, and the model sees both on its next request
                yield self._finish(turn, last, own, hidden, number, context, agent_messages)
                return
            if _forces_a_call(body.get("tool_choice"), active):
                body["tool_choice"] = "auto"  # or the model is forced into endless calls

        notice = (f"toolkeeper stopped this turn: the model was still calling tools after {self.max_rounds} "
                  "rounds without an answer.")
        yield turn.say(notice)
        yield self._finish(turn, last, [], hidden, self.max_rounds, context, agent_messages,  # type: ignore[arg-type]
                           said=notice)

    def _search(self, call: ToolCall, turn: _Turn, searchable: set[str], offered: list[str]) -> Outcome:
        arguments, problem = parse_arguments(call.arguments)
        query = (arguments or {}).get("query")
        if problem or not isinstance(query, str) or not query.strip():
            return Outcome(f"Error: {SEARCH_TOOL} needs one field, query: a few words saying what you want to "
                           f"do. You sent: {SEARCH_TOOL}({call.arguments_text})")
        turn.searches += 1
        if turn.searches > SEARCH_BUDGET:
            return Outcome(budget_answer())
        found = self.index.search(query, among=searchable)
        # Found tools join the offer here, inside the search itself, so the
        # very next round already carries them.
        turn.discovered |= set(found)
        return Outcome(search_answer(query, [self.agent.tools[name] for name in found], offered))

    def _finish(self, turn: _Turn, last: Round, own: list[ToolCall], hidden: list[dict[str, Any]], rounds: int,
                context: TurnContext, agent_messages: list[dict[str, Any]], said: str = "") -> TurnResult:
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
        if hidden:
            exchange = list(hidden)
            if said:
                exchange.append({"role": "assistant", "content": said})
            elif not own:
                exchange.append(last.assistant_message())  # the answer, as the model wrote it
        result = TurnResult(
            head=turn.head or last.head,
            text={key: "".join(parts) for key, parts in turn.text.items()},
            tool_calls=own,
            finish_reason=finish_reason,
            usage=turn.usage,
            rounds=rounds,
            last=last,
            exchange=exchange,
        )
        if exchange and self.history is not None:
            self.history.remember(context.tenant, agent_messages, result.received(), exchange)
        return result


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


def _forces_a_call(tool_choice: Any, active: dict[str, DeclaredTool]) -> bool:
    if tool_choice == "required":
        return True
    if isinstance(tool_choice, dict):
        return _tool_name(tool_choice) in active
    return False
