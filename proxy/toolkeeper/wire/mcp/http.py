"""`/mcp` on serve: MCP's Streamable HTTP transport, the SDK's, served from aiohttp.

    POST/GET/DELETE /mcp -> Origin checked (the server's middleware: a page elsewhere is refused, against DNS
                            rebinding) -> the agent's key (Bearer, as for the model API), or with `auth.mcp` an
                            OAuth access token for this resource (oauth.py) -> the session's owner (owners.py:
                            only the credential that opened a session may use it) -> the SDK's session manager,
                            called as the ASGI app it is, the principal in its scope

The SDK's manager is an ASGI app; the bridge below hands it the request and
writes what it sends, streamed (its answers may be SSE). Its task group lives
in a task of its own for the server's lifetime: anyio scopes are left by the
task that entered them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from toolkeeper.common import is_loopback
from toolkeeper.wire.errors import OPENAI
from toolkeeper.wire.guard import AGENT_NAME, PRINCIPAL, SUBJECT_TOKEN
from toolkeeper.wire.mcp.oauth import McpCaller, ProtectedResource
from toolkeeper.wire.mcp.owners import Credential, SessionOwners
from toolkeeper.wire.mcp.server import (
    AGENT_HEADER_SCOPE_KEY,
    AGENT_SCOPE_KEY,
    PRINCIPAL_SCOPE_KEY,
    SUBJECT_TOKEN_SCOPE_KEY,
)

log = logging.getLogger("toolkeeper")

PATH = "/mcp"
DISCONNECT_GRACE = 5.0  # seconds the SDK has to end a response whose client has gone, before it is cancelled


class McpEndpoint:
    """The `/mcp` route and the lifetime of the SDK's session manager."""

    def __init__(self, server: Any, *, keys_required: bool, host: str, identity_header: str | None = None,
                 resource: ProtectedResource | None = None):
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

        self.manager = StreamableHTTPSessionManager(app=server, security_settings=None)
        # Beyond loopback, a call of a declared tool needs to say who makes it.
        self.keys_required = keys_required or not is_loopback(host)
        self.owners = SessionOwners()  # a session answers only to the credential that opened it
        self.identity_header = identity_header  # serve's --identity-header: `agent.header`, as on the model APIs
        self.resource = resource  # with `auth.mcp`: every request shows a listed key or an access token for /mcp

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
        caller = await self._caller(request)
        if isinstance(caller, web.StreamResponse):
            return caller
        principal = caller.principal if caller is not None else request.get(PRINCIPAL)
        agent = (principal.agent or None) if principal is not None else request.get(AGENT_NAME)
        if agent is None and self.keys_required and caller is None:
            return OPENAI.refusal(401, "/mcp needs an agent key (Authorization: Bearer KEY, a key listed under "
                                       "`agents:`) when toolkeeper listens beyond this machine", "invalid_api_key")
        # a token-borne principal is bound by who it names: its client refreshes the token within the session
        subject_token = _subject_token(request, caller)
        credential = Credential.of(request, principal, token=subject_token is not None)
        refused = self.owners.refusal(request, credential)
        if refused is not None:
            return refused
        state = {AGENT_SCOPE_KEY: agent, AGENT_HEADER_SCOPE_KEY: self._agent_header(request),
                 PRINCIPAL_SCOPE_KEY: principal, SUBJECT_TOKEN_SCOPE_KEY: subject_token,
                 "user": credential.as_scope_user()}
        # the owner is noted as the answer starts: the client may use the session it names before the answer ends
        return await asgi(self.manager.handle_request, request, state,
                          starting=lambda response: self.owners.note(request, credential, response))

    async def _caller(self, request: web.Request) -> McpCaller | web.StreamResponse | None:
        """With OAuth at /mcp: who the request is from, or its refusal; None when the guard has said who."""
        return await self.resource.caller(request) if self.resource is not None else None

    def _agent_header(self, request: web.Request) -> str | None:
        return request.headers.get(self.identity_header) if self.identity_header else None


def _subject_token(request: web.Request, caller: McpCaller | None) -> str | None:
    """The caller's own token, to exchange for another server's: /mcp's access token, or a JWT agent's."""
    if caller is not None:
        return caller.token
    return request.get(SUBJECT_TOKEN)


def _scope(request: web.Request, state: dict[str, Any]) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": request.method,
            "scheme": request.scheme, "path": request.path, "raw_path": request.raw_path.encode(),
            "query_string": request.query_string.encode(), "root_path": "",
            "headers": [(name.lower(), value) for name, value in request.raw_headers],
            "client": (request.remote or "", 0), "server": (request.host, 0), **state}


async def _run_apart(call: Any, done: asyncio.Event) -> None:
    """The app runs in a task of its own: aiohttp cancels this handler when the client disconnects, and that
    cancellation, raised inside the SDK, would discard a session whose `initialize` was answered a moment before.
    A client gone is told to the app as ASGI says (`http.disconnect`), and the app ends its response itself."""
    running = asyncio.create_task(call, name="mcp request")
    try:
        await asyncio.shield(running)
    except asyncio.CancelledError:
        done.set()
        await asyncio.wait({running}, timeout=DISCONNECT_GRACE)
        if not running.done():
            running.cancel()
        elif not running.cancelled():
            running.exception()  # taken: an error in a response no one will read is not news
        raise


async def asgi(app: Any, request: web.Request, state: dict[str, Any],
               starting: Callable[[web.StreamResponse], None] | None = None) -> web.StreamResponse:
    """One request through an ASGI app, its answer streamed back as it is sent; `starting` sees the answer's
    status and headers before the client does."""
    body = await request.read()
    scope = _scope(request, state)
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
        if done.is_set():  # the client has gone: what is left to write is dropped, as an ASGI server drops it
            return
        try:
            await _write(message)
        except ConnectionError:
            # The client closed its connection (say, right after reading `initialize`'s answer). That ends this
            # response, not the MCP session: raised into the SDK, it would discard the session it just opened.
            done.set()

    async def _write(message: dict[str, Any]) -> None:
        nonlocal response
        if message["type"] == "http.response.start":
            headers = CIMultiDict((name.decode("latin-1"), value.decode("latin-1"))
                                  for name, value in message.get("headers", []))
            response = web.StreamResponse(status=message["status"], headers=headers)
            if starting is not None:
                starting(response)
            await response.prepare(request)
        elif message["type"] == "http.response.body" and response is not None:
            if message.get("body"):
                await response.write(message["body"])
            if not message.get("more_body"):
                await response.write_eof()

    try:
        await _run_apart(app(scope, receive, send), done)
    finally:
        done.set()
    if response is None:
        return OPENAI.refusal(502, "the MCP transport gave no answer", "mcp_no_answer")
    return response
