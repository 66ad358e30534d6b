"""One upstream Responses stream, read event by event: what the agent may see, and the Round at the end.

Events of a declared call (its `output_item.*`, `function_call_arguments.*`)
are dropped; a reasoning item's events wait until the item after it shows
whether it is hidden (a reasoning item travels with the item it precedes).
The other events are kept, as the server wrote them, for the writer to relay
with its own `sequence_number` and `output_index`. Lifecycle events
(`response.created`, `.completed`, ...) are read here, never relayed: the
agent's response has its own, once.
"""

from __future__ import annotations

from typing import Any

from toolkeeper.engine import Round
from toolkeeper.wire.chat_stream import MalformedResponse
from toolkeeper.wire.relay import HoldingReader
from toolkeeper.wire.responses_items import CALL_TYPES, call_id_of, round_from_response

TERMINAL = ("response.completed", "response.incomplete")
LIFECYCLE = ("response.created", "response.in_progress", "response.queued")


class UpstreamFailed(Exception):
    """The model server ended the response with `response.failed` or an `error` event."""

    def __init__(self, error: dict[str, Any], response: dict[str, Any] | None = None):
        super().__init__(error.get("message") or "the model server failed")
        self.error = error
        self.response = response


class ResponsesReader(HoldingReader):
    def __init__(self, hidden: set[str]):
        super().__init__(hidden)
        self.response: dict[str, Any] | None = None  # from response.created
        self.final: dict[str, Any] | None = None  # from the terminal event
        self._done: dict[int, dict[str, Any]] = {}  # finished items, by output_index

    @property
    def head(self) -> dict[str, Any] | None:
        return self.response

    def feed(self, event: dict[str, Any]) -> str | None:
        """One event; the text it adds to a message the agent sees, if any."""
        kind = event.get("type")
        if not isinstance(kind, str):
            raise MalformedResponse("a stream event without a 'type'")
        if kind in LIFECYCLE:
            self.response = self.response or _object(event, "response")
            return None
        if kind in TERMINAL:
            self.final = _object(event, "response")
            return None
        if kind == "response.failed":
            response = _object(event, "response")
            raise UpstreamFailed(response.get("error") or {"message": "the model server failed"}, response)
        if kind == "error":
            raise UpstreamFailed(event.get("error") if isinstance(event.get("error"), dict) else event)
        index = event.get("output_index")
        if not isinstance(index, int):
            self.relay.append(event)  # an event of the response as a whole (annotations, ...): kept
            return None
        if kind == "response.output_item.added":
            item = _object(event, "item")
            call = item.get("type") in CALL_TYPES
            self.starts(index, holds=item.get("type") == "reasoning", hidden=call and item.get("name") in self.hidden,
                        own_call=call_id_of(item) if call else None)
        if kind == "response.output_item.done":
            self._done[index] = _object(event, "item")
        if not self.route(index, event):
            return None
        delta = event.get("delta")
        return delta if kind == "response.output_text.delta" and isinstance(delta, str) else None

    def finish(self) -> Round:
        """The Round, once the stream ended: from the terminal event's response, or the finished items."""
        if self.final is None:
            raise MalformedResponse("the stream ended before response.completed")
        self.settle()
        final = dict(self.final)
        streamed = [self._done[i] for i in sorted(self._done)]
        if not final.get("output"):
            final["output"] = streamed
        elif _calls(final["output"]) != _calls(streamed):
            # the rules read the final output, the agent gets the streamed items: they must be the same calls
            raise MalformedResponse("the final response's tool calls differ from the streamed ones")
        final.setdefault("id", (self.response or {}).get("id"))
        return round_from_response(final)


def _calls(items: Any) -> list[tuple[str, Any, Any]]:
    return [(call_id_of(item), item.get("name"), item.get("arguments", item.get("input")))
            for item in items if isinstance(item, dict) and item.get("type") in CALL_TYPES]


def _object(event: dict[str, Any], key: str) -> dict[str, Any]:
    value = event.get(key)
    if not isinstance(value, dict):
        raise MalformedResponse(f"a {event.get('type')} event without its '{key}' object")
    return value
