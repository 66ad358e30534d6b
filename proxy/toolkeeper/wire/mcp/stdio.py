"""`toolkeeper mcp`'s server over stdio, which answers the handshake before toolkeeper's app exists.

`initialize` needs only the SDK and what this module says (the server's name,
version, instructions and capabilities, the same as `build_server`'s); the app
(the stores, the trail, the rules, the engine, the agent's MCP servers) is
built when a request first needs it, and that request and every later one go
to the server `build_server` made for it. So an agent starting its session
waits for toolkeeper's imports only when it asks for its tools, not to connect.
Nothing here imports the engine, the policy or aiohttp.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

NAME = "toolkeeper"
INSTRUCTIONS = ("Tools served by toolkeeper: each call is checked against its declaration and the security team's "
                "rules, may wait for a person's approval, and is recorded.")
METHODS = ("tools/list", "tools/call")  # what build_server's server answers besides the handshake


def deferred_server(built: Callable[[], Awaitable[Any]], version: str = "") -> Any:
    """An MCP server that answers as the one `built()` returns (build_server's), with the same name, version,
    instructions and capabilities; each of its requests awaits `built()` first, the handshake does not."""
    from mcp.server.lowlevel import Server

    async def list_tools(ctx: Any, params: Any) -> Any:
        return await _handler(await built(), "tools/list")(ctx, params)

    async def call_tool(ctx: Any, params: Any) -> Any:
        return await _handler(await built(), "tools/call")(ctx, params)

    return Server(NAME, version=version, instructions=INSTRUCTIONS, on_list_tools=list_tools, on_call_tool=call_tool)


def _handler(server: Any, method: str) -> Callable[[Any, Any], Awaitable[Any]]:
    return server.get_request_handler(method).handler


async def serve_stdio(server: object) -> None:
    """The server over this process's stdin and stdout, until the client closes them."""
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())  # type: ignore[attr-defined]
