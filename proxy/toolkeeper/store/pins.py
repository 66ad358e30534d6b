"""The pinned definitions of the agent's MCP servers' tools (mixed into SQLStore).

The first definition seen of a tool is pinned; one that differs later is kept
beside it as `seen` until a person approves it (`toolkeeper mcp approve`).

A pin holds the whole definition, every field as the client receives it: MCP
marks none of a tool's fields as volatile, and each one steers a client or a
model (`title` and `annotations.readOnlyHint` decide what a client asks about,
`outputSchema` and `_meta` what it does with a result).

Pins written by earlier versions: their `digest` column covers the name,
description and input schema only. It is not read: a pin's digests are taken
again from the definitions kept beside them, which have always been whole (the
definition as first seen or approved). So an earlier pin covers every field
from the upgrade on: a field that changed since it was pinned, even one the old
digest left out, is a change like any other, withheld until approved and shown
in the diff. Nothing is approved again without a person.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import orjson

from toolkeeper.common import canonical_json, sha256_hex


def definition_digest(definition: dict[str, Any]) -> str:
    """What a pin holds a tool to: its whole definition (name, title, description, inputSchema, outputSchema,
    annotations, execution, icons, _meta and whatever else the client receives)."""
    return sha256_hex(canonical_json(definition))


@lru_cache(maxsize=256)
def _digest_of_stored(body: bytes | str) -> str:
    """The digest of a definition as the store keeps it (every call reads its tool's pin: taken once each)."""
    return definition_digest(orjson.loads(body))


def _pin(row: tuple) -> dict[str, Any]:
    server, tool, _stored_digest, definition, _stored_seen_digest, seen_definition, approver, updated = row
    definition, seen_definition = _hashable(definition), _hashable(seen_definition)
    approved, seen = orjson.loads(definition), orjson.loads(seen_definition)
    # see above: never the stored digests
    digest, seen_digest = _digest_of_stored(definition), _digest_of_stored(seen_definition)
    return {"server": server, "tool": tool, "digest": digest, "definition": approved, "seen_digest": seen_digest,
            "seen_definition": seen, "approver": approver, "updated": updated, "changed": digest != seen_digest}


def _hashable(body: Any) -> bytes | str:
    return bytes(body) if isinstance(body, memoryview | bytearray) else body


PIN_FIELDS = "server, tool, digest, definition, seen_digest, seen_definition, approver, updated"


class Pins:
    async def see_definition(self: Any, server: str, tool: str, definition: dict) -> dict[str, Any]:
        """The pin of a tool whose definition the server gives now: pinned when first seen, else `seen` is
        updated (one statement: two processes seeing it at once pin one definition)."""
        body, digest = orjson.dumps(definition), definition_digest(definition)
        rows = await self._fetch(
            f"INSERT INTO mcp_pins ({PIN_FIELDS}) VALUES (?, ?, ?, ?, ?, ?, NULL, ?) ON CONFLICT (server, tool) "  # noqa: S608
            "DO UPDATE SET seen_digest = excluded.seen_digest, seen_definition = excluded.seen_definition, "
            f"updated = excluded.updated RETURNING {PIN_FIELDS}",
            (server, tool, digest, body, digest, body, self.now()))
        return _pin(rows[0])

    async def pin(self: Any, server: str, tool: str) -> dict[str, Any] | None:
        """A tool's pin as the store holds it now (None when never seen): read, nothing written. What every
        process checks a definition against, since a person may approve another one at any time, anywhere."""
        rows = await self._fetch(f"SELECT {PIN_FIELDS} FROM mcp_pins WHERE server = ? AND tool = ?",  # noqa: S608
                                 (server, tool))
        return _pin(rows[0]) if rows else None

    async def server_pins(self: Any, server: str) -> dict[str, dict[str, Any]]:
        """Every pin of one server's tools, by tool, in one read (a listing checks them all)."""
        rows = await self._fetch(f"SELECT {PIN_FIELDS} FROM mcp_pins WHERE server = ?", (server,))  # noqa: S608
        return {pin["tool"]: pin for pin in map(_pin, rows)}

    async def approve_definition(self: Any, server: str, tool: str, approver: str) -> dict[str, Any] | None:
        """The definition the server gives now taken in force; None when no such tool was seen."""
        rows = await self._fetch(
            "UPDATE mcp_pins SET digest = seen_digest, definition = seen_definition, approver = ?, updated = ? "  # noqa: S608
            f"WHERE server = ? AND tool = ? RETURNING {PIN_FIELDS}", (approver, self.now(), server, tool))
        return _pin(rows[0]) if rows else None

    async def pins(self: Any) -> list[dict[str, Any]]:
        rows = await self._fetch(f"SELECT {PIN_FIELDS} FROM mcp_pins ORDER BY server, tool")  # noqa: S608
        return [_pin(row) for row in rows]
