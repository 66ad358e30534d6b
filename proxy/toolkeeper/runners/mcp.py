"""The agent's MCP servers, as a client: one connection each, its tools, its calls, a restart when it fails.

    McpServers (the agent file's `mcp_servers:`)
      McpConnection: started on first use -> tools listed -> calls, each with the server's timeout
        its last listing kept (McpListing: the tools, and when they were asked for), a listing under way shared
        by whoever needs one as recent; the server's `notifications/tools/list_changed` (sent unasked before the
        2026-07-28 protocol, on a `subscriptions/listen` stream held open from then on) marks it stale
        a call that fails with the connection (the server died) or outlasts its timeout (it hangs):
        a tool error saying so, the connection dropped (a stdio server's process ended), and the next use starts
        it again
      a server with `auth: {token_exchange: ...}`: one connection per caller (`for_caller`), each with that
        caller's exchanged token; a caller without a token of its own reaches none of it (McpCallerRequired)
    McpRunner: a declared tool with `mcp: {server, tool}`, run like any other runner

A connection lives in a task of its own: the SDK's transports are anyio
contexts, entered and left by one task. Nothing here decides or records.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from toolkeeper.common import canonical_json, printable
from toolkeeper.runners.base import OutputBuffer, RunResult
from toolkeeper.runners.mcpauth import Caller, ServerTokens, bearer_auth, current_caller, no_caller_token
from toolkeeper.tools import DeclaredTool, McpServerSpec

log = logging.getLogger("toolkeeper")

CONNECT_TIMEOUT = 30.0  # seconds a server has to start and list its tools
RETRY_AFTER = 30.0  # seconds a server that failed to start is not started again: its callers are told at once
CALLERS_KEPT = 64  # per server with token exchange: the callers' connections kept open, the least recent closed


class McpServerError(Exception):
    """The server could not be reached, failed or did not answer in time; the message says which, for the model."""


class McpServerTimeout(McpServerError):
    """The server did not answer a call within its timeout."""


class McpCallerRequired(McpServerError):
    """The server takes the caller's own token (exchanged), and the caller presented none: refused, not sent."""


@dataclass
class McpAnswer:
    """A `tools/call` result as the server gave it (JSON), to pass on unchanged."""

    result: dict[str, Any]
    duration: float

    @property
    def is_error(self) -> bool:
        return bool(self.result.get("isError"))

    def text(self) -> str:
        """What a model reads of it: the text blocks, else the whole result as JSON."""
        texts = [block.get("text", "") for block in self.result.get("content") or []
                 if isinstance(block, dict) and block.get("type") == "text"]
        return "\n".join(texts) if texts else canonical_json(self.result).decode()


@dataclass(frozen=True)
class McpListing:
    """One `tools/list` of a server: its tools as it listed them (JSON), and when it was asked for."""

    asked: float  # time.monotonic() as the request went: what it says, the server gave then or later
    tools: list[dict[str, Any]]

    @cached_property
    def by_name(self) -> dict[str, dict[str, Any]]:
        return {tool["name"]: tool for tool in self.tools}

    def get(self, name: str) -> dict[str, Any] | None:
        return self.by_name.get(name)


@dataclass
class McpConnection:
    spec: McpServerSpec
    directory: Path = field(default_factory=Path.cwd)  # a relative workdir is the agent file's directory's
    _client: Any = None
    _holder: asyncio.Task[None] | None = None
    _closing: asyncio.Event = field(default_factory=asyncio.Event)
    _starting: asyncio.Lock = field(default_factory=asyncio.Lock)
    listed: McpListing | None = None  # its last listing since it started; None once it stopped
    changed_at: float = 0.0  # time.monotonic() when the server last said its tools changed (list_changed)
    on_changed: Callable[[McpConnection], None] | None = None  # told when it says so (engine/mcppins.py re-lists)
    _under_way: tuple[float, asyncio.Future[McpListing]] | None = None  # the listing asked for last, and when
    _failed: tuple[float, str] | None = None  # when the last start failed, and why
    tokens: ServerTokens | None = None  # its `auth:` tokens, shared with its callers' connections
    caller: Caller | None = None  # whom this connection acts for (token exchange: one connection per caller)
    _callers: OrderedDict[str, McpConnection] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        auth = self.spec.auth
        if auth is not None and self.tokens is None:
            self.tokens = ServerTokens(self.spec.name, auth.client, exchange=auth.per_caller)

    def for_caller(self, caller: Caller | None) -> McpConnection:
        """The connection a call for `caller` goes through: this one, unless the server takes each caller's own
        token; then the caller's (opened on first use), or McpCallerRequired when the caller has no token."""
        if self.spec.auth is None or not self.spec.auth.per_caller:
            return self
        if caller is None or not caller.token:
            raise McpCallerRequired(no_caller_token(self.spec.name))
        connection = self._callers.get(caller.key)
        if connection is None:
            connection = McpConnection(self.spec, self.directory, tokens=self.tokens, caller=Caller(caller.key),
                                       on_changed=self.on_changed)
            self._callers[caller.key] = connection
            if len(self._callers) > CALLERS_KEPT:
                _, oldest = self._callers.popitem(last=False)
                _in_background(oldest.drop())
        self._callers.move_to_end(caller.key)
        if connection.caller.token != caller.token:  # type: ignore[union-attr]
            connection.caller.token = caller.token  # type: ignore[union-attr]  # the latest: a refreshed one
            connection._failed = None  # a start its expired token failed is no reason to wait with a fresh one
        return connection

    async def client(self) -> Any:
        """The connected client, started (or started again) when there is none."""
        if self.spec.auth is not None and self.spec.auth.per_caller and self.caller is None:
            raise McpCallerRequired(no_caller_token(self.spec.name))
        async with self._starting:
            if self._client is None:
                if self._failed is not None and time.monotonic() - self._failed[0] < RETRY_AFTER:
                    # a server that would not start is not waited for again on every listing and call
                    raise McpServerError(f"{self._failed[1]} (it is tried again {RETRY_AFTER:g} s after)")
                await self._start()
            return self._client

    async def _start(self) -> None:
        ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._closing = asyncio.Event()
        self._holder = asyncio.create_task(self._hold(ready), name=f"mcp server {self.spec.name}")
        try:
            self._client = await asyncio.wait_for(asyncio.shield(ready), CONNECT_TIMEOUT)
        except (TimeoutError, McpServerError) as exc:
            await self.drop()
            failure = str(exc) if isinstance(exc, McpServerError) else \
                f"the MCP server {self.spec.name} did not start within {CONNECT_TIMEOUT:g} s"
            self._failed = (time.monotonic(), failure)
            raise McpServerError(failure) from None
        self._failed = None
        log.info("MCP server %s: connected, %d tools", self.spec.name, len(self.tools))

    async def _hold(self, ready: asyncio.Future[Any]) -> None:
        from mcp import Client  # the SDK: for agents that list MCP servers only

        try:
            async with Client(self._transport(), read_timeout_seconds=self.spec.timeout, cache=None,
                              message_handler=self._notified) as client:
                asked = time.monotonic()
                self.listed = McpListing(asked, await _list_all(client))
                ready.set_result(client)
                await self._held(client)
        except Exception as exc:  # the transport's own errors, grouped or not: said once, in words
            if not ready.done():
                ready.set_exception(McpServerError(f"the MCP server {self.spec.name} could not be started: "
                                                   f"{_cause(exc)}"))
            else:
                log.warning("MCP server %s: the connection ended: %s", self.spec.name, printable(_cause(exc)))
        finally:
            self._client = None

    async def _held(self, client: Any) -> None:
        """Until the connection is closed. On a 2026-07-28 connection, a server says its tools changed only on a
        `subscriptions/listen` stream: one is held open meanwhile (an earlier protocol's server says it unasked)."""
        import anyio

        async with anyio.create_task_group() as group:
            group.start_soon(self._listen, client)
            await self._closing.wait()
            group.cancel_scope.cancel()

    async def _listen(self, client: Any) -> None:
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        held = client.protocol_version in MODERN_PROTOCOL_VERSIONS
        while held:
            held = False
            try:
                async with client.listen(tools_list_changed=True) as subscription:
                    held = True
                    async for _ in subscription:  # each event reaches _notified as well, which acts on it
                        pass
            except Exception as exc:  # a server that takes none: its listings are renewed by age alone
                log.debug("MCP server %s: subscriptions/listen: %s", self.spec.name, printable(_cause(exc)))
            if held:  # the stream ended under a live connection: what it missed (no replay) is listed anew
                self.tools_changed()
                await asyncio.sleep(1.0)

    async def _notified(self, message: Any) -> None:
        """What the server sends unasked: `notifications/tools/list_changed` makes its last listing stale."""
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            self.tools_changed()

    def tools_changed(self) -> None:
        """The server said its tools changed: no call is decided on a listing asked for before now."""
        self.changed_at = time.monotonic()
        if self.on_changed is not None:
            self.on_changed(self)

    @property
    def tools(self) -> list[dict[str, Any]]:
        """Its tools as it last listed them, JSON."""
        return self.listed.tools if self.listed is not None else []

    def _transport(self) -> Any:
        if self.spec.url:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            try:
                headers = self.spec.resolved_headers()
            except KeyError as exc:
                raise McpServerError(str(exc.args[0])) from None
            auth = bearer_auth(self.tokens, self.caller) if self.tokens is not None else None
            return streamable_http_client(self.spec.url, http_client=httpx2.AsyncClient(
                headers=headers, auth=auth, timeout=httpx2.Timeout(self.spec.timeout, connect=10.0)))
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        command = self.spec.command or ("",)
        workdir = (self.directory / self.spec.workdir).resolve() if self.spec.workdir else self.directory
        return stdio_client(StdioServerParameters(command=command[0], args=list(command[1:]),
                                                  env=self.spec.environment(), cwd=workdir), errlog=sys.stderr)

    async def refreshed(self) -> list[dict[str, Any]]:
        """Its tools as it lists them now (a server may change them while it runs)."""
        return (await self.listing(time.monotonic())).tools

    @property
    def listing_under_way(self) -> bool:
        return self._under_way is not None and not self._under_way[1].done()

    async def listing(self, since: float) -> McpListing:
        """A listing asked for at `since` (time.monotonic()) or later: its last one when it is that recent, the one
        under way when it was asked for since, else a new one. McpServerError when the server cannot list them (it
        is then dropped, to be started again)."""
        listed = self.listed
        if listed is not None and listed.asked >= since and self._client is not None:
            return listed
        under_way = self._under_way
        if under_way is None or under_way[0] < since or under_way[1].done():
            asked = time.monotonic()
            under_way = self._under_way = (asked, asyncio.ensure_future(self._list(asked)))
            under_way[1].add_done_callback(_retrieved)
        return await asyncio.shield(under_way[1])  # one caller given up on it does not end it for the others

    async def _list(self, asked: float) -> McpListing:
        client = await self.client()  # not running: starting it lists them
        if self.listed is not None and self.listed.asked >= asked:
            return self.listed
        try:
            listing = McpListing(asked, await asyncio.wait_for(_list_all(client), self.spec.timeout))
        except Exception as exc:
            await self.drop()
            raise McpServerError(f"the MCP server {self.spec.name} did not list its tools ({_cause(exc)})") from None
        if self._client is client and (self.listed is None or self.listed.asked < asked):  # a later one may be in
            self.listed = listing
        return listing

    async def call(self, tool: str, arguments: dict[str, Any], timeout: float | None = None) -> McpAnswer:
        """One `tools/call`; a server that fails or outlasts the timeout (its own, unless a declared tool's is
        given) is dropped, to be started again."""
        client = await self.client()
        timeout = timeout or self.spec.timeout
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout):  # not wait_for: no task of its own for each call
                result = await client.call_tool(tool, arguments, read_timeout_seconds=timeout)
        except TimeoutError:
            await self.drop()
            raise McpServerTimeout(f"the MCP server {self.spec.name} did not answer within {timeout:g} s; the call "
                                 "was abandoned and the server is started again") from None
        except Exception as exc:  # the connection failed mid-call (the server died), or the server refused it
            if self._client is not client or _connection_lost(exc):
                await self.drop()
                raise McpServerError(f"the MCP server {self.spec.name} failed during the call ({_cause(exc)}); it "
                                     "is started again for the next call") from None
            raise McpServerError(f"the MCP server {self.spec.name} refused the call: {_cause(exc)}") from None
        return McpAnswer(result.model_dump(mode="json", by_alias=True, exclude_none=True),
                         time.monotonic() - started)

    async def drop(self) -> None:
        """The connection ended (a stdio server's process with it), and its callers' connections with it."""
        callers, self._callers = list(self._callers.values()), OrderedDict()
        self.listed = None  # a server started again is listed again
        await asyncio.gather(*(connection.drop() for connection in callers))
        holder, self._holder, self._client = self._holder, None, None
        if holder is None:
            return
        self._closing.set()
        try:
            await asyncio.wait_for(asyncio.shield(holder), 5.0)
        except (TimeoutError, Exception):
            holder.cancel()
            with contextlib.suppress(BaseException):
                await holder


async def _list_all(client: Any) -> list[dict[str, Any]]:
    """Every page of the server's tools, as JSON."""
    tools: list[dict[str, Any]] = []
    cursor = None
    for _ in range(100):  # a server paging forever is cut off
        page = await client.list_tools(cursor=cursor)
        tools += [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in page.tools]
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


_BACKGROUND: set[asyncio.Task[Any]] = set()  # held until done: the loop keeps only weak references to tasks


def _in_background(work: Coroutine[Any, Any, Any]) -> None:
    task = asyncio.get_running_loop().create_task(work)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


def _retrieved(done: asyncio.Future[Any]) -> None:
    """A listing no one waits for any more: its failure is not logged as never retrieved."""
    if not done.cancelled():
        done.exception()


def _connection_lost(exc: BaseException) -> bool:
    text = _cause(exc).lower()
    return any(word in text for word in ("closed", "connection", "eof", "broken pipe", "terminated"))


def _cause(exc: BaseException) -> str:
    """The first real error inside an exception group, in words."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return printable(str(exc) or type(exc).__name__)


class McpServers:
    """The agent file's MCP servers, each connected on first use."""

    def __init__(self, specs: Iterable[McpServerSpec], directory: Path | None = None):
        self.connections = {spec.name: McpConnection(spec, directory or Path.cwd()) for spec in specs}

    def __bool__(self) -> bool:
        return bool(self.connections)

    def get(self, name: str) -> McpConnection:
        return self.connections[name]

    def watch(self, on_changed: Callable[[McpConnection], None]) -> None:
        """`on_changed(connection)` when a server says its tools changed (its callers' connections too)."""
        for connection in self.connections.values():
            connection.on_changed = on_changed

    async def close(self) -> None:
        await asyncio.gather(*(connection.drop() for connection in self.connections.values()))


class McpRunner:
    """A declared tool run by an MCP server's tool: the declaration's checked values are its arguments."""

    def __init__(self, servers: McpServers):
        self.servers = servers

    async def run(self, tool: DeclaredTool, argv: list[str], values: dict[str, Any]) -> RunResult:
        target = tool.spec.mcp
        assert target is not None
        stdout, stderr = OutputBuffer(tool.spec.max_output), OutputBuffer(4096)
        started = time.monotonic()
        try:
            connection = self.servers.get(target.server).for_caller(current_caller())
            answer = await connection.call(target.tool, values, tool.spec.timeout)
        except McpServerError as exc:
            timed_out = isinstance(exc, McpServerTimeout)
            return RunResult("timeout" if timed_out else "error", None, stdout, stderr, time.monotonic() - started,
                             detail=f"{tool.spec.timeout:g} s" if timed_out else str(exc), subject="MCP tool")
        stdout.feed(answer.text().encode())
        return RunResult("failed" if answer.is_error else "ok", 1 if answer.is_error else 0, stdout, stderr,
                         answer.duration, subject="MCP tool")
