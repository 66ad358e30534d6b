"""The structural events of a Responses message item, learnt across requests (wire/event_templates.py).

A shown message item streams as `output_item.added`, `content_part.added`,
its text deltas, `output_text.done`, `content_part.done` and
`output_item.done`. Their bytes differ between items in a few values only,
and those the reader knows but one: the event's `sequence_number` (the one
after the last), the item's `output_index` and id (from its announcement),
the part's `content_index`; what it does not know is the new item's id (in
its announcement) and the text (in the `done` events). One template per
event type is kept for the process, learnt from an event of a message item
that was parsed and went on as it came; an event that fits it is read
without a parse (reader.py). A text delta's template is not read so: it
gives each part's deltas their shape from the first (`sse.NumberedShape`).
"""

from __future__ import annotations

from typing import Any

from toolkeeper.wire.event_templates import EventTemplate

ADDED, PART_ADDED, DELTA = b"response.output_item.added", b"response.content_part.added", b"response.output_text.delta"
TEXT_DONE, PART_DONE, DONE = b"response.output_text.done", b"response.content_part.done", b"response.output_item.done"

_WHERE = {"sequence_number": b"number", "output_index": b"index", "item_id": b"item", "content_index": b"part"}
# each event type's holes (key: role) and the role read from its bytes (the others are known)
HOLES: dict[bytes, tuple[dict[str, bytes], bytes | None]] = {
    ADDED: ({"sequence_number": b"number", "output_index": b"index", "id": b"item"}, b"item"),
    PART_ADDED: (_WHERE, None),
    DELTA: ({**_WHERE, "delta": b"text", "obfuscation": b"pad"}, b"text"),
    TEXT_DONE: ({**_WHERE, "text": b"text"}, b"text"),
    PART_DONE: ({**_WHERE, "text": b"text"}, b"text"),
    DONE: ({"sequence_number": b"number", "output_index": b"index", "id": b"item", "text": b"text"}, b"text"),
}
SCORE = 64  # a template's score (hits less misses, at most this): one at zero is learnt again
TEMPLATES: dict[bytes, EventTemplate] = {}
_FAILED: dict[bytes, int] = {}  # learning attempts since a type's last template was learnt


def learn(kind: bytes, data: bytes, at: int, event: dict[str, Any]) -> None:
    """Learn the template of a message item's event of type `kind` that was parsed and went on as it came, when
    there is none for that type or the one there keeps missing."""
    known = TEMPLATES.get(kind)
    if known is not None:
        known.hits -= 1
        if known.hits > 0:
            return
    failed = _FAILED.get(kind, 0)
    _FAILED[kind] = failed + 1
    if failed % SCORE:
        return  # this type's events did not make a template lately: tried again once in so many
    roles, free = HOLES[kind]
    template = EventTemplate.learn(data, at, event, roles, free)
    if template is not None and b"number" in template.roles:
        TEMPLATES[kind] = template
        _FAILED[kind] = 0


def hit(template: EventTemplate) -> None:
    if template.hits < SCORE:
        template.hits += 1
