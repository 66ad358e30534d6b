"""The engine: the tool loop, protocol-free.

An adapter hands it the agent's request in the neutral (Chat Completions)
form and a `Model`; it yields `Visible` text, `Working` while a declared call
runs, and one `TurnResult`. It holds one declared call's steps (`calls`),
each call's session (`flows`), the hidden history and its store, and
`MockModel`, a Model answered in-process, for tests. It never imports HTTP.
"""

from toolkeeper.engine.calls import CallContext, CallHandler, Outcome
from toolkeeper.engine.flows import Flows, conversation_session, door_session
from toolkeeper.engine.history import DEFAULT_TTL, History
from toolkeeper.engine.hooks import HookCalls, HookDecision
from toolkeeper.engine.hosted import HostedTools
from toolkeeper.engine.limits import CHARACTERS_PER_TOKEN, LimitReached
from toolkeeper.engine.loop import MAX_ROUNDS, Engine, tool_name
from toolkeeper.engine.mcp import McpDoor, McpSession
from toolkeeper.engine.mcppins import approve_definition, changed_fields, definition_diff
from toolkeeper.engine.mock import MockModel, answer
from toolkeeper.engine.secrets import AgentResults
from toolkeeper.engine.types import (
    Event,
    Model,
    Round,
    ToolCall,
    TurnContext,
    TurnResult,
    Visible,
    Working,
    add_usage,
)

__all__ = [
    "CHARACTERS_PER_TOKEN",
    "DEFAULT_TTL",
    "MAX_ROUNDS",
    "AgentResults",
    "CallContext",
    "CallHandler",
    "Engine",
    "Event",
    "Flows",
    "History",
    "HookCalls",
    "HookDecision",
    "HostedTools",
    "LimitReached",
    "McpDoor",
    "McpSession",
    "MockModel",
    "Model",
    "Outcome",
    "Round",
    "ToolCall",
    "TurnContext",
    "TurnResult",
    "Visible",
    "Working",
    "add_usage",
    "answer",
    "approve_definition",
    "changed_fields",
    "conversation_session",
    "definition_diff",
    "door_session",
    "tool_name",
]
