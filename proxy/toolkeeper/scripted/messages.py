"""The scripted model server's Anthropic Messages API (`POST /v1/messages`), strict as Anthropic's.

It answers the same script steps as the other APIs (`content`, `tool_calls`,
`usage`, `when`, `status`/`body`, `raw`, `hang`, `delay`), plus `thinking`: a
thinking block with a signature, before the rest, and `stop_reason`. It
rejects, with the 400 the real API gives, what a proxy must never send: a
`tool_use` without its `tool_result` in the next user message, a
`tool_result` for no `tool_use` before it, a `tool_result` after other
content in its message, a thinking block whose text no longer matches its
signature; and the MCP connector's current form (`mcp_toolset` tools, beta
`mcp-client-2025-11-20`) where it breaks the API's rules on it.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

import orjson
from aiohttp import web

from toolkeeper.scripted.responses import Rejected


def signature(thinking: str) -> str:
    return "sig-" + hashlib.sha256(thinking.encode()).hexdigest()[:24]


MCP_TOOLSET_BETA = "mcp-client-2025-11-20"
MCP_TOOL_CONFIG_KEYS = ("enabled", "defer_loading")


def check(body: dict[str, Any], beta: str = "") -> None:
    """The real API's rules on a conversation's tool calls, results and thinking, and on its MCP toolsets."""
    check_mcp_toolsets(body, beta)
    messages = body.get("messages") or []
    for position, message in enumerate(messages):
        content = message.get("content") if isinstance(message.get("content"), list) else []
        if message.get("role") == "assistant":
            for block in content:
                if block.get("type") == "thinking" and block.get("signature") != signature(block.get("thinking", "")):
                    raise _rejected(f"messages.{position}.content: Invalid `signature` in `thinking` block")
            called = [b.get("id") for b in content if b.get("type") == "tool_use"]
            following = messages[position + 1] if position + 1 < len(messages) else None
            answered = _results(following) if following and following.get("role") == "user" else []
            missing = [call_id for call_id in called if call_id not in answered]
            if missing:
                raise _rejected(f"messages.{position + 1}: `tool_use` ids were found without `tool_result` blocks "
                                f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                                "corresponding `tool_result` block in the next message.")
        else:
            previous = messages[position - 1] if position else {}
            called = [b.get("id") for b in previous.get("content") or [] if isinstance(b, dict)
                      and b.get("type") == "tool_use"] if previous.get("role") == "assistant" else []
            seen_other = False
            for block in content:
                if block.get("type") != "tool_result":
                    seen_other = True
                    continue
                if seen_other:
                    raise _rejected(f"messages.{position}.content: tool_result blocks must come first in the "
                                    "user message")
                if block.get("tool_use_id") not in called:
                    raise _rejected(f"messages.{position}.content: unexpected `tool_use_id` found in "
                                    f"`tool_result` blocks: {block.get('tool_use_id')}. Each `tool_result` block "
                                    "must have a corresponding `tool_use` block in the previous message.")


def check_mcp_toolsets(body: dict[str, Any], beta: str) -> None:
    """The MCP connector as `mcp-client-2025-11-20` has it: each `mcp_servers` entry ({type: url, url, name,
    authorization_token?}, no `tool_configuration` any more) named by exactly one `mcp_toolset` tool
    ({type, mcp_server_name, default_config?, configs?: {tool: {enabled?, defer_loading?}}, cache_control?})."""
    toolsets = [(position, tool) for position, tool in enumerate(body.get("tools") or [])
                if isinstance(tool, dict) and tool.get("type") == "mcp_toolset"]
    servers = [server.get("name") for server in body.get("mcp_servers") or [] if isinstance(server, dict)]
    if not toolsets:
        return
    if MCP_TOOLSET_BETA not in [part.strip() for part in beta.split(",")]:
        raise _rejected(f"tools.{toolsets[0][0]}.type: 'mcp_toolset' requires the beta header {MCP_TOOLSET_BETA}")
    for position, server in enumerate(body.get("mcp_servers") or []):
        if isinstance(server, dict) and "tool_configuration" in server:
            raise _rejected(f"mcp_servers.{position}.tool_configuration: Extra inputs are not permitted (with "
                            f"{MCP_TOOLSET_BETA}, configure a server's tools in its mcp_toolset)")
    named: list[str] = []
    for position, toolset in toolsets:
        _check_toolset(position, toolset, servers)
        named.append(toolset["mcp_server_name"])
    for name in servers:
        if named.count(name) != 1:
            raise _rejected(f"mcp_servers: the MCP server '{name}' must be referenced by exactly one mcp_toolset "
                            f"(it is by {named.count(name)})")


def _check_toolset(position: int, toolset: dict[str, Any], servers: list[Any]) -> None:
    where = f"tools.{position}"
    extra = set(toolset) - {"type", "mcp_server_name", "default_config", "configs", "cache_control"}
    if extra:
        raise _rejected(f"{where}.{sorted(extra)[0]}: Extra inputs are not permitted")
    name = toolset.get("mcp_server_name")
    if not isinstance(name, str) or not name:
        raise _rejected(f"{where}.mcp_server_name: Field required")
    if name not in servers:
        raise _rejected(f"{where}.mcp_server_name: '{name}' does not name a server in mcp_servers")
    configs = toolset.get("configs") or {}
    if not isinstance(configs, dict):
        raise _rejected(f"{where}.configs: Input should be a valid dictionary")
    for key, config in [("default_config", toolset.get("default_config") or {}),
                        *((f"configs.{tool}", value) for tool, value in configs.items())]:
        if not isinstance(config, dict) or set(config) - set(MCP_TOOL_CONFIG_KEYS) or not all(
                isinstance(value, bool) for value in config.values()):
            raise _rejected(f"{where}.{key}: an object whose keys are among {', '.join(MCP_TOOL_CONFIG_KEYS)}, "
                            "each true or false")


def _results(message: dict[str, Any]) -> list[str]:
    content = message.get("content") if isinstance(message.get("content"), list) else []
    return [b.get("tool_use_id") for b in content if b.get("type") == "tool_result"]


def _rejected(message: str) -> Rejected:
    error = Rejected(message)
    error.body = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    return error


class MessagesScript:
    def __init__(self) -> None:
        self._ids = itertools.count(1)

    def answer(self, step: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        number = next(self._ids)
        message_id = step.get("id", f"msg_scripted{number}")
        tag = message_id.removeprefix("msg_")
        content: list[dict[str, Any]] = []
        if step.get("thinking"):
            content.append({"type": "thinking", "thinking": step["thinking"], "signature": signature(step["thinking"])})
        text = _fill(step.get("content"), body)
        if text:
            content.append({"type": "text", "text": text})
        for position, call in enumerate(step.get("tool_calls") or []):
            arguments = call.get("arguments", {})
            content.append({"type": "tool_use", "id": call.get("id", f"toolu_{tag}_{position}"), "name": call["name"],
                            "input": orjson.loads(arguments) if isinstance(arguments, str) else arguments})
        content += step.get("blocks") or []  # blocks as given: a server tool's call and its result, ...
        stop = step.get("stop_reason", "tool_use" if step.get("tool_calls") else "end_turn")
        usage = {"input_tokens": 10 * len(body.get("messages") or []), "output_tokens": 5 + 7 * len(content),
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, **(step.get("usage") or {})}
        return {"id": message_id, "type": "message", "role": "assistant", "model": body.get("model", "scripted"),
                "content": content, "stop_reason": stop, "stop_sequence": None, "usage": usage}

    async def reply(self, request: web.Request, message: dict[str, Any], stream: bool) -> web.StreamResponse:
        if not stream:
            return web.Response(body=orjson.dumps(message), content_type="application/json")
        answer = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await answer.prepare(request)
        await answer.write(b"".join(_sse(event) for event in events(message)))
        await answer.write_eof()
        return answer


def events(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The SSE events of a message, in the order Anthropic sends them (a ping after the start)."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {**usage, "output_tokens": 1}}
    out: list[dict[str, Any]] = [{"type": "message_start", "message": start}, {"type": "ping"}]
    for index, block in enumerate(message["content"]):
        out += _block_events(index, block)
    out += [{"type": "message_delta", "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
             "usage": {"output_tokens": usage["output_tokens"]}}, {"type": "message_stop"}]
    return out


def _block_events(index: int, block: dict[str, Any]) -> list[dict[str, Any]]:
    if block["type"] == "text":
        opened = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": block["text"][i:i + 6]} for i in range(0, len(block["text"]), 6)]
    elif block["type"] == "thinking":
        opened = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                  {"type": "signature_delta", "signature": block["signature"]}]
    elif "input" not in block:  # a result block (web_search_tool_result, ...): whole at its start
        opened, deltas = block, []
    else:
        opened = {**block, "input": {}}
        arguments = orjson.dumps(block["input"]).decode()
        deltas = [{"type": "input_json_delta", "partial_json": arguments[i:i + 7]} for i in range(0, len(arguments), 7)]
    return [{"type": "content_block_start", "index": index, "content_block": opened},
            *({"type": "content_block_delta", "index": index, "delta": delta} for delta in deltas),
            {"type": "content_block_stop", "index": index}]


def _fill(content: str | None, body: dict[str, Any]) -> str | None:
    if content and "{tool_result}" in content:
        results = [b for m in body.get("messages") or [] if isinstance(m.get("content"), list)
                   for b in m["content"] if b.get("type") == "tool_result"]
        value = results[-1].get("content") if results else ""
        if isinstance(value, list):
            value = "".join(part.get("text", "") for part in value)
        return content.replace("{tool_result}", str(value))
    return content


def _sse(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
