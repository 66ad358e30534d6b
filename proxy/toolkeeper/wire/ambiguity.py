"""JSON that every parser reads as toolkeeper does: the condition for passing a model server's bytes on.

toolkeeper decides on what orjson reads of an answer; the agent reads what it
is sent with its own parser. Two things make parsers disagree on valid JSON:

- a key given twice: orjson (and Python, JavaScript) keep the last copy,
  some parsers the first (gjson, which Go clients use), some refuse it;
- a key in another case: Go's `encoding/json` matches a struct's fields in
  any case, Unicode's simple folding included, so a `"Tool_calls"` (or a
  `"tool_calls"` whose last s is U+017F, a long s) that toolkeeper reads as no
  key of the API's is tool calls to a Go agent, and
  `"type":"text","Type":"tool_use"` a `tool_use` block.

An answer with the first is passed on as toolkeeper re-encodes it (one copy of
each key: `read_alike`). The APIs' keys are all lower case, and a key of their
structure in another case is what a real server never sends: refused
(`MalformedResponse`, a 502: `check_keys`), as re-encoding would pass it on.
Objects that hold data a model or a user wrote (a tool's `input`, a schema
echoed back, `metadata`, an environment) are not the API's structure: their
keys are theirs.
"""

from __future__ import annotations

from typing import Any

import orjson

from toolkeeper.wire.errors import MalformedResponse

# Keys whose values are data a model or a user wrote, not the API's structure: their keys are not checked.
DATA_KEYS = frozenset({"input", "arguments", "parameters", "input_schema", "schema", "metadata", "variables", "env",
                       "headers", "attributes", "annotations"})
NOT_PLAIN = bytes(range(32)) + b'"\\'  # what a JSON string holds only escaped (or as its end)
PLAIN_KEPT = 4096  # keys known to be in lower case, kept: at most so many (a server could send any number)
_PLAIN: set[str] = set()


def read_alike(raw: bytes, parsed: Any) -> bool:
    """Whether `raw` (valid JSON), parsed as `parsed`, has each key once: then every parser reads it as toolkeeper
    did. A key given twice is one string fewer in `parsed`, so one quote pair fewer in its encoding."""
    encoded = orjson.dumps(parsed)
    return encoded == raw or _delimiters(encoded) == _delimiters(raw)


def check_keys(raw: bytes, parsed: dict[str, Any], *, shallow: bool = False, texts: tuple[Any, ...] = ()) -> None:
    """MalformedResponse when a key of the API's structure in `parsed` (read from `raw`) is not in lower case.
    Bytes with no upper case at all, and no escape (most stream events), have none; nor have bytes whose upper
    case is all in `texts` (string values `parsed` holds: `without_texts`); the others' objects are walked
    (`shallow`: `parsed` and the objects it holds, not theirs)."""
    if raw.isascii() and raw.islower() and raw.find(b"\\u") < 0:
        return  # no upper case (and some lower case), and none spelled with an escape
    check_keys_beside(raw, parsed, shallow=shallow, texts=texts)


def check_keys_beside(raw: bytes, parsed: dict[str, Any], *, shallow: bool = False,
                      texts: tuple[Any, ...] = ()) -> None:
    """`check_keys`, for bytes its first test did not clear: with upper case, or an escape."""
    if texts and raw.isascii() and raw.find(b"\\") < 0 and without_texts(raw, texts).islower():
        return
    if not shallow:
        _check_all(parsed)
        return
    refuse_odd_keys(parsed)
    for value in parsed.values():
        refuse_odd_keys(value)


def without_texts(raw: bytes, texts: tuple[Any, ...]) -> bytes:
    """`raw` (valid JSON in ASCII with no backslash: each quote begins or ends a string, and no string holds
    one) with each of `texts` (those with no quote, backslash or control character in them) taken out where it
    follows a quote and a colon as a string (`":"TEXT"`). What is taken out is never a key: the quote before
    the colon ends a key, then the text is its value; or it ends a string value, and what lies between the
    quote after the colon and the next is not in a string. So no key's upper case is taken out with them."""
    for text in texts:
        if type(text) is str and text:
            encoded = text.encode()
            if encoded.translate(None, NOT_PLAIN) == encoded:
                raw = raw.replace(b'":"' + encoded + b'"', b'":""')
    return raw


def plain_keys(value: dict[str, Any]) -> bool:
    """Whether each key of `value` is in lower case (or has no case): `refuse_odd_keys` says which is not. The
    keys found so are kept (an API has a few hundred): most objects' keys are all known ones, a subset test."""
    if value.keys() <= _PLAIN:
        return True
    keys = "".join(value)
    if not ((keys.isascii() and keys.islower()) or keys.casefold() == keys):
        return False
    if len(_PLAIN) < PLAIN_KEPT:
        _PLAIN.update(value)
    return True


def refuse_odd_keys(value: Any) -> None:
    """MalformedResponse naming the first key of `value` (an object) that is not in lower case."""
    if type(value) is dict and not plain_keys(value):
        odd = next(key for key in value if key.casefold() != key)
        raise MalformedResponse(f"a key {odd[:40]!r} in an answer: the API's keys are in lower case, and some "
                                f"parsers read this one as {odd.casefold()[:40]!r}")


def _delimiters(raw: bytes) -> int:
    """The quotes that open or close a string in `raw` (valid JSON). A backslash in JSON is an escape, inside a
    string; escapes pair from the left, so dropping `\\\\` and then `\\"` leaves the delimiters."""
    if b"\\" in raw:
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    return raw.count(b'"')


def _check_all(value: Any) -> None:
    if type(value) is dict:
        if not value.keys() <= _PLAIN:
            refuse_odd_keys(value)
        for key, item in value.items():
            kind = type(item)
            if (kind is dict or kind is list) and item and key not in DATA_KEYS:
                _check_all(item)
    else:
        for item in value:
            kind = type(item)
            if (kind is dict or kind is list) and item:
                _check_all(item)
