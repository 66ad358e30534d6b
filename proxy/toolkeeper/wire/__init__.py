"""The HTTP side: the agent APIs' adapters, the upstream client, /toolkeeper/ (admin API, console), interception,
pass-through.

    server.py     the app: routes, probes, pass-through; guard.py: web pages and agent keys
    apis/         one room per agent API (chat, responses, messages), each of one design
    upstream.py   the model server client; errors.py: every error shape, one mapping of upstream failures
    hooks.py      the agents' own hook formats (Claude Code, Gemini CLI, Codex CLI), read and answered
    admin/        /toolkeeper/: the admin API, its guard, browser sessions, the console
    intercept/    requests `toolkeeper intercept` re-routed, and its mitmproxy addon

A new agent API is a new room in `apis/`, translating to and from the
engine's neutral turn; the engine gains nothing HTTP. This layer never picks
a runner or a policy: the composition root (`toolkeeper.app`) hands it what it
serves.
"""

from toolkeeper.wire.admin import AdminGuard, Console, admin_app, approvals_api, pins_api, tools_api
from toolkeeper.wire.apis import ChatCompletions, anthropic_tool, flat_tool
from toolkeeper.wire.errors import UpstreamError
from toolkeeper.wire.hooks import (
    HOOK_AGENTS,
    HOOK_AGENTS_THAT_ASK,
    HOOK_DECISIONS,
    HookEvent,
    HookFormatError,
    read_event,
    render,
)
from toolkeeper.wire.intercept import ADDON, ENDPOINTS, HOST_NAME
from toolkeeper.wire.mcp import build_server, serve_stdio
from toolkeeper.wire.server import Check, Doors, proxy_app
from toolkeeper.wire.upstream import Upstream

__all__ = [
    "ADDON",
    "ENDPOINTS",
    "HOOK_AGENTS",
    "HOOK_AGENTS_THAT_ASK",
    "HOOK_DECISIONS",
    "HOST_NAME",
    "AdminGuard",
    "ChatCompletions",
    "Check",
    "Console",
    "Doors",
    "HookEvent",
    "HookFormatError",
    "Upstream",
    "UpstreamError",
    "admin_app",
    "anthropic_tool",
    "approvals_api",
    "build_server",
    "flat_tool",
    "pins_api",
    "proxy_app",
    "read_event",
    "render",
    "serve_stdio",
    "tools_api",
]
