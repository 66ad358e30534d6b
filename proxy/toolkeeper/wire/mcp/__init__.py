"""MCP, served: toolkeeper's tools and the agent's MCP servers' tools over stdio and Streamable HTTP (`/mcp`), the
latter an OAuth 2.1 protected resource when `auth.mcp` names an authorization server."""

from toolkeeper.wire.mcp.http import PATH, McpEndpoint
from toolkeeper.wire.mcp.oauth import METADATA_PATHS, McpCaller, ProtectedResource
from toolkeeper.wire.mcp.server import ElicitationConsent, build_server

__all__ = ["METADATA_PATHS", "PATH", "ElicitationConsent", "McpCaller", "McpEndpoint", "ProtectedResource",
           "build_server", "serve_stdio"]


async def serve_stdio(server: object) -> None:
    """The server over this process's stdin and stdout, until the client closes them."""
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())  # type: ignore[attr-defined]
