"""What the Responses and Messages adapters share: reading an upstream stream for an agent that must not see
every item of it.

- `HoldingReader`: the events the agent may see, in order. An item's events
  are kept, dropped (a declared call) or held: a reasoning or thinking item
  until the item after it shows whether it is hidden (it travels with the
  item it precedes), and one of the agent's own calls until the rules have
  decided on it (the writer sends it, at the end, only if it was allowed).
- `RelayingModel`: one upstream round, streamed or whole, read through such a
  reader; the events to relay wait in `relayed`, tagged with their round, for
  the adapter's writer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from toolkeeper.engine import Round, Visible
from toolkeeper.wire.chat_stream import MalformedResponse
from toolkeeper.wire.sse import EventSplitter
from toolkeeper.wire.upstream import MAX_EVENT_BYTES, Upstream, UpstreamError, read_whole

RAW = "_raw"  # an upstream event's own bytes, kept beside its parsed fields


def parse_event(data: bytes) -> dict[str, Any]:
    """One SSE event's JSON (its `data:` lines; the `event:` line repeats the type), with its bytes (`RAW`):
    an event the writer need not renumber goes to the agent as the server wrote it."""
    lines = [line[5:].lstrip() for line in data.split(b"\n") if line.startswith(b"data:")]
    try:
        event = orjson.loads(b"\n".join(lines))
    except orjson.JSONDecodeError as exc:
        raise MalformedResponse(f"a stream event that is not JSON ({exc})") from exc
    if not isinstance(event, dict):
        raise MalformedResponse("a stream event that is not an object")
    event[RAW] = data
    return event


class HoldingReader:
    def __init__(self, hidden: set[str]):
        self.hidden = hidden
        self.relay: list[dict[str, Any]] = []  # the agent's events, not yet taken
        self._held: dict[int, list[dict[str, Any]]] = {}  # reasoning or thinking items' events, by index
        self._dropped: set[int] = set()
        self.awaiting: dict[int, tuple[str, list[dict[str, Any]]]] = {}  # the agent's own calls: id, events

    @property
    def head(self) -> dict[str, Any] | None:
        """The round's response or message, once its first event came."""
        raise NotImplementedError

    def feed(self, event: dict[str, Any]) -> str | None:
        raise NotImplementedError

    def finish(self) -> Round:
        raise NotImplementedError

    def starts(self, index: int, *, holds: bool, hidden: bool, own_call: str | None = None) -> None:
        """An item begins: held until the next, or it settles the held ones (hidden with it, or shown, or
        waiting with the agent's call they precede)."""
        if holds:
            self._held[index] = []
            return
        before = [event for held in sorted(self._held) for event in self._held[held]]
        if hidden:
            self._dropped.update(self._held)
        elif own_call is not None:
            self.awaiting[index] = (own_call, before)
        else:
            self.relay.extend(before)
        self._held.clear()
        if hidden:
            self._dropped.add(index)

    def route(self, index: int, event: dict[str, Any]) -> bool:
        """Keep, hold or drop one of an item's events; True when the agent gets it."""
        if index in self._dropped:
            return False
        if index in self._held:
            self._held[index].append(event)
            return False
        if index in self.awaiting:
            self.awaiting[index][1].append(event)
            return False
        self.relay.append(event)
        return True

    def settle(self) -> None:
        """The round ended: a held item with nothing after it stays hidden."""
        self._dropped.update(self._held)
        self._held.clear()

    def take(self) -> list[dict[str, Any]]:
        taken, self.relay = self.relay, []
        return taken


class RelayingModel:
    reader: HoldingReader | None

    def __init__(self, hidden: set[str], streaming: bool):
        self.hidden = hidden
        self.streaming = streaming
        self.first: dict[str, Any] | None = None  # the first round's response or message: the agent's id
        self.rounds: list[Round] = []
        self.visible_output: list[dict[str, Any]] = []  # not streamed: what the agent sees, in order
        self.relayed: list[tuple[int, dict[str, Any]]] = []  # streamed: (round, event) the writer has yet to send
        self.calls: list[tuple[int, str, list[dict[str, Any]]]] = []  # streamed: the agent's calls, for the verdict
        self.reader = None

    async def post(self, upstream: Upstream, url: str, payload: bytes,
                   headers: dict[str, str]) -> AsyncIterator[Visible | Round]:
        """One round: the request posted, the answer read as a stream or whole (`_read_whole`)."""
        async with upstream.session.post(url, data=payload, headers=headers, timeout=upstream.timeout) as response:
            if response.status != 200:
                raise UpstreamError(response.status, await response.read(),
                                    response.headers.get("Content-Type", "application/json"))
            if "text/event-stream" in response.headers.get("Content-Type", ""):
                async for event in self.read_stream(response):
                    yield event
            else:
                for event in self._read_whole(await read_whole(response)):
                    yield event

    def _read_whole(self, raw: bytes) -> list[Visible | Round]:
        raise NotImplementedError

    def without_calls(self, output: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The output without any call (and the reasoning or thinking that led to one)."""
        raise NotImplementedError

    async def read_stream(self, response: aiohttp.ClientResponse) -> AsyncIterator[Visible | Round]:
        reader = self.reader
        assert reader is not None
        events = EventSplitter(MAX_EVENT_BYTES)
        async for data in response.content.iter_any():
            texts = [text for event in events.feed(data) if (text := reader.feed(parse_event(event)))]
            self.first = self.first or reader.head
            if self._collect():
                yield Visible(tuple({"content": text} for text in texts), {"id": (self.first or {}).get("id")})
        last = events.rest()
        if last:
            reader.feed(parse_event(last))
        found = reader.finish()
        self._collect()
        round_number = len(self.rounds)
        self.calls.extend((round_number, call_id, events) for _, (call_id, events) in sorted(reader.awaiting.items()))
        yield self.finished(found)

    def whole(self, found: Round, response: dict[str, Any], shown: list[dict[str, Any]]) -> list[Visible | Round]:
        """A whole (not streamed) round: what the agent sees of it, and the Round."""
        self.first = self.first or response
        if self.visible_output:  # a round before this one did not end the turn: none of its agent's calls went
            self.visible_output = self.without_calls(self.visible_output)
        self.visible_output.extend(shown)
        text = found.message.get("content")
        return [*([Visible(({"content": text},), {"id": self.first.get("id")})] if text else []),
                self.finished(found)]

    def _collect(self) -> bool:
        """Move what the reader kept for the agent to the writer's queue; True when there was some."""
        taken = self.reader.take() if self.reader else []
        self.relayed.extend((len(self.rounds), event) for event in taken)
        return bool(taken)

    def take(self) -> list[tuple[int, dict[str, Any]]]:
        taken, self.relayed = self.relayed, []
        return taken

    def allowed_calls(self, allowed: set[str]) -> list[tuple[int, dict[str, Any]]]:
        """At the turn's end: the events of the agent's calls that the rules let through, in order. Only the
        last round's: a round with an agent's call that went through ends the turn, so an earlier round's were
        refused (whatever id a later call reuses)."""
        last = len(self.rounds) - 1
        return [(number, event) for number, call_id, events in self.calls if number == last and call_id in allowed
                for event in events]

    def finished(self, found: Round) -> Round:
        self.rounds.append(found)
        return found
