"""The Responses API adapter: `POST /v1/responses` in, one engine turn out.

    agent body --(input items -> neutral messages)--> engine --(ResponsesModel: neutral -> input items)--> upstream
    agent  <-- one response: the items it may see, one id, usage summed --+

History, both ways the API keeps it:

- the agent resends its whole `input` (`store: false`, Codex; or the SDKs'
  defaults): the engine restores the hidden items in their place, as for
  Chat Completions (responses_items.py says how items become messages);
- `previous_response_id` (or `conversation`): each hidden round goes upstream
  chained to the one before, so the server's stored chain holds them all. The
  agent receives the first round's id; the store links it to the last round's
  (and to the results of declared calls the last round still owes), and the
  agent's next `previous_response_id` is mapped through that link (model.py
  chains the rounds, `keep` stores the link).

Every id the agent receives that a request can name again (not `store:
false`) is linked, most to themselves, with the session of its conversation
(engine/flows.py): a chain keeps one session however many requests it takes.
When the model server cannot tell one tenant from another (toolkeeper holds
its key), the link also says whose the id is, and an id another tenant names
is refused (owners.py).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from aiohttp import web

from toolkeeper.common import digest, dumps
from toolkeeper.engine import TurnResult, conversation_session, door_session
from toolkeeper.store import Store, StoreError
from toolkeeper.wire.apis.base import AgentAPI, credentials_hash
from toolkeeper.wire.apis.relay import whole_output
from toolkeeper.wire.apis.responses.items import (
    ITEMS,
    check_request,
    hosted_tool,
    input_from_messages,
    messages_from_input,
    said_item,
    visible_items,
)
from toolkeeper.wire.apis.responses.model import ENGINE_KEYS, ResponsesModel, forced_approvals
from toolkeeper.wire.apis.responses.owners import (
    named_in_path,
    previous_in,
    previous_not_found,
    response_not_found,
    shared_key,
)
from toolkeeper.wire.apis.responses.writer import ResponsesWriter, final_response
from toolkeeper.wire.apis.results import guard_results
from toolkeeper.wire.errors import store_unavailable
from toolkeeper.wire.upstream import upstream_for

log = logging.getLogger("toolkeeper")

LINK_TTL = 30 * 24 * 3600  # stored responses are kept 30 days upstream


class ResponsesAPI(AgentAPI):
    api = "responses"

    def __init__(self, *args: Any, store: Store, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.store = store

    check = staticmethod(check_request)

    async def answer(self, request: web.Request, body: Any, raw: bytes) -> web.StreamResponse:
        if body.get("background") is True:
            return self.refuse("background responses are not governed: toolkeeper decides on a response's calls "
                               "as it arrives, and a background one arrives when nobody waits; send it without "
                               "background", "background_not_governed")
        context = self.context(request, raw)
        upstream = upstream_for(request, self.upstream)
        guarded = shared_key(request, upstream)  # `guards`: the model server cannot tell this request's tenant
        try:
            if isinstance(body.get("previous_response_id"), str):
                followed, session, linked = await self._follow_link(context.tenant, body, guarded)
                if followed is None:  # before anything is recorded of the turn: no hosted tool's offer either
                    return previous_not_found(body["previous_response_id"])
                body = followed
            else:  # `_follow_link`'s answer, with no link to follow
                conversation = body.get("conversation")
                session, linked = (_conversation(context.tenant, conversation) if conversation else ""), False
            ids = _references(body["input"])
            messages = messages_from_input(body["input"], await self._referenced(context.tenant, ids) if ids else None)
            context.session = session or conversation_session(context.tenant, messages)
            if isinstance(body.get("tools"), list):
                body = {**body, "tools": await self.offered(body["tools"], hosted_tool, context)}
        except StoreError as exc:
            return self.errors.response(store_unavailable(exc))
        messages = guard_results(self.engine, messages, context, original=ITEMS, field="output")  # no secret goes up
        neutral = {"messages": messages}
        for key in ENGINE_KEYS:
            if key in body:
                neutral[key] = body[key]
        mcp_servers: dict[str, dict[str, Any]] = {}
        if isinstance(neutral.get("tools"), list):  # a hosted MCP server asks before each call, so the rules decide
            neutral["tools"], mcp_servers = forced_approvals(neutral["tools"])
        model = ResponsesModel(upstream, request.headers, body, request.query_string, mcp_servers=mcp_servers)
        events = self.engine.run(neutral, model, context)

        # the id is linked unless the server keeps no response (`store: false`): then no request can name it.
        # Linked to itself when the server cannot say whose it is, or to keep a session that holds something: one
        # the chain already had, or in which this turn decided a call (a session of nothing needs no keeping)
        kept = body.get("store") is not False
        claimed = guarded and kept

        async def keep(result: TurnResult, final: dict[str, Any] | None) -> None:
            session = context.session if kept and (linked or context.session_calls) else None
            if result.rounds == 1 and not result.exchange and not claimed and session is None:
                return  # nothing hidden, no owner to say, no session to keep: `_link` would write nothing
            try:
                await self._link(context.tenant, result, final, session, claimed)
                if result.exchange and final is not None and body.get("store") is not False:
                    await self._remember_items(context.tenant, final["output"])
            except StoreError as exc:  # the agent has its answer; a later reference to it will miss
                log.error("the ids of this response could not be stored: %s", exc)

        if body.get("stream"):
            return await ResponsesWriter(request, body, self.keepalive, keep).relay(events)
        return await self.whole(events, partial(whole_answer, body), keep)

    # -- previous_response_id across hidden rounds ------------------------------------

    async def _follow_link(self, tenant: str, body: dict[str, Any],
                           guarded: bool) -> tuple[dict[str, Any] | None, str, bool]:
        """The agent's previous_response_id, mapped to the last upstream response of that turn; the declared
        results that response still owes go first in the input. None: an id not this tenant's (`guarded`: the
        model server cannot tell). With it, the session the chain is in ("" when the request holds its whole
        conversation, whose opening names it), and whether a link kept it."""
        previous = body.get("previous_response_id")
        link = await self.store.get_link(digest(tenant, "response", previous)) if isinstance(previous, str) else None
        if link is None:
            if isinstance(previous, str):  # a chain of no call yet, begun elsewhere, or whose link expired
                return (None if guarded else body), door_session("response", tenant, previous), False
            return body, _conversation(tenant, body.get("conversation")), False
        session = link.get("session") or door_session("response", tenant, str(previous))
        if link["last"] == previous and not link["owed"]:
            return body, session, bool(link.get("session"))  # an id that stands for itself: whose, and its session
        given = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
        return {**body, "previous_response_id": link["last"], "input": [*link["owed"], *given]}, session, True

    async def _referenced(self, tenant: str, ids: list[Any]) -> dict[str, dict[str, Any]]:
        """The items the agent's `item_reference`s (`ids`: theirs) stand for, among those toolkeeper handed it."""
        keys = {digest(tenant, "item", item_id): item_id for item_id in ids if isinstance(item_id, str)}
        found = await self.store.get_links(list(keys))
        return {keys[key]: item for key, item in found.items()}

    async def _remember_items(self, tenant: str, output: list[dict[str, Any]]) -> None:
        """After a turn with hidden rounds, what the agent saw, by item id: clients that keep `store: true`
        send it back as references (the Vercel AI SDK), and the history must still recognise it."""
        for item in output:
            if isinstance(item.get("id"), str):
                await self.store.put_link(digest(tenant, "item", item["id"]), item, LINK_TTL)

    async def _link(self, tenant: str, result: TurnResult, final: dict[str, Any] | None, session: str | None,
                    claimed: bool) -> None:
        """The id the agent got (`final`'s; None: the model server's answer went back as it came), linked to what
        it stands for and to its `session` (None: none to keep); linked to itself when it stands for nothing else
        and `claimed` (so the link says whose it is) or a session is to be kept (so the chain's next request finds
        it). One write a turn at most: a link to the last round says whose the id is too."""
        # after a mixed round, the results of its declared calls go upstream with the agent's own
        owed = _owed(result.exchange) if result.exchange else []
        given = final["id"] if final is not None else result.last.head.get("id")
        if result.rounds == 1 and not owed:
            # nothing hidden: the id the agent got is the model server's own, its answer as the agent saw it
            if (claimed or session is not None) and isinstance(given, str) and given:
                await self.store.put_link(digest(tenant, "response", given),
                                          {"last": given, "owed": [], "session": session or ""}, LINK_TTL)
            return
        await self.store.put_link(digest(tenant, "response", given or ""), {
            "last": result.last.head.get("id"), "owed": owed, "shown": final, "session": session or ""}, LINK_TTL)

    # -- whose a stored response is (owners.py) -----------------------------------------

    def guards(self, request: web.Request) -> bool:
        """Whether toolkeeper says whose each response id is: the model server cannot tell this request's tenant."""
        return shared_key(request, upstream_for(request, self.upstream))

    async def retrieve(self, request: web.Request, response_id: str) -> tuple[str, dict[str, Any] | None] | None:
        """GET /v1/responses/{id}: (the id the model server knows, and the response as the agent received it when
        toolkeeper hid anything of it); None: an id not this tenant's. The server's stored response holds the
        hidden and the refused calls: the agent gets back what it got, never those."""
        link = await self.store.get_link(digest(credentials_hash(request), "response", response_id))
        if link is None:
            return None if self.guards(request) else (response_id, None)
        return link["last"], link.get("shown")

    async def refused_elsewhere(self, request: web.Request,
                                body: bytes | None) -> tuple[web.Response | None, bytes | None]:
        """A request the catch-all passes on (DELETE /v1/responses/{id}, its input_items, /compact, ...): refused
        when it names a response that is not this tenant's; else the body to send (read, when it named one)."""
        named = named_in_path(request.path, request.method)
        if named is None or not self.guards(request):
            return None, body
        if named:
            return (None if await self._owns(request, named) else response_not_found(named)), body
        previous, parsed = previous_in(body if body is not None else await request.read())
        if parsed is None:
            return self.refuse("the request body must be a JSON object"), None
        if isinstance(previous, str) and not await self._owns(request, previous):
            return previous_not_found(previous), None
        return None, dumps(parsed)  # what was checked is what goes: one copy of each key, as toolkeeper read it

    async def _owns(self, request: web.Request, response_id: str) -> bool:
        return await self.store.get_link(digest(credentials_hash(request), "response", response_id)) is not None


def whole_answer(body: dict[str, Any], result: TurnResult, relayed: list[tuple[Any, ...]]) -> dict[str, Any]:
    """The response a whole turn gives the agent: its items (`whole_output`; a turn of one round with no call
    in it: that round's items as shown), toolkeeper's closing words, the response's fields."""
    if result.rounds == 1 and len(relayed) == 1 and not result.last.tool_calls:
        output = list(relayed[0])
    else:
        output = whole_output(relayed, visible_items, {call.id for call in result.tool_calls})
    if result.said:
        output.append(said_item(result.said))
    return final_response(body, result, output)


def _references(given: Any) -> list[Any]:
    """The ids the `item_reference`s of an agent's input name."""
    return [i.get("id") for i in given if i.get("type") == "item_reference"] if isinstance(given, list) else []


def _owed(exchange: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The results the last round of a turn still owes the model server, as input items."""
    last_call = max((i for i, m in enumerate(exchange) if m.get("role") == "assistant"), default=-1)
    return input_from_messages(exchange[last_call + 1:])


def _conversation(tenant: str, conversation: Any) -> str:
    """The session of a request in a conversation the model server keeps (`conversation`: its id, or an object
    naming it); "" for none: the request then holds its whole conversation."""
    named = conversation.get("id") if isinstance(conversation, dict) else conversation
    return door_session("conversation-id", tenant, named) if isinstance(named, str) and named else ""
