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
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from toolkeeper.common import digest
from toolkeeper.engine import TurnResult
from toolkeeper.store import Store, StoreError
from toolkeeper.wire.apis.base import AgentAPI
from toolkeeper.wire.apis.relay import whole_output
from toolkeeper.wire.apis.responses.items import (
    check_request,
    hosted_tool,
    input_from_messages,
    messages_from_input,
    said_item,
    visible_items,
)
from toolkeeper.wire.apis.responses.model import ENGINE_KEYS, ResponsesModel, forced_approvals
from toolkeeper.wire.apis.responses.writer import ResponsesWriter, final_response
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
        try:
            if isinstance(body.get("tools"), list):
                body = {**body, "tools": await self.offered(body["tools"], hosted_tool, context)}
            body = await self._follow_link(context.tenant, body)
            referenced = await self._referenced(context.tenant, body["input"])
        except StoreError as exc:
            return self.errors.response(store_unavailable(exc))
        neutral = {"messages": messages_from_input(body["input"], referenced),
                   **{key: body[key] for key in ENGINE_KEYS if key in body}}
        mcp_servers: dict[str, dict[str, Any]] = {}
        if isinstance(neutral.get("tools"), list):  # a hosted MCP server asks before each call, so the rules decide
            neutral["tools"], mcp_servers = forced_approvals(neutral["tools"])
        model = ResponsesModel(upstream_for(request, self.upstream), request.headers, body, request.query_string,
                               mcp_servers=mcp_servers)
        events = self.engine.run(neutral, model, context)

        async def keep(result: TurnResult, final: dict[str, Any]) -> None:
            try:
                await self._link(context.tenant, result, final)
                if result.exchange and body.get("store") is not False:
                    await self._remember_items(context.tenant, final["output"])
            except StoreError as exc:  # the agent has its answer; a later reference to it will miss
                log.error("the ids of this response could not be stored: %s", exc)

        if body.get("stream"):
            return await ResponsesWriter(request, body, self.keepalive, keep).relay(events)
        return await self.whole(events, lambda result, relayed: final_response(body, result, [
            *whole_output(relayed, visible_items, {call.id for call in result.tool_calls}),
            *([said_item(result.said)] if result.said else [])]), keep)

    # -- previous_response_id across hidden rounds ------------------------------------

    async def _follow_link(self, tenant: str, body: dict[str, Any]) -> dict[str, Any]:
        """The agent's previous_response_id, mapped to the last upstream response of that turn; the declared
        results that response still owes go first in the input."""
        previous = body.get("previous_response_id")
        link = await self.store.get_link(digest(tenant, "response", previous)) if isinstance(previous, str) else None
        if link is None:
            return body
        given = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
        return {**body, "previous_response_id": link["last"], "input": [*link["owed"], *given]}

    async def _referenced(self, tenant: str, given: Any) -> dict[str, dict[str, Any]]:
        """The items the agent's `item_reference`s stand for, among those toolkeeper handed it."""
        ids = [i.get("id") for i in given if i.get("type") == "item_reference"] if isinstance(given, list) else []
        keys = {digest(tenant, "item", item_id): item_id for item_id in ids if isinstance(item_id, str)}
        found = await self.store.get_links(list(keys))
        return {keys[key]: item for key, item in found.items()}

    async def _remember_items(self, tenant: str, output: list[dict[str, Any]]) -> None:
        """After a turn with hidden rounds, what the agent saw, by item id: clients that keep `store: true`
        send it back as references (the Vercel AI SDK), and the history must still recognise it."""
        for item in output:
            if isinstance(item.get("id"), str):
                await self.store.put_link(digest(tenant, "item", item["id"]), item, LINK_TTL)

    async def _link(self, tenant: str, result: TurnResult, final: dict[str, Any]) -> None:
        # after a mixed round, the results of its declared calls go upstream with the agent's own
        last_call = max((i for i, m in enumerate(result.exchange) if m.get("role") == "assistant"), default=-1)
        owed = input_from_messages(result.exchange[last_call + 1:])
        if result.rounds == 1 and not owed:
            return  # nothing hidden: the id the agent got is the model server's own, its answer as the agent saw it
        await self.store.put_link(digest(tenant, "response", final["id"] or ""),
                                  {"last": result.last.head.get("id"), "owed": owed, "shown": final}, LINK_TTL)

    async def retrieve(self, tenant: str, response_id: str) -> tuple[str, dict[str, Any] | None]:
        """GET /v1/responses/{id}: (the id the model server knows, and the response as the agent received it when
        toolkeeper hid anything of it). The server's stored response holds the hidden and the refused calls: the
        agent gets back what it got, never those."""
        link = await self.store.get_link(digest(tenant, "response", response_id))
        if link is None:
            return response_id, None
        return link["last"], link.get("shown")
