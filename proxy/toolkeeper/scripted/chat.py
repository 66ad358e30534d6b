"""The scripted model's Chat Completions answers: one step as a whole response or as SSE chunks, with the quirks
of real servers (server.py lists them)."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import orjson
from aiohttp import web

MODEL = "scripted-model"


class ChatAnswer:
    def __init__(self, step: dict[str, Any], request: dict[str, Any], response_id: str, quirks: set[str]):
        self.step = step
        self.request = request
        self.id = step.get("id", response_id)
        self.quirks = quirks
        self.created = step.get("created", int(time.time()))
        self.model = request.get("model") or MODEL
        self.content = _fill(step.get("content"), request)
        self.calls = []
        for position, call in enumerate(step.get("tool_calls") or []):
            arguments = call.get("arguments", {})
            if "args_object" not in quirks and not isinstance(arguments, str):
                arguments = orjson.dumps(arguments).decode()
            if "no_ids" in quirks:
                call_id = None
            elif "empty_ids" in quirks:
                call_id = ""
            elif "int_ids" in quirks:
                call_id = position
            else:
                call_id = call.get("id", f"call_{response_id[-6:]}{position}")
            self.calls.append({"id": call_id, "name": call["name"], "arguments": arguments,
                               "extra": call.get("extra") or {}})
        default_finish = "tool_calls" if self.calls and "stop_with_tools" not in quirks else "stop"
        self.finish_reason = step.get("finish_reason", default_finish)
        self.usage = step.get("usage") or {
            "prompt_tokens": 10 * len(request.get("messages") or []),
            "completion_tokens": 5 + len(self.content or "") // 4 + 7 * len(self.calls),
        }
        self.usage.setdefault("total_tokens", self.usage["prompt_tokens"] + self.usage["completion_tokens"])

    def _call_entry(self, call: dict[str, Any], index: int) -> dict[str, Any]:
        entry: dict[str, Any] = {"index": index} if index is not None else {}
        if call["id"] is not None:
            entry["id"] = call["id"]
        entry["type"] = "function"
        entry["function"] = {"name": call["name"], "arguments": call["arguments"]}
        entry.update(call.get("extra") or {})  # fields some servers add, like Gemini's extra_content
        return entry

    def whole(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.step.get("reasoning_content"):
            message["reasoning_content"] = self.step["reasoning_content"]
        message.update(self.step.get("message_extra") or {})
        if self.calls:
            message["tool_calls"] = [self._call_entry(call, None) for call in self.calls]
            for entry in message["tool_calls"]:
                entry.pop("index", None)
        message["refusal"] = None
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "system_fingerprint": "fp_scripted",
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": self.finish_reason}],
                "usage": self.usage, "service_tier": "default"}

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
        chunk = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                 "system_fingerprint": "fp_scripted",
                 "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
        if self.include_usage:
            chunk["usage"] = None
        chunk.update(extra)
        return chunk

    @property
    def include_usage(self) -> bool:
        return bool((self.request.get("stream_options") or {}).get("include_usage"))

    def chunks(self) -> list[Any]:
        """Every SSE event of the answer, in order: dicts, or raw bytes for broken ones."""
        events: list[Any] = []
        if "azure_empty_first" in self.quirks:
            events.append({"choices": [], "created": 0, "id": "", "model": "", "object": "",
                           "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}]})
        events.append(self._chunk({"role": "assistant", "content": "", **(self.step.get("message_extra") or {})}))
        if self.step.get("reasoning_content"):
            for piece in _pieces(self.step["reasoning_content"], 8):
                events.append(self._chunk({"reasoning_content": piece}))
        for piece in _pieces(self.content or "", int(self.step.get("chunk_size", 6))):
            events.append(self._chunk({"content": piece}))
        if "error_mid_stream" in self.quirks:
            events.append({"error": {"message": "scripted mid-stream failure", "type": "server_error",
                                     "code": "internal"}})
            return events
        if "garbage_mid_stream" in self.quirks:
            events.append(b"data: {this is not json\n\n")
            return events
        if "drop_mid_stream" in self.quirks:
            events.append(None)  # close the connection here
            return events
        for index, call in enumerate(self.calls):
            events.extend(self._call_chunks(call, 0 if "all_index_0" in self.quirks else index))
        events.append(self._chunk({}, self.finish_reason))
        if self.include_usage:
            events.append({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                           "model": self.model, "system_fingerprint": "fp_scripted", "choices": [],
                           "usage": self.usage})
        if "no_done" not in self.quirks:
            events.append(b"data: [DONE]\n\n")
        return events

    def _call_chunks(self, call: dict[str, Any], index: int) -> list[dict[str, Any]]:
        arguments = call["arguments"]
        first = self._call_entry({**call, "arguments": ""}, index)
        if not isinstance(arguments, str) or "args_one_chunk" in self.quirks or "all_index_0" in self.quirks:
            first["function"]["arguments"] = arguments
            return [self._chunk({"tool_calls": [first]})]
        size = (1, 2, 3) if "split_escape" in self.quirks else (7,)
        chunks = [self._chunk({"tool_calls": [first]})]
        for piece in _pieces(arguments, size):
            entry: dict[str, Any] = {"index": index, "function": {"arguments": piece}}
            if "name_every_delta" in self.quirks:
                entry = self._call_entry({**call, "arguments": piece}, index)
            chunks.append(self._chunk({"tool_calls": [entry]}))
        return chunks

    async def stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        for event in self.chunks():
            if event is None:
                assert request.transport is not None
                request.transport.close()
                return response
            data = event if isinstance(event, bytes) else b"data: " + orjson.dumps(event) + b"\n\n"
            if "byte_drip" in self.quirks:
                for start in range(0, len(data), 5):
                    await response.write(data[start:start + 5])
            else:
                await response.write(data)
            if self.step.get("chunk_delay"):
                await asyncio.sleep(self.step["chunk_delay"])
        await response.write_eof()
        return response


def _pieces(text: str, sizes: Any) -> list[str]:
    if isinstance(sizes, int):
        sizes = (sizes,)
    pieces, start = [], 0
    for size in itertools.cycle(sizes):
        if start >= len(text):
            break
        pieces.append(text[start:start + size])
        start += size
    return pieces


def _fill(content: str | None, request: dict[str, Any]) -> str | None:
    if content is None or "{tool_result}" not in content:
        return content
    results = [m.get("content") for m in request.get("messages") or [] if m.get("role") == "tool"]
    return content.replace("{tool_result}", str(results[-1]).strip() if results else "(no tool result)")
