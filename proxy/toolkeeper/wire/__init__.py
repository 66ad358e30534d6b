"""The HTTP side: the agent APIs' adapters, the upstream client, /toolkeeper/ (admin API, console), interception,
pass-through.

    server.py     the app: routes, probes, pass-through; guard.py: web pages and agent keys
    apis/         one room per agent API (chat, responses, messages), each of one design
    upstream.py   the model server client; errors.py: every error shape, one mapping of upstream failures
    hooks.py      the agents' own hook formats (Claude Code, Gemini CLI, Codex CLI), read and answered
    admin/        /toolkeeper/: the admin API, its guard, browser sessions, the console
    notify/       asks sent to the policy's `notify:` channels (signed webhooks, Slack), with a link to the call
    intercept/    requests `toolkeeper intercept` re-routed, and its mitmproxy addon

A new agent API is a new room in `apis/`, translating to and from the
engine's neutral turn; the engine gains nothing HTTP. This layer never picks
a runner or a policy: the composition root (`toolkeeper.app`) hands it what it
serves.
"""

import importlib
from typing import Any

# Each name's module, imported when the name is first used: `toolkeeper hook`, run before every tool call of an
# agent, reads the hook formats without importing the server, the admin app and the adapters.
_HOMES = {
    "toolkeeper.wire.admin": ("AdminGuard", "Console", "LimitsView", "admin_app", "approvals_api", "limits_api",
                              "pins_api", "tools_api"),
    "toolkeeper.wire.apis": ("ChatCompletions", "anthropic_tool", "flat_tool"),
    "toolkeeper.wire.errors": ("UpstreamError",),
    "toolkeeper.wire.hooks": ("HOOK_AGENTS", "HOOK_AGENTS_THAT_ASK", "HOOK_DECISIONS", "HookEvent", "HookFormatError",
                              "read_event", "render"),
    "toolkeeper.wire.intercept": ("ADDON", "ENDPOINTS", "HOST_NAME"),
    "toolkeeper.wire.mcp": ("build_server", "deferred_server", "serve_stdio"),
    "toolkeeper.wire.notify": ("Notifier",),
    "toolkeeper.wire.server": ("Check", "Doors", "proxy_app"),
    "toolkeeper.wire.upstream": ("Upstream",),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'toolkeeper.wire' has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(module), name)
    return value


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
    "LimitsView",
    "Notifier",
    "Upstream",
    "UpstreamError",
    "admin_app",
    "anthropic_tool",
    "approvals_api",
    "build_server",
    "deferred_server",
    "flat_tool",
    "limits_api",
    "pins_api",
    "proxy_app",
    "read_event",
    "render",
    "serve_stdio",
    "tools_api",
]
