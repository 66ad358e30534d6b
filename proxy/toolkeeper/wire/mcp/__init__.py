"""MCP, served: toolkeeper's tools and the agent's MCP servers' tools over stdio and Streamable HTTP (`/mcp`), the
latter an OAuth 2.1 protected resource when `auth.mcp` names an authorization server.

    server.py   the SDK's server on the engine's door (build_server), for both transports
    stdio.py    `toolkeeper mcp`: the same server over stdio, answering the handshake before the app is built
    http.py     `/mcp` on serve (aiohttp), its OAuth metadata (oauth.py) and session owners (owners.py)
"""

import importlib
from typing import Any

# Each name's module, imported when the name is first used: `toolkeeper mcp` answers `initialize` with stdio.py
# alone, before the engine, the policy and aiohttp are imported.
_HOMES = {
    "toolkeeper.wire.mcp.http": ("PATH", "McpEndpoint"),
    "toolkeeper.wire.mcp.oauth": ("METADATA_PATHS", "McpCaller", "ProtectedResource"),
    "toolkeeper.wire.mcp.server": ("ElicitationConsent", "build_server"),
    "toolkeeper.wire.mcp.stdio": ("deferred_server", "serve_stdio"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'toolkeeper.wire.mcp' has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(module), name)
    return value


__all__ = ["METADATA_PATHS", "PATH", "ElicitationConsent", "McpCaller", "McpEndpoint", "ProtectedResource",
           "build_server", "deferred_server", "serve_stdio"]
