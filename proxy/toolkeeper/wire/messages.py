"""The Anthropic Messages adapter: `POST /v1/messages` in (Claude Code, the anthropic SDKs), one engine turn out.

    agent body --(messages -> neutral)--> engine --(MessagesModel: neutral -> messages)--> upstream /messages
    agent  <-- one message: the blocks it may see, one id, usage summed, the final stop_reason --+

Headers go upstream as the agent sent them (`anthropic-version`,
`anthropic-beta`, `x-api-key` or `Authorization`; `api_key_env` replaces the
key in `x-api-key`), and so does the query (`?beta=true`). Errors have the
API's own shape: `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from toolkeeper.common import dumps
from toolkeeper.engine import Round, TurnResult, Visible
from toolkeeper.wire.agentapi import AgentAPI, TurnWriter, whole_turn
from toolkeeper.wire.chat_stream import MalformedResponse
from toolkeeper.wire.intercepted import upstream_for
from toolkeeper.wire.messages_items import (
    BLOCKS,
    anthropic_from_messages,
    anthropic_tool,
    check_request,
    messages_from_anthropic,
    neutral_tool_choice,
    round_from_message,
    visible_blocks,
)
from toolkeeper.wire.messages_stream import MessagesReader
from toolkeeper.wire.relay import RAW, RelayingModel
from toolkeeper.wire.responses_stream import UpstreamFailed
from toolkeeper.wire.sse import EventTooLarge
from toolkeeper.wire.upstream import Upstream, UpstreamError, forward_headers

ENGINE_KEYS = ("tools", "tool_choice")
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 415: "invalid_request_error",
               429: "rate_limit_error", 529: "overloaded_error"}
PING = b'event: ping\ndata: {"type": "ping"}\n\n'


def anthropic_error(status: int, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"),
                                                    "message": message}})


def error_response(error: UpstreamError) -> web.Response:
    """The model server's own errors as they came (a 529 stays an overloaded_error); toolkeeper's in the shape."""
    return web.Response(status=error.status, body=anthropic_body(error), content_type="application/json")


def anthropic_body(error: UpstreamError) -> bytes:
    try:
        parsed = orjson.loads(error.body)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("type") == "error":
        return error.body
    return anthropic_error(error.status, str(error.error_object().get("message") or "the model server failed"))


class MessagesAPI(AgentAPI):
    api = "messages"

    def refuse(self, message: str, code: str = "invalid_request", status: int = 400) -> web.Response:
        return web.Response(status=status, body=anthropic_error(status, message), content_type="application/json")

    async def answer(self, request: web.Request, body: Any, raw: bytes) -> web.StreamResponse:
        problem = check_request(body)
        if problem:
            return self.refuse(problem)
        neutral: dict[str, Any] = {"messages": messages_from_anthropic(body["messages"])}
        if "tools" in body:
            neutral["tools"] = body["tools"]
        if "tool_choice" in body:
            neutral["tool_choice"] = neutral_tool_choice(body["tool_choice"])
        model = MessagesModel(upstream_for(request, self.upstream), request, body, self.engine.hidden_names(neutral))
        events = self.engine.run(neutral, model, self.context(request, raw))
        if body.get("stream"):
            return await MessagesWriter(request, model, self.keepalive).relay(events)
        result = await whole_turn(events, error_response)
        if isinstance(result, web.Response):
            return result
        if result.passthrough and not model.hidden:
            return web.Response(body=result.last.raw, content_type="application/json")
        shown = visible_blocks(model.visible_output, set(), {call.id for call in result.tool_calls})
        return web.Response(body=dumps(final_message(model, result, shown)),
                            content_type="application/json")


class MessagesModel(RelayingModel):
    """The engine's Model for the Messages API: one upstream message per round."""

    def __init__(self, upstream: Upstream, request: web.Request, body: dict[str, Any], hidden: set[str]):
        super().__init__(hidden, bool(body.get("stream")))
        self.upstream = upstream
        self.headers = {**forward_headers(request.headers, upstream.api_key, key_header="x-api-key"),
                        "Content-Type": "application/json"}
        self.query = f"?{request.query_string}" if request.query_string else ""
        self.body = body

    def request(self, neutral: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in self.body.items() if k not in ENGINE_KEYS}
        if neutral.get("tools"):
            out["tools"] = [anthropic_tool(t) for t in neutral["tools"]]
        if "tool_choice" in self.body:
            choice = self.body["tool_choice"]
            if neutral.get("tool_choice") == "auto" and choice.get("type") != "auto":  # the forced call was made
                choice = {**{k: v for k, v in choice.items() if k != "name"}, "type": "auto"}
            out["tool_choice"] = choice
        out["messages"] = anthropic_from_messages(neutral["messages"])
        return out

    async def round(self, body: dict[str, Any]) -> AsyncIterator[Visible | Round]:
        self.reader = MessagesReader(self.hidden)
        try:
            async for event in self.post(self.upstream, self.upstream.url("/messages") + self.query,
                                         dumps(self.request(body)), self.headers):
                yield event
        except (MalformedResponse, EventTooLarge) as exc:
            raise UpstreamError(502, anthropic_error(502, f"the model server sent a malformed response: {exc}"),
                                ) from exc
        except UpstreamFailed as exc:
            status = 529 if exc.error.get("type") == "overloaded_error" else 502
            raise UpstreamError(status, orjson.dumps({"type": "error", "error": exc.error})) from exc
        except TimeoutError as exc:
            raise UpstreamError(504, anthropic_error(504, "the model server did not answer in time")) from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(502, anthropic_error(502, f"cannot reach the model server: {exc}")) from exc

    def without_calls(self, output: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return visible_blocks(output, set(), set())

    def _read_whole(self, raw: bytes) -> list[Visible | Round]:
        try:
            message = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise MalformedResponse(f"JSON that does not parse ({exc})") from exc
        if not isinstance(message, dict) or not isinstance(message.get("content", []), list):
            raise MalformedResponse("a message without its content list")
        found = round_from_message(message, raw if not self.streaming else None)
        return self.whole(found, message, visible_blocks(found.message[BLOCKS], self.hidden))

def final_message(model: MessagesModel, result: TurnResult, content: list[dict[str, Any]]) -> dict[str, Any]:
    last = dict(result.last.head.get("message") or {})
    first = model.first or {}
    if result.said:
        content = [*content, {"type": "text", "text": result.said}]
    stop = "tool_use" if result.tool_calls else ("max_tokens" if result.finish_reason == "length"
                                                 else last.get("stop_reason") or "end_turn")
    if stop == "tool_use" and not result.tool_calls:
        stop = "end_turn"
    return {**last, "id": first.get("id", last.get("id")), "content": content, "stop_reason": stop,
            "usage": result.usage}


class MessagesWriter(TurnWriter):
    """The agent's side, streamed: one message_start, the blocks it may see with `index` from 0, pings while a
    tool runs, one message_delta (the final stop_reason, usage summed), one message_stop."""

    keepalive_data = PING

    def __init__(self, request: web.Request, model: MessagesModel, keepalive: float):
        super().__init__(request, keepalive)
        self.model = model
        self.started = False
        self.indexes: dict[tuple[int, int], int] = {}

    async def working(self) -> None:
        await self._flush()

    async def visible(self, event: Visible) -> None:
        await self._flush()

    def _event(self, event: dict[str, Any]) -> bytes:
        return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"

    async def _flush(self, events: list[tuple[int, dict[str, Any]]] | None = None) -> None:
        parts = []
        if not self.started and self.model.first is not None:
            self.started = True
            first = {**self.model.first, "content": [], "stop_reason": None, "stop_sequence": None}
            parts.append(self._event({"type": "message_start", "message": first}))
        for round_number, event in self.model.take() if events is None else events:
            raw = event.pop(RAW, None)
            index = self.indexes.setdefault((round_number, event["index"]), len(self.indexes))
            if raw is not None and index == event["index"]:
                parts.append(raw + b"\n\n")  # nothing to renumber: the server's own bytes
            else:
                parts.append(self._event({**event, "index": index}))
        if parts:
            await self.write(b"".join(parts))

    async def finish(self, result: TurnResult) -> None:
        await self._flush()
        await self._flush(self.model.allowed_calls({call.id for call in result.tool_calls}))
        parts = []
        if result.said:
            index = len(self.indexes)
            self.indexes[(-1, index)] = index
            parts += [self._event({"type": "content_block_start", "index": index,
                                   "content_block": {"type": "text", "text": ""}}),
                      self._event({"type": "content_block_delta", "index": index,
                                   "delta": {"type": "text_delta", "text": result.said}}),
                      self._event({"type": "content_block_stop", "index": index})]
        final = final_message(self.model, result, [])
        parts += [self._event({"type": "message_delta", "delta": {"stop_reason": final["stop_reason"],
                                                                  "stop_sequence": final.get("stop_sequence")},
                               "usage": final["usage"] or {}}),
                  self._event({"type": "message_stop"})]
        response = await self.prepared()
        await response.write_eof(b"".join(parts))

    async def fail(self, error: UpstreamError) -> web.StreamResponse:
        if self.response is None:
            return error_response(error)
        await self.response.write_eof(b"event: error\ndata: " + anthropic_body(error) + b"\n\n")
        return self.response


def count_tokens_body(body: dict[str, Any], declared: list[dict[str, Any]]) -> dict[str, Any]:
    """`/v1/messages/count_tokens` counts with the declared tools the model would get."""
    mine = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
    extra = [anthropic_tool(t) for t in declared if anthropic_tool(t)["name"] not in mine]
    return {**body, "tools": [*(body.get("tools") or []), *extra]} if extra else body

