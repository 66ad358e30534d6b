"""Anthropic Messages, to and from the engine's neutral (Chat Completions) form, losing nothing.

    user message: its tool_result blocks -> {"role": "tool", "tool_call_id", "content"} each,
                  the rest of its blocks  -> {"role": "user", ...} (marked as following those results)
    assistant message                     -> {"role": "assistant", "content": text, "tool_calls": [tool_use...]}
    system turns inside `messages`        -> {"role": "system", ...}

Each neutral message keeps what it came from (`_blocks`, or `_message` for a
whole message), so the model server gets the agent's blocks back verbatim,
`cache_control`, thinking signatures and all. Going back, a run of tool
results and the rest of its user message become one user message again, the
results first (the API requires it): toolkeeper's hidden results join the run,
before the agent's text.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from toolkeeper.engine import Round, ToolCall
from toolkeeper.wire.apis.relay import shown_entries
from toolkeeper.wire.errors import MalformedResponse

BLOCKS = "_blocks"  # a neutral message's original content blocks
MESSAGE = "_message"  # a neutral message's original message, when it maps whole
AFTER_RESULTS = "_after_results"  # the rest of a user message whose tool_result blocks came first
CALL_BLOCK = "_block"  # the original block of a call
THINKING = ("thinking", "redacted_thinking")
# The tools the agent runs (its own, and Anthropic's client tools); any other type Anthropic's servers run
# (web_search_*, web_fetch_*, code_execution_*, tool_search_tool_*, and types to come): governed on the offer.
CLIENT_TOOLS = ("custom", "bash_", "text_editor_", "computer_", "memory_")
DATED = re.compile(r"_\d{8}$")  # a server tool's version: web_search_20250305 is web_search to the rules
SERVER_CALLS = ("server_tool_use", "mcp_tool_use")  # their calls in an answer; a block with the call's id follows
ROLES = ("user", "assistant", "system")


def messages_from_anthropic(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    neutral: list[dict[str, Any]] = []
    for message in messages:
        content = message.get("content")
        role = message.get("role")
        if role == "assistant":
            blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
            neutral.append({**assistant_message(blocks), MESSAGE: message})
            continue
        if role != "user" or not isinstance(content, list):
            neutral.append({"role": role, "content": content, MESSAGE: message})
            continue
        results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
        rest = [b for b in content if not (isinstance(b, dict) and b.get("type") == "tool_result")]
        for block in results:
            neutral.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": block.get("content"),
                            BLOCKS: [block]})
        if rest or not results:
            neutral.append({"role": "user", "content": rest, BLOCKS: rest, AFTER_RESULTS: bool(results)})
    return neutral


def assistant_message(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """The neutral message for an assistant's blocks: its text, and its tool_use blocks as calls."""
    text = "".join(b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text")
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    calls = [call_entry(b) for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
    if calls:
        message["tool_calls"] = calls
    return message


def call_entry(block: dict[str, Any]) -> dict[str, Any]:
    return {"id": block.get("id"), "type": "function",
            "function": {"name": block.get("name"), "arguments": orjson.dumps(block.get("input", {})).decode()}}


def anthropic_from_messages(neutral: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Neutral messages back to Anthropic's: originals verbatim, results gathered first in their user message."""
    out: list[dict[str, Any]] = []
    gathering = False  # the last message out is a user message of tool results, open to more
    for message in neutral:
        role = message.get("role")
        if role == "tool":
            block = (message.get(BLOCKS) or [None])[0] or {"type": "tool_result",
                                                            "tool_use_id": message.get("tool_call_id"),
                                                            "content": message.get("content") or ""}
            if not gathering:
                out.append({"role": "user", "content": []})
                gathering = True
            out[-1]["content"].append(block)
            continue
        if role == "user" and message.get(AFTER_RESULTS) and gathering:
            out[-1]["content"].extend(message.get(BLOCKS) or [])
        elif MESSAGE in message:
            out.append(message[MESSAGE])
        elif BLOCKS in message:
            out.append({"role": role, "content": message[BLOCKS]})
        else:  # toolkeeper's own words (a turn it ended)
            out.append({"role": role, "content": [{"type": "text", "text": message.get("content") or ""}]})
        gathering = False
    return out


def is_mcp_toolset(entry: Any) -> bool:
    """The MCP connector's current form (beta mcp-client-2025-11-20): `{"type": "mcp_toolset", "mcp_server_name",
    "default_config": {"enabled", "defer_loading"}, "configs": {TOOL: {...}}}` in `tools`, naming an
    `mcp_servers` entry. Governed tool by tool (the adapter's `_governed_toolset`), not by a name of its own."""
    return isinstance(entry, dict) and entry.get("type") == "mcp_toolset" and isinstance(
        entry.get("mcp_server_name"), str)


def hosted_tool(entry: Any) -> tuple[str, str] | None:
    """A tool entry Anthropic's servers run (a server tool), or an MCP connector server, as (its name for the
    rules, its kind); None for the agent's own, and for an MCP toolset (governed tool by tool)."""
    if not isinstance(entry, dict) or is_mcp_toolset(entry):
        return None
    kind = str(entry.get("type") or "custom")
    if kind == "url" and "name" in entry:  # an `mcp_servers` entry
        return f"mcp__{entry['name']}__*", "mcp_server"
    if kind.startswith(CLIENT_TOOLS):
        return None
    return str(entry.get("name") or DATED.sub("", kind) or kind), kind


def observed_calls(blocks: list[dict[str, Any]]) -> list[ToolCall]:
    """The calls the server ran within its answer, each with the result block that answers it."""
    results = {block.get("tool_use_id"): block.get("content") for block in blocks if "tool_use_id" in block}
    return [ToolCall(str(block.get("id") or ""), f"mcp__{block.get('server_name')}__{block.get('name')}"
                     if block["type"] == "mcp_tool_use" else str(block.get("name") or ""), block.get("input"),
                     {"output": results.get(block.get("id"))}, block["type"])
            for block in blocks if block.get("type") in SERVER_CALLS]


def check_block(block: dict[str, Any]) -> None:
    """A block that is a call of a kind toolkeeper does not know (a `*_use` block it cannot answer): the whole
    answer is refused, never passed on."""
    kind = str(block.get("type") or "")
    if kind.endswith("_use") and kind not in ("tool_use", *SERVER_CALLS):
        raise MalformedResponse(f"a {kind[:40]} block, a kind of call toolkeeper does not know and cannot govern")


def round_from_message(message: dict[str, Any], raw: bytes | None = None) -> Round:
    """One upstream message as the engine's Round (its blocks read in one loop: text, calls, the server's)."""
    blocks = [b for b in message.get("content") or [] if isinstance(b, dict)]
    calls: list[ToolCall] = []
    texts: list[str] = []
    served = False
    for block in blocks:
        check_block(block)  # every block first: a kind of call toolkeeper does not know refuses the answer
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            texts.append(block.get("text", ""))
        elif kind == "tool_use":
            calls.append(ToolCall(block.get("id") or "", block.get("name") or "", block.get("input", {}),
                                  {CALL_BLOCK: block}))
        elif kind in SERVER_CALLS:
            served = True
    stop = message.get("stop_reason")
    finish = "tool_calls" if stop == "tool_use" else "length" if stop == "max_tokens" else "stop"
    fields = dict(message)  # the message but its blocks and usage
    fields.pop("content", None)
    fields.pop("usage", None)
    head = {"id": message.get("id"), "model": message.get("model"), "message": fields}
    text = "".join(texts) or None  # assistant_message's
    found = Round(head, {"content": text, BLOCKS: blocks}, calls, finish, message.get("usage"), raw=raw)
    if served:
        found.observed = observed_calls(blocks)
    return found


def visible_blocks(blocks: list[dict[str, Any]], hidden: set[str], allowed: set[str] | None = None,
                   ) -> list[dict[str, Any]]:
    """The blocks the agent may see (`relay.shown_entries`): thinking travels with the block it precedes."""
    return shown_entries(blocks, hidden, allowed, held=THINKING, is_call=lambda block: block.get("type") == "tool_use",
                         id_of=lambda block: str(block.get("id") or ""))


def anthropic_tool(entry: dict[str, Any]) -> dict[str, Any]:
    """A declared tool's chat-shaped schema as Anthropic's; the agent's own tools as they are."""
    function = entry.get("function")
    if entry.get("type") == "function" and isinstance(function, dict):
        return {"name": function["name"], "description": function.get("description", ""),
                "input_schema": function.get("parameters") or {"type": "object", "properties": {}}}
    return entry


def neutral_tool_choice(choice: Any) -> Any:
    """Anthropic's tool_choice as the engine reads it (none, required, a named tool, auto)."""
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "none":
        return "none"
    if kind == "any":
        return "required"
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return "auto"


def check_request(body: dict[str, Any]) -> str | None:
    """What is wrong with a Messages request, in the words a 400 gives; None when it can be served."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: must be a non-empty list"
    for position, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            return f"messages.{position}.role: must be user or assistant"
        content = message.get("content")
        if not isinstance(content, (str, list)) or (isinstance(content, list) and not all(
                isinstance(b, dict) and isinstance(b.get("type"), str) for b in content)):
            return f"messages.{position}.content: must be a string or a list of blocks, each with a type"
        for block in content if isinstance(content, list) else []:
            if block["type"] == "tool_use" and not (isinstance(block.get("id"), str)
                                                    and isinstance(block.get("name"), str)):
                return f"messages.{position}: a tool_use block needs an id and a name"
            if block["type"] == "tool_result" and not isinstance(block.get("tool_use_id"), str):
                return f"messages.{position}: a tool_result block needs a tool_use_id"
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(
            isinstance(t, dict) and (isinstance(t.get("name"), str) or is_mcp_toolset(t)) for t in tools)):
        return "tools: must be a list of tools, each with a name (an mcp_toolset: with its mcp_server_name)"
    choice = body.get("tool_choice")
    if choice is not None and not (isinstance(choice, dict) and isinstance(choice.get("type"), str)):
        return "tool_choice: must be an object with a type"
    if "stream" in body and not isinstance(body["stream"], bool):
        return "stream: must be true or false"
    return None
