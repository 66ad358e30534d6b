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
from toolkeeper.wire.errors import MalformedResponse, UpstreamError, UpstreamFailures, json_object
from toolkeeper.wire.sse import EventSplitter, TextShape
from toolkeeper.wire.upstream import MAX_EVENT_BYTES, Upstream, drained, is_event_stream, read_whole


class ChatModel:
    def __init__(self, upstream: Upstream, headers: Mapping[str, str], query: str = ""):
        self.upstream = upstream
        self.headers = upstream.headers(headers)
        self.query = query  # the agent's (Azure's api-version): the model server's too

    async def round(self, body: dict[str, Any], *, hidden: frozenset[str] = frozenset(),
                    previous: Round | None = None) -> AsyncIterator[Visible | Round]:
        streaming = bool(body.get("stream"))
        with UpstreamFailures():
            async with self.upstream.post("/chat/completions", dumps(body), self.headers, self.query) as response:
                if streaming and is_event_stream(response):
                    async for event in _read_stream(response, first=previous is None):
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


async def _read_stream(response: aiohttp.ClientResponse, first: bool = False) -> AsyncIterator[Visible | Round]:
    """Parse SSE as it arrives; what one network read brings is handed on together. In the turn's first round,
    each text event goes with its own bytes (`Visible.relay`), which the writer sends on as the server wrote
    them."""
    assembler = StreamAssembler()
    events = EventSplitter(MAX_EVENT_BYTES)
    shape = TextShape()
    done = False
    async for data in response.content.iter_any():
        read = _Read(assembler, shape, first)
        try:
            done = read.events(events.feed(data))
        except (UpstreamError, ValueError) as exc:  # a broken event (MalformedResponse, EventTooLarge)
            read.broken = exc
        # what came before a broken event is the agent's, whatever the network's timing
        if read.visible:
            yield Visible(tuple(read.visible), assembler.head, tuple(read.relay) if first else ())
        if read.broken is not None:
            raise read.broken
        if done:
            await drained(response)
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


class _Read:
    """The events of one network read: what the agent may see of them, and (first round) their own bytes."""

    def __init__(self, assembler: StreamAssembler, shape: TextShape, first: bool):
        self.assembler = assembler
        self.shape = shape
        self.first = first
        self.visible: list[dict[str, str]] = []
        self.relay: list[bytes | None] = []
        self.broken: Exception | None = None

    def events(self, events: list[bytes]) -> bool:
        """Read them in one loop (most are one piece of text: read by their shape, or parsed once and checked
        inline); True at [DONE]."""
        assembler, visible, relay, shape = self.assembler, self.visible, self.relay, self.shape
        texts = assembler.texts("content")
        for event in events:
            text = shape.text_of(event)
            if text is not None:
                if text:
                    texts.append(text)
                    visible.append({"content": text})
                    relay.append(event + b"\n\n")
                continue
            if event.startswith(b'data: {"') and b"\n" not in event and assembler.head:
                try:
                    chunk = orjson.loads(event[6:])
                except orjson.JSONDecodeError:
                    chunk = json_object(event[6:], "a stream event")  # raises, saying what is wrong
                if type(chunk) is not dict:
                    json_object(event[6:], "a stream event")  # raises: not an object
                text = _text_of(chunk)
                if text is not None:
                    if text:
                        texts.append(text)
                        visible.append({"content": text})
                        relayable = _relayable(event)
                        relay.append(event + b"\n\n" if relayable else None)
                        if relayable:
                            shape.learn(event, text)
                    continue
                done, seen = False, _fed(chunk, assembler)
            else:
                done, seen = _dispatch(event, assembler)
            if done:
                return True
            if seen:
                visible.append(seen)
                relay.append(None)
        return False


def _relayable(event: bytes) -> bool:
    """An event whose own bytes may go to the agent: nothing in them that another parser could read as a call
    toolkeeper did not see. A key spelled with an escape (`tool\\u005fcalls`), in another case (Go matches keys
    so) or twice (toolkeeper keeps the last, some parsers the first) is such a thing: that event is sent as
    toolkeeper read it instead."""
    if b"\\u" in event:
        return False
    folded = event.lower()
    return (b'"tool_calls"' not in folded and b'"function_call"' not in folded
            and folded.count(b'"choices"') == 1 and folded.count(b'"delta"') == 1)


def _text_of(chunk: dict[str, Any]) -> str | None:
    """The text of a chunk that carries only that: one choice, no finish, no usage, no error (None: any other)."""
    choices = chunk.get("choices")
    if type(choices) is not list or len(choices) != 1 or chunk.get("usage") is not None or "error" in chunk:
        return None
    choice = choices[0]
    if type(choice) is not dict or choice.get("finish_reason") is not None:
        return None
    delta = choice.get("delta")
    if type(delta) is not dict or len(delta) != 1:
        return None
    text = delta.get("content")
    return text if type(text) is str else None


def _fed(chunk: dict[str, Any], assembler: StreamAssembler) -> dict[str, str] | None:
    if chunk.get("error"):
        raise UpstreamError(502, orjson.dumps({"error": chunk["error"]}))  # the server's own error, as it came
    return assembler.feed(chunk)


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
    return False, _fed(json_object(data, "a stream event"), assembler)
