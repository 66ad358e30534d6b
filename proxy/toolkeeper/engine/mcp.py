"""The MCP door: the declared tools, and the agent's MCP servers' tools, served to an MCP client.

    tools/list -> the declared tools (as `toolkeeper schema --api mcp` prints them), the search tool when some
                  are discoverable, and each server's tools as `mcp__<server>__<tool>`: minus those a rule
                  denies outright, and those whose definition changed since it was pinned
    tools/call -> a declared tool: one declared call (`CallHandler.handle`), `api: mcp`
                  a server's tool: pinned? -> rules -> consent -> recorded -> sent on -> recorded
                  (pinned? on the server's last listing, at most its `pin_recheck` old: engine/mcppins.py)

Results are MCP `CallToolResult`s as JSON: a server's is passed on unchanged;
a refusal is a tool error (`isError: true`) whose text says why.

A call is for the session's principal (over HTTP, the person /mcp's access
token or the agent's JWT names). A server that takes each caller's own token
(`auth: {token_exchange: ...}`) is reached through that caller's connection;
a caller with no token to exchange is refused (`denied`) before any server is,
and is not shown that server's tools.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from toolkeeper.audit import CallStatus, ExecutionRecord
from toolkeeper.common import canonical_json, printable, sha256_hex
from toolkeeper.engine.calls import ANSWER_EXCERPT, CallContext, CallState, Outcome
from toolkeeper.engine.discovery import Discovery
from toolkeeper.engine.loop import Engine
from toolkeeper.engine.mcppins import PinnedDefinitions
from toolkeeper.engine.secrets import proxied_result
from toolkeeper.engine.types import ToolCall, TurnContext
from toolkeeper.policy import Consent, Decision
from toolkeeper.runners import Caller, McpCallerRequired, McpConnection, McpServerError, McpServers, McpServerTimeout
from toolkeeper.store import Store
from toolkeeper.tools import PROXIED_PREFIX, SEARCH_TOOL, McpServerSpec, mcp_tool, tool_schema

log = logging.getLogger("toolkeeper")


@dataclass
class McpSession:
    """One MCP client's connection: who it is, what its searches found, and who is asked for it. Over HTTP, each
    request's view of it (`dataclasses.replace`) carries that request's principal and token: a client refreshes
    its token within a session, and a person's groups may change meanwhile."""

    agent: str
    tenant: str = ""
    agent_header: str | None = None
    principal: dict[str, Any] | None = None  # who the calls are for (identity.Principal.document())
    subject_token: str | None = field(default=None, repr=False, compare=False)  # the client's token: never sent on
    session: str = ""  # the flow session its calls are decided in (engine/flows.py): the MCP session, with whose
    consent: Consent | None = None  # the client's elicitation, when it declares it and nothing else can ask
    found: set[str] = field(default_factory=set)
    trace: Any = None  # the request's span, when tracing is on: its declared and proxied calls' parent

    def turn(self) -> TurnContext:
        return TurnContext(request_id=secrets.token_hex(8), agent=self.agent, tenant=self.tenant or self.agent,
                           agent_header=self.agent_header, principal=self.principal,
                           subject_token=self.subject_token, api="mcp", consent=self.consent, trace=self.trace,
                           session=self.session)

    @property
    def caller(self) -> Caller | None:
        """Whom the agent's MCP servers act for, when one exchanges the caller's token."""
        return Caller.of(self.principal, self.subject_token)


async def _listing(connection: McpConnection, caller: Caller | None) -> list[dict[str, Any]]:
    """A server's tools as the caller may reach them: none (McpCallerRequired) from a server that needs the caller's
    token when it has none."""
    return await connection.for_caller(caller).refreshed()


def tool_error(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": True}


class McpDoor(PinnedDefinitions):
    def __init__(self, engine: Engine, servers: McpServers, store: Store | None):
        self.engine = engine
        self.servers = servers
        self.store = store
        # definition changes already in the trail: (server, tool, the pinned digest, the one served instead)
        self._reported: set[tuple[str, str, str, str]] = set()
        self._unlisted: set[tuple[str, str]] = set()  # `tools:` entries naming no tool of their server, logged
        self._watch_servers()

    @property
    def handler(self) -> Any:
        return self.engine.handler

    # -- tools/list -------------------------------------------------------------------------

    async def list_tools(self, session: McpSession) -> list[dict[str, Any]]:
        listed = [mcp_tool(entry) for entry in self._declared_entries(session)]
        connections = list(self.servers.connections.values())
        # every server listed at once: one slow to start holds the listing up by its own wait, not the sum
        answers = await asyncio.gather(*(_listing(connection, session.caller) for connection in connections),
                                       return_exceptions=True)
        for connection, tools in zip(connections, answers, strict=True):
            if isinstance(tools, McpCallerRequired):  # not this caller's to see: no token of its own to exchange
                log.debug("%s: its tools are not listed to this caller", printable(str(tools)))
                continue
            if isinstance(tools, McpServerError):
                log.warning("%s: its tools are not listed", printable(str(tools)))
                continue
            if isinstance(tools, BaseException):
                raise tools
            self._warn_unlisted(connection.spec, tools)
            pins = await self._server_pins(connection.spec)
            for tool in tools:
                if await self._offered(connection.spec, tool, session, pins):
                    listed.append({**tool, "name": connection.spec.proxied_name(tool["name"])})
        return listed

    def _warn_unlisted(self, spec: McpServerSpec, tools: list[dict[str, Any]]) -> None:
        """A server's `tools:` entry that names none of its tools gives its labels to nothing: a typo, most likely,
        and an `egress` tool left unlabelled. Said once each."""
        listed = {tool.get("name") for tool in tools}
        for name in sorted(set(spec.tools) - listed):
            if (spec.name, name) not in self._unlisted:
                self._unlisted.add((spec.name, name))
                log.warning("MCP server %s lists no tool %s: its `tools:` entry (labels, secrets) applies to nothing",
                            spec.name, printable(name))

    def _declared_entries(self, session: McpSession) -> list[dict[str, Any]]:
        discovery = self._discovery(session)
        style = self.engine.agent.config.schema_style
        tools = self.engine.agent.tools
        return [tool_schema(tools[name].spec, style) for name in discovery.offered()] + discovery.schemas()

    def _discovery(self, session: McpSession) -> Discovery:
        discovery = Discovery(self.engine.index, self.engine.agent.tools, set(), [])
        discovery.found |= session.found & discovery.searchable
        return discovery

    async def _offered(self, spec: McpServerSpec, tool: dict[str, Any], session: McpSession,
                       pins: dict[str, dict[str, Any]]) -> bool:
        """Listed unless a rule denies it whatever its arguments, or its definition changed since pinned."""
        name = spec.proxied_name(tool["name"])
        document = self.handler.document(name, {}, None, session.turn(), source="mcp", tier=spec.tier)
        if self.handler.policy.denied_outright(document) is not None:
            return False
        return await self._pinned(spec, tool, pins.get(tool["name"])) is None

    # -- tools/call -------------------------------------------------------------------------

    async def call_tool(self, session: McpSession, name: str, arguments: Any) -> dict[str, Any]:
        if name.startswith(PROXIED_PREFIX):
            return await self._proxied(session, name, arguments)
        return await self._declared(session, name, arguments)

    async def _declared(self, session: McpSession, name: str, arguments: Any) -> dict[str, Any]:
        call = ToolCall(f"mcp_{secrets.token_hex(6)}", name, arguments if arguments is not None else {})
        discovery = self._discovery(session)
        offered = discovery.offered()
        answered = discovery.answer(call, offered) if discovery.can_search else None
        session.found |= discovery.found
        if answered is not None:
            return {"content": [{"type": "text", "text": answered}], "isError": name != SEARCH_TOOL}
        tool = self.engine.agent.tools.get(name)
        if tool is None:
            return tool_error(f"Unknown tool {name!r}: toolkeeper serves {', '.join(offered) or 'no tools'}.")
        outcome = await self.handler.handle(call, tool, CallContext(session.turn()))
        return {"content": [{"type": "text", "text": outcome.answer}], "isError": outcome.status != "ok"}

    async def _proxied(self, session: McpSession, name: str, arguments: Any) -> dict[str, Any]:
        turn = session.turn()
        values = arguments if isinstance(arguments, dict) else {}
        record = ExecutionRecord(request_id=turn.request_id, agent=turn.agent, api="mcp", tool=name, runner="mcp",
                                 call_id=f"mcp_{secrets.token_hex(6)}", arguments_sent=arguments, arguments=values,
                                 source="mcp", status="denied", policy_revision=self.handler.policy.revision,
                                 agent_revision=self.engine.agent.revision or None, session=turn.session or None)
        answer = await self._proxied_answer(name, values, record, turn, time.monotonic())
        if turn.trace is not None:  # tracing on: the call's span, under its request's
            turn.trace.tool(record)
        return answer

    async def _proxied_answer(self, name: str, values: dict[str, Any], record: ExecutionRecord, turn: TurnContext,
                              arrived: float) -> dict[str, Any]:
        try:
            found = await self._server_tool(name, Caller.of(turn.principal, turn.subject_token), arrived)
        except McpCallerRequired as exc:  # refused before any server is reached: a denied call, and why
            return await self._unreached(record, "denied", f"Not run: {exc}.")
        except McpServerError as exc:
            return await self._unreached(record, "failed", f"Not run: {exc}.")
        if found is None:
            return await self._unreached(record, "invalid",
                                         f"Unknown tool {name!r}: no MCP server toolkeeper serves has it.")
        connection, tool, withheld = found
        refused = await self._decide(connection, tool, record, turn, withheld)
        if refused is not None:
            record.answer = refused
            await self.handler.settle(record, Outcome(refused))
            return tool_error(refused)
        return await self._send(connection, tool["name"], values, record)

    async def _unreached(self, record: ExecutionRecord, status: CallStatus, answer: str) -> dict[str, Any]:
        """A call that reached no server's tool (there is no such tool, or its server would not start): recorded
        all the same, since a client probing for tools, or calling one it cannot reach, is worth seeing."""
        record.status = status
        record.decided_by(Decision("deny", "toolkeeper", answer))
        record.answer = answer
        await self.handler.settle(record, Outcome(answer))
        return tool_error(answer)

    async def _server_tool(self, name: str, caller: Caller | None,
                           arrived: float) -> tuple[McpConnection, dict[str, Any], str | None] | None:
        """The connection the call goes through (the caller's own, for a server that exchanges its token), the
        tool's definition as the server's last listing gives it, and why it is withheld (None: it is not)."""
        server, _, tool = name[len(PROXIED_PREFIX):].partition("__")
        connection = self.servers.connections.get(server)
        if connection is None:
            return None
        connection = connection.for_caller(caller)
        # the server's definition as it last listed it, not the one the client listed: a client lists once a
        # session, and a server may change a tool after that; the pin is checked against that listing
        definition, withheld = await self._call_definition(connection, tool, arrived)
        return (connection, definition, withheld) if definition is not None else None

    async def _decide(self, connection: McpConnection, tool: dict[str, Any], record: ExecutionRecord,
                      turn: TurnContext, withheld: str | None) -> str | None:
        """None when the call may be sent on (decided, and recorded); else what the client is told."""
        if withheld is not None:
            record.decided_by(Decision("deny", "pin", withheld))
            return f"Not run: {record.tool} was not allowed ({withheld})."
        document = self.handler.document(record.tool, record.arguments, None, turn, source="mcp",
                                         tier=connection.spec.tier, labels=connection.spec.labels_of(tool["name"]))
        decision = await self.handler.judge(record, document, turn)
        record.decided_by(decision)
        if record.decision == "ask":
            state = CallState(ToolCall(record.call_id, record.tool, record.arguments_sent), None,  # type: ignore[arg-type]
                              CallContext(turn), record, False, values=record.arguments or {})
            record.decided_by(await self.handler.ask(state, decision))
        await self.handler.noted(record, turn)
        if record.decision != "allow":
            return f"Not run: {record.tool} was not allowed ({record.decision_reason})."
        state = CallState(ToolCall(record.call_id, record.tool, record.arguments_sent), None,  # type: ignore[arg-type]
                          CallContext(turn), record, False)
        refused = await self.handler.record_before_run(state)  # no record, no call
        return refused.answer if refused is not None else None

    async def _send(self, connection: McpConnection, tool: str, values: dict[str, Any],
                    record: ExecutionRecord) -> dict[str, Any]:
        started = time.monotonic()
        try:
            answer = await connection.call(tool, values)
        except McpServerError as exc:
            # how long it was waited for: a call that hung until its timeout took that long
            record.duration_ms = round((time.monotonic() - started) * 1000, 3)
            record.status = "timeout" if isinstance(exc, McpServerTimeout) else "failed"
            record.answer = f"Not completed: {exc}."
            await self.handler.settle(record, Outcome(record.answer, ran=True, detail=str(exc)))
            return tool_error(record.answer)
        text = canonical_json(answer.result).decode()
        record.status = "failed" if answer.is_error else "ok"
        record.duration_ms = round(answer.duration * 1000, 3)
        record.output_bytes, record.output_sha256 = len(text.encode()), sha256_hex(text.encode())
        shown = proxied_result(self.handler, record, connection.spec.secrets_of(tool), answer.result)  # no secret
        record.answer = answer.text()[:ANSWER_EXCERPT]
        await self.handler.settle(record, Outcome(record.answer, ran=True))
        return shown
