"""The agent's side of a Messages turn: one message, whatever happened in between.

Streamed: one `message_start` (the first round's id), the blocks the agent
may see with `index` from 0 (the server's own bytes where the index is
unchanged), `ping`s while a tool runs, one `message_delta` (the final
stop_reason, usage summed) and one `message_stop`; an upstream failure after
the first byte is an `error` event. Whole: the same message, at once.
"""

from __future__ import annotations

from typing import Any

import orjson

from toolkeeper.engine import TurnResult
from toolkeeper.wire.apis.relay import FIRST
from toolkeeper.wire.apis.relay_writer import RelayWriter
from toolkeeper.wire.apis.runs import Run
from toolkeeper.wire.errors import ANTHROPIC, UpstreamError

PING = b'event: ping\ndata: {"type": "ping"}\n\n'
STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'  # as `_event` writes it


def final_message(result: TurnResult, content: list[dict[str, Any]]) -> dict[str, Any]:
    """The message the agent gets: the last round's fields, the first round's id, its blocks, usage summed."""
    last = result.last.head.get("message") or {}
    first = result.last.head.get(FIRST) or {}
    if result.said:
        content = [*content, {"type": "text", "text": result.said}]
    return {**last, "id": first.get("id", last.get("id")), "content": content, "stop_reason": stop_reason(result, last),
            "usage": result.usage}


def stop_reason(result: TurnResult, last: dict[str, Any]) -> str:
    """The agent's message's stop_reason: the last round's, but tool_use only when the agent has calls to run."""
    stop = "tool_use" if result.tool_calls else ("max_tokens" if result.finish_reason == "length"
                                                 else last.get("stop_reason") or "end_turn")
    return "end_turn" if stop == "tool_use" and not result.tool_calls else stop


def _event(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


class MessagesWriter(RelayWriter):
    keepalive_data = PING
    errors = ANTHROPIC

    def __init__(self, request: Any, keepalive: float):
        super().__init__(request, keepalive)
        self.started = False

    def opening(self) -> list[bytes]:
        if self.started or self.first is None:
            return []
        self.started = True
        return [_event({"type": "message_start", "message": {**self.first, "content": [], "stop_reason": None,
                                                              "stop_sequence": None}})]

    def relayed(self, event: Any) -> bytes:
        if type(event) is Run:  # events that may go on as they came: so, unless renumbered
            if self.unchanged(event):
                return event.raw()
            return b"".join(self.relayed(one) for one in event.expanded())
        raw, round_key = self.unpacked(event)
        index = self.number(round_key, event["index"])
        if raw is not None and index == event["index"]:
            return raw + b"\n\n"  # nothing to renumber: the server's own bytes
        return _event({**event, "index": index})

    async def closing(self, result: TurnResult) -> list[bytes]:
        parts = []
        if result.said:
            index = self.own_index()
            parts += [_event({"type": "content_block_start", "index": index,
                              "content_block": {"type": "text", "text": ""}}),
                      _event({"type": "content_block_delta", "index": index,
                              "delta": {"type": "text_delta", "text": result.said}}),
                      _event({"type": "content_block_stop", "index": index})]
        last = result.last.head.get("message") or {}
        parts.append(_event({"type": "message_delta", "delta": {"stop_reason": stop_reason(result, last),
                                                                 "stop_sequence": last.get("stop_sequence")},
                             "usage": result.usage or {}}))  # `final_message`'s
        parts.append(STOP)
        return parts

    def failure(self, error: UpstreamError) -> bytes:
        return b"event: error\ndata: " + ANTHROPIC.body(error) + b"\n\n"
