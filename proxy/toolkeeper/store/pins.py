"""The pinned definitions of the agent's MCP servers' tools (mixed into SQLStore).

The first definition seen of a tool is pinned; one that differs later is kept
beside it as `seen` until a person approves it (`toolkeeper mcp approve`).
"""

from __future__ import annotations

from typing import Any

import orjson


def _pin(row: tuple) -> dict[str, Any]:
    server, tool, digest, definition, seen_digest, seen_definition, approver, updated = row
    return {"server": server, "tool": tool, "digest": digest, "definition": orjson.loads(definition),
            "seen_digest": seen_digest, "seen_definition": orjson.loads(seen_definition), "approver": approver,
            "updated": updated, "changed": digest != seen_digest}


PIN_FIELDS = "server, tool, digest, definition, seen_digest, seen_definition, approver, updated"


class Pins:
    async def see_definition(self: Any, server: str, tool: str, digest: str, definition: dict) -> dict[str, Any]:
        """The pin of a tool whose definition the server gives now: pinned when first seen, else `seen` is
        updated (one statement: two processes seeing it at once pin one definition)."""
        body = orjson.dumps(definition)
        rows = await self._fetch(
            f"INSERT INTO mcp_pins ({PIN_FIELDS}) VALUES (?, ?, ?, ?, ?, ?, NULL, ?) ON CONFLICT (server, tool) "  # noqa: S608
            "DO UPDATE SET seen_digest = excluded.seen_digest, seen_definition = excluded.seen_definition, "
            f"updated = excluded.updated RETURNING {PIN_FIELDS}",
            (server, tool, digest, body, digest, body, self.now()))
        return _pin(rows[0])

    async def approve_definition(self: Any, server: str, tool: str, approver: str) -> dict[str, Any] | None:
        """The definition the server gives now taken in force; None when no such tool was seen."""
        rows = await self._fetch(
            "UPDATE mcp_pins SET digest = seen_digest, definition = seen_definition, approver = ?, updated = ? "  # noqa: S608
            f"WHERE server = ? AND tool = ? RETURNING {PIN_FIELDS}", (approver, self.now(), server, tool))
        return _pin(rows[0]) if rows else None

    async def pins(self: Any) -> list[dict[str, Any]]:
        rows = await self._fetch(f"SELECT {PIN_FIELDS} FROM mcp_pins ORDER BY server, tool")  # noqa: S608
        return [_pin(row) for row in rows]
