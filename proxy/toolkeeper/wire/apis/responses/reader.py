"""One upstream Responses stream, read event by event: what the agent may see, and the Round at the end.

Events of a declared call (its `output_item.*`, `function_call_arguments.*`)
are dropped; a reasoning item's events wait until the item after it shows
whether it is hidden (a reasoning item travels with the item it precedes).
The other events are kept, as the server wrote them, for the writer to relay
with its own `sequence_number` and `output_index`. Lifecycle events
(`response.created`, `.completed`, ...) are read here, never relayed: the
agent's response has its own, once.

What an item is is decided once, when it is announced (`output_item.added`):
an event for an item never announced, an item announced twice, or one that
finishes as something else (a `message` whose `done` is a call) is a
malformed answer, never relayed, so no call can reach the agent under
another item's name.

Most events are read without a parse: a shown message's text deltas by
their shape (`sse.NumberedShape`), and its structural events (announced, a
part begun, a text, a part and the item finished) by the templates the
process learnt of them (shapes.py).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import orjson

from toolkeeper.engine import Round
from toolkeeper.wire.apis.relay import HoldingReader, event_object, parse_event, round_head
from toolkeeper.wire.apis.responses import shapes
from toolkeeper.wire.apis.responses.items import call_arguments, call_id_of, call_name, is_call, round_from_response
from toolkeeper.wire.apis.runs import Build, Run
from toolkeeper.wire.errors import MalformedResponse, UpstreamFailed
from toolkeeper.wire.event_templates import EventTemplate
from toolkeeper.wire.sse import NumberedShape

TERMINAL = ("response.completed", "response.incomplete")
# A call's arguments (a custom tool's input) stream in pieces, then whole, then in the finished item.
DELTAS = ("response.function_call_arguments.delta", "response.custom_tool_call_input.delta")
DONES = {"response.function_call_arguments.done": "arguments", "response.custom_tool_call_input.done": "input"}
ARGUMENT_EVENTS = frozenset((*DELTAS, *DONES, "response.output_item.done"))
LIFECYCLE = ("response.created", "response.in_progress", "response.queued")
TEXT_DELTA = "response.output_text.delta"
MESSAGE = ("message",)  # a message item's identity (`_identity`)
LAST_NUMBER = 2**63 - 1  # numbers past it are not read by shapes or templates (a parse may not read them as whole)
PLACEHOLDER, PAD = b"toolkeeper:text", b"toolkeeperpad"  # a delta's text and padding where a shape learns their places
# An item's events that are more than routed (the rest are: `read`), and the events of no item.
NOT_PLAIN_ITEM_EVENTS = frozenset((*LIFECYCLE, *TERMINAL, *ARGUMENT_EVENTS, "response.output_item.added",
                                   "response.failed", "error"))


class ResponsesReader(HoldingReader):
    own_events = frozenset((*LIFECYCLE, *TERMINAL))
    text_kind = TEXT_DELTA
    index_key = "output_index"
    numbered = True
    item_done = "response.output_item.done"

    def __init__(self, hidden: frozenset[str], previous: Round | None):
        super().__init__(hidden, previous)
        self.final: dict[str, Any] | None = None  # from the terminal event
        self._done: dict[int, dict[str, Any]] = {}  # finished items, by output_index
        self._announced: dict[int, tuple[Any, ...]] = {}  # what each item was announced as, by output_index
        self._streamed: dict[int, list[str]] = {}  # a call's arguments as streamed so far, by output_index
        self._shape = NumberedShape()  # the text deltas of one shown item, once one of them was parsed
        self._shape_index = -1
        self._number = -1  # the last event's sequence_number: the next one read by its shape has the one after
        self._build: Build = _rebuilt
        self._created = False  # a response.created was read
        self._progress = b""  # the bytes of the response.in_progress that would say the same again
        self._item: int | None = None  # the parts so far of the message item being read (`_track`)
        self._known: dict[bytes, Any] = {}  # what its next event says that the reader knows (shapes.py)

    def text_of(self, event: dict[str, Any]) -> str | None:
        delta = event.get("delta")
        return delta if event["type"] == TEXT_DELTA and isinstance(delta, str) else None

    def take_all(self, events: list[bytes], round_key: object) -> list[Any]:
        """Most events of a stream are a piece of a shown message's text: one with the bytes around its text (and
        its number, and its padding) of such a delta parsed before, numbered after the last event, is that
        delta, with no parse and no routing (its item is shown, and stays so: an item is what it was announced
        as, once). Events that may go on as they came, in a row, go on as one `Run`."""
        relay: list[Any] = []
        self._shown, shape, own = relay, self._shape, self.own_events  # what `read` shows goes in
        run: Run | None = None
        bound: Run | None = None  # the run the appends below are bound to
        for data in events:
            if shape.head is not None and self._number < LAST_NUMBER:
                text = shape.read(data, self._number + 1)
                if text is not None:
                    self._number += 1
                    if run is None:
                        run = Run(self._number, round_key)
                        relay.append(run)
                    if run is not bound:
                        bound, run.build, padded = run, self._build, shape.tail is not None
                        add_data, add_event, add_text = run.data.append, run.events.append, run.texts.append
                        if self._shape_index not in run.indexes:
                            run.indexes.append(self._shape_index)
                    add_data(data)
                    add_event(text)
                    add_text(text)
                    if padded:
                        run.pads.append(shape.pad)
                    continue
            bound = None
            if data == self._progress:  # what `read` does of it: nothing (the response began with created)
                self._number += 1
                self._progress = b""
                run = None
                continue
            kind = data[7:data.find(b"\n")] if data.startswith(b"event: response.") else b""
            template = shapes.TEMPLATES.get(kind) if kind and self._number < LAST_NUMBER else None
            if template is not None:
                fitted = self._fitted(kind, template, data)
                if fitted is not None:
                    run = self._joined(run, relay, round_key, data, fitted, kind == shapes.PART_ADDED)
                    shapes.hit(template)
                    continue
            event = parse_event(data, round_key, own)
            number = event.get("sequence_number")
            if type(number) is int:
                self._number = number
            before = len(relay)
            self.read(event)
            run = self.ran(run, relay, before, event, number)
            if run is not None and kind in shapes.HOLES and self._announced.get(event.get("output_index")) == MESSAGE:
                shapes.learn(kind, data, data.find(b"\n") + 7, event)
            if run is not None and event["type"] == TEXT_DELTA and self._learn(data, event):
                run = None  # one shape a run
            elif event["type"] == "response.created" and not self._created:
                self._created = True
                self._progress = _in_progress(data, number)
        return relay

    def _joined(self, run: Run | None, relay: list[Any], round_key: object, data: bytes, fitted: tuple[Any, int, Any],
                part: bool) -> Run | None:
        """A fitted event in the run it follows (or a new one: the number it fitted is the one after the run's last);
        then the run the next event may join (None after a part begins whose deltas have their shape now, if this
        run holds another's: one shape a run)."""
        self._number += 1
        if run is None:
            run = Run(self._number, round_key)
            relay.append(run)
        entry, index, item = fitted
        run.data.append(data)
        run.events.append(entry)
        if index not in run.indexes:
            run.indexes.append(index)
        if item is not None:
            run.items.append(item)
        return None if part and self._seed(run) else run

    def _fitted(self, kind: bytes, template: EventTemplate, data: bytes) -> tuple[Any, int, Any] | None:
        """`_fit`, and a template it cannot fill (none should be: `EventTemplate.learn` keeps each hole's kind) taken
        away: that event is parsed, and the template never tried again."""
        try:
            return self._fit(kind, template, data)
        except (KeyError, TypeError, ValueError):
            shapes.TEMPLATES.pop(kind, None)
            return None

    def _fit(self, kind: bytes, template: EventTemplate, data: bytes) -> tuple[Any, int, Any] | None:
        """A message item's event that fits its type's template (shapes.py), taken as `read` takes it: (its entry
        in a run, its item's index, the item it finishes or None); None: parse it. The values known are the next
        number, the next item's index (an announcement), or the current message item's index, id and part."""
        if kind == shapes.ADDED:
            if self._held:
                return None  # a reasoning item waits for this one: `read` settles it
            index = len(self._announced)
            item_id = template.read(data, {b"number": self._number + 1, b"index": index})
            if item_id is None:
                return None
            event = orjson.loads(data[14 + len(kind):])  # of the template's structure: a message item announced
            self._announce(index, event["item"])  # shown, and `_track`ed till it finishes
            self._track(index, item_id)
            return event, index, None
        parts, known = self._item, self._known
        if parts is None or kind == shapes.DELTA:
            return None
        known[b"number"] = self._number + 1
        index = known[b"index"]
        if kind == shapes.PART_ADDED:
            known[b"part"] = parts
            if data != template.before % known:
                return None
            self._item = parts + 1
            return 14 + len(kind), index, None  # where its JSON begins: parsed if ever it is written anew
        known[b"part"] = parts - 1
        if template.read(data, known) is None:
            return None
        if kind != shapes.DONE:
            return 14 + len(kind), index, None
        if index in self._streamed:
            return None  # a call's arguments streamed under this index: `read` compares them, and refuses
        event = orjson.loads(data[14 + len(kind):])
        done = self._done[index] = event["item"]  # a message, as announced
        self._item = None
        return event, index, done

    def _track(self, index: int, item_id: bytes | None) -> None:
        """The message item whose events may fit their templates: the one just announced (its id as written), until
        it finishes."""
        self._item = None if item_id is None else 0  # its parts so far
        self._known = {b"number": 0, b"index": index, b"item": item_id, b"part": 0}

    def _seed(self, run: Run) -> bool:
        """A part begun: its deltas' shape, from the process's delta template with this item's values (their text
        and padding aside). True: the shape is the reader's now, and `run` holds deltas of the last one."""
        template = shapes.TEMPLATES.get(shapes.DELTA)
        if template is None:
            return False
        number = self._known[b"number"] + 1
        data = template.whole % {**self._known, b"number": number, b"text": PLACEHOLDER, b"pad": PAD}
        fields = orjson.loads(data[data.find(b"\n") + 7:])
        pad = PAD.decode() if b"pad" in template.roles else None
        if not self._shape.learn(data, PLACEHOLDER.decode(), number, pad, fields):
            return False
        shapes.hit(template)
        self._shape_index = self._known[b"index"]
        self._build = partial(_rebuilt, fields=fields)
        return run.build is not None

    def _learn(self, data: bytes, event: dict[str, Any]) -> bool:
        """The shape of a shown item's text delta that goes on as it came (`ran`: each key once in its bytes; a
        key in another case was refused as it was parsed): its text, number and padding of the types they
        have."""
        text, number, pad = event.get("delta"), event.get("sequence_number"), event.get("obfuscation")
        if type(text) is not str or type(event.get("output_index")) is not int \
                or (number is not None and type(number) is not int) or (pad is not None and type(pad) is not str):
            return False
        if not self._shape.learn(data, text, number, pad, event):
            return False
        self._shape_index = event["output_index"]
        self._build = partial(_rebuilt, fields=event)
        return True

    def read(self, event: dict[str, Any]) -> None:
        kind, index = event.get("type"), event.get("output_index")
        if type(index) is int and type(kind) is str and kind not in NOT_PLAIN_ITEM_EVENTS:
            if index not in self._announced:  # the most of a stream: an announced item's event, routed
                raise MalformedResponse(f"a {kind[:60]} event for item {index}, which was never announced")
            if kind == "response.content_part.added" and self._item is not None and index == self._known[b"index"]:
                self._item += 1  # a part of the current message begins (`_fitted` counts those it reads)
            self.route(index, event)
            return
        if not isinstance(kind, str):
            raise MalformedResponse("a stream event without a 'type'")
        if kind in LIFECYCLE:
            self.started = self.started or event_object(event, "response")
            return
        if kind in TERMINAL:
            self.final = event_object(event, "response")
            return
        if kind == "response.failed":
            response = event_object(event, "response")
            raise UpstreamFailed(response.get("error") or {"message": "the model server failed"}, response)
        if kind == "error":
            raise UpstreamFailed(event.get("error") if isinstance(event.get("error"), dict) else event)
        if type(index) is not int:
            if "output_index" in event or "item" in event or "item_id" in event:
                raise MalformedResponse(f"a {kind[:60]} event for an item, without the item's output_index")
            self.keep(event)  # an event of the response as a whole
            return
        if kind in ARGUMENT_EVENTS:
            self._arguments(kind, index, event)
        if kind == "response.output_item.added":
            item = event_object(event, "item")
            self._announce(index, item)
            self._track(index, _written(item.get("id")) if item.get("type") == "message" else None)
        elif index not in self._announced:
            raise MalformedResponse(f"a {kind[:60]} event for item {index}, which was never announced")
        if kind == "response.output_item.done":
            item = self._done[index] = event_object(event, "item")
            self._item = None
            if _identity(item) != self._announced[index]:
                raise MalformedResponse(f"item {index} was announced as {self._announced[index][0]} and finished "
                                        f"as {str(item.get('type'))[:40]}")
        self.route(index, event)

    def _arguments(self, kind: str, index: int, event: dict[str, Any]) -> None:
        """A call's arguments (a custom tool's input) as its deltas, its `.done` and its finished item say them:
        the same, or the answer is malformed (the rules read the item's; an agent may build them from the
        deltas)."""
        if kind in DELTAS:
            self._streamed.setdefault(index, []).append(str(event.get("delta", "")))
            return
        said = event.get(DONES[kind]) if kind in DONES else _said(event.get("item"))
        streamed = self._streamed.get(index)
        if streamed is not None and "".join(streamed) != said:
            raise MalformedResponse(f"item {index}'s arguments differ from the deltas that streamed them")
        if isinstance(said, str):
            self._streamed[index] = [said]

    def _announce(self, index: int, item: dict[str, Any]) -> None:
        if index in self._announced:
            raise MalformedResponse(f"item {index} was announced twice")
        self._announced[index] = _identity(item)
        call = is_call(item)
        self.starts(index, holds=item.get("type") == "reasoning", hidden=call and call_name(item) in self.hidden,
                    own_call=call_id_of(item) if call else None)

    def finish(self) -> Round:
        """The Round, once the stream ended: from the terminal event's response, or the finished items."""
        if self.final is None:
            raise MalformedResponse("the stream ended before response.completed")
        final = dict(self.final)
        streamed = [self._done[i] for i in sorted(self._done)]
        if not final.get("output"):
            final["output"] = streamed
        elif final["output"] != streamed and _calls(final["output"]) != _calls(streamed):
            # the rules read the final output, the agent gets the streamed items: they must be the same calls
            raise MalformedResponse("the final response's tool calls differ from the streamed ones")
        final.setdefault("id", (self.started or {}).get("id"))
        found = round_from_response(final)
        found.head = round_head(found.head, self.started, self.previous)
        return self.settled(found)


def _in_progress(created: bytes, number: Any) -> bytes:
    """The `response.in_progress` a server sends after `created` (its bytes, numbered `number`) when it says the
    same response again, as OpenAI does: the same bytes but its type, in both places it is named (its event line
    and its `type`, the only ones: no escape in them), and its number, the next ("": none to expect). Such an
    event reads as `created` did but for those two; `read` does nothing with either but the first."""
    if type(number) is not int or not created.startswith(b"event: response.created\ndata: ") \
            or created.count(b"\n") != 1 or created.find(b"\\") >= 0 or created.count(b"response.created") != 2 \
            or created.count(b'"sequence_number":') != 1:
        return b""
    at = created.index(b'"sequence_number":') + 18
    digits = b"%d" % number
    end = at + len(digits)
    if created[at:end] != digits or created[end:end + 1] not in (b",", b"}"):
        return b""
    progress = created[:at] + b"%d" % (number + 1) + created[end:]
    return progress.replace(b"response.created", b"response.in_progress")


def _written(item_id: Any) -> bytes | None:
    """An item's id as a server writes it in its events' JSON (a string's body)."""
    return orjson.dumps(item_id)[1:-1] if type(item_id) is str else None


def _rebuilt(text: str, number: int, pad: str | None, fields: dict[str, Any] | None = None) -> dict[str, Any]:
    """A delta read by a learnt shape: the event it was learnt from (`fields`), with its text, number and
    padding."""
    rebuilt = {**(fields or {}), "delta": text}
    if "sequence_number" in rebuilt:
        rebuilt["sequence_number"] = number
    if pad is not None:
        rebuilt["obfuscation"] = pad
    return rebuilt


def _said(item: Any) -> Any:
    """A finished item's arguments (a custom tool call's input), None for an item of another kind."""
    if not isinstance(item, dict):
        return None
    return item.get("input") if item.get("type") == "custom_tool_call" else item.get("arguments")


def _identity(item: dict[str, Any]) -> tuple[Any, ...]:
    """What an item is, for the rules and the agent: its type, and a call's id and tool."""
    if is_call(item):
        return item.get("type"), call_id_of(item), call_name(item)
    return (item.get("type"),)


def _calls(items: Any) -> list[tuple[str, Any, Any]]:
    return [(call_id_of(item), call_name(item), call_arguments(item))
            for item in items if isinstance(item, dict) and is_call(item)]

