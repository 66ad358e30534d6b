"""What the model sees of a declared tool, derived from its declaration.

`plain` (the default) carries `type` and `description` only, with "Required."
and "One of: ..." written into each parameter's description: small models
follow words better than keywords, and strict servers choke on less. `standard`
sends full JSON Schema for servers that want `required` and `enum`.
"""

from __future__ import annotations

from typing import Any

from toolkeeper.tools.agentfile import Parameter, ToolSpec
from toolkeeper.tools.templates import render_scalar

CLOSING_SENTENCE = "Give each parameter as its own field."


def constraint_words(param: Parameter) -> list[str]:
    """The rules of a parameter in words, as the model and the invalid-call answer read them."""
    words = ["Required." if param.is_required else "Optional."]
    if param.enum is not None:
        words.append("One of: " + ", ".join(render_scalar(v) for v in param.enum) + ".")
    if param.pattern:
        words.append(f"Must match the regular expression {param.pattern}.")
    if param.minimum is not None:
        words.append(f"At least {render_scalar(_tidy(param.minimum))}.")
    if param.maximum is not None:
        words.append(f"At most {render_scalar(_tidy(param.maximum))}.")
    if param.has_default and param.default is not None:
        words.append(f"Default: {render_scalar(param.default)}.")
    return words


def _tidy(number: float) -> float | int:
    return int(number) if float(number).is_integer() else number


def _type_schema(param: Parameter) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": param.type}
    if param.type == "array":
        schema["items"] = {"type": param.items}
    return schema


def mcp_tool(entry: dict[str, Any]) -> dict[str, Any]:
    """A tool entry (Chat Completions shape) as an MCP `tools/list` gives it."""
    function = entry["function"]
    return {"name": function["name"], "description": function["description"], "inputSchema": function["parameters"]}


def tool_schema(tool: ToolSpec, style: str) -> dict[str, Any]:
    """The `{type: function, function: {...}}` entry sent in each model request."""
    properties: dict[str, Any] = {}
    for name, param in tool.parameters.items():
        prop = _type_schema(param)
        if style == "plain":
            prop["description"] = " ".join([param.description.strip(), *constraint_words(param)]).strip()
        else:
            if param.description:
                prop["description"] = param.description.strip()
            if param.enum is not None:
                prop["enum"] = list(param.enum)
            if param.pattern:
                prop["pattern"] = param.pattern
            if param.minimum is not None:
                prop["minimum"] = _tidy(param.minimum)
            if param.maximum is not None:
                prop["maximum"] = _tidy(param.maximum)
            if param.has_default and param.default is not None:
                prop["default"] = param.default
        properties[name] = prop
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if style == "standard":
        parameters["required"] = [name for name, p in tool.parameters.items() if p.is_required]
        parameters["additionalProperties"] = False
    description = tool.description
    if tool.parameters:
        description = f"{description} {CLOSING_SENTENCE}"
    return {"type": "function", "function": {"name": tool.name, "description": description, "parameters": parameters}}
