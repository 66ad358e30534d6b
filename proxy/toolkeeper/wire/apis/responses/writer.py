"""The agent's side of a Responses turn: one response, whatever happened in between.

Streamed, the agent reads `response.created` once (the first round's id),
then the events of the items it may see, relayed as the model server wrote
them but numbered anew: `sequence_number` from 0 without gaps, `output_index`
contiguous over the items it sees. Keep-alive comments while a declared call
runs; one `response.completed` (or `.incomplete`) at the end whose `output`
is exactly the items relayed and whose `usage` is the sum over every round.
An upstream failure after the first byte is a `response.failed`. Whole, the
same response object, at once.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from aiohttp import web

from toolkeeper.engine import TurnResult
from toolkeeper.wire.apis.base import Keep
from toolkeeper.wire.apis.relay import FIRST
from toolkeeper.wire.apis.relay_writer import RelayWriter
from toolkeeper.wire.apis.responses.items import said_item
from toolkeeper.wire.apis.runs import RAW, ROUND, Run
from toolkeeper.wire.errors import UpstreamError


def shown(response: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """A response object as the agent may see it: the server echoes the tools it was sent, declared ones
    included; the agent sees its own, and its own tool_choice."""
    seen = {**response, "tools": body.get("tools") or []}
    if "tool_choice" in body:
        seen["tool_choice"] = body["tool_choice"]
    return seen


def final_response(body: dict[str, Any], result: TurnResult, output: list[dict[str, Any]]) -> dict[str, Any]:
    """The response the agent gets: the last round's fields, the first round's id, its items, usage summed."""
    last = result.last.head.get("response") or {}
    first = result.last.head.get(FIRST) or {}
    status = "incomplete" if result.finish_reason == "length" else "completed"
    # `shown`'s fields, in one dict
    final = {**last, "id": first.get("id", last.get("id")), "created_at": first.get("created_at",
                                                                                   last.get("created_at")),
             "status": status, "output": output, "usage": result.usage, "tools": body.get("tools") or []}
    if "tool_choice" in body:
        final["tool_choice"] = body["tool_choice"]
    return final


class ResponsesWriter(RelayWriter):
    def __init__(self, request: web.Request, body: dict[str, Any], keepalive: float, keep: Keep):
        super().__init__(request, keepalive)
        self.body = body
        self.keep = keep
        self.sequence = 0
        self.output: list[dict[str, Any]] = []  # the items relayed, as the final response lists them

    def _event(self, event: dict[str, Any]) -> bytes:
        event = {**event, "sequence_number": self.sequence}
        self.sequence += 1
        return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"

    def _lifecycle(self, kind: str, **fields: Any) -> bytes:
        response = {**(self.first or {}), "status": "in_progress", "output": [], "usage": None, **fields}
        return self._event({"type": kind, "response": shown(response, self.body)})

    def opening(self) -> list[bytes]:
        if self.sequence or self.first is None:
            return []
        # the two events `_lifecycle` writes, around one encoding of their response
        response = orjson.dumps(shown({**self.first, "status": "in_progress", "output": [], "usage": None}, self.body))
        self.sequence = 2
        return [b'event: response.created\ndata: {"type":"response.created","response":' + response
                + b',"sequence_number":0}\n\n',
                b'event: response.in_progress\ndata: {"type":"response.in_progress","response":' + response
                + b',"sequence_number":1}\n\n']

    def relayed(self, event: Any) -> bytes:
        if type(event) is Run:  # events that may go on as they came: so, unless renumbered
            if event.number == self.sequence and self.unchanged(event):
                self.sequence += len(event.data)
                self.output += event.items
                return event.raw()
            return b"".join(self.relayed(one) for one in event.expanded())
        raw, round_key = event.pop(RAW, None), event.pop(ROUND, None)
        index = event.get("output_index")
        mapped = self.number(round_key, index) if isinstance(index, int) else index
        if event["type"] == "response.output_item.done":
            self.output.append(event["item"])
        if raw is not None and mapped == index and event.get("sequence_number") == self.sequence:
            raw = self.as_came(raw, event)
            if raw is not None:
                self.sequence += 1  # nothing to renumber: the server's own bytes
                return raw + b"\n\n"
        return self._event({**event, "output_index": mapped} if isinstance(index, int) else event)

    async def closing(self, result: TurnResult) -> list[bytes]:
        parts = self._whole_item(said_item(result.said)) if result.said else []
        final = final_response(self.body, result, self.output)
        await self.keep(result, final)  # before the agent has the end, and can send its next request
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return [*parts, self._event({"type": kind, "response": final})]

    def _whole_item(self, item: dict[str, Any]) -> list[bytes]:
        """An item of toolkeeper's own, in the events a streamed item has."""
        index, text = self.own_index(), item["content"][0]["text"]
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        events = [
            {"type": "response.output_item.added", "output_index": index, "item": {**item, "status": "in_progress",
                                                                                  "content": []}},
            {"type": "response.content_part.added", **where, "part": part},
            {"type": "response.output_text.delta", **where, "delta": text, "logprobs": []},
            {"type": "response.output_text.done", **where, "text": text, "logprobs": []},
            {"type": "response.content_part.done", **where, "part": {**part, "text": text}},
            {"type": "response.output_item.done", "output_index": index, "item": item},
        ]
        self.output.append(item)
        return [self._event(event) for event in events]

    def failure(self, error: UpstreamError) -> bytes:
        body = error.error_object()
        return self._lifecycle("response.failed", status="failed", output=self.output,
                               error={"code": str(body.get("code") or "upstream_error"),
                                      "message": body.get("message") or "the model server failed"},
                               completed_at=None, failed_at=int(time.time()))
