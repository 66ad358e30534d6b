"""A scripted model server: the one stand-in allowed, since no model runs here.

It speaks Chat Completions as OpenAI does, SSE included (the Responses and
Messages APIs: responses.py, messages.py beside it), replays scripted
responses in order, records every request, and reproduces real servers'
quirks on demand. `toolkeeper model`, the demo and the tests run it.

A step of the script:

    {"content": "text", "tool_calls": [{"name": "release", "arguments": {...}, "extra": {...}}],
     "finish_reason": "tool_calls", "usage": {...}, "reasoning_content": "...",
     "message_extra": {...}, "quirks": ["no_ids", ...], "delay": 0.1, "repeat": false}
    {"status": 500, "body": {...}}        an error answer
    {"hang": true}                        never answers
    {"raw": "text", "content_type": "..."} these exact bytes

Any step may carry `"when": "text"`: it then answers only a request whose last
user message contains that text (for concurrent conversations), and
`"answering": true` (or false): only a request that ends (or does not end)
with tool results, so a repeated step answers retried requests alike; and
`"offered": "name"`: only a request that offers a tool of that name.

In `content`, `{tool_result}` is replaced by the last tool message the request
carried, so a scripted answer can quote what a tool printed.

Quirks: args_one_chunk, split_escape (arguments in 1-3 character pieces, inside
escapes too), byte_drip (the body written a few bytes at a time, splitting
multi-byte characters), args_object (llama.cpp), no_ids, empty_ids, int_ids
(vLLM, LM Studio), name_every_delta, stop_with_tools (Ollama, gpt-4o),
all_index_0 (Ollama), azure_empty_first, error_mid_stream, drop_mid_stream,
garbage_mid_stream, no_done, json_when_streaming.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from toolkeeper.scripted.messages import MessagesScript
from toolkeeper.scripted.messages import check as check_messages
from toolkeeper.scripted.responses import Rejected, ResponsesScript

MODEL = "scripted-model"


class ScriptedModel:
    def __init__(self, steps: list[dict[str, Any]] | None = None):
        self.steps: list[dict[str, Any]] = list(steps or [])
        self.requests: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self.responses_script = ResponsesScript()
        self.messages_script = MessagesScript()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/messages/count_tokens", self.count_tokens)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_post("/_script", self.set_script)
        app.router.add_get("/_requests", self.get_requests)
        return app

    def _next_step(self, body: dict[str, Any]) -> dict[str, Any]:
        """The first step for this request: steps with `when` answer only requests whose last
        user message contains it, so concurrent conversations each get their own script."""
        conversation = body.get("messages") or body.get("input") or []
        if isinstance(conversation, str):
            conversation = [{"role": "user", "content": conversation}]
        asked = next((str(m.get("content")) for m in reversed(conversation)
                      if isinstance(m, dict) and m.get("role") == "user" and not _only_results(m)), "")
        last = conversation[-1] if conversation and isinstance(conversation[-1], dict) else {}
        answering = last.get("role") == "tool" or last.get("type") == "function_call_output" or _only_results(last)
        offered = {(tool.get("function") or tool).get("name") for tool in body.get("tools") or []
                   if isinstance(tool, dict)}
        for position, step in enumerate(self.steps):
            if step.get("answering", answering) != answering:
                continue
            if step.get("offered") is not None and step["offered"] not in offered:
                continue
            if step.get("when") is None or step["when"] in asked:
                return step if step.get("repeat") else self.steps.pop(position)
        return {"status": 500, "body": {"error": {"message": "no scripted response fits this request",
                                                  "type": "server_error"}}}

    # -- control -------------------------------------------------------------

    async def set_script(self, request: web.Request) -> web.Response:
        data = orjson.loads(await request.read())
        if data.get("append"):  # another conversation joins those under way
            self.steps.extend(data.get("steps") or [])
        else:
            self.steps = list(data.get("steps") or [])
            self.requests = []
        return web.json_response({"steps": len(self.steps)})

    async def get_requests(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(self.requests), content_type="application/json")

    # -- the OpenAI API ------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        # the cookies and credentials that reached the model server, for tests of what is forwarded
        seen = {"X-Seen-Cookie": request.headers.get("Cookie", ""),
                "X-Seen-Authorization": request.headers.get("Authorization", "")}
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "created": 1700000000,
                                                               "owned_by": "toolkeeper-tests"}]}, headers=seen)

    async def embeddings(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        return web.json_response({"object": "list", "model": body.get("model", MODEL), "data": [
            {"object": "embedding", "index": 0, "embedding": [0.25, -0.5, 0.125]}],
            "usage": {"prompt_tokens": 3, "total_tokens": 3}})

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.requests.append({"body": body, "headers": {str(k): v for k, v in request.headers.items()}})
        try:
            context = self.responses_script.context(body)
        except Rejected as exc:
            return web.json_response(exc.body, status=400)
        step = self._next_step(body) if self.steps else {"status": 500}
        if step.get("delay"):
            await asyncio.sleep(step["delay"])
        if step.get("hang"):
            await asyncio.sleep(3600)
        if "status" in step and not isinstance(step["status"], str):
            payload = step.get("body", {"error": {"message": "scripted failure", "type": "server_error"}})
            return web.json_response(payload, status=step["status"])
        if "raw" in step:
            return web.Response(body=step["raw"].encode(), headers={
                "Content-Type": step.get("content_type", "application/json")})
        response = self.responses_script.answer(step, body, context)
        return await self.responses_script.reply(request, response, bool(body.get("stream")))

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.requests.append({"body": body, "headers": {str(k): v for k, v in request.headers.items()},
                              "query": request.query_string})
        try:
            check_messages(body)
        except Rejected as exc:
            return web.json_response(exc.body, status=400)
        step = self._next_step(body) if self.steps else {"status": 500}
        if step.get("delay"):
            await asyncio.sleep(step["delay"])
        if "status" in step:
            payload = step.get("body", {"type": "error", "error": {"type": "api_error", "message": "scripted"}})
            return web.json_response(payload, status=step["status"])
        if "raw" in step:
            return web.Response(body=step["raw"].encode(), headers={
                "Content-Type": step.get("content_type", "application/json")})
        message = self.messages_script.answer(step, body)
        return await self.messages_script.reply(request, message, bool(body.get("stream")))

    async def count_tokens(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        return web.json_response({"input_tokens": 10 * len(body.get("messages") or []) + 100 * len(
            body.get("tools") or []), "tools_seen": [t.get("name") for t in body.get("tools") or []]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.requests.append({"body": body, "headers": {str(k): v for k, v in request.headers.items()}})
        if not self.steps:
            return web.json_response({"error": {"message": "the scripted model has no more responses",
                                                "type": "server_error", "code": None}}, status=500)
        step = self._next_step(body)
        if step.get("delay"):
            await asyncio.sleep(step["delay"])
        if step.get("hang"):
            await asyncio.sleep(3600)
        if "status" in step:
            payload = step.get("body", {"error": {"message": "scripted failure", "type": "server_error"}})
            data = payload.encode() if isinstance(payload, str) else orjson.dumps(payload)
            return web.Response(status=step["status"], body=data, content_type="application/json")
        if "raw" in step:
            return web.Response(body=step["raw"].encode(), headers={
                "Content-Type": step.get("content_type", "application/json")})
        quirks = set(step.get("quirks") or [])
        response = _Response(step, body, f"chatcmpl-scripted{next(self._ids)}", quirks)
        if body.get("stream") and "json_when_streaming" not in quirks:
            return await response.stream(request)
        return web.Response(body=orjson.dumps(response.whole()), content_type="application/json")


class _Response:
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


def _only_results(message: dict[str, Any]) -> bool:
    """An Anthropic user message that only carries tool results: not what the user asked."""
    content = message.get("content")
    return isinstance(content, list) and bool(content) and all(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content)


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


async def serve_scripted(model: ScriptedModel, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(model.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    sockets = site._server.sockets  # type: ignore[union-attr]
    return runner, sockets[0].getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m toolkeeper.scripted", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    parser.add_argument("--port", type=int, default=0, help="the port (0: a free one)")
    parser.add_argument("--script", help="a JSON file with a list of steps")
    args = parser.parse_args()
    sys.exit(run_scripted(orjson.loads(Path(args.script).read_bytes()) if args.script else [], args.host, args.port))


def run_scripted(steps: list[dict[str, Any]], host: str, port: int, origin: str = "") -> int:
    """Serve the script until interrupted: 0, or 1 when the port cannot be had."""

    async def run() -> None:
        runner, bound = await serve_scripted(ScriptedModel(steps), host, port)
        print(f"scripted model listening on http://{host}:{bound}/v1{origin}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(run())
    except OSError as exc:
        print(f"toolkeeper: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0

