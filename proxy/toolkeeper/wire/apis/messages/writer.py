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
from toolkeeper.wire.apis.relay import FIRST, RelayWriter
from toolkeeper.wire.errors import ANTHROPIC, UpstreamError

PING = b'event: ping\ndata: {"type": "ping"}\n\n'


def final_message(result: TurnResult, content: list[dict[str, Any]]) -> dict[str, Any]:
    """The message the agent gets: the last round's fields, the first round's id, its blocks, usage summed."""
    last = dict(result.last.head.get("message") or {})
    first = result.last.head.get(FIRST) or {}
    if result.said:
        content = [*content, {"type": "text", "text": result.said}]
    stop = "tool_use" if result.tool_calls else ("max_tokens" if result.finish_reason == "length"
                                                 else last.get("stop_reason") or "end_turn")
    if stop == "tool_use" and not result.tool_calls:
        stop = "end_turn"
    return {**last, "id": first.get("id", last.get("id")), "content": content, "stop_reason": stop,
            "usage": result.usage}


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

    def relayed(self, event: dict[str, Any]) -> bytes:
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
        final = final_message(result, [])
        return [*parts, _event({"type": "message_delta", "delta": {"stop_reason": final["stop_reason"],
                                                                    "stop_sequence": final.get("stop_sequence")},
                                "usage": final["usage"] or {}}),
                _event({"type": "message_stop"})]

    def failure(self, error: UpstreamError) -> bytes:
        return b"event: error\ndata: " + ANTHROPIC.body(error) + b"\n\n"
