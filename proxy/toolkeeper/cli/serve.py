"""`toolkeeper serve AGENT_FILE`: the proxy, on the flags `Settings` declares."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sqlite3
import sys

from toolkeeper.settings import Settings


def add_parser(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="run the proxy in front of the agent file's upstream")
    serve.add_argument("agent_file", help="the agent file (YAML) declaring the tools")
    Settings.add_arguments(serve)
    serve.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from toolkeeper.audit import AuditError
    from toolkeeper.policy import RulesError
    from toolkeeper.tools import AgentFileError, load_agent_file

    settings = Settings.from_arguments(args)
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        agent = load_agent_file(args.agent_file, upstream=settings.upstream)
        return asyncio.run(serve(agent, settings))
    except (AgentFileError, RulesError, AuditError, ValueError) as exc:
        print(f"toolkeeper: {exc}", file=sys.stderr)
        return 2
    except sqlite3.Error as exc:
        print(f"toolkeeper: cannot open a database: {exc} (the store and the audit trail live next to the "
              "agent file unless --store and --audit say where)", file=sys.stderr)
        return 2


async def serve(agent, settings: Settings) -> int:
    from aiohttp import web

    from toolkeeper.app import POLICY, build_app

    app = build_app(agent, settings)
    # handler_cancellation: an agent that disconnects cancels its turn, and with
    # it the running tool (its process group is killed).
    # keepalive_timeout also closes a connection that never completes its request's headers
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, keepalive_timeout=settings.idle_timeout)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    try:
        await site.start()
    except OSError as exc:
        print(f"toolkeeper: cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}",
              file=sys.stderr)
        await runner.cleanup()
        return 1
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"toolkeeper listening on http://{settings.host}:{port}/v1 ({len(agent.tools)} declared tools from "
          f"{agent.path}, upstream {agent.config.upstream}, {app[POLICY].describe()})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    return 0

