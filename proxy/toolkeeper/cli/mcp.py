"""`toolkeeper mcp AGENT_FILE`: toolkeeper as an MCP server over stdio, the way desktop agents launch one;
`toolkeeper mcp pins` and `toolkeeper mcp approve SERVER TOOL`: the pinned definitions of the agent's MCP servers.

Over stdio, the declared tools and the agent file's `mcp_servers:` are served
as `serve` serves them on `/mcp`: the same app, the same store and trail. A
person answers a gated call through the approvals channel: this process also
listens on serve's address for the admin API (`toolkeeper approve`) when that
address is free; when a `serve` of the same agent file holds it, that one
answers, through the shared store.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys
import traceback

from toolkeeper.cli import no_collection
from toolkeeper.cli.serve import configure_logging
from toolkeeper.cli.tokens import no_store_at
from toolkeeper.common import counted, printable
from toolkeeper.settings import Settings, SettingsError

log = logging.getLogger("toolkeeper")


def add_parser(commands: argparse._SubParsersAction) -> None:
    mcp = commands.add_parser("mcp", help="serve the declared tools and the agent's MCP servers over stdio (MCP); "
                                          "`mcp pins`, `mcp approve SERVER TOOL`: their pinned definitions")
    mcp.add_argument("words", nargs="+", metavar="AGENT_FILE | pins | approve SERVER TOOL",
                     help="the agent file to serve; or `pins` (list the pinned definitions); or `approve SERVER "
                          "TOOL` (take the definition a server gives now, after reviewing its change)")
    mcp.add_argument("--as", dest="approver", help="who approves a definition (default: your user name)")
    Settings.add_arguments(mcp)
    mcp.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        settings = Settings.from_arguments(args)
    except SettingsError as exc:
        print(f"toolkeeper: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    words = args.words
    if words[0] == "pins" and len(words) == 1:
        return asyncio.run(pins_command(settings))
    if words[0] == "approve":
        if len(words) != 3:
            print("toolkeeper: usage: toolkeeper mcp approve SERVER TOOL", file=sys.stderr)
            return 2
        return asyncio.run(approve_command(settings, words[1], words[2], args.approver))
    if len(words) != 1:
        print("toolkeeper: usage: toolkeeper mcp AGENT_FILE (or `mcp pins`, `mcp approve SERVER TOOL`)",
              file=sys.stderr)
        return 2
    return serve_command(words[0], settings)


def serve_command(agent_file: str, settings: Settings) -> int:
    from toolkeeper.cli.serve import linted
    from toolkeeper.tools import load_agent_file

    try:
        with no_collection():
            agent = load_agent_file(agent_file, upstream=settings.upstream)
            if not linted(agent):
                return 2
        return asyncio.run(serve_stdio(agent, settings))
    except Exception as exc:
        if not said(exc):
            raise
        return 2


def said(exc: Exception) -> bool:
    """Whether `exc` is one of the errors that end `toolkeeper mcp` with their message and status 2 (a file that
    does not load, a store that does not open...): then it is said on stderr. The classes are imported when one
    happens, not at every start."""
    from toolkeeper.audit import AuditError
    from toolkeeper.policy import RulesError
    from toolkeeper.store import SchemaError, StoreError
    from toolkeeper.tools import AgentFileError

    if not isinstance(exc, (AgentFileError, RulesError, AuditError, StoreError, SchemaError, ValueError)):
        return False
    print(f"toolkeeper: {exc}", file=sys.stderr)
    return True


async def serve_stdio(agent, settings: Settings) -> int:
    """The MCP server over stdio, answering `initialize` with the SDK alone; the app is built when a request
    first needs it (wire/mcp/stdio.py), and closed when the client goes."""
    from toolkeeper import __version__
    from toolkeeper.wire import deferred_server
    from toolkeeper.wire import serve_stdio as serve_over_stdio

    app = DeferredApp(agent, settings)
    with no_collection():
        server = deferred_server(app.server, __version__)
    try:
        await serve_over_stdio(server)
    finally:
        await app.close()
    return 0


class DeferredApp:
    """serve's app for one agent file, built at the first request that needs it. A failure to build it ends the
    process as it ended before the handshake was answered first: the error on stderr and status 2 (status 1 and
    the traceback for an unexpected one); stdin, read by the SDK in a thread, cannot be closed under it."""

    def __init__(self, agent, settings: Settings):
        self.agent = agent
        self.settings = settings
        self.runner = None
        self._building: asyncio.Future | None = None

    async def server(self):
        """build_server's server on the app (built by the first caller, awaited by the others)."""
        if self._building is None:
            self._building = asyncio.ensure_future(self._build())
        return await asyncio.shield(self._building)

    async def _build(self):
        try:
            return await self._built()
        except Exception as exc:
            status = 2 if said(exc) else 1
            if status == 1:
                traceback.print_exc()
            sys.stderr.flush()
            os._exit(status)

    async def _built(self):
        with no_collection():
            from aiohttp import web

            from toolkeeper.app import MCP_SERVER, build_app, consent_mode

            settings = self.settings
            if consent_mode(settings) == "terminal":  # stdin is the protocol: no one can answer there
                settings = dataclasses.replace(settings, consent="approvals" if settings.admin_token else "none")
            app = build_app(self.agent, settings)
        self.runner = runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                                             keepalive_timeout=settings.idle_timeout)
        await runner.setup()
        if consent_mode(settings) == "approvals":
            await _listen_for_approvals(runner, settings)
        log.info("toolkeeper mcp: %s from %s, %s, over stdio", counted(len(self.agent.tools), "declared tool"),
                 self.agent.path, counted(len(self.agent.config.mcp_servers), "MCP server"))
        return app[MCP_SERVER]

    async def close(self) -> None:
        if self._building is not None and not self._building.done():
            await asyncio.wait([self._building])
        if self.runner is not None:
            await self.runner.cleanup()


async def _listen_for_approvals(runner, settings: Settings) -> None:
    from aiohttp import web

    site = web.TCPSite(runner, settings.host, settings.port, reuse_port=settings.reuse_port)
    try:
        await site.start()
        log.info("toolkeeper mcp: the admin API (toolkeeper approve) on %s", settings.local_url)
    except OSError as exc:
        log.info("toolkeeper mcp: %s is taken (%s): approvals are answered by the toolkeeper listening there, "
                 "through the shared store", settings.local_url, exc.strerror or exc)


async def pins_command(settings: Settings) -> int:
    from toolkeeper.engine import changed_fields, definition_diff
    from toolkeeper.store import open_store

    if no_store_at(settings.kept("store")):
        return 2
    store = open_store(settings.kept("store"))
    try:
        pins = await store.pins()
    finally:
        await store.close()
    if not pins:
        print("no MCP server tool seen yet")
    for pin in pins:
        state = "pinned"
        if pin["changed"]:
            fields = ", ".join(changed_fields(pin["definition"], pin["seen_definition"]))
            state = f"CHANGED ({fields}): withheld until approved"
        print(printable(f"{pin['server']} {pin['tool']}: {state}"))
        if pin["changed"]:
            print("\n".join(printable(line) for line in definition_diff(pin["definition"],
                                                                         pin["seen_definition"]).splitlines()))
    return 0


async def approve_command(settings: Settings, server: str, tool: str, approver: str | None) -> int:
    from toolkeeper.audit import open_audit
    from toolkeeper.engine import approve_definition
    from toolkeeper.policy import local_user
    from toolkeeper.store import open_store

    if no_store_at(settings.kept("store")):
        return 2
    store, audit = open_store(settings.kept("store")), open_audit(settings.kept("audit"))
    try:
        pin = await approve_definition(store, audit, server, tool, approver or local_user())
    finally:
        await store.close()
        audit.close()
    if pin is None:
        print(printable(f"toolkeeper: no tool {tool!r} of an MCP server {server!r} has been seen (toolkeeper mcp "
                        "pins lists them)"), file=sys.stderr)
        return 1
    print(printable(f"approved: {server} {tool} is served with the definition it gives now, by {pin['approver']}"))
    return 0


