"""The pinned definitions of the agent's MCP servers' tools, checked on every listing and every call (McpDoor's).

    a listing (a client's tools/list through toolkeeper; one made in the background) -> each definition against
        its pin as the store holds it now: a changed one is withheld, and reported once in the trail
    a call -> decided on a listing of the server's asked for at most `pin_recheck` seconds before the call came,
        and after the server last said `notifications/tools/list_changed`; waited for when there is none that
        recent (none at all: a listing that fails fails the call)
        the tool is not in it, or the store holds another definition for it than it (the store's last `seen` or
        no pin at all: another process saw something else, or a person approved another definition since) ->
            decided on a listing made for the call instead, as with `pin_recheck: 0`
        else -> the pin read from the store says: the pinned definition (sent on), or a changed one (refused)
    a listing older than half its bound, at a call -> another one asked for in the background, so that calls
        seldom wait for one; `list_changed` -> another one at once, in the background

So a definition a server changes is caught at its next listing: within `pin_recheck` seconds (60 by default), at
once when the server says list_changed, at once when a client lists the tools or another process has seen it. An
approval holds at once everywhere: every call reads the pin from the store.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import logging
import secrets
import time
from collections.abc import Coroutine
from typing import Any

from toolkeeper.audit import ExecutionRecord
from toolkeeper.common import printable
from toolkeeper.engine.calls import Outcome
from toolkeeper.policy import Decision
from toolkeeper.runners import McpConnection, McpServerError, McpServers
from toolkeeper.store import Store, StoreError, definition_digest
from toolkeeper.tools import PROXIED_PREFIX, McpServerSpec

log = logging.getLogger("toolkeeper")

AHEAD = 0.5  # a listing this share of its bound old is renewed in the background at the next call


def changed_fields(before: dict[str, Any], after: dict[str, Any], depth: int = 2) -> list[str]:
    """The fields that differ between two definitions, named down to `depth` (`annotations.readOnlyHint`,
    `inputSchema.properties`): what a log line can say in a few words; the diff says the rest."""
    changed = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        if depth > 1 and isinstance(old, dict) and isinstance(new, dict):
            changed += [f"{key}.{inner}" for inner in changed_fields(old, new, depth - 1)]
        else:
            changed.append(key)
    return changed


def definition_diff(before: dict[str, Any], after: dict[str, Any]) -> str:
    """What changed in a tool's definition: a unified diff of its JSON."""
    old = json.dumps(before, indent=2, sort_keys=True, ensure_ascii=False).splitlines()
    new = json.dumps(after, indent=2, sort_keys=True, ensure_ascii=False).splitlines()
    return "\n".join(difflib.unified_diff(old, new, "approved", "served now", lineterm=""))


async def approve_definition(store: Store, audit: Any, server: str, tool: str, approver: str) -> dict[str, Any] | None:
    """The definition a server's tool has now, taken in force by a person (`toolkeeper mcp approve`, the admin API),
    and recorded in the trail with what changed; None when no such tool was seen."""
    before = {(pin["server"], pin["tool"]): pin for pin in await store.pins()}.get((server, tool))
    pin = await store.approve_definition(server, tool, approver) if before is not None else None
    if pin is None or before is None:
        return None
    diff = definition_diff(before["definition"], before["seen_definition"])
    fields = changed_fields(before["definition"], before["seen_definition"])
    await audit.write("refused", _approval_record(server, tool, approver, fields, diff))  # one event, every field
    log.info("MCP definition of %s %s approved by %s", printable(server), printable(tool), printable(approver))
    return pin


def _approval_record(server: str, tool: str, approver: str, fields: list[str], diff: str) -> ExecutionRecord:
    """A definition taken in force by a person, for the trail: who, and what changed."""
    record = ExecutionRecord(api="mcp", tool=f"{PROXIED_PREFIX}{server}__{tool}", runner="mcp", source="mcp",
                             status="ok", call_id=f"definition-approved:{secrets.token_hex(4)}", approver=approver,
                             consent="approved")
    changed = f" (changed: {', '.join(fields)})" if fields else ""
    record.decided_by(Decision("allow", "pin", f"the definition the server gives now was approved by "
                                               f"{approver}{changed}"))
    record.answer = diff
    return record


class PinnedDefinitions:
    """Mixed into McpDoor: its servers, its store, its handler (the trail)."""

    servers: McpServers
    store: Store | None
    handler: Any
    _reported: set[tuple[str, str, str, str]]
    _background: set[asyncio.Task[Any]]

    def _watch_servers(self) -> None:
        self._background = set()
        self.servers.watch(self._tools_changed)

    def _in_background(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)  # held until done: the loop keeps only weak references to tasks
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("MCP: a listing made in the background failed: %s", printable(str(task.exception())))

    def _tools_changed(self, connection: McpConnection) -> None:
        """The server said its tools changed: listed again at once, its definitions checked."""
        self._in_background(self._relisted(connection, connection.changed_at))

    async def _relisted(self, connection: McpConnection, since: float) -> None:
        """A listing made in the background: a changed definition is withheld and reported now, not at a call."""
        try:
            listing = await connection.listing(since)
        except McpServerError as exc:
            log.warning("%s", printable(str(exc)))
            return
        pins = await self._server_pins(connection.spec)
        for tool in listing.tools:
            await self._pinned(connection.spec, tool, pins.get(tool["name"]))

    async def _server_pins(self, spec: McpServerSpec) -> dict[str, dict[str, Any]]:
        """A server's pins in one read, for a listing; empty when unread (each tool is then read on its own)."""
        try:
            return await self.store.server_pins(spec.name) if self.store is not None else {}
        except StoreError:
            return {}

    async def _call_definition(self, connection: McpConnection, tool: str,
                               arrived: float) -> tuple[dict[str, Any] | None, str | None]:
        """The definition a call of `tool` that came at `arrived` is decided on (None: the server has no such
        tool), and why the call is withheld (None: it is not). McpServerError when no listing can be had."""
        spec = connection.spec
        listing = await connection.listing(max(arrived - spec.pin_recheck, connection.changed_at))
        definition = listing.get(tool)
        if listing.asked < arrived:  # a listing from before the call: trusted while the store agrees with it
            self._renew(connection, listing.asked)
            if definition is not None and self.store is None:
                return definition, None  # no pins kept
            pin = await self._agreeing(spec, definition)
            if pin is not None:
                return definition, await self._verdict(spec, pin)
            listing = await connection.listing(arrived)  # else one made for the call decides
            definition = listing.get(tool)
        if definition is None:
            return None, None
        return definition, await self._pinned(spec, definition)

    def _renew(self, connection: McpConnection, asked: float) -> None:
        """A listing half its bound old is renewed in the background, so that calls seldom wait for one."""
        if time.monotonic() - asked > connection.spec.pin_recheck * AHEAD and not connection.listing_under_way:
            self._in_background(self._relisted(connection, time.monotonic()))

    async def _agreeing(self, spec: McpServerSpec, definition: dict[str, Any] | None) -> dict[str, Any] | None:
        """The tool's pin, when the store's last seen definition of it is this one; else None."""
        if definition is None or self.store is None:
            return None
        try:
            pin = await self.store.pin(spec.name, definition["name"])
        except StoreError:
            return None  # a listing made for the call decides, and the store is read again (it fails closed)
        return pin if pin is not None and pin["seen_digest"] == definition_digest(definition) else None

    async def _pinned(self, spec: McpServerSpec, tool: dict[str, Any], pin: dict[str, Any] | None = None) -> str | None:
        """None when the definition is the pinned one (or is pinned now, first seen); else why it is withheld.

        Checked against the store each time, never against what this process once found pinned: a person may
        approve another definition at any time, from the CLI or another replica, and a definition trusted here
        before is then a change like any other. The pin is read (nothing written) while the server gives the
        pinned definition; anything else updates what it was seen to give. `pin`: as a listing just read it."""
        if self.store is None:
            return None
        seen = definition_digest(tool)
        try:
            pin = pin or await self.store.pin(spec.name, tool["name"])
            if pin is None or not pin["digest"] == pin["seen_digest"] == seen:
                pin = await self.store.see_definition(spec.name, tool["name"], tool)
        except StoreError as exc:
            return f"toolkeeper could not check its pinned definition ({exc})"
        return await self._verdict(spec, pin)

    async def _verdict(self, spec: McpServerSpec, pin: dict[str, Any]) -> str | None:
        """None when the pin holds the definition last seen; else why the tool is withheld (the change reported
        once)."""
        if not pin["changed"]:
            return None
        reported = (spec.name, pin["tool"], pin["digest"], pin["seen_digest"])
        if reported not in self._reported:  # each change from each pinned definition once in the trail
            self._reported.add(reported)
            await self._report_change(spec, pin)
        fields = ", ".join(changed_fields(pin["definition"], pin["seen_definition"]))
        return (f"its definition changed since it was approved ({fields}); an administrator must review the change "
                f"(toolkeeper mcp approve {spec.name} {pin['tool']})")

    async def _report_change(self, spec: McpServerSpec, pin: dict[str, Any]) -> None:
        """A changed definition goes in the trail, with what changed."""
        diff = definition_diff(pin["definition"], pin["seen_definition"])
        record = ExecutionRecord(agent="", api="mcp", tool=spec.proxied_name(pin["tool"]), runner="mcp",
                                 source="mcp", status="withheld", call_id=f"definition:{pin['seen_digest'][:16]}",
                                 policy_revision=self.handler.policy.revision)
        fields = ", ".join(changed_fields(pin["definition"], pin["seen_definition"]))
        record.decided_by(Decision("deny", "pin", f"the tool's definition changed since it was approved ({fields}): "
                                                  f"withheld until `toolkeeper mcp approve {spec.name} {pin['tool']}`"))
        record.answer = diff
        log.warning("MCP server %s changed the definition of %s (%s): withheld until approved", spec.name,
                    printable(pin["tool"]), printable(fields))
        await self.handler.settle(record, Outcome(diff))
