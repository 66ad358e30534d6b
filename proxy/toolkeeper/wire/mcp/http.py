"""`/mcp` on serve: MCP's Streamable HTTP transport, the SDK's, served from aiohttp.

    POST/GET/DELETE /mcp -> Origin checked (the server's middleware: a page elsewhere is refused, against DNS
                            rebinding) -> the agent's key (Bearer, as for the model API) -> the SDK's session
                            manager, called as the ASGI app it is

The SDK's manager is an ASGI app; the bridge below hands it the request and
writes what it sends, streamed (its answers may be SSE). Its task group lives
in a task of its own for the server's lifetime: anyio scopes are left by the
task that entered them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from toolkeeper.common import is_loopback
from toolkeeper.wire.errors import OPENAI
from toolkeeper.wire.guard import AGENT_NAME
from toolkeeper.wire.mcp.server import AGENT_SCOPE_KEY

log = logging.getLogger("toolkeeper")

PATH = "/mcp"


class McpEndpoint:
    """The `/mcp` route and the lifetime of the SDK's session manager."""

    def __init__(self, server: Any, *, keys_required: bool, host: str):
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

        self.manager = StreamableHTTPSessionManager(app=server, security_settings=None)
        # Beyond loopback, a call of a declared tool needs to say who makes it.
        self.keys_required = keys_required or not is_loopback(host)

    async def lifetime(self, app: web.Application) -> AsyncIterator[None]:
        """For `cleanup_ctx`: the manager runs in its own task until the server stops."""
        started, stop = asyncio.Event(), asyncio.Event()

        async def hold() -> None:
            async with self.manager.run():
                started.set()
                await stop.wait()

        holder = asyncio.create_task(hold(), name="mcp session manager")
        await started.wait()
        yield
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(holder, 5.0)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        agent = request.get(AGENT_NAME)
        if agent is None and self.keys_required:
            return OPENAI.refusal(401, "/mcp needs an agent key (Authorization: Bearer KEY, a key listed under "
                                       "`agents:`) when toolkeeper listens beyond this machine", "invalid_api_key")
        return await asgi(self.manager.handle_request, request, {AGENT_SCOPE_KEY: agent})


async def asgi(app: Any, request: web.Request, state: dict[str, Any]) -> web.StreamResponse:
    """One request through an ASGI app, its answer streamed back as it is sent."""
    body = await request.read()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": request.method,
             "scheme": request.scheme, "path": request.path, "raw_path": request.raw_path.encode(),
             "query_string": request.query_string.encode(), "root_path": "",
             "headers": [(name.lower(), value) for name, value in request.raw_headers],
             "client": (request.remote or "", 0), "server": (request.host, 0), **state}
    delivered = False
    done = asyncio.Event()
    response: web.StreamResponse | None = None

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal response
        if message["type"] == "http.response.start":
            headers = CIMultiDict((name.decode("latin-1"), value.decode("latin-1"))
                                  for name, value in message.get("headers", []))
            response = web.StreamResponse(status=message["status"], headers=headers)
            await response.prepare(request)
        elif message["type"] == "http.response.body" and response is not None:
            if message.get("body"):
                await response.write(message["body"])
            if not message.get("more_body"):
                await response.write_eof()

    try:
        await app(scope, receive, send)
    finally:
        done.set()
    if response is None:
        return OPENAI.refusal(502, "the MCP transport gave no answer", "mcp_no_answer")
    return response
