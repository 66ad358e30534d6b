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

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

import orjson
from aiohttp import web

from toolkeeper.engine import Event, TurnResult, Visible, Working
from toolkeeper.wire.agentapi import error_response, keep_alive
from toolkeeper.wire.responses_items import said_item
from toolkeeper.wire.upstream import UpstreamError

log = logging.getLogger("toolkeeper")

RAW = "_raw"  # an upstream event's own bytes, kept beside its parsed fields


class ResponsesModel(Protocol):
    """What the writer reads of the adapter's model (responses.py)."""

    first: dict[str, Any] | None  # the first round's response: the agent's id and head

    def take(self) -> list[tuple[int, dict[str, Any]]]: ...

    def shown(self, response: dict[str, Any]) -> dict[str, Any]: ...


def final_response(model: ResponsesModel, result: TurnResult, output: list[dict[str, Any]]) -> dict[str, Any]:
    """The response the agent gets: the last round's fields, the first round's id, its items, usage summed."""
    last = dict(result.last.head.get("response") or {})
    first = model.first or {}
    status = "incomplete" if result.finish_reason == "length" else "completed"
    return model.shown({**last, "id": first.get("id", last.get("id")),
                        "created_at": first.get("created_at", last.get("created_at")),
                        "status": status, "output": output, "usage": result.usage})


class ResponsesWriter:
    def __init__(self, request: web.Request, model: ResponsesModel, keepalive: float):
        self.request = request
        self.model = model
        self.keepalive = keepalive
        self.response: web.StreamResponse | None = None
        self.result: TurnResult | None = None
        self.sequence = 0
        self.indexes: dict[tuple[int, int], int] = {}  # (round, upstream output_index) -> the agent's
        self.output: list[dict[str, Any]] = []

    async def relay(self, events: AsyncIterator[Event]) -> web.StreamResponse:
        keepalive: asyncio.Task[None] | None = None
        try:
            async for event in events:
                if isinstance(event, Working):
                    await self._flush()  # what the round showed goes out before the tool runs
                    keepalive = keepalive or asyncio.create_task(keep_alive(self.keepalive, self._write))
                    continue
                if keepalive is not None:
                    keepalive.cancel()
                    await asyncio.gather(keepalive, return_exceptions=True)
                    keepalive = None
                if isinstance(event, Visible):
                    await self._flush()
                elif isinstance(event, TurnResult):
                    await self._finish(event)
        except UpstreamError as exc:
            return await self._fail(exc)
        except Exception as exc:
            log.error("turn failed", exc_info=exc)
            return await self._fail(UpstreamError.ours(500, f"toolkeeper failed: {exc}", "toolkeeper_error"))
        finally:
            if keepalive is not None:
                keepalive.cancel()
        if self.response is None:
            raise RuntimeError("the engine ended a turn without a result")
        return self.response

    async def _write(self, data: bytes) -> None:
        if self.response is None:
            self.response = web.StreamResponse(headers={
                "Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        await self.response.prepare(self.request)
        await self.response.write(data)

    def _event(self, event: dict[str, Any]) -> bytes:
        event = {**event, "sequence_number": self.sequence}
        self.sequence += 1
        return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"

    def _lifecycle(self, kind: str, **fields: Any) -> bytes:
        first = self.model.first or {}
        response = {**first, "status": "in_progress", "output": [], "usage": None, **fields}
        return self._event({"type": kind, "response": self.model.shown(response)})

    async def _flush(self) -> None:
        parts = []
        if self.sequence == 0 and self.model.first is not None:
            parts += [self._lifecycle("response.created"), self._lifecycle("response.in_progress")]
        for round_number, event in self.model.take():
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
            await self._write(b"".join(parts))

    async def _finish(self, result: TurnResult) -> None:
        self.result = result
        await self._flush()
        if result.said:
            await self._whole_item(said_item(result.said))
        final = final_response(self.model, result, self.output)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        ending = self._event({"type": kind, "response": final})
        if self.response is None:
            await self._write(b"")
        await self.response.write_eof(ending)  # type: ignore[union-attr]

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
        await self._write(b"".join(self._event(event) for event in events))

    async def _fail(self, error: UpstreamError) -> web.StreamResponse:
        if self.response is None:
            return error_response(error)
        body = error.error_object()
        failed = self._lifecycle("response.failed", status="failed", output=self.output,
                                 error={"code": str(body.get("code") or "upstream_error"),
                                        "message": body.get("message") or "the model server failed"},
                                 completed_at=None, failed_at=int(time.time()))
        await self.response.write_eof(failed)
        return self.response
