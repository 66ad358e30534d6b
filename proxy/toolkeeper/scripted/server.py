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
`"offered": "name"`: only a request that offers a tool of that name. A step answers
once and is used up, unless it says `"repeat": true`: it then answers every
request it fits, so a script whose steps all repeat serves any number of clients.

In `content`, `{tool_result}` is replaced by the last tool message the request
carried, so a scripted answer can quote what a tool printed.

Canaries: a request that holds a secret a test planted (`POST /_canaries`, or
TOOLKEEPER_SCRIPTED_CANARIES) is refused with a 400 naming it (canaries.py).

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
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from toolkeeper.scripted.canaries import Canaries
from toolkeeper.scripted.chat import MODEL, ChatAnswer
from toolkeeper.scripted.messages import MessagesScript
from toolkeeper.scripted.messages import check as check_messages
from toolkeeper.scripted.responses import Rejected, ResponsesScript

# A used-up script is the first thing a newcomer meets on a second request: the error says the way out.
KEEP_ANSWERING = " (a step with `repeat: true` answers every request it fits)"


class ScriptedModel:
    def __init__(self, steps: list[dict[str, Any]] | None = None):
        self.steps: list[dict[str, Any]] = list(steps or [])
        self.requests: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self.responses_script = ResponsesScript()
        self.messages_script = MessagesScript()
        self.canaries = Canaries.from_environment()  # secrets no request may hold (canaries.py)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_get("/v1/responses/{id}", self.stored_response)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/messages/count_tokens", self.count_tokens)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_post("/_script", self.set_script)
        app.router.add_post("/_canaries", self.set_canaries)
        app.router.add_get("/_requests", self.get_requests)
        app.router.add_route("*", "/{tail:.*}", self.unknown)
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
        return {"status": 500, "body": {"error": {"message": f"no scripted response fits this request{KEEP_ANSWERING}",
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

    async def set_canaries(self, request: web.Request) -> web.Response:
        data = orjson.loads(await request.read())
        self.canaries.plant(data.get("canaries") or {}, append=bool(data.get("append")))
        return web.json_response({"canaries": sorted(self.canaries.planted)})

    def _leaked(self, body: Any, api: str, request: web.Request) -> web.Response | None:
        """A request holding a canary: recorded, and refused in its API's shape (canaries.py)."""
        name = self.canaries.leaked(body)
        if name is None:
            return None
        self.requests.append({"body": body, "headers": {str(k): v for k, v in request.headers.items()},
                              "canary": name})
        print(f"scripted model: a request to {request.path} holds the canary {name!r}", file=sys.stderr, flush=True)
        return web.json_response(self.canaries.refusal(name, api), status=400)

    async def get_requests(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(self.requests), content_type="application/json")

    async def unknown(self, request: web.Request) -> web.Response:
        """A path no API here has: recorded (a test can see what reached the model server), and a 404 as
        OpenAI answers one."""
        self.requests.append({"path": request.path, "method": request.method, "body": None,
                              "headers": {str(k): v for k, v in request.headers.items()}})
        return web.json_response({"error": {"message": f"Invalid URL ({request.method} {request.path})",
                                            "type": "invalid_request_error", "param": None, "code": None}},
                                 status=404)

    # -- the OpenAI API ------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        # the cookies and credentials that reached the model server, for tests of what is forwarded
        seen = {"X-Seen-Cookie": request.headers.get("Cookie", ""),
                "X-Seen-Authorization": request.headers.get("Authorization", "")}
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "created": 1700000000,
                                                               "owned_by": "toolkeeper-tests"}]}, headers=seen)

    async def embeddings(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        refused = self._leaked(body, "chat", request)
        if refused is not None:
            return refused
        return web.json_response({"object": "list", "model": body.get("model", MODEL), "data": [
            {"object": "embedding", "index": 0, "embedding": [0.25, -0.5, 0.125]}],
            "usage": {"prompt_tokens": 3, "total_tokens": 3}})

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        refused = self._leaked(body, "responses", request)
        if refused is not None:
            return refused
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

    async def stored_response(self, request: web.Request) -> web.Response:
        stored = self.responses_script.responses.get(request.match_info["id"])
        if stored is None:
            return web.json_response({"error": {"message": f"Response with id '{request.match_info['id']}' not "
                                                "found.", "type": "invalid_request_error", "param": None,
                                                "code": None}}, status=404)
        return web.json_response(stored)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        refused = self._leaked(body, "messages", request)
        if refused is not None:
            return refused
        self.requests.append({"body": body, "headers": {str(k): v for k, v in request.headers.items()},
                              "query": request.query_string})
        try:
            check_messages(body, request.headers.get("anthropic-beta", ""))
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
        refused = self._leaked(body, "messages", request)
        if refused is not None:
            return refused
        return web.json_response({"input_tokens": 10 * len(body.get("messages") or []) + 100 * len(
            body.get("tools") or []), "tools_seen": [t.get("name") for t in body.get("tools") or []]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        refused = self._leaked(body, "chat", request)
        if refused is not None:
            return refused
        self.requests.append({"body": body, "headers": {str(k): v for k, v in request.headers.items()}})
        if not self.steps:
            return web.json_response({"error": {"message": f"the scripted model has no more responses{KEEP_ANSWERING}",
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
        response = ChatAnswer(step, body, f"chatcmpl-scripted{next(self._ids)}", quirks)
        if body.get("stream") and "json_when_streaming" not in quirks:
            return await response.stream(request)
        return web.Response(body=orjson.dumps(response.whole()), content_type="application/json")


def _only_results(message: dict[str, Any]) -> bool:
    """An Anthropic user message that only carries tool results: not what the user asked."""
    content = message.get("content")
    return isinstance(content, list) and bool(content) and all(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content)


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

