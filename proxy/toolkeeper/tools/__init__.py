"""The declaration: agent files, argv templates, arguments, what the model sees, discovery.

Every list toolkeeper keeps about its tools (schemas sent, the silent set, the
search index, reserved names) is derived from what is loaded here. This layer
knows nothing of how a tool runs, who allows it, or how it is recorded.
"""

from typing import Any

from toolkeeper.tools.agentfile import (
    DEFAULT_RESERVED_NAMES,
    Agent,
    AgentFileError,
    AgentKey,
    DeclaredTool,
    MountedDir,
    Parameter,
    ToolSpec,
    load_agent_file,
    load_agent_keys,
    minimal_path,
)
from toolkeeper.tools.arguments import (
    Checked,
    CheckedCall,
    ambiguous_keys,
    check_arguments,
    check_call,
    invalid_call_answer,
    parse_arguments,
)
from toolkeeper.tools.discovery import (
    SEARCH_BUDGET,
    SEARCH_SCHEMA,
    SEARCH_TOOL,
    ToolIndex,
    budget_answer,
    not_found_yet_answer,
    search_answer,
)
from toolkeeper.tools.labels import KNOWN_LABELS, LABEL, McpToolSettings, SecretsMode, checked_labels
from toolkeeper.tools.lint import Finding, lint_agent
from toolkeeper.tools.mcpservers import PROXIED_PREFIX, McpServerSpec, McpTarget, OAuthClient
from toolkeeper.tools.schemas import mcp_tool, tool_schema
from toolkeeper.tools.templates import CommandTemplate, RenderError, TemplateError, render_scalar

__all__ = [
    "DEFAULT_RESERVED_NAMES",
    "KNOWN_LABELS",
    "LABEL",
    "PROXIED_PREFIX",
    "SEARCH_BUDGET",
    "SEARCH_SCHEMA",
    "SEARCH_TOOL",
    "Agent",
    "AgentFileError",
    "AgentKey",
    "Checked",
    "CheckedCall",
    "CommandTemplate",
    "DeclaredTool",
    "Finding",
    "McpServerSpec",
    "McpTarget",
    "McpToolSettings",
    "ModuleCache",
    "MountedDir",
    "OAuthClient",
    "Parameter",
    "RenderError",
    "SecretsMode",
    "TemplateError",
    "ToolIndex",
    "ToolSpec",
    "WasmModuleError",
    "ambiguous_keys",
    "budget_answer",
    "check_arguments",
    "check_call",
    "checked_labels",
    "compiled_modules",
    "invalid_call_answer",
    "lint_agent",
    "load_agent_file",
    "load_agent_keys",
    "mcp_tool",
    "minimal_path",
    "not_found_yet_answer",
    "offered_schemas",
    "parse_arguments",
    "render_scalar",
    "search_answer",
    "tool_schema",
]

_WASM = ("ModuleCache", "WasmModuleError", "compiled_modules")


def offered_schemas(agent: Agent, style: str | None = None) -> list[dict[str, Any]]:
    """The tool entries the model receives at the start of a conversation, in order (Chat Completions shape):
    the inline tools as declared, then the search tool when some are discoverable."""
    style = style or agent.config.schema_style
    tools = list(agent.tools.values())
    inline = [tool_schema(tool.spec, style) for tool in tools if tool.spec.visibility != "discoverable"]
    return inline + ([SEARCH_SCHEMA] if len(inline) < len(tools) else [])


def __getattr__(name: str) -> Any:
    """The wasm module compile, imported on first use: wasmtime loads only for agents that declare a wasm tool."""
    if name in _WASM:
        from toolkeeper.tools import wasmmodule

        return getattr(wasmmodule, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
