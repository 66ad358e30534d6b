"""What every agent API adapter does the same way: read the JSON body, say who asks, count the answer.

An adapter (Chat Completions, Responses, ...) subclasses `AgentAPI` and
implements `answer(request, body, raw)`; errors before the turn are 4xx in the
OpenAI error shape (`bad_request`).
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from toolkeeper.engine import Engine, TurnContext
from toolkeeper.metrics import Metrics
from toolkeeper.wire.guard import AGENT_NAME, is_json
from toolkeeper.wire.upstream import Upstream, UpstreamError, error_body

KEEPALIVE = b": keep-alive\n\n"


def bad_request(message: str, code: str = "invalid_request", status: int = 400) -> web.Response:
    return web.Response(status=status, body=error_body(message, code, "invalid_request_error"),
                        content_type="application/json")


def error_response(error: UpstreamError) -> web.Response:
    return web.Response(status=error.status, body=error.body, headers={"Content-Type": error.content_type})


def credentials_hash(headers: Any) -> str:
    """A hash of the agent's credentials: who the agent is, never the key itself."""
    credential = headers.get("Authorization") or headers.get("api-key") or headers.get("x-api-key") or ""
    return hashlib.sha256(b"toolkeeper-tenant\x00" + credential.encode()).hexdigest()


class AgentAPI:
    api = "chat"  # what records say the agent spoke
    name = "Chat"

    def __init__(self, engine: Engine, upstream: Upstream, *, keepalive: float = 5.0,
                 identity_header: str | None = None, metrics: Metrics | None = None):
        self.engine = engine
        self.upstream = upstream
        self.keepalive = keepalive
        self.identity_header = identity_header  # set by the deployment, read by policies
        self.metrics = metrics

    async def handle(self, request: web.Request) -> web.StreamResponse:
        response = await self._handle(request)
        if self.metrics is not None:
            self.metrics.count("toolkeeper_requests_total", "Agent requests answered, by API, streaming and status.",
                               api=self.api, stream=str(response.content_type == "text/event-stream").lower(),
                               code=str(response.status))
        return response

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if not is_json(request.headers.get("Content-Type", "")):
            # a web page can post text/plain without asking first; an agent always sends JSON
            return bad_request("the request body must be sent as Content-Type: application/json",
                               "unsupported_content_type", status=415)
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return bad_request(f"the request body is not valid JSON: {exc}")
        return await self.answer(request, body, raw)

    async def answer(self, request: web.Request, body: Any, raw: bytes) -> web.StreamResponse:
        raise NotImplementedError

    def context(self, request: web.Request, raw: bytes) -> TurnContext:
        tenant = credentials_hash(request.headers)
        return TurnContext(
            request_id=request.headers.get("X-Request-Id") or secrets.token_hex(8),
            agent=request.get(AGENT_NAME) or tenant[:16],
            tenant=tenant,
            request_key=hashlib.sha256(tenant.encode() + b"\x00" + raw).hexdigest(),
            agent_header=request.headers.get(self.identity_header) if self.identity_header else None,
            api=self.api,
        )


async def keep_alive(every: float, write: Callable[[bytes], Awaitable[None]]) -> None:
    """SSE comments while a declared call is decided or run: the agent's connection stays open."""
    while True:
        await asyncio.sleep(every)
        await write(KEEPALIVE)
