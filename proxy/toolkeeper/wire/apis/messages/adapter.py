"""The Anthropic Messages adapter: `POST /v1/messages` in (Claude Code, the anthropic SDKs), one engine turn out.

    agent body --(messages -> neutral: items.py)--> engine --(MessagesModel)--> upstream /messages
    agent  <-- one message (writer.py): the blocks it may see, one id, usage summed, the final stop_reason --+

Errors have the API's own shape: `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from toolkeeper.engine import TurnContext
from toolkeeper.wire.apis.base import AgentAPI
from toolkeeper.wire.apis.messages.items import (
    BLOCKS,
    anthropic_tool,
    check_request,
    hosted_tool,
    is_mcp_toolset,
    messages_from_anthropic,
    neutral_tool_choice,
    visible_blocks,
)
from toolkeeper.wire.apis.messages.model import MessagesModel
from toolkeeper.wire.apis.messages.writer import MessagesWriter, final_message
from toolkeeper.wire.apis.relay import whole_output
from toolkeeper.wire.apis.results import guard_results
from toolkeeper.wire.errors import ANTHROPIC
from toolkeeper.wire.upstream import upstream_for


class MessagesAPI(AgentAPI):
    api = "messages"
    errors = ANTHROPIC

    async def _connector_server(self, server: Any, context: TurnContext) -> Any:
        """An `mcp_servers` entry of the connector's older form as the rules allow it: None when withheld whole
        (recorded). Its tools are offered as one (`mcp__<server>__*`) unless `allowed_tools` lists them; then each
        listed tool is decided and the ones the rules deny are left out (each recorded `withheld`); None when none
        is left. Offered as one, a rule covering some of its tools by a pattern withholds it: they are not known."""
        found = hosted_tool(server)
        configuration = server.get("tool_configuration") if isinstance(server, dict) else None
        configuration = configuration if isinstance(configuration, dict) else {}
        listed = configuration.get("allowed_tools")
        unnamed = found is not None and found[1] == "mcp_server" and not isinstance(listed, list) and \
            configuration.get("enabled", True) is not False
        if found is not None and not await self.engine.hosted.offer(*found, server, context, unnamed=unnamed):
            return None
        if not isinstance(listed, list):
            return server
        kept = await self.offered(listed, lambda tool: (f"mcp__{server.get('name')}__{tool}", "mcp_tool")
                                  if isinstance(tool, str) else None, context)
        return {**server, "tool_configuration": {**configuration, "allowed_tools": kept}} if kept else None

    async def _governed_toolset(self, toolset: dict[str, Any], context: TurnContext) -> dict[str, Any]:
        """An MCP toolset as the rules allow it: each tool they deny (or would ask about: no one can be asked per
        call) switched off in its `configs`, the server's other tools left usable; where they deny the server's
        tools by default, `default_config` off and the tools they allow switched on. Each tool withheld is
        recorded `withheld`, as a server tool's offer is."""
        prefix = f"mcp__{toolset['mcp_server_name']}__"
        configs = {tool: dict(config) for tool, config in (toolset.get("configs") or {}).items()
                   if isinstance(config, dict)}
        default = dict(toolset.get("default_config") or {})
        wanted_by_default = default.get("enabled", True) is not False
        # the server's tools no one names: decided as one (`mcp__<server>__*`, kind mcp_server, as the older form's
        # server entry is), their names and arguments unknown
        allowed_by_default = wanted_by_default and await self.engine.hosted.offer(
            prefix + "*", "mcp_server", toolset, context, unnamed=True)
        for tool in sorted(set(configs) | self.engine.handler.policy.tools_named(prefix)):
            if not configs.get(tool, {}).get("enabled", wanted_by_default):
                continue  # the agent switched it off itself
            allowed = await self.engine.hosted.offer(prefix + tool, "mcp_tool", configs.get(tool), context)
            if not allowed or not allowed_by_default:  # said outright: it differs from the default, or may
                configs[tool] = {**configs.get(tool, {}), "enabled": allowed}
        if wanted_by_default and not allowed_by_default:
            default["enabled"] = False
        governed = {**toolset, "configs": configs} if configs else dict(toolset)
        return {**governed, "default_config": default} if default else governed

    check = staticmethod(check_request)

    async def answer(self, request: web.Request, body: Any, raw: bytes) -> web.StreamResponse:
        messages = messages_from_anthropic(body["messages"])
        context = self.context(request, raw, messages)
        toolsets = [tool for tool in body.get("tools") or [] if is_mcp_toolset(tool)]
        if toolsets:  # the connector's current form: each server's tools governed in its toolset, by name
            governed = {id(toolset): await self._governed_toolset(toolset, context) for toolset in toolsets}
            body = {**body, "tools": [governed.get(id(tool), tool) for tool in body["tools"]]}
        in_toolsets = {toolset["mcp_server_name"] for toolset in toolsets}
        if isinstance(body.get("tools"), list):  # server tools
            body = {**body, "tools": await self.offered(body["tools"], hosted_tool, context)}
        if isinstance(body.get("mcp_servers"), list):  # the connector's servers of the older form (the current
            # form's are governed in their toolsets: withholding one would leave its toolset naming no server, a 400)
            kept = [server if isinstance(server, dict) and server.get("name") in in_toolsets
                    else await self._connector_server(server, context) for server in body["mcp_servers"]]
            body = {**body, "mcp_servers": [server for server in kept if server is not None]}
        neutral: dict[str, Any] = {"messages": guard_results(self.engine, messages, context, original=BLOCKS)}
        if "tools" in body:
            neutral["tools"] = body["tools"]
        if "tool_choice" in body:
            neutral["tool_choice"] = neutral_tool_choice(body["tool_choice"])
        model = MessagesModel(upstream_for(request, self.upstream), request.headers, body, request.query_string)
        events = self.engine.run(neutral, model, context)
        if body.get("stream"):
            return await MessagesWriter(request, self.keepalive).relay(events)
        return await self.whole(events, lambda result, relayed: final_message(result, whole_output(
            relayed, visible_blocks, {call.id for call in result.tool_calls})))


def count_tokens_body(body: dict[str, Any], declared: list[dict[str, Any]]) -> dict[str, Any]:
    """`/v1/messages/count_tokens` counts with the declared tools the model would get."""
    mine = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
    extra = [anthropic_tool(t) for t in declared if anthropic_tool(t)["name"] not in mine]
    return {**body, "tools": [*(body.get("tools") or []), *extra]} if extra else body

