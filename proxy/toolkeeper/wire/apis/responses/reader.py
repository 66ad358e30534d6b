"""One upstream Responses stream, read event by event: what the agent may see, and the Round at the end.

Events of a declared call (its `output_item.*`, `function_call_arguments.*`)
are dropped; a reasoning item's events wait until the item after it shows
whether it is hidden (a reasoning item travels with the item it precedes).
The other events are kept, as the server wrote them, for the writer to relay
with its own `sequence_number` and `output_index`. Lifecycle events
(`response.created`, `.completed`, ...) are read here, never relayed: the
agent's response has its own, once.

What an item is is decided once, when it is announced (`output_item.added`):
an event for an item never announced, an item announced twice, or one that
finishes as something else (a `message` whose `done` is a call) is a
malformed answer, never relayed, so no call can reach the agent under
another item's name.
"""

from __future__ import annotations

from typing import Any

from toolkeeper.engine import Round
from toolkeeper.wire.apis.relay import HoldingReader, event_object, round_head
from toolkeeper.wire.apis.responses.items import call_arguments, call_id_of, call_name, is_call, round_from_response
from toolkeeper.wire.errors import MalformedResponse, UpstreamFailed

TERMINAL = ("response.completed", "response.incomplete")
# A call's arguments (a custom tool's input) stream in pieces, then whole, then in the finished item.
DELTAS = ("response.function_call_arguments.delta", "response.custom_tool_call_input.delta")
DONES = {"response.function_call_arguments.done": "arguments", "response.custom_tool_call_input.done": "input"}
ARGUMENT_EVENTS = frozenset((*DELTAS, *DONES, "response.output_item.done"))
LIFECYCLE = ("response.created", "response.in_progress", "response.queued")


class ResponsesReader(HoldingReader):
    own_events = frozenset((*LIFECYCLE, *TERMINAL))

    def __init__(self, hidden: frozenset[str], previous: Round | None):
        super().__init__(hidden, previous)
        self.final: dict[str, Any] | None = None  # from the terminal event
        self._done: dict[int, dict[str, Any]] = {}  # finished items, by output_index
        self._announced: dict[int, tuple[Any, ...]] = {}  # what each item was announced as, by output_index
        self._streamed: dict[int, list[str]] = {}  # a call's arguments as streamed so far, by output_index

    def text_of(self, event: dict[str, Any]) -> str | None:
        delta = event.get("delta")
        return delta if event["type"] == "response.output_text.delta" and isinstance(delta, str) else None

    def read(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if not isinstance(kind, str):
            raise MalformedResponse("a stream event without a 'type'")
        if kind in LIFECYCLE:
            self.started = self.started or event_object(event, "response")
            return
        if kind in TERMINAL:
            self.final = event_object(event, "response")
            return
        if kind == "response.failed":
            response = event_object(event, "response")
            raise UpstreamFailed(response.get("error") or {"message": "the model server failed"}, response)
        if kind == "error":
            raise UpstreamFailed(event.get("error") if isinstance(event.get("error"), dict) else event)
        index = event.get("output_index")
        if type(index) is not int:
            if "output_index" in event or "item" in event or "item_id" in event:
                raise MalformedResponse(f"a {kind[:60]} event for an item, without the item's output_index")
            self.keep(event)  # an event of the response as a whole
            return
        if kind in ARGUMENT_EVENTS:
            self._arguments(kind, index, event)
        if kind == "response.output_item.added":
            self._announce(index, event_object(event, "item"))
        elif index not in self._announced:
            raise MalformedResponse(f"a {kind[:60]} event for item {index}, which was never announced")
        if kind == "response.output_item.done":
            item = self._done[index] = event_object(event, "item")
            if _identity(item) != self._announced[index]:
                raise MalformedResponse(f"item {index} was announced as {self._announced[index][0]} and finished "
                                        f"as {str(item.get('type'))[:40]}")
        self.route(index, event)

    def _arguments(self, kind: str, index: int, event: dict[str, Any]) -> None:
        """A call's arguments (a custom tool's input) as its deltas, its `.done` and its finished item say them:
        the same, or the answer is malformed (the rules read the item's; an agent may build them from the
        deltas)."""
        if kind in DELTAS:
            self._streamed.setdefault(index, []).append(str(event.get("delta", "")))
            return
        said = event.get(DONES[kind]) if kind in DONES else _said(event.get("item"))
        streamed = self._streamed.get(index)
        if streamed is not None and "".join(streamed) != said:
            raise MalformedResponse(f"item {index}'s arguments differ from the deltas that streamed them")
        if isinstance(said, str):
            self._streamed[index] = [said]

    def _announce(self, index: int, item: dict[str, Any]) -> None:
        if index in self._announced:
            raise MalformedResponse(f"item {index} was announced twice")
        self._announced[index] = _identity(item)
        call = is_call(item)
        self.starts(index, holds=item.get("type") == "reasoning", hidden=call and call_name(item) in self.hidden,
                    own_call=call_id_of(item) if call else None)

    def finish(self) -> Round:
        """The Round, once the stream ended: from the terminal event's response, or the finished items."""
        if self.final is None:
            raise MalformedResponse("the stream ended before response.completed")
        final = dict(self.final)
        streamed = [self._done[i] for i in sorted(self._done)]
        if not final.get("output"):
            final["output"] = streamed
        elif _calls(final["output"]) != _calls(streamed):
            # the rules read the final output, the agent gets the streamed items: they must be the same calls
            raise MalformedResponse("the final response's tool calls differ from the streamed ones")
        final.setdefault("id", (self.started or {}).get("id"))
        found = round_from_response(final)
        found.head = round_head(found.head, self.started, self.previous)
        return self.settled(found)


def _said(item: Any) -> Any:
    """A finished item's arguments (a custom tool call's input), None for an item of another kind."""
    if not isinstance(item, dict):
        return None
    return item.get("input") if item.get("type") == "custom_tool_call" else item.get("arguments")


def _identity(item: dict[str, Any]) -> tuple[Any, ...]:
    """What an item is, for the rules and the agent: its type, and a call's id and tool."""
    if is_call(item):
        return item.get("type"), call_id_of(item), call_name(item)
    return (item.get("type"),)


def _calls(items: Any) -> list[tuple[str, Any, Any]]:
    return [(call_id_of(item), call_name(item), call_arguments(item))
            for item in items if isinstance(item, dict) and is_call(item)]

