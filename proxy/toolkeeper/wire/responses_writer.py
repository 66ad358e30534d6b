"""The agent's side of a Responses turn, streamed: one response, whatever happened in between.

The agent reads `response.created` once (the first round's id), then the
events of the items it may see, relayed as the model server wrote them but
numbered anew: `sequence_number` from 0 without gaps, `output_index`
contiguous over the items it sees. Keep-alive comments while a declared call
runs; one `response.completed` (or `.incomplete`) at the end whose `output`
is exactly the items relayed and whose `usage` is the sum over every round.
An upstream failure after the first byte is a `response.failed`.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import orjson
from aiohttp import web

from toolkeeper.engine import TurnResult, Visible
from toolkeeper.wire.agentapi import TurnWriter, error_response
from toolkeeper.wire.relay import RAW
from toolkeeper.wire.responses_items import said_item
from toolkeeper.wire.upstream import UpstreamError


class ResponsesModel(Protocol):
    """What the writer reads of the adapter's model (responses.py)."""

    first: dict[str, Any] | None  # the first round's response: the agent's id and head

    def take(self) -> list[tuple[int, dict[str, Any]]]: ...

    def shown(self, response: dict[str, Any]) -> dict[str, Any]: ...

    def allowed_calls(self, allowed: set[str]) -> list[tuple[int, dict[str, Any]]]: ...


def final_response(model: ResponsesModel, result: TurnResult, output: list[dict[str, Any]]) -> dict[str, Any]:
    """The response the agent gets: the last round's fields, the first round's id, its items, usage summed."""
    last = dict(result.last.head.get("response") or {})
    first = model.first or {}
    status = "incomplete" if result.finish_reason == "length" else "completed"
    return model.shown({**last, "id": first.get("id", last.get("id")),
                        "created_at": first.get("created_at", last.get("created_at")),
                        "status": status, "output": output, "usage": result.usage})


class ResponsesWriter(TurnWriter):
    def __init__(self, request: web.Request, model: ResponsesModel, keepalive: float):
        super().__init__(request, keepalive)
        self.model = model
        self.result: TurnResult | None = None
        self.sequence = 0
        self.indexes: dict[tuple[int, int], int] = {}  # (round, upstream output_index) -> the agent's
        self.output: list[dict[str, Any]] = []

    async def working(self) -> None:
        await self._flush()  # what the round showed goes out before the tool runs

    async def visible(self, event: Visible) -> None:
        await self._flush()

    def _event(self, event: dict[str, Any]) -> bytes:
        event = {**event, "sequence_number": self.sequence}
        self.sequence += 1
        return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"

    def _lifecycle(self, kind: str, **fields: Any) -> bytes:
        first = self.model.first or {}
        response = {**first, "status": "in_progress", "output": [], "usage": None, **fields}
        return self._event({"type": kind, "response": self.model.shown(response)})

    async def _flush(self, events: list[tuple[int, dict[str, Any]]] | None = None) -> None:
        parts = []
        if self.sequence == 0 and self.model.first is not None:
            parts += [self._lifecycle("response.created"), self._lifecycle("response.in_progress")]
        for round_number, event in self.model.take() if events is None else events:
            raw = event.pop(RAW, None)
            index = event.get("output_index")
            mapped = self.indexes.setdefault((round_number, index), len(self.indexes)) if isinstance(index, int) \
                else index
            if event["type"] == "response.output_item.done":
                self.output.append(event["item"])
            if raw is not None and mapped == index and event.get("sequence_number") == self.sequence:
                self.sequence += 1  # nothing to renumber: the server's own bytes
                parts.append(raw + b"\n\n")
            else:
                parts.append(self._event({**event, "output_index": mapped} if isinstance(index, int) else event))
        if parts:
            await self.write(b"".join(parts))

    async def finish(self, result: TurnResult) -> None:
        self.result = result
        await self._flush()
        await self._flush(self.model.allowed_calls({call.id for call in result.tool_calls}))
        if result.said:
            await self._whole_item(said_item(result.said))
        final = final_response(self.model, result, self.output)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        ending = self._event({"type": kind, "response": final})
        response = await self.prepared()
        await response.write_eof(ending)

    async def _whole_item(self, item: dict[str, Any]) -> None:
        """An item of toolkeeper's own, in the events a streamed item has."""
        index, text = len(self.indexes), item["content"][0]["text"]
        self.indexes[(-1, index)] = index
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
        await self.write(b"".join(self._event(event) for event in events))

    async def fail(self, error: UpstreamError) -> web.StreamResponse:
        if self.response is None:
            return error_response(error)
        body = error.error_object()
        failed = self._lifecycle("response.failed", status="failed", output=self.output,
                                 error={"code": str(body.get("code") or "upstream_error"),
                                        "message": body.get("message") or "the model server failed"},
                                 completed_at=None, failed_at=int(time.time()))
        await self.response.write_eof(failed)
        return self.response
