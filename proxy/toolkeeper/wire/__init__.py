"""The HTTP side: the agent APIs' adapters, the upstream client, /toolkeeper/ (admin API, console), pass-through.

A new agent API is a new adapter here, translating to and from the engine's
neutral turn; the engine gains nothing HTTP. This layer never picks a runner
or a policy: the composition root (`toolkeeper.app`) hands it what it serves.
"""

from toolkeeper.wire.admin import AdminGuard, admin_app, approvals_api
from toolkeeper.wire.chat import ChatCompletions
from toolkeeper.wire.console import Console
from toolkeeper.wire.messages_items import anthropic_tool
from toolkeeper.wire.otlp import OtlpExporter
from toolkeeper.wire.responses_items import flat_tool
from toolkeeper.wire.scripted import ScriptedModel, run_scripted, serve_scripted
from toolkeeper.wire.server import Check, proxy_app
from toolkeeper.wire.upstream import Upstream, UpstreamError

__all__ = [
    "AdminGuard",
    "ChatCompletions",
    "Check",
    "Console",
    "OtlpExporter",
    "ScriptedModel",
    "Upstream",
    "UpstreamError",
    "admin_app",
    "anthropic_tool",
    "approvals_api",
    "flat_tool",
    "proxy_app",
    "run_scripted",
    "serve_scripted",
]
