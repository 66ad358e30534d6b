"""Canaries: secrets a test plants in what a tool prints, which must never reach the model server.

A request whose body holds one is refused with a 400 in its API's shape that
names the canary (never its value), and recorded with `"canary": NAME`, so a
test that leaks a secret fails loudly, whatever it asserts. "Holds" is read
in the parsed body (JSON escapes undone) and is wider than the whole value:
each line of a multi-line canary (a private key's base64 lines; not its
armour), and the head and the tail of a long line, so a secret redacted in
part still counts as leaked.

Planted through `POST /_canaries {"canaries": {NAME: VALUE, ...}}` (replacing
those before; `"append": true` adds), or by the variable
TOOLKEEPER_SCRIPTED_CANARIES when the server starts (a JSON object of names
and values, or a list of values).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import orjson

VARIABLE = "TOOLKEEPER_SCRIPTED_CANARIES"
LINE = 16  # a line this long of a multi-line canary is a canary of its own
PART = 20  # ... and a line of twice this: its head and its tail too


class Canaries:
    def __init__(self) -> None:
        self.planted: dict[str, str] = {}
        self._fragments: list[tuple[str, str]] = []  # (name, text that must not be seen)

    @classmethod
    def from_environment(cls) -> Canaries:
        canaries = cls()
        text = os.environ.get(VARIABLE)
        if text:
            canaries.plant(orjson.loads(text))
        return canaries

    def plant(self, canaries: dict[str, str] | list[str], append: bool = False) -> None:
        named = canaries if isinstance(canaries, dict) else {f"canary {i + 1}": v for i, v in enumerate(canaries)}
        self.planted = {**(self.planted if append else {}), **{str(k): str(v) for k, v in named.items() if v}}
        self._fragments = [(name, fragment) for name, value in self.planted.items()
                           for fragment in sorted(_fragments(value))]

    def leaked(self, body: Any) -> str | None:
        """The name of the first canary the parsed body holds; None when it holds none."""
        if not self._fragments:
            return None
        text = "\x00".join(_strings(body))
        return next((name for name, fragment in self._fragments if fragment in text), None)

    def refusal(self, name: str, api: str) -> dict[str, Any]:
        """The 400's body, in the shape of `api` (chat and responses: OpenAI's; messages: Anthropic's)."""
        message = (f"the scripted model server refuses this request: it holds the canary secret {name!r} (a secret "
                   "a test planted reached the model server)")
        if api == "messages":
            return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
        return {"error": {"message": message, "type": "invalid_request_error", "param": None,
                          "code": "canary_leaked"}}


def _fragments(value: str) -> set[str]:
    found = {value}
    for line in value.splitlines():
        line = line.strip()
        if len(line) >= LINE and not line.startswith("--"):  # a PEM's armour is no secret of its own
            found.add(line)
            if len(line) >= 2 * PART:
                found.update((line[:PART], line[-PART:]))
    if "\n" not in value.strip() and len(value) >= 2 * PART:
        found.update((value[:PART], value[-PART:]))
    return found


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, member in value.items():
            yield str(key)
            yield from _strings(member)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
