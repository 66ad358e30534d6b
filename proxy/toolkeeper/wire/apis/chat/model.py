"""The engine's `Model` for Chat Completions: one `/chat/completions` request per round, read as it streams.

It holds the upstream and the agent's headers, nothing between rounds. What
one network read brings is handed on together, and what came before a broken
event still reaches the agent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson

from toolkeeper.common import dumps
from toolkeeper.engine import Round, Visible
from toolkeeper.wire.ambiguity import read_alike
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
                    # read here, not in a generator of its own: one layer less for every piece of every answer
                    stream = _Stream(first=previous is None)
                    content = response.content
                    async for data in content.iter_any():
                        visible = stream.read(data, content.at_eof())
                        if visible is not None:  # what came before a broken event is the agent's
                            yield visible
                        if stream.broken is not None:
                            raise stream.broken
                        if stream.done:
                            await drained(response)
                            break
                    visible = stream.last()
                    if visible is not None:
                        yield visible
                    yield stream.finish()
                    return
                # not streamed (or a server that ignored `stream`): one whole response
                raw = await read_whole(response)
                parsed = _parse_json(raw)
                found = round_from_response(raw, parsed)
                if not found.normalized and not read_alike(raw, parsed):
                    found.normalized = True  # re-encoded, each key once, not passed on as it came
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


class _Stream:
    """One streamed round, read as it arrives: what one network read brings is handed on together (in the
    turn's first round, each text event with its own bytes, `Visible.relay`, which the writer sends on as the
    server wrote them)."""

    def __init__(self, first: bool):
        self.first = first
        self.assembler = StreamAssembler()
        self.splitter = EventSplitter(MAX_EVENT_BYTES)
        self.shape = TextShape()
        self.done = False  # [DONE] read
        self.broken: Exception | None = None  # a broken event (MalformedResponse, EventTooLarge), raised after

    def read(self, data: bytes, ended: bool) -> Visible | None:
        """What the agent may see of one network read (`ended`: the body ended with it)."""
        read = _Read(self.assembler, self.shape)
        try:
            self.done = read.events(self.splitter.feed(data))
        except (UpstreamError, ValueError) as exc:
            self.broken = exc
        if not read.visible:
            return None
        relay = tuple(read.relay) if self.first else ()
        return Visible(tuple(read.visible), self.assembler.head, relay, last=self.done or ended)

    def last(self) -> Visible | None:
        """The last event, when the stream ended without a blank line after it."""
        last = self.splitter.rest()
        if not last or self.done:
            return None
        self.done, seen = _dispatch(last, self.assembler)
        return Visible((seen,), self.assembler.head, last=True) if seen else None

    def finish(self) -> Round:
        if not self.done and self.assembler.finish_reason is None:
            raise UpstreamError.ours(502, "the model server's stream ended before the response was complete",
                                     "upstream_incomplete")
        return self.assembler.finish()


class _Read:
    """The events of one network read: what the agent may see of them, and their own bytes (which the round's
    Visible carries in the turn's first round)."""

    def __init__(self, assembler: StreamAssembler, shape: TextShape):
        self.assembler = assembler
        self.shape = shape
        self.visible: list[dict[str, str]] = []
        self.relay: list[bytes | None] = []

    def events(self, events: list[bytes]) -> bool:
        """Read them in one loop (most are one piece of text: read by their shape, or parsed once and checked
        inline); True at [DONE]."""
        assembler, visible, relay, shape = self.assembler, self.visible, self.relay, self.shape
        texts = assembler.texts("content")
        for event in events:
            text = shape.text_of(event)
            if text is None and event.startswith(b'data: {"') and b"\n" not in event and assembler.head:
                chunk = _chunk_of(event)
                text = _text_of(chunk)
                if text is None:
                    done, seen = False, _fed(chunk, assembler)
                elif text and _relayable(event):
                    shape.learn(event, text)
                else:
                    event = b""  # sent as toolkeeper read it
            elif text is None:
                done, seen = _dispatch(event, assembler)
            if text is not None:
                if text:
                    texts.append(text)
                    visible.append({"content": text})
                    relay.append(event + b"\n\n" if event else None)
                continue
            if done:
                return True
            if seen:
                visible.append(seen)
                relay.append(None)
        return False


def _chunk_of(event: bytes) -> dict[str, Any]:
    """A `data: {...}` event's JSON object, or MalformedResponse saying what is wrong with it."""
    try:
        chunk = orjson.loads(event[6:])
    except orjson.JSONDecodeError:
        chunk = json_object(event[6:], "a stream event")  # raises, saying what is wrong
    if type(chunk) is not dict:
        json_object(event[6:], "a stream event")  # raises: not an object
    return chunk


def _relayable(event: bytes) -> bool:
    """An event whose own bytes may go to the agent: nothing in them that another parser could read as a call
    toolkeeper did not see. A key spelled with an escape (`tool\\u005fcalls`), in another case (Go matches keys
    so, a long s for an s too: see wire/ambiguity.py) or twice (toolkeeper keeps the last, some parsers the first) is
    such a thing: that event is sent as toolkeeper read it instead."""
    if b"\\u" in event:
        return False
    folded = event.lower() if event.isascii() else event.decode(errors="replace").casefold().encode()
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
