"""Event templates learnt across requests: an event's bytes with holes where the values that vary go.

A model server writes the structural events of a stream (an item announced,
a part begun, a text finished) the same way every time but for a few values:
the event's number, the item's index and id, the text. A `EventTemplate` is learnt
from one such event that was parsed and checked (each key once, no key in
another case: it went on as it came) and whose bytes hold no backslash, so
that each of its quotes begins or ends a string and each `"key":` in them is
a key. Its holes are the values of the keys a reader names (`roles`), each a
number or a string written as itself; the bytes around them are kept, the
learnt values are not (a template outlives the request it was learnt from).

An event later fits the template when its bytes are the template's with
every hole but one filled with the value the reader expects (`known`) and
the one left (`free`) a string. A number put in a hole is digits; a string is
one the reader read in such a hole before (its bytes as the server wrote
them); the free string is read up to the template's own closing quote and
must be a whole JSON string body there (no quote or control character of its
own, escapes valid), so it cannot end early or spell a key. Such an event's
JSON has the learnt event's structure exactly, those values aside: what was
checked of the learnt one holds of it, and the reader knows what it is
without a parse (the tests compare the two).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from toolkeeper.wire.sse import NOT_PLAIN

MAX_TEMPLATE = 2048  # bytes of a learnt event, its holes' values included: larger ones are parsed each time
STRINGS = frozenset({b"item", b"text", b"pad"})  # the roles whose values are strings (the others: whole numbers)


class EventTemplate:
    """One event's bytes, with holes named by role (`whole`: a %-format over a mapping of the roles' values, its keys
    bytes, as bytes formatting has them)."""

    __slots__ = ("after", "before", "hits", "roles", "whole")

    def __init__(self, whole: bytes, before: bytes, after: bytes, roles: frozenset[bytes]):
        self.whole = whole  # every hole a %(role)d or %(role)b
        # around the free hole's string body; with no free hole, `before` is the whole, and an event with the known
        # values fits when its bytes are `before % known`
        self.before, self.after = before, after
        self.roles = roles
        self.hits = 0

    @classmethod
    def learn(cls, data: bytes, at: int, event: dict[str, Any], roles: Mapping[str, bytes],
              free: bytes | None) -> EventTemplate | None:
        """The template of `data` (an SSE event whose JSON begins at `at`, parsed as `event` and checked: each key
        once, none in another case), whose keys named in `roles` are holes (a string where the role is in
        `STRINGS`, else a whole number: the kind of value the reader fills it with); `free` the role read from the
        bytes (a string, once), None for none. None when its bytes cannot say where each hole is."""
        if len(data) > MAX_TEMPLATE or b"\\" in data:
            return None
        cuts: list[tuple[int, int, bytes, type]] = []  # each hole's value: start, end, role, its type
        learnt: dict[bytes, Any] = {}
        position = at
        for key, value in _keys(event):
            needle = b'"' + key.encode() + b'":'
            found = data.find(needle, position)
            if found < 0:
                return None
            position = found + len(needle)
            if data[position:position + 1] == b" ":
                position += 1  # `"key": value`, as some servers write it
            role = roles.get(key)
            if role is None:
                continue
            kind = type(value)
            if kind is not (str if role in STRINGS else int):
                return None  # a value not of its role's kind (a number as a string, say): the reader's would not fit
            written = b"%d" % value if kind is int else b'"%b"' % value.encode()
            if not data.startswith(written, position):
                return None  # a space before it: not learnt
            quoted = kind is str
            cuts.append((position + quoted, position + len(written) - quoted, role, kind))
            learnt[role] = value if kind is int else value.encode()  # a role given twice must have one value
            position += len(written)
        if free is not None and [role for _, _, role, kind in cuts if role == free and kind is str] != [free]:
            return None
        formats, last, before, after = [], 0, b"", b""
        for start, end, role, kind in cuts:
            formats.append(data[last:start].replace(b"%", b"%%"))
            if role == free:
                before, last = b"".join(formats), end
                formats = []
                continue
            formats.append(b"%(" + role + (b")d" if kind is int else b")b"))
            last = end
        formats.append(data[last:].replace(b"%", b"%%"))
        rest = b"".join(formats)
        if free is None:
            before, rest = rest, b""
        after = rest
        whole = before + (b"%(" + free + b")b" if free is not None else b"") + after
        try:
            if whole % learnt != data:
                return None  # a role with two values (two ids, say): not one hole
        except (KeyError, TypeError):
            return None
        return cls(whole, before, after, frozenset(learnt))

    def read(self, data: bytes, known: Mapping[bytes, Any]) -> bytes | None:
        """The free hole's string body, as written, when `data` is this template with the `known` values around a
        whole JSON string body; None when it is not."""
        before = self.before % known
        after = self.after % known
        end = len(data) - len(after)
        if end < len(before) or not data.startswith(before) or not data.endswith(after):
            return None
        inside = data[len(before):end]
        if inside.translate(None, NOT_PLAIN) == inside:  # no quote, backslash or control character
            if inside.isascii():
                return inside
            try:
                inside.decode()
            except UnicodeDecodeError:
                return None
            return inside
        try:  # an escape in it: a whole string body or nothing (a quote of its own ends the string: refused)
            value = orjson.loads(b'"' + inside + b'"')
        except orjson.JSONDecodeError:
            return None
        return inside if type(value) is str else None


def _keys(value: Any) -> Iterator[tuple[str, Any]]:
    """Every key of `value`, and its value, in the order its JSON writes them (a parse of JSON with each key once
    keeps it)."""
    if type(value) is dict:
        for key, item in value.items():
            yield key, item
            if type(item) is dict or type(item) is list:
                yield from _keys(item)
    elif type(value) is list:
        for item in value:
            yield from _keys(item)
