"""`POST /toolkeeper/hooks`: what `toolkeeper hook AGENT` asks, on behalf of an agent's own pre- and post-tool hook.

    {"agent": "claude-code", "event": <the hook's stdin, as the agent wrote it>}
        -> {"decision": "allow" | "deny" | "ask" | "defer", "reason": "..."}

"defer": no rule decided the call, and serve's `hooks_undecided` is defer (the
default): the hook gives the agent no decision, so its own permission flow
applies.

The event is read by `wire/hooks.py` (each agent's format, in one place) and
decided by the engine's `HookCalls`. The caller presents an agent key (listed
under `agents:`); with none listed, only a toolkeeper on loopback answers.
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson
from aiohttp import web

from toolkeeper.common import digest, is_loopback, printable
from toolkeeper.engine import HookCalls, ToolCall, TurnContext, door_session
from toolkeeper.wire.guard import AgentKeys
from toolkeeper.wire.hooks import HOOK_AGENTS, HOOK_AGENTS_THAT_ASK, HookFormatError, read_event

PATH = "/toolkeeper/hooks"


class HooksEndpoint:
    def __init__(self, calls: HookCalls, keys: AgentKeys, host: str, identity_header: str | None = None):
        self.calls = calls
        self.keys = keys
        self.identity_header = identity_header  # serve's --identity-header: `agent.header`, as on the model APIs
        self.open = not keys.keys and is_loopback(host)  # no keys listed: this machine's agents only

    async def handle(self, request: web.Request) -> web.Response:
        who = await self.keys.identify(request, required=not self.open)
        if isinstance(who, str):  # a token refused, an identity header from an untrusted peer
            return _refusal(request.get("refusal_status", 401), who)
        agent = who.agent if who is not None and who.agent else ("hook" if self.open else None)
        if agent is None:
            return _refusal(401, "toolkeeper does not know this agent's key: set TOOLKEEPER_AGENT_KEY to a key "
                                 "whose SHA-256 is listed under `agents:`")
        try:
            body = orjson.loads(await request.read())
            kind = body.get("agent") if isinstance(body, dict) else None
            if kind not in HOOK_AGENTS:
                raise HookFormatError(f"`agent` must be one of {', '.join(HOOK_AGENTS)}")
            event = read_event(kind, body.get("event"))
        except (orjson.JSONDecodeError, HookFormatError) as exc:
            return _refusal(400, f"not a hook event toolkeeper can read: {printable(str(exc))}")
        # a call's pre and post events pair within one tenant: the agent's, and the user's (a token names the agent
        # by its client, which every user of that client shares: one user must not complete another's call)
        whose = (who.issuer or "", who.user) if who is not None and who.user else ()
        tenant = digest(agent, kind, event.session, *whose)
        # the agent's own session is the flow's (an agent that names none: one session for all its calls)
        turn = TurnContext(request_id=secrets.token_hex(8), agent=agent, api="hook", workdir=event.cwd,
                           tenant=tenant, session=door_session("hook", tenant),
                           agent_header=request.headers.get(self.identity_header) if self.identity_header else None,
                           principal=who.document() if who is not None else None)
        if event.phase == "post":
            recorded = await self.calls.after(turn, event.call_id, event.result, event.error)
            return web.json_response({"decision": "allow", "reason": "recorded" if recorded else "no call waited"})
        decided = await self.calls.before(turn, ToolCall(event.call_id, event.tool, event.arguments),
                                          agent_asks=kind in HOOK_AGENTS_THAT_ASK)
        return web.json_response({"decision": decided.effect, "reason": decided.reason})

def _refusal(status: int, message: str) -> web.Response:
    body: dict[str, Any] = {"error": message}
    return web.json_response(body, status=status)
