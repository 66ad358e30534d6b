"""What the Responses and Messages adapters share: they relay their server's own events, less what the agent
must not see.

    upstream SSE --parse_event--> a HoldingReader (one per round) --Visible(relay=events)--> engine --> RelayWriter
                                        └── at the round's end: Round(held=the agent's calls' events) --> TurnResult

- `HoldingReader`: one round's stream, in order. An item's events are kept,
  dropped (a declared call) or held: a reasoning or thinking item until the
  item after it shows whether it is hidden (it travels with the item it
  precedes), and one of the agent's own calls until the rules have decided on
  it (its events ride on the Round; the writer relays them at the end only if
  the call went through).
- `RelayingModel`: the engine's Model for such an API, one upstream request a
  round, holding nothing between rounds (what the next round needs of this
  one travels on the Round: its head, the turn's first response). A streamed
  round goes through a reader (`read_relayed`); each event keeps its bytes
  (`RAW`) and its round (`ROUND`), so the writer can pass on as they came the
  events it need not renumber (those checked for it travel in a `Run`:
  runs.py). A whole round is relayed as its shown items.
- `RelayWriter` (relay_writer.py): the agent's side, streamed: numbers the
  items of every round into one answer, opens it once, and sends the held
  calls that went through.
- `whole_output`: the agent's side, not streamed: the items of every round.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import aiohttp
import orjson

from toolkeeper.common import dumps
from toolkeeper.engine import Round, Visible
from toolkeeper.wire.ambiguity import check_keys, check_keys_beside, read_alike
from toolkeeper.wire.apis.runs import RAW, ROUND, Run
from toolkeeper.wire.errors import OPENAI, ErrorShape, MalformedResponse, UpstreamFailures, json_object
from toolkeeper.wire.sse import EventSplitter
from toolkeeper.wire.upstream import MAX_EVENT_BYTES, Upstream, is_event_stream, read_whole

FIRST = "first"  # in a round's head: the turn's first response (or message) as its stream began: the agent's id

Items = Callable[[list[dict[str, Any]], set[str], set[str] | None], list[dict[str, Any]]]


def parse_event(data: bytes, round_key: object, own: frozenset[str] = frozenset()) -> dict[str, Any]:
    """One SSE event's JSON (its `data:` lines; the `event:` line repeats the type), with its round, and its
    bytes (and where its JSON begins in them) when they may go on as they came: the usual shape, one event line
    naming the event's type and one data line, of a type not in `own` (the answer's own events, never
    relayed). Others are re-encoded by the writer. Its keys are checked (wire/ambiguity.py): an event of a type
    in `own` (toolkeeper keeps the fields of its response or message and replaces what holds items) down to
    its objects' fields only."""
    at = data.find(b"\n")
    usual = data.startswith(b"event: ") and data.startswith(b"\ndata: ", at) and data.find(b"\n", at + 1) < 0
    if usual:
        payload = data[at + 7:]
    else:
        payload = b"\n".join(line[5:].lstrip() for line in data.split(b"\n") if line.startswith(b"data:"))
    try:
        event = orjson.loads(payload)
    except orjson.JSONDecodeError:
        event = None
    if type(event) is not dict:
        event = json_object(payload, "a stream event")  # raises, saying what is wrong
    kind = event.get("type")
    mine = kind in own
    if not (payload.isascii() and payload.islower() and payload.find(b"\\u") < 0):  # `check_keys`'s own test
        check_keys_beside(payload, event, shallow=mine)
    # whether each key is once in them is asked only of the events relayed (`HoldingReader.ran`, the writer)
    event[RAW] = (data, at + 7) if usual and not mine and type(kind) is str and data[7:at] == kind.encode() \
        else None
    event[ROUND] = round_key
    return event


def event_object(event: dict[str, Any], key: str) -> dict[str, Any]:
    """An event's field that must be an object (`response`, `item`, `message`, `content_block`, `delta`)."""
    value = event.get(key)
    if not isinstance(value, dict):
        raise MalformedResponse(f"a {event.get('type')} event without its '{key}' object")
    return value


def round_head(head: dict[str, Any], started: dict[str, Any] | None, previous: Round | None) -> dict[str, Any]:
    """A round's head, with the turn's first response as it began (carried on from the round before)."""
    first = previous.head.get(FIRST) if previous is not None else None
    return {**head, FIRST: first or started}


class HoldingReader:
    own_events: frozenset[str] = frozenset()  # the answer's own events (`parse_event`), read, never relayed
    text_kind = ""  # the type of the events that add text (`text_of` says what text)
    index_key = "index"  # where an item's event names its item
    numbered = False  # whether the API numbers its events (`sequence_number`): a run's are the server's in a row
    item_done = ""  # the type of the event that carries a finished item (relayed, the answer lists it)

    def __init__(self, hidden: frozenset[str], previous: Round | None):
        self.hidden = hidden
        self.previous = previous
        self.started: dict[str, Any] | None = None  # the round's response or message as its stream began
        self._head: dict[str, Any] | None = None  # the round's head for its Visible pieces, once started
        self._shown: list[dict[str, Any]] = []  # the agent's events of the event being read
        self._held: dict[int, list[dict[str, Any]]] = {}  # reasoning or thinking items' events, by index
        self._dropped: set[int] = set()
        self.awaiting: dict[int, tuple[str, list[dict[str, Any]]]] = {}  # the agent's own calls: id, events

    def read(self, event: dict[str, Any]) -> None:
        """Take one event: `starts` an item, `route` an item's event, or keep it as the round's own."""
        raise NotImplementedError

    def text_of(self, event: dict[str, Any]) -> str | None:
        """The answer's text an event adds, if any."""
        raise NotImplementedError

    def finish(self) -> Round:
        raise NotImplementedError

    def feed(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """One event; the events the agent may have now (it, or held ones it settles)."""
        self._shown = []
        self.read(event)
        return self._shown

    def take_all(self, events: list[bytes], round_key: object) -> list[Any]:
        """The events of one network read, as they came (their bytes): what the agent may have now, in order
        (events as parsed, and runs of events that may go on as they came: `Run`)."""
        relay: list[Any] = []
        self._shown, read, own, run = relay, self.read, self.own_events, None  # what `read` shows goes in
        for data in events:
            event = parse_event(data, round_key, own)
            before = len(relay)
            read(event)
            run = self.ran(run, relay, before, event)
        return relay

    def ran(self, run: Run | None, relay: list[Any], before: int, event: dict[str, Any],
            number: Any = 0) -> Run | None:
        """`event`, just read (`relay` held `before` entries): in the run it follows, or in a new one, when it was
        shown at once, alone, and may go on as it came (its usual shape, each key once: `read_alike`; and its
        number, `number`, the one after the run's); then the run. None: it stays as parsed, for the writer."""
        if len(relay) != before + 1 or relay[before] is not event:
            return None
        raw = event[RAW]
        numbered = self.numbered
        if raw is None or (numbered and type(number) is not int):
            return None
        data, at = raw
        round_key = event.pop(ROUND)
        del event[RAW]
        if not read_alike(data[at:], event):
            event[RAW], event[ROUND] = None, round_key  # written as toolkeeper read it
            return None
        if run is None or (numbered and number != run.number + len(run.data)):
            run = Run(number if numbered else 0, round_key)
            relay[before] = run
        else:
            relay.pop()
        kind = event["type"]
        run.parsed(data, event, event.get(self.index_key), self.text_of(event) if kind == self.text_kind else None)
        if kind == self.item_done:
            run.items.append(event["item"])
        return run

    def take(self, data: bytes, round_key: object) -> list[dict[str, Any]]:
        """One event as it came: what the agent may have now, each event as the API has it."""
        return [event for kept in self.take_all([data], round_key)
                for event in (kept.expanded() if type(kept) is Run else (kept,))]

    def visible(self, relay: list[Any], last: bool = False) -> Visible:
        texts: list[dict[str, str]] = []
        text_kind = self.text_kind
        for event in relay:
            if type(event) is Run:
                texts += [{"content": text} for text in event.texts]
            elif event["type"] == text_kind and (text := self.text_of(event)):
                texts.append({"content": text})
        head = self._head
        if head is None:
            head = round_head({"id": (self.started or {}).get("id")}, self.started, self.previous)
            self._head = head if self.started is not None else None
        return Visible(tuple(texts), head, tuple(relay), last)

    def starts(self, index: int, *, holds: bool, hidden: bool, own_call: str | None = None) -> None:
        """An item begins: held until the next, or it settles the held ones (hidden with it, or shown, or
        waiting with the agent's call they precede)."""
        if holds:
            self._held[index] = []
            return
        before = [event for held in sorted(self._held) for event in self._held[held]] if self._held else []
        if hidden:
            self._dropped.update(self._held)
        elif own_call is not None:
            self.awaiting[index] = (own_call, before)
        else:
            self._shown.extend(before)
        self._held.clear()
        if hidden:
            self._dropped.add(index)

    def route(self, index: int, event: dict[str, Any]) -> None:
        """Keep, hold or drop one of an item's events."""
        if index in self._dropped:
            return
        if index in self._held:
            self._held[index].append(event)
        elif index in self.awaiting:
            self.awaiting[index][1].append(event)
        else:
            self._shown.append(event)

    def keep(self, event: dict[str, Any]) -> None:
        """An event of the round as a whole (annotations, ...): the agent's."""
        self._shown.append(event)

    def settled(self, found: Round) -> Round:
        """The round ended: a held item with nothing after it stays hidden; the agent's calls ride on the Round."""
        if self._held:
            self._dropped.update(self._held)
            self._held.clear()
        if self.awaiting:
            found.held = [self.awaiting[index] for index in sorted(self.awaiting)]
        return found


async def read_relayed(response: aiohttp.ClientResponse, reader: HoldingReader) -> AsyncIterator[Visible | Round]:
    """One streamed round: what the agent may see as it comes (what one network read brings, together), then
    the Round. Nothing of a round whose end is malformed goes out after the fault."""
    round_key = object()
    events = EventSplitter(MAX_EVENT_BYTES)
    content = response.content
    async for data in content.iter_any():
        relay = reader.take_all(events.feed(data), round_key)
        if relay:
            yield reader.visible(relay, content.at_eof())
    last = events.rest()
    relay = reader.take_all([last], round_key) if last else []
    found = reader.finish()
    if relay:
        yield reader.visible(relay, True)
    yield found


@dataclass(frozen=True)
class Relayed:
    """What relaying needs to know of one API."""

    path: str  # its endpoint under the base URL
    answer: str  # what a whole answer is called, for errors ("a response")
    listed: str  # a whole answer's list of items ("output")
    kept_in: str  # where a Round's message keeps them
    reader: Callable[[frozenset[str], Round | None], HoldingReader]
    items: Items  # the items an agent may see (the declared calls, and the refused ones, out)
    errors: ErrorShape = OPENAI
    key_header: str = "Authorization"  # where toolkeeper's own key goes, when it holds one


class RelayingModel:
    api: ClassVar[Relayed]

    def __init__(self, upstream: Upstream, headers: Mapping[str, str], body: dict[str, Any], query: str = ""):
        self.upstream = upstream
        self.headers = upstream.headers(headers, self.api.key_header)
        self.body = body  # the agent's request, as it came
        self.query = query  # the agent's (Azure's api-version, Anthropic's beta): the model server's too
        self.streaming = bool(body.get("stream"))

    def request(self, neutral: dict[str, Any], previous: Round | None) -> dict[str, Any]:
        """This round's request body, in the API's own form."""
        raise NotImplementedError

    def round_of(self, answer: dict[str, Any], raw: bytes | None) -> Round:
        raise NotImplementedError

    @staticmethod
    def texts_of(answer: dict[str, Any]) -> tuple[Any, ...]:
        """The texts a whole answer says, where the upper case of its bytes usually is (`check_keys`)."""
        return ()

    def prepared(self, found: Round) -> Round:
        """A round's calls as the engine is to decide on them (what the agent's request says of them)."""
        return found

    async def round(self, body: dict[str, Any], *, hidden: frozenset[str],
                    previous: Round | None) -> AsyncIterator[Visible | Round]:
        payload = dumps(self.request(body, previous))
        with UpstreamFailures(self.api.errors):
            async with self.upstream.post(self.api.path, payload, self.headers, self.query) as response:
                if is_event_stream(response):
                    async for event in read_relayed(response, self.api.reader(hidden, previous)):
                        yield self.prepared(event) if isinstance(event, Round) else event
                else:
                    for event in self._whole(await read_whole(response), hidden, previous):
                        yield event

    def _whole(self, raw: bytes, hidden: frozenset[str], previous: Round | None) -> list[Visible | Round]:
        """A whole answer: its text and shown items, then the Round. Its bytes can go back as they came only
        when nothing was hidden (a server echoes the tools it was sent), the agent asked for JSON, and every
        parser reads them alike."""
        api = self.api
        answer = json_object(raw, api.answer)
        if not isinstance(answer.get(api.listed, []), list):
            raise MalformedResponse(f"{api.answer} without its {api.listed} list")
        check_keys(raw, answer, texts=self.texts_of(answer))
        passed = not (self.streaming or hidden) and read_alike(raw, answer)
        found = self.prepared(self.round_of(answer, raw if passed else None))
        found.head = round_head(found.head, answer, previous)
        shown = () if self.streaming else tuple(api.items(found.message[api.kept_in], set(hidden), None))
        text = found.message.get("content")
        visible = Visible(({"content": text},) if text else (), found.head, shown)
        return [visible, found] if text or shown else [found]


def shown_entries(entries: list[dict[str, Any]], hidden: set[str] | frozenset[str], allowed: set[str] | None, *,
                  held: tuple[str, ...], is_call: Callable[[dict[str, Any]], bool],
                  id_of: Callable[[dict[str, Any]], str],
                  name_of: Callable[[dict[str, Any]], Any] = lambda entry: entry.get("name"),
                  ) -> list[dict[str, Any]]:
    """The items (or blocks) an agent may see: all but the declared calls (and, given `allowed`, the agent's
    calls the rules did not let through), and the reasoning or thinking that led to one (of a type in `held`:
    it travels with the entry it precedes). `name_of`: a call's name as the rules know it."""
    shown: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    for entry in entries:
        if entry.get("type") in held:
            pending.append(entry)
            continue
        if not (is_call(entry) and (name_of(entry) in hidden or (allowed is not None and id_of(entry) not in allowed))):
            shown.extend(pending)
            shown.append(entry)
        pending = []
    return shown


def whole_output(rounds: list[tuple[Any, ...]], items: Items, allowed: set[str]) -> list[dict[str, Any]]:
    """A whole turn's items as the agent sees them: every round's shown items (`rounds`, one tuple a round),
    of which only the last round's calls can have gone to the agent, and of those the ones in `allowed`."""
    if len(rounds) == 1:  # the usual turn: its one round's items
        return items(list(rounds[0]), set(), allowed)
    output: list[dict[str, Any]] = []
    for shown in rounds:
        output = items(output, set(), set()) + list(shown)  # a round after it: none of its calls went
    return items(output, set(), allowed)
