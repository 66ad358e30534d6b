"""toolkeeper as an MCP server, on the official SDK: `tools/list` and `tools/call` answered by the engine's door.

The same server answers over stdio (`toolkeeper mcp AGENT_FILE`) and
Streamable HTTP (`/mcp` on serve). Who is calling: the agent key's name (or
the OAuth client's) over HTTP, with the person its token names, each request's
own; the client's own name over stdio. Who is asked before a gated call: the
configured channel (approvals, the terminal), else the client itself through
MCP elicitation when it declares it, else no one (the call is denied, and says
why).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import weakref
from collections import OrderedDict
from typing import Any

from toolkeeper.common import printable
from toolkeeper.engine import McpDoor, McpSession, door_session
from toolkeeper.policy import Consent, ConsentAnswer, ConsentRequest
from toolkeeper.tracing import TRACE_HEADERS, Tracing
from toolkeeper.wire.mcp.stdio import INSTRUCTIONS, NAME

log = logging.getLogger("toolkeeper")

AGENT_SCOPE_KEY = "toolkeeper.agent"  # the ASGI scope's entry naming the agent an HTTP request came from
AGENT_HEADER_SCOPE_KEY = "toolkeeper.agent_header"  # and the value of its --identity-header, when serve names one
PRINCIPAL_SCOPE_KEY = "toolkeeper.principal"  # who the request is for (an identity.Principal), when something said
SUBJECT_TOKEN_SCOPE_KEY = "toolkeeper.subject_token"  # noqa: S105 - the scope entry holding the caller's token
SESSION_HEADER = "mcp-session-id"  # Streamable HTTP's session, once the client initialised one
CLIENTS_KEPT = 4096  # the clients whose searches are remembered, the least recent forgotten first


class ElicitationConsent:
    """Asks the MCP client's user, through elicitation (the client shows the question and returns the answer)."""

    can_ask = True

    def __init__(self, session: Any, client: str, request_id: Any = None):
        self.session = session
        self.who = f"{client} (MCP elicitation)"
        # The question travels on the stream of the call it is about, when there is one (a POST's own answer
        # stream over HTTP): a client need not hold the standalone GET stream open to be asked.
        self.request_id = request_id

    async def ask(self, request: ConsentRequest) -> ConsentAnswer:
        schema = {"type": "object", "properties": {"approve": {
            "type": "boolean", "title": "Allow this call", "description": "Allow it once, with these arguments"}},
            "required": ["approve"]}
        message = f"toolkeeper asks: allow {request.summary()}? Why it asks: {request.why()}"
        try:
            answer = await self.session.elicit_form(message, schema, related_request_id=self.request_id)
        except Exception as exc:  # the client could not ask: a deny, said
            return ConsentAnswer(False, self.who, f"the MCP client could not ask its user ({printable(str(exc))})")
        approved = answer.action == "accept" and (answer.content or {}).get("approve") is True
        return ConsentAnswer(approved, self.who, "approved" if approved else f"the user's answer: {answer.action}")


def build_server(door: McpDoor, configured: Consent, version: str = "", tracing: Tracing | None = None) -> Any:
    """The SDK's low-level server with toolkeeper's two handlers (`tracing`: each call's span, when it is on)."""
    import mcp_types as types
    from mcp.server.lowlevel import Server

    # The SDK hands each request a session of its own (elicitation goes through it), so what a client's searches
    # found is kept by the client: its process over stdio, its agent and MCP session over HTTP.
    sessions: weakref.WeakKeyDictionary[Any, McpSession] = weakref.WeakKeyDictionary()
    # over stdio, the process's one client: one flow session for all its calls (the SDK's session is per request)
    stdio_session = door_session("mcp-stdio", secrets.token_hex(16))
    found_by_client: OrderedDict[tuple[str, ...], set[str]] = OrderedDict()

    def session_of(ctx: Any) -> McpSession:
        session = sessions.get(ctx.session)
        if session is None:
            session = sessions[ctx.session] = _new_session(ctx, configured, types, stdio_session)
            client = _client_key(ctx, session)
            session.found = found_by_client.setdefault(client, session.found)
            found_by_client.move_to_end(client)
            if len(found_by_client) > CLIENTS_KEPT:
                found_by_client.popitem(last=False)
        return _this_request(ctx, session)

    async def list_tools(ctx: Any, params: Any) -> Any:
        tools = await door.list_tools(session_of(ctx))
        return types.ListToolsResult(tools=[types.Tool.model_validate(tool) for tool in tools])

    async def call_tool(ctx: Any, params: Any) -> Any:
        session = session_of(ctx)
        if tracing is None:
            return await answered(ctx, session, params)
        with tracing.mcp_call(str(params.name), _trace_carrier(ctx, params)) as trace:
            session.trace = trace
            return await answered(ctx, session, params)

    async def answered(ctx: Any, session: McpSession, params: Any) -> Any:
        before = set(session.found)
        result = await door.call_tool(session, params.name, params.arguments)
        if session.found != before:  # a search found tools: the client lists them again
            with contextlib.suppress(Exception):  # a client that cannot take the notice still has the search's answer
                await ctx.session.send_tool_list_changed()
        return types.CallToolResult.model_validate(result)

    return Server(NAME, version=version, instructions=INSTRUCTIONS, on_list_tools=list_tools,
                  on_call_tool=call_tool)


def _trace_carrier(ctx: Any, params: Any) -> dict[str, str]:
    """Where a call's trace context comes from: the request's `_meta` (MCP's own place for `traceparent`), else
    its HTTP headers."""
    carrier = {key.lower(): str(value) for key, value in (getattr(getattr(ctx, "request", None), "headers", None)
                                                          or {}).items() if key.lower() in TRACE_HEADERS}
    meta = getattr(params, "meta", None)
    meta = meta.model_dump(by_alias=True) if hasattr(meta, "model_dump") else meta
    if isinstance(meta, dict):
        carrier.update({key: str(meta[key]) for key in TRACE_HEADERS if isinstance(meta.get(key), str)})
    return carrier


def _client_key(ctx: Any, session: McpSession) -> tuple[str, ...]:
    """Who a request comes from, across requests: over stdio the one client of the process; over HTTP the agent,
    and its MCP session when it has one."""
    request = getattr(ctx, "request", None)
    if request is None:
        return ("stdio",)
    headers = getattr(request, "headers", None) or {}
    return ("http", session.agent, headers.get(SESSION_HEADER) or "")


def _this_request(ctx: Any, session: McpSession) -> McpSession:
    """The session as this request sees it: its principal and token (a client refreshes its token within a
    session; the session's owner check holds the person the same). Its searches' findings are shared."""
    scope = getattr(getattr(ctx, "request", None), "scope", None) or {}
    principal = scope.get(PRINCIPAL_SCOPE_KEY)
    document = principal.document() if principal is not None else None
    return dataclasses.replace(session, principal=document, subject_token=scope.get(SUBJECT_TOKEN_SCOPE_KEY))


def _new_session(ctx: Any, configured: Consent, types: Any, stdio_session: str) -> McpSession:
    request = getattr(ctx, "request", None)
    scope = getattr(request, "scope", None) or {}
    agent = scope.get(AGENT_SCOPE_KEY)
    params = getattr(ctx.session, "client_params", None)
    client_name = getattr(getattr(params, "client_info", None), "name", None) or "mcp-client"
    session = McpSession(agent=agent or printable(client_name)[:64], agent_header=scope.get(AGENT_HEADER_SCOPE_KEY),
                         session=_flow_session(request, scope) if request is not None else stdio_session)
    if not configured.can_ask and _declares_elicitation(ctx.session, types):
        session.consent = ElicitationConsent(ctx.session, printable(client_name)[:64], getattr(ctx, "request_id", None))
    return session


def _flow_session(request: Any, scope: dict[str, Any]) -> str:
    """The session its calls are decided in (engine/flows.py): over HTTP, the MCP session with whose it is (the
    credential that opened it, as the SDK's `user` holds it); a client that opened none shares one with every
    other of that credential. (Over stdio, the process's one client: build_server's.)"""
    user = scope.get("user")
    token = getattr(user, "access_token", None)
    owner = (str(scope.get(AGENT_SCOPE_KEY) or ""), str(getattr(token, "client_id", "")),
             str(getattr(token, "subject", "") or ""), str((getattr(token, "claims", None) or {}).get("iss", "")))
    headers = getattr(request, "headers", None) or {}
    return door_session("mcp", *owner, headers.get(SESSION_HEADER) or "")


def _declares_elicitation(server_session: Any, types: Any) -> bool:
    """The client takes elicitation requests, on a connection that can carry one (the 2025 handshake's; the
    2026 protocol's requests have no back-channel: they would need its input-required round trip)."""
    try:
        return bool(getattr(server_session, "can_send_request", False)) and bool(server_session.check_client_capability(
            types.ClientCapabilities(elicitation=types.ElicitationCapability())))
    except Exception:
        return False
