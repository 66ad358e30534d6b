"""The agent's side of a Chat Completions turn: one response, streamed or whole, whatever happened in between.

To the agent the whole turn is one response: one id, created and model; the
role once; the text of every round as it comes; its own tool calls renumbered
from 0; one usage (the sum), only when asked; one `[DONE]`. The response is
prepared lazily, so that an upstream error before the first byte keeps its
status and body; after it, the error becomes an SSE error event and a clean
close.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import orjson
from aiohttp import web

from toolkeeper.engine import TurnResult, Visible
from toolkeeper.wire.apis.base import TurnWriter
from toolkeeper.wire.errors import UpstreamError

DONE = b"data: [DONE]\n\n"
HEAD = ("id", "created", "model")  # a round's head with these: its events' envelope is the turn's


def _head(result_head: dict[str, Any] | None, request: dict[str, Any]) -> dict[str, Any]:
    head = dict(result_head or {})
    if "id" not in head:
        head["id"] = "chatcmpl-" + secrets.token_hex(12)
    if "created" not in head:
        head["created"] = int(time.time())
    if "model" not in head:
        head["model"] = request.get("model", "")
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
        if event.relay and event.head and all(key in event.head for key in HEAD):
            # the first round's text, as the server wrote it: its id, created and model are the turn's
            # the role comes first, in a chunk of its own (as OpenAI sends it), when no chunk of ours carried it
            opening = self._chunk({"content": ""}) if not self.role_sent and event.relay[0] is not None else b""
            await self.write(opening + b"".join(raw if raw is not None else self._chunk(delta)
                                                for raw, delta in zip(event.relay, event.deltas, strict=True)),
                             hold=event.last)
            return
        await self.write(b"".join(self._chunk(delta) for delta in event.deltas), hold=event.last)

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
        await self.end(b"".join(parts))  # one wake-up less for the agent

    def failure(self, error: UpstreamError) -> bytes:
        return b"data: " + orjson.dumps({"error": error.error_object()}) + b"\n\n"
