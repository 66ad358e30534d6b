"""The Chat Completions adapter: `POST /v1/chat/completions` in, one engine turn out.

    agent body (already neutral) --> engine --(ChatModel)--> upstream /chat/completions
    agent  <-- one response (writer.py): every round's text, its own calls, one id, usage summed --+

Nothing of a declared call ever reaches the agent.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from toolkeeper.wire.apis.base import AgentAPI, Field, field_problem, first_problem
from toolkeeper.wire.apis.chat.model import ChatModel
from toolkeeper.wire.apis.chat.writer import StreamWriter, whole_response
from toolkeeper.wire.apis.results import guard_results
from toolkeeper.wire.upstream import upstream_for


def check_request(body: dict[str, Any]) -> str | None:
    """What is wrong with a chat request, in the words a 400 gives; None when the engine can take it."""
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        return "'tools' must be a list of tool objects"
    options = body.get("stream_options")
    if isinstance(options, dict) and not isinstance(options.get("include_usage", False), bool):
        return "'stream_options.include_usage' must be true or false"
    if isinstance(body.get("n"), int) and body["n"] < 1:
        return "'n' must be at least 1"
    messages = body.get("messages")
    return ((None if _plain_messages(messages) else first_problem(
                messages, _check_message, "messages", "message",
                required="'messages' must be a non-empty list of messages"))
            or first_problem(tools or [], _check_tool, "tools", "tool") or field_problem(body, REQUEST_FIELDS))


def _plain_messages(messages: Any) -> bool:
    """The usual history, read in one loop: objects with a role, no calls (which _check_message reads)."""
    if type(messages) is not list or not messages:
        return False
    for message in messages:
        if type(message) is not dict or type(message.get("role")) is not str or "tool_calls" in message:
            return False
    return True


# Request fields the engine reads: their JSON types (a bool is never taken for a number).
REQUEST_FIELDS: tuple[Field, ...] = (
    ("stream", (bool,), "'stream' must be true or false"),
    ("stream_options", (dict,), "'stream_options' must be an object"),
    ("n", (int,), "'n' must be a whole number"),
    ("tool_choice", (str, dict), "'tool_choice' must be a string or an object"),
    ("parallel_tool_calls", (bool,), "'parallel_tool_calls' must be true or false"),
    ("model", (str,), "'model' must be a string"),
)


def _check_message(message: dict[str, Any]) -> str | None:
    if not isinstance(message.get("role"), str):
        return "every message must be an object with a 'role' string"
    calls = message.get("tool_calls")
    if calls is None:
        return None
    if not isinstance(calls, list):
        return "'tool_calls' must be a list"
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return "each tool call must be an object whose 'function' has a 'name' string"
        if not isinstance(function.get("arguments", ""), (str, dict)):
            return "a tool call's 'arguments' must be a JSON string"
    return None


def _check_tool(tool: dict[str, Any]) -> str | None:
    function = tool.get("function")
    if "function" in tool and not isinstance(function, dict):
        return "'function' must be an object with a 'name'"
    name = function.get("name") if isinstance(function, dict) else tool.get("name")
    if name is not None and not isinstance(name, str):
        return "a tool's 'name' must be a string"
    return None


class ChatCompletions(AgentAPI):
    check = staticmethod(check_request)

    async def answer(self, request: web.Request, body: Any, raw: bytes) -> web.StreamResponse:
        if body.get("functions") is not None or body.get("function_call") is not None:
            return self.refuse("the legacy `functions` and `function_call` are not governed by toolkeeper: send "
                               "the same functions as `tools` (and `tool_choice`)", "legacy_functions_not_governed")
        if any(type(tool) is dict and tool.get("type", "function") != "function" for tool in body.get("tools") or ()):
            return self.refuse("toolkeeper governs Chat Completions tools of type function only (a custom tool's "
                               "calls carry no function): send the tool as a function, its input one string "
                               "parameter", "tool_type_not_governed")
        if isinstance(body.get("n"), int) and body["n"] > 1 and (self.engine.active_tools(body) or body.get("tools")):
            return self.refuse("n > 1 cannot be combined with tools: every call is decided and recorded, and "
                               "only the first choice is; send n = 1", "n_not_supported")
        context = self.context(request, raw, body["messages"])
        options = body.get("web_search_options")  # a search model's web search, run by the model server
        if options is not None and not await self.engine.hosted.offer("web_search", "web_search_options", options,
                                                                       context):
            return self.refuse("the rules do not let the model server search the web for this agent, and this "
                               "request asks it to (web_search_options): recorded, not sent", "hosted_tool_denied",
                               status=403)
        model = ChatModel(upstream_for(request, self.upstream), request.headers, request.query_string)
        messages = guard_results(self.engine, body["messages"], context)  # no secret of a result goes upstream
        if messages is not body["messages"]:
            body = {**body, "messages": messages}
        events = self.engine.run(body, model, context)
        if body.get("stream"):
            return await StreamWriter(request, body, self.keepalive).relay(events)
        return await self.whole(events, lambda result, relayed: whole_response(result, body))
