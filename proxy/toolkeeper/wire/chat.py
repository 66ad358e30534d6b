"""The Chat Completions adapter: `POST /v1/chat/completions` in, one engine turn out.

To the agent the whole turn is one response: one id, created and model; the
role once; the text of every round as it comes; its own tool calls renumbered
from 0; one usage (the sum), only when asked; one `[DONE]`. Nothing of a
declared call ever reaches it.

The response is prepared lazily, so that an upstream error before the first
byte can keep its status and body; after it, the error becomes an SSE error
event and a clean close.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web

from toolkeeper.common import dumps
from toolkeeper.engine import Event, TurnResult, Visible
from toolkeeper.wire.agentapi import AgentAPI, TurnWriter, bad_request, error_response, whole_turn
from toolkeeper.wire.chat_stream import of_json_type
from toolkeeper.wire.intercepted import upstream_for
from toolkeeper.wire.upstream import UpstreamError

DONE = b"data: [DONE]\n\n"


def check_request(body: Any) -> str | None:
    """What is wrong with a chat request, in the words a 400 gives; None when the engine can take it."""
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list of messages"
    for position, message in enumerate(messages):
        problem = _check_message(message)
        if problem:
            return f"messages[{position}]: {problem}"
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            return "'tools' must be a list of tool objects"
        for position, tool in enumerate(tools):
            problem = _check_tool(tool)
            if problem:
                return f"tools[{position}]: {problem}"
    for key, kinds, what in REQUEST_FIELDS:
        if body.get(key) is not None and not of_json_type(body[key], kinds):
            return f"'{key}' must be {what}"
    options = body.get("stream_options")
    if isinstance(options, dict) and not isinstance(options.get("include_usage", False), bool):
        return "'stream_options.include_usage' must be true or false"
    if isinstance(body.get("n"), int) and body["n"] < 1:
        return "'n' must be at least 1"
    return None


# Request fields the engine reads: their JSON types (a bool is never taken for a number).
REQUEST_FIELDS = (
    ("stream", (bool,), "true or false"),
    ("stream_options", (dict,), "an object"),
    ("n", (int,), "a whole number"),
    ("tool_choice", (str, dict), "a string or an object"),
    ("parallel_tool_calls", (bool,), "true or false"),
    ("model", (str,), "a string"),
)


def _check_message(message: Any) -> str | None:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        return "every message must be an object with a 'role' string"
    calls = message.get("tool_calls")
    if calls is None:
        return None
    if not isinstance(calls, list):
        return "'tool_calls' must be a list"
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return "each tool call must be an object whose 'function' has a 'name' string"
        if not isinstance(function.get("arguments", ""), (str, dict)):
            return "a tool call's 'arguments' must be a JSON string"
    return None


def _check_tool(tool: Any) -> str | None:
    if not isinstance(tool, dict):
        return "each tool must be an object"
    function = tool.get("function")
    if "function" in tool and not isinstance(function, dict):
        return "'function' must be an object with a 'name'"
    name = function.get("name") if isinstance(function, dict) else tool.get("name")
    if name is not None and not isinstance(name, str):
        return "a tool's 'name' must be a string"
    return None


class ChatCompletions(AgentAPI):
    async def answer(self, request: web.Request, body: Any, raw: bytes) -> web.StreamResponse:
        problem = check_request(body)
        if problem:
            return bad_request(problem)
        if isinstance(body.get("n"), int) and body["n"] > 1 and (
                self.engine.active_tools(body) or (body.get("tools") and self.engine.calls.policy.governs_agents)):
            return bad_request("n > 1 cannot be combined with declared tools or governed tool calls: only the "
                               "first choice is checked; send n = 1", "n_not_supported")
        model = upstream_for(request, self.upstream).model(request.headers, request.query_string)
        events = self.engine.run(body, model, self.context(request, raw))
        if body.get("stream"):
            return await StreamWriter(request, body, self.keepalive).relay(events)
        return await self._whole(body, events)

    async def _whole(self, body: dict[str, Any], events: AsyncIterator[Event]) -> web.StreamResponse:
        result = await whole_turn(events)
        if isinstance(result, web.Response):
            return result
        if result.passthrough:
            return web.Response(body=result.last.raw, content_type="application/json")
        return web.Response(body=dumps(whole_response(result, body)), content_type="application/json")


def _head(result_head: dict[str, Any] | None, request: dict[str, Any]) -> dict[str, Any]:
    head = dict(result_head or {})
    head.setdefault("id", "chatcmpl-" + secrets.token_hex(12))
    head.setdefault("created", int(time.time()))
    head.setdefault("model", request.get("model", ""))
    return head


def whole_response(result: TurnResult, request: dict[str, Any]) -> dict[str, Any]:
    """The non-streamed answer: the text of every round joined, exactly what a streaming agent read."""
    last = orjson.loads(result.last.raw) if result.last.raw else {}
    head = _head(result.head, request)
    message = dict(result.last.message)
    message["role"] = "assistant"
    for key, text in result.text.items():
        message[key] = text
    message.setdefault("content", None if result.tool_calls else "")
    if result.tool_calls:
        message["tool_calls"] = [call.as_message_entry() for call in result.tool_calls]
    choice = dict((last.get("choices") or [{}])[0] or {})
    choice.update({"index": 0, "message": message, "finish_reason": result.finish_reason})
    choice.setdefault("logprobs", None)
    response = {**last, "id": head["id"], "object": "chat.completion", "created": head["created"],
                "model": head["model"], "choices": [choice]}
    if "system_fingerprint" in head:
        response["system_fingerprint"] = head["system_fingerprint"]
    if result.usage is not None:
        response["usage"] = result.usage
    return response


class StreamWriter(TurnWriter):
    """Relays one turn to a streaming agent as Chat Completions SSE."""

    def __init__(self, request: web.Request, body: dict[str, Any], keepalive: float):
        super().__init__(request, keepalive)
        self.body = body
        self.include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.head: dict[str, Any] | None = None
        self.role_sent = False
        self._envelope: tuple[bytes, bytes] | None = None

    async def visible(self, event: Visible) -> None:
        self.head = self.head or _head(event.head, self.body)
        await self.write(b"".join(self._chunk(delta) for delta in event.deltas))

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        if not self.role_sent:
            delta = {"role": "assistant", **delta}
            self.role_sent = True
        if self._envelope is None:
            # Every chunk of the turn shares id, created and model: serialise them once.
            head = self.head or _head(None, self.body)
            envelope = {"id": head["id"], "object": "chat.completion.chunk", "created": head["created"],
                        "model": head["model"]}
            if "system_fingerprint" in head:
                envelope["system_fingerprint"] = head["system_fingerprint"]
            prefix = b"data: " + orjson.dumps(envelope)[:-1] + b',"choices":[{"index":0,"delta":'
            suffix = b',"usage":null}\n\n' if self.include_usage else b"}\n\n"
            self._envelope = (prefix, suffix)
        prefix, suffix = self._envelope
        finish = b"null" if finish_reason is None else orjson.dumps(finish_reason)
        return prefix + orjson.dumps(delta) + b',"logprobs":null,"finish_reason":' + finish + b"}]" + suffix

    async def finish(self, result: TurnResult) -> None:
        self.head = self.head or _head(result.head, self.body)
        parts = []
        for index, call in enumerate(result.tool_calls):
            parts.append(self._chunk({"tool_calls": [call.as_message_entry(index)]}))
        if not self.role_sent:
            parts.append(self._chunk({"content": ""}))
        parts.append(self._chunk({}, result.finish_reason))
        if self.include_usage:
            usage = {"id": self.head["id"], "object": "chat.completion.chunk", "created": self.head["created"],
                     "model": self.head["model"], "choices": [], "usage": result.usage}
            parts.append(b"data: " + orjson.dumps(usage) + b"\n\n")
        parts.append(DONE)
        # the end of the answer and the end of the body in one send: one wake-up less for the agent
        response = await self.prepared()
        await response.write_eof(b"".join(parts))

    async def fail(self, error: UpstreamError) -> web.StreamResponse:
        if self.response is None:
            return error_response(error)
        await self.response.write_eof(b"data: " + orjson.dumps({"error": error.error_object()}) + b"\n\n")
        return self.response
