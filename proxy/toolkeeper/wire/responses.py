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
  agent's next `previous_response_id` is mapped through that link.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from toolkeeper.common import digest, dumps
from toolkeeper.engine import Round, TurnResult, Visible
from toolkeeper.store import Store, StoreError
from toolkeeper.wire.agentapi import AgentAPI, bad_request, whole_turn
from toolkeeper.wire.chat_stream import MalformedResponse
from toolkeeper.wire.intercepted import upstream_for
from toolkeeper.wire.relay import RelayingModel
from toolkeeper.wire.responses_items import (
    ITEMS,
    check_request,
    flat_tool,
    input_from_messages,
    messages_from_input,
    round_from_response,
    said_item,
    visible_items,
)
from toolkeeper.wire.responses_stream import ResponsesReader, UpstreamFailed
from toolkeeper.wire.responses_writer import ResponsesWriter, final_response
from toolkeeper.wire.sse import EventTooLarge
from toolkeeper.wire.upstream import Upstream, UpstreamError, forward_headers

log = logging.getLogger("toolkeeper")

# What the engine reads of a request; the rest of the agent's body goes upstream as it came.
ENGINE_KEYS = ("tools", "tool_choice", "parallel_tool_calls")
CHAIN_KEYS = ("previous_response_id", "conversation")
LINK_TTL = 30 * 24 * 3600  # stored responses are kept 30 days upstream


class ResponsesAPI(AgentAPI):
    api = "responses"

    def __init__(self, *args: Any, store: Store, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.store = store

    async def answer(self, request: web.Request, body: Any, raw: bytes) -> web.StreamResponse:
        problem = check_request(body)
        if problem:
            return bad_request(problem)
        context = self.context(request, raw)
        try:
            body = await self._follow_link(context.tenant, body)
            referenced = await self._referenced(context.tenant, body["input"])
        except StoreError as exc:
            return bad_request(f"toolkeeper's store did not answer: {exc}", "store_unavailable", status=503)
        neutral = {"messages": messages_from_input(body["input"], referenced),
                   **{key: body[key] for key in ENGINE_KEYS if key in body}}
        model = ResponsesModel(upstream_for(request, self.upstream), request.headers, body,
                               self.engine.hidden_names(neutral), request.query_string)
        events = self.engine.run(neutral, model, context)
        if body.get("stream"):
            writer = ResponsesWriter(request, model, self.keepalive)
            response = await writer.relay(events)
            result, shown = writer.result, writer.output
        else:
            response, result = await self._whole(model, events)
            shown = visible_items(model.visible_output, set(), {call.id for call in result.tool_calls}) \
                if result is not None else []
        if result is not None:
            try:
                await self._link(context.tenant, model, result)
                if result.exchange and body.get("store") is not False:
                    await self._remember_items(context.tenant, shown)
            except StoreError as exc:  # the agent has its answer; a later reference to it will miss
                log.error("the ids of this response could not be stored: %s", exc)
        return response

    async def _whole(self, model: ResponsesModel, events: AsyncIterator[Any]) -> tuple[web.StreamResponse,
                                                                                       TurnResult | None]:
        result = await whole_turn(events)
        if isinstance(result, web.Response):
            return result, None
        if result.passthrough and not model.hidden:  # no declared tool offered: the server's bytes as they are
            return web.Response(body=result.last.raw, content_type="application/json"), result
        allowed = {call.id for call in result.tool_calls}
        output = visible_items(model.visible_output, set(), allowed) + ([said_item(result.said)] if result.said else [])
        return web.Response(body=dumps(final_response(model, result, output)),
                            content_type="application/json"), result

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

    async def _link(self, tenant: str, model: ResponsesModel, result: TurnResult) -> None:
        # after a mixed round, the results of its declared calls go upstream with the agent's own
        last_call = max((i for i, m in enumerate(result.exchange) if m.get("role") == "assistant"), default=-1)
        owed = input_from_messages(result.exchange[last_call + 1:])
        if result.rounds == 1 and not owed:
            return  # nothing hidden: the id the agent got is the model server's own
        await self.store.put_link(digest(tenant, "response", model.first_id or ""),
                            {"last": result.last.head.get("id"), "owed": owed}, LINK_TTL)

    async def resolve(self, tenant: str, response_id: str) -> str:
        """An id the agent received, as the model server knows it (for GET /v1/responses/{id})."""
        link = await self.store.get_link(digest(tenant, "response", response_id))
        return link["last"] if link else response_id


class ResponsesModel(RelayingModel):
    """The engine's Model for the Responses API: one upstream response per round."""

    def __init__(self, upstream: Upstream, headers: Mapping[str, str], body: dict[str, Any], hidden: set[str],
                 query: str = ""):
        super().__init__(hidden, bool(body.get("stream")))
        self.upstream = upstream
        self.query = f"?{query}" if query else ""  # the agent's (Azure's api-version): the model server's too
        self.headers = {**forward_headers(headers, upstream.api_key), "Content-Type": "application/json"}
        self.body = body
        self.chain = next((key for key in CHAIN_KEYS if body.get(key)), None)
        self._consumed = 0  # chained: how many neutral messages the upstream chain already holds

    @property
    def first_id(self) -> str | None:
        return (self.first or {}).get("id")

    def shown(self, response: dict[str, Any]) -> dict[str, Any]:
        """A response object as the agent may see it: the server echoes the tools it was sent, declared ones
        included; the agent sees its own, and its own tool_choice."""
        shown = {**response, "tools": self.body.get("tools") or []}
        if "tool_choice" in self.body:
            shown["tool_choice"] = self.body["tool_choice"]
        return shown

    def request(self, neutral: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in self.body.items() if k not in (*ENGINE_KEYS, *CHAIN_KEYS, "input")}
        for key in ENGINE_KEYS:
            if key in neutral:
                out[key] = [flat_tool(t) for t in neutral[key]] if key == "tools" else neutral[key]
        messages = neutral["messages"]
        if self.chain and self.rounds:  # the chain holds the rounds so far: only the new items go
            if self.chain == "previous_response_id":
                out["previous_response_id"] = self.rounds[-1].head.get("id")
            else:
                out["conversation"] = self.body["conversation"]
            out["input"] = input_from_messages(messages[self._consumed:])
        else:
            out.update({key: self.body[key] for key in CHAIN_KEYS if key in self.body})
            out["input"] = input_from_messages(messages)
        self._consumed = len(messages) + 1  # and the round's own output
        return out

    async def round(self, body: dict[str, Any]) -> AsyncIterator[Visible | Round]:
        self.reader = ResponsesReader(self.hidden)
        try:
            async for event in self.post(self.upstream, self.upstream.url("/responses") + self.query,
                                         dumps(self.request(body)), self.headers):
                yield event
        except (MalformedResponse, EventTooLarge) as exc:
            code = "upstream_too_large" if isinstance(exc, EventTooLarge) else "upstream_malformed"
            raise UpstreamError.ours(502, f"the model server sent a malformed response: {exc}", code) from exc
        except UpstreamFailed as exc:
            error = {"message": exc.error.get("message") or "the model server failed", "type": "upstream_error",
                     "param": None, "code": exc.error.get("code") or "upstream_failed"}
            raise UpstreamError(502, orjson.dumps({"error": error})) from exc
        except TimeoutError as exc:
            raise UpstreamError.ours(504, "the model server did not answer in time", "upstream_timeout") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError.ours(502, f"cannot reach the model server: {exc}", "upstream_unreachable") from exc

    def without_calls(self, output: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return visible_items(output, set(), set())

    def _read_whole(self, raw: bytes) -> list[Visible | Round]:
        try:
            response = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise MalformedResponse(f"JSON that does not parse ({exc})") from exc
        if not isinstance(response, dict) or not isinstance(response.get("output", []), list):
            raise MalformedResponse("a response without its output list")
        if response.get("status") == "failed":
            raise UpstreamFailed(response.get("error") or {}, response)
        found = round_from_response(response, raw if not self.streaming else None)
        return self.whole(found, response, visible_items(found.message[ITEMS], self.hidden))
