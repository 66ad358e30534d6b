"""`toolkeeper serve AGENT_FILE`: the proxy, on the options `Settings` declares (flags, TOOLKEEPER_*, --config)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sqlite3
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from toolkeeper.common import counted
from toolkeeper.settings import Settings, SettingsError

log = logging.getLogger("toolkeeper")


MAX_HEADER_BYTES = 20 * 1024


def add_parser(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="run the proxy in front of the agent file's upstream")
    serve.add_argument("agent_path", metavar="agent_file", nargs="?",
                       help="the agent file (YAML) declaring the tools (or --agent-file, $TOOLKEEPER_AGENT_FILE, "
                       "`agent_file:` in the config file)")
    Settings.add_arguments(serve)
    serve.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from toolkeeper.audit import AuditError
    from toolkeeper.cli.workers import supervise, worker_count
    from toolkeeper.policy import RulesError
    from toolkeeper.store import SchemaError, StoreError
    from toolkeeper.tools import AgentFileError, load_agent_file
    from toolkeeper.tracing import check as check_tracing

    try:
        settings = Settings.from_arguments(args)
        settings.check_exposure()
        agent_file = the_agent_file(args.agent_path, settings.agent_file)
    except SettingsError as exc:
        print(f"toolkeeper: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    try:
        agent = load_agent_file(agent_file, upstream=settings.upstream)
        if not linted(agent):
            return 2
        check_tracing(settings.otlp_endpoint, settings.otlp_protocol)  # before any worker starts
        loop = event_loop(settings.event_loop)
        workers = worker_count(settings)
        if workers > 1:
            def worker(given: Settings, ready_fd: int | None) -> int:
                try:  # a worker started again after a reload serves what its siblings serve
                    current = load_agent_file(agent_file, upstream=settings.upstream)
                except AgentFileError:
                    current = agent
                return run_loop(serve(current, given, worker=True, ready_fd=ready_fd), loop)

            def announce(port: int, policy: str) -> None:
                print(listening_line(agent, settings.host, port, policy, workers, loop), flush=True)

            return supervise(settings, workers, worker, announce)
        return run_loop(serve(agent, settings, loop=loop), loop)
    except (AgentFileError, RulesError, AuditError, StoreError, SchemaError, ValueError) as exc:
        print(f"toolkeeper: {exc}", file=sys.stderr)
        return 2
    except sqlite3.Error as exc:
        print(f"toolkeeper: cannot open a database: {exc} (the store and the audit trail live next to the "
              "agent file unless --store and --audit say where)", file=sys.stderr)
        return 2


async def serve(agent, settings: Settings, *, worker: bool = False, ready_fd: int | None = None,
                loop: str = "asyncio") -> int:
    """One process serving the port; a worker shares it with its siblings, and says it listens on `ready_fd` (its
    supervisor's pipe) rather than on stdout."""
    from aiohttp import web

    from toolkeeper.app import RELOAD, build_app

    app = build_app(agent, settings)
    # handler_cancellation: an agent that disconnects cancels its turn, and with
    # it the running tool (its process group is killed).
    # keepalive_timeout also closes a connection that never completes its request's headers.
    # max_field_size: an access token with many groups (Entra's) is longer than aiohttp's 8 KiB default for one
    # header; toolkeeper's own check refuses tokens past 16 KiB, in the API's error shape.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, keepalive_timeout=settings.idle_timeout,
                           max_field_size=MAX_HEADER_BYTES)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, reuse_port=worker or settings.reuse_port)
    try:
        await site.start()
    except OSError as exc:
        print(f"toolkeeper: cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}",
              file=sys.stderr)
        await runner.cleanup()
        return 1
    stop = asyncio.Event()
    running = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        running.add_signal_handler(sig, stop.set)
    running.add_signal_handler(signal.SIGHUP, app[RELOAD])  # read again: before the start line, so one sent on it holds
    if not worker:
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(listening_line(agent, settings.host, port, app[RELOAD].describe(), loop=loop), flush=True)
    elif ready_fd is not None:
        os.write(ready_fd, app[RELOAD].describe().encode() + b"\n")
        os.close(ready_fd)
    settle_heap()
    await stop.wait()
    await runner.cleanup()
    return 0


def settle_heap() -> None:
    """What the start built (modules, the app, the rules, the bash grammar) lives as long as the process: frozen
    out of the collector's reach, so that a collection walks what requests made, not the whole heap. And
    collections every 10,000 allocations rather than 700: a request makes a few hundred objects, and with 32 at
    once in flight, each collection walked all of theirs."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def the_agent_file(argument: str | None, setting: str | None) -> str:
    """The argument or the setting; both, naming two files, is refused: the other commands would look for the
    store and the trail beside the one serve did not load."""
    if argument and setting and Path(argument).resolve() != Path(setting).resolve():
        raise SettingsError(f"two agent files: {argument} (the argument) and {setting} (--agent-file, "
                            "$TOOLKEEPER_AGENT_FILE or `agent_file:` in the config file): give one")
    if not (argument or setting):
        raise SettingsError("serve needs the agent file: `toolkeeper serve agent.yaml` (or `agent_file:` in the "
                            "config file, or $TOOLKEEPER_AGENT_FILE)")
    return argument or setting


def linted(agent) -> bool:
    """`toolkeeper check`'s errors stop the start; its warnings are logged once."""
    from toolkeeper.tools import lint_agent

    findings = lint_agent(agent)
    for finding in findings:
        if finding.severity == "error":
            print(f"toolkeeper: {agent.path}: {finding.line()} (toolkeeper check {agent.path})", file=sys.stderr)
        else:
            log.warning("%s: %s", agent.path, finding.line())
    return not any(finding.severity == "error" for finding in findings)


def listening_line(agent, host: str, port: int, policy: str, workers: int = 1, loop: str = "asyncio") -> str:
    processes = f", {workers} workers" if workers > 1 else ""
    return (f"toolkeeper listening on http://{host}:{port}/v1 ({counted(len(agent.tools), 'declared tool')} from "
            f"{agent.path}, upstream {agent.config.upstream}, {policy}{processes}, event loop {loop})")


def event_loop(wanted: str) -> str:
    """The loop serve runs on: uvloop where it is installed (`auto`, the default: 14% less CPU per request
    here, bench/overhead.py), else asyncio's own. Asking for uvloop where it is not installed is an error, not
    a quiet fallback."""
    if wanted == "asyncio":
        return "asyncio"
    try:
        import uvloop
    except ImportError:
        if wanted == "uvloop":
            raise ValueError("--event-loop uvloop: uvloop is not installed here (pip install uvloop)") from None
        return "asyncio"
    return f"uvloop {uvloop.__version__}"


def run_loop(main: Coroutine[Any, Any, int], loop: str) -> int:
    if loop.startswith("uvloop"):
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def configure_logging(level: str) -> None:
    """toolkeeper's log on stderr; the MCP SDK's own INFO lines (its session manager starting) are not toolkeeper's
    to say."""
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger().level
    logging.getLogger("mcp").setLevel(logging.WARNING if root == logging.INFO else root)  # DEBUG: all of it
