"""The engine's `Model` for Chat Completions: one `/chat/completions` request per round, read as it streams.

It holds the upstream and the agent's headers, nothing between rounds. What
one network read brings is handed on together, and what came before a broken
event still reaches the agent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import orjson

from toolkeeper.common import dumps
from toolkeeper.engine import Round, Visible
from toolkeeper.wire.apis.chat.stream import VISIBLE_FIELDS, StreamAssembler, round_from_response
from toolkeeper.wire.errors import MalformedResponse, UpstreamError, json_object, upstream_failures
from toolkeeper.wire.sse import EventSplitter
from toolkeeper.wire.upstream import MAX_EVENT_BYTES, Upstream, is_event_stream, read_whole


class ChatModel:
    def __init__(self, upstream: Upstream, headers: Mapping[str, str], query: str = ""):
        self.upstream = upstream
        self.headers = upstream.headers(headers)
        self.query = query  # the agent's (Azure's api-version): the model server's too

    async def round(self, body: dict[str, Any], *, hidden: frozenset[str] = frozenset(),
                    previous: Round | None = None) -> AsyncIterator[Visible | Round]:
        streaming = bool(body.get("stream"))
        with upstream_failures():
            async with self.upstream.post("/chat/completions", dumps(body), self.headers, self.query) as response:
                if streaming and is_event_stream(response):
                    async for event in _read_stream(response):
                        yield event
                    return
                # not streamed (or a server that ignored `stream`): one whole response
                raw = await read_whole(response)
                found = round_from_response(raw, _parse_json(raw))
                visible = {key: value for key, value in found.message.items()
                           if key in VISIBLE_FIELDS and isinstance(value, str) and value}
                if visible:
                    yield Visible((visible,), found.head)
                if streaming:
                    found.raw = None  # the agent gets SSE, not these bytes
                yield found


def _parse_json(raw: bytes) -> dict[str, Any]:
    parsed = json_object(raw, "a response")
    if not isinstance(parsed.get("choices"), list):
        raise MalformedResponse("a response without choices")
    return parsed


async def _read_stream(response: aiohttp.ClientResponse) -> AsyncIterator[Visible | Round]:
    """Parse SSE as it arrives; what one network read brings is handed on together."""
    assembler = StreamAssembler()
    events = EventSplitter(MAX_EVENT_BYTES)
    done = False
    async for data in response.content.iter_any():
        visible: list[dict[str, str]] = []
        broken: Exception | None = None
        try:
            for event in events.feed(data):
                done, seen = _dispatch(event, assembler)
                if done:
                    break
                if seen:
                    visible.append(seen)
        except (UpstreamError, ValueError) as exc:  # a broken event (MalformedResponse, EventTooLarge)
            broken = exc
        # what came before a broken event is the agent's, whatever the network's timing
        if visible:
            yield Visible(tuple(visible), assembler.head)
        if broken is not None:
            raise broken
        if done:
            break
    last = events.rest()
    if last and not done:  # the last event, with no blank line after it
        done, seen = _dispatch(last, assembler)
        if seen:
            yield Visible((seen,), assembler.head)
    if not done and assembler.finish_reason is None:
        raise UpstreamError.ours(502, "the model server's stream ended before the response was complete",
                                 "upstream_incomplete")
    yield assembler.finish()


def _dispatch(event: bytes, assembler: StreamAssembler) -> tuple[bool, dict[str, str] | None]:
    """One SSE event: (the stream is done, what the agent may see of it)."""
    if event.startswith(b"data: ") and b"\n" not in event:
        data = event[6:]  # the usual shape: one data line
    else:
        lines = [line[6:] if line[5:6] == b" " else line[5:]
                 for line in event.split(b"\n") if line.startswith(b"data:")]
        if not lines:
            return False, None  # a comment, or event:/id:/retry: fields only
        data = b"\n".join(lines)
    if data.strip() == b"[DONE]":
        return True, None
    chunk = json_object(data, "a stream event")
    if chunk.get("error"):
        raise UpstreamError(502, orjson.dumps({"error": chunk["error"]}))  # the server's own error, as it came
    return False, assembler.feed(chunk)
