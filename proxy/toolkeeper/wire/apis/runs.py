"""Events that may go on as the server wrote them, one after the other in a network read: relayed as one.

A reader knows, of most events of a stream, that they are a shown item's
(or block's) and that every parser reads their bytes as toolkeeper did: a
text event read by its shape (wire/sse.py) or an event that fits a template
(wire/event_templates.py) has the structure of one parsed and checked
before, and a parsed one was checked (each key once: `read_alike`). A row
of them travels as one `Run` in a `Visible`'s relay: their bytes, the text
they add, the items they belong to and the number of the first (Responses
numbers its events). A writer whose numbering agrees
with the server's for all of them (the turn's first round, nothing held or
dropped before them) sends their bytes as they came, together; else it
writes each (`expanded`) as it writes any event.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

RAW = "_raw"  # an upstream event's own bytes, kept beside its parsed fields (parsed: with where its JSON begins)
ROUND = "_round"  # which upstream round an event came from: items are numbered per round

# An event read by its shape, rebuilt: from its text, its number and its padding (sse.NumberedShape).
Build = Callable[[str, int, str | None], dict[str, Any]]


class Run:
    """Events of shown items, in a row, each relayable as it came."""

    __slots__ = ("build", "data", "events", "indexes", "items", "number", "pads", "round_key", "texts")

    def __init__(self, number: int, round_key: object):
        self.number = number  # the server's number of the first (Responses; 0 where the API numbers nothing)
        self.round_key = round_key
        self.data: list[bytes] = []  # each one's bytes, as the server wrote them (no blank line)
        # each one as parsed (its bytes and round off), the text of one read by its shape (`build` rebuilds it), or
        # where the JSON of one read by a template begins (of the structure of one checked: parsed when needed)
        self.events: list[dict[str, Any] | str | int] = []
        self.build: Build | None = None  # the shape's, of those read by it: one shape a run
        self.pads: list[str] = []  # the padding of each read by its shape, where the shape has one
        self.texts: list[str] = []  # the answer's text they add, in order
        self.indexes: list[int] = []  # the server's indexes of their items, each once, as they first come
        self.items: list[dict[str, Any]] = []  # the items they finish (Responses' output_item.done), in order

    def parsed(self, data: bytes, event: dict[str, Any], index: Any, text: str | None) -> None:
        self.data.append(data)
        self.events.append(event)
        if text:
            self.texts.append(text)
        if type(index) is int and index not in self.indexes:
            self.indexes.append(index)

    def raw(self) -> bytes:
        """Their bytes as the server wrote them, each with its blank line."""
        return b"\n\n".join(self.data) + b"\n\n"

    def expanded(self) -> list[dict[str, Any]]:
        """Each event as the API has it, with its bytes (they may go on as they came) and round."""
        events, pads = [], iter(self.pads)
        for offset, (data, event) in enumerate(zip(self.data, self.events, strict=True)):
            if type(event) is str:
                event = self.build(event, self.number + offset, next(pads, None))  # type: ignore[misc]
            elif type(event) is int:  # read by a template (wire/event_templates.py): where its JSON begins
                event = orjson.loads(data[event:])
            events.append({**event, RAW: data, ROUND: self.round_key})
        return events
