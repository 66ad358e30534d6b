"""The scripted model server's Anthropic Messages API (`POST /v1/messages`), strict as Anthropic's.

It answers the same script steps as the other APIs (`content`, `tool_calls`,
`usage`, `when`, `status`/`body`, `raw`, `hang`, `delay`), plus `thinking`: a
thinking block with a signature, before the rest, and `stop_reason`. It
rejects, with the 400 the real API gives, what a proxy must never send: a
`tool_use` without its `tool_result` in the next user message, a
`tool_result` for no `tool_use` before it, a `tool_result` after other
content in its message, a thinking block whose text no longer matches its
signature.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

import orjson
from aiohttp import web

from toolkeeper.scripted.responses import Rejected


def signature(thinking: str) -> str:
    return "sig-" + hashlib.sha256(thinking.encode()).hexdigest()[:24]


def check(body: dict[str, Any]) -> None:
    """The real API's rules on a conversation's tool calls, results and thinking."""
    messages = body.get("messages") or []
    for position, message in enumerate(messages):
        content = message.get("content") if isinstance(message.get("content"), list) else []
        if message.get("role") == "assistant":
            for block in content:
                if block.get("type") == "thinking" and block.get("signature") != signature(block.get("thinking", "")):
                    raise _rejected(f"messages.{position}.content: Invalid `signature` in `thinking` block")
            called = [b.get("id") for b in content if b.get("type") == "tool_use"]
            following = messages[position + 1] if position + 1 < len(messages) else None
            answered = _results(following) if following and following.get("role") == "user" else []
            missing = [call_id for call_id in called if call_id not in answered]
            if missing:
                raise _rejected(f"messages.{position + 1}: `tool_use` ids were found without `tool_result` blocks "
                                f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                                "corresponding `tool_result` block in the next message.")
        else:
            previous = messages[position - 1] if position else {}
            called = [b.get("id") for b in previous.get("content") or [] if isinstance(b, dict)
                      and b.get("type") == "tool_use"] if previous.get("role") == "assistant" else []
            seen_other = False
            for block in content:
                if block.get("type") != "tool_result":
                    seen_other = True
                    continue
                if seen_other:
                    raise _rejected(f"messages.{position}.content: tool_result blocks must come first in the "
                                    "user message")
                if block.get("tool_use_id") not in called:
                    raise _rejected(f"messages.{position}.content: unexpected `tool_use_id` found in "
                                    f"`tool_result` blocks: {block.get('tool_use_id')}. Each `tool_result` block "
                                    "must have a corresponding `tool_use` block in the previous message.")


def _results(message: dict[str, Any]) -> list[str]:
    content = message.get("content") if isinstance(message.get("content"), list) else []
    return [b.get("tool_use_id") for b in content if b.get("type") == "tool_result"]


def _rejected(message: str) -> Rejected:
    error = Rejected(message)
    error.body = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    return error


class MessagesScript:
    def __init__(self) -> None:
        self._ids = itertools.count(1)

    def answer(self, step: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        number = next(self._ids)
        message_id = step.get("id", f"msg_scripted{number}")
        tag = message_id.removeprefix("msg_")
        content: list[dict[str, Any]] = []
        if step.get("thinking"):
            content.append({"type": "thinking", "thinking": step["thinking"], "signature": signature(step["thinking"])})
        text = _fill(step.get("content"), body)
        if text:
            content.append({"type": "text", "text": text})
        for position, call in enumerate(step.get("tool_calls") or []):
            arguments = call.get("arguments", {})
            content.append({"type": "tool_use", "id": call.get("id", f"toolu_{tag}_{position}"), "name": call["name"],
                            "input": orjson.loads(arguments) if isinstance(arguments, str) else arguments})
        content += step.get("blocks") or []  # blocks as given: a server tool's call and its result, ...
        stop = step.get("stop_reason", "tool_use" if step.get("tool_calls") else "end_turn")
        usage = {"input_tokens": 10 * len(body.get("messages") or []), "output_tokens": 5 + 7 * len(content),
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, **(step.get("usage") or {})}
        return {"id": message_id, "type": "message", "role": "assistant", "model": body.get("model", "scripted"),
                "content": content, "stop_reason": stop, "stop_sequence": None, "usage": usage}

    async def reply(self, request: web.Request, message: dict[str, Any], stream: bool) -> web.StreamResponse:
        if not stream:
            return web.Response(body=orjson.dumps(message), content_type="application/json")
        answer = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await answer.prepare(request)
        await answer.write(b"".join(_sse(event) for event in events(message)))
        await answer.write_eof()
        return answer


def events(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The SSE events of a message, in the order Anthropic sends them (a ping after the start)."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {**usage, "output_tokens": 1}}
    out: list[dict[str, Any]] = [{"type": "message_start", "message": start}, {"type": "ping"}]
    for index, block in enumerate(message["content"]):
        out += _block_events(index, block)
    out += [{"type": "message_delta", "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
             "usage": {"output_tokens": usage["output_tokens"]}}, {"type": "message_stop"}]
    return out


def _block_events(index: int, block: dict[str, Any]) -> list[dict[str, Any]]:
    if block["type"] == "text":
        opened = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": block["text"][i:i + 6]} for i in range(0, len(block["text"]), 6)]
    elif block["type"] == "thinking":
        opened = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                  {"type": "signature_delta", "signature": block["signature"]}]
    elif "input" not in block:  # a result block (web_search_tool_result, ...): whole at its start
        opened, deltas = block, []
    else:
        opened = {**block, "input": {}}
        arguments = orjson.dumps(block["input"]).decode()
        deltas = [{"type": "input_json_delta", "partial_json": arguments[i:i + 7]} for i in range(0, len(arguments), 7)]
    return [{"type": "content_block_start", "index": index, "content_block": opened},
            *({"type": "content_block_delta", "index": index, "delta": delta} for delta in deltas),
            {"type": "content_block_stop", "index": index}]


def _fill(content: str | None, body: dict[str, Any]) -> str | None:
    if content and "{tool_result}" in content:
        results = [b for m in body.get("messages") or [] if isinstance(m.get("content"), list)
                   for b in m["content"] if b.get("type") == "tool_result"]
        value = results[-1].get("content") if results else ""
        if isinstance(value, list):
            value = "".join(part.get("text", "") for part in value)
        return content.replace("{tool_result}", str(value))
    return content


def _sse(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
