"""What `toolkeeper hook` and `toolkeeper mcp` import before they answer (issue 43): only what each needs.

`toolkeeper hook` runs before and after every tool call of an agent, and `toolkeeper mcp` at each of its sessions'
starts; their cost is mostly the modules they import (bench/startup.py times them). Asserted here on the modules
themselves, never on a time: the process's own `sys.modules` (exact, where `python -X importtime` misses what
importlib.import_module loads), written when the hook has answered, and when `initialize` has been answered.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from conftest import free_port, write_agent
from test_hook_formats import CLAUDE_PRE, StandIn

# What neither needs to answer: the proxy's web stack and app, the SDKs and clients of what toolkeeper talks to,
# the configuration models, the bash grammar, the secret detectors.
HEAVY = ("aiohttp", "yarl", "multidict", "pydantic", "yaml", "prometheus_client", "opentelemetry",
         "psycopg", "wasmtime", "opa_client", "requests", "urllib3", "jwt", "cryptography", "detect_secrets",
         "tree_sitter", "tree_sitter_bash", "uvloop", "importlib.metadata")
TOOLKEEPER_HEAVY = ("toolkeeper.app", "toolkeeper.engine", "toolkeeper.policy", "toolkeeper.audit",
                    "toolkeeper.store", "toolkeeper.runners", "toolkeeper.identity", "toolkeeper.tools",
                    "toolkeeper.strict", "toolkeeper.wire.server", "toolkeeper.wire.admin", "toolkeeper.wire.apis")
# `initialize` is the SDK's (mcp, mcp_types, pydantic, anyio...) and the agent file's (checked before it is
# answered, as before): not the app's.
HANDSHAKE_HEAVY = ("aiohttp", "prometheus_client", "psycopg", "wasmtime", "opa_client", "jwt", "detect_secrets",
                   "tree_sitter", "tree_sitter_bash", "uvloop", "toolkeeper.app", "toolkeeper.engine",
                   "toolkeeper.policy", "toolkeeper.audit", "toolkeeper.store", "toolkeeper.runners",
                   "toolkeeper.identity", "toolkeeper.wire.server", "toolkeeper.wire.admin", "toolkeeper.wire.apis",
                   "toolkeeper.wire.mcp.server", "toolkeeper.wire.mcp.http")
# run as the agent runs it, with the modules it holds written to argv[1] once it has answered
DUMPED = ("import json, sys\n"
          "from toolkeeper.cli import main\n"
          "status = main(sys.argv[2:])\n"
          "open(sys.argv[1], 'w').write(json.dumps(sorted(sys.modules)))\n"
          "sys.exit(status)\n")
# `toolkeeper mcp`, writing the modules it holds to argv[1] when it gets SIGUSR1 (between two messages)
ON_SIGNAL = ("import json, signal, sys\n"
             "signal.signal(signal.SIGUSR1, lambda *_: open(sys.argv[1], 'w').write(json.dumps(sorted(sys.modules))))\n"
             "from toolkeeper.cli import main\n"
             "sys.exit(main(sys.argv[2:]))\n")
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "test", "version": "1"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
AGENT = """
    upstream: http://127.0.0.1:9/v1
    tools:
      - name: say_text
        description: Print a short text. Use it when the user asks to print one.
        command: [echo, "{{text}}"]
        tier: silent
        parameters:
          text: {type: string, description: what to print}
"""


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TOOLKEEPER_")}


def loaded(names: list[str], wanted: tuple[str, ...]) -> list[str]:
    return sorted(name for name in names if any(name == top or name.startswith(top + ".") for top in wanted))


def hook_modules(tmp_path: Path, url: str, event: dict | str) -> tuple[subprocess.CompletedProcess, list[str]]:
    dump = tmp_path / "modules.json"
    stdin = event if isinstance(event, str) else json.dumps(event)
    done = subprocess.run([sys.executable, "-c", DUMPED, str(dump), "hook", "claude-code", "--url", url],
                          input=stdin, capture_output=True, text=True, timeout=60, env=clean_env())
    return done, json.loads(dump.read_text())


def test_the_hook_imports_none_of_the_proxy_whether_answered_or_not(tmp_path):
    stand_in = StandIn({"decision": "allow", "reason": "echo only prints"})
    try:
        answered, modules = hook_modules(tmp_path, stand_in.url, CLAUDE_PRE)
    finally:
        stand_in.close()
    assert answered.returncode == 0 and '"permissionDecision": "allow"' in answered.stdout, answered.stderr
    assert loaded(modules, HEAVY + TOOLKEEPER_HEAVY) == []
    assert "toolkeeper.cli.hooks" in modules and "urllib.request" in modules  # it did run, and post

    down, modules = hook_modules(tmp_path, f"http://127.0.0.1:{free_port()}", CLAUDE_PRE)  # nothing listens
    assert down.returncode == 0 and '"permissionDecision": "deny"' in down.stdout  # it still fails closed
    assert loaded(modules, HEAVY + TOOLKEEPER_HEAVY) == []

    unreadable, modules = hook_modules(tmp_path, "http://127.0.0.1:9", "not json")
    assert '"permissionDecision": "deny"' in unreadable.stdout
    assert loaded(modules, HEAVY + TOOLKEEPER_HEAVY) == []


def test_strict_configuration_is_still_reached_through_common():
    """common gives toolkeeper.strict's names (PEP 562), so every `from toolkeeper.common import Strict` holds."""
    from toolkeeper import common, strict

    assert common.Strict is strict.Strict and common.load_yaml_model is strict.load_yaml_model
    assert common.regex is strict.regex and common.describe is strict.describe


def test_every_command_still_lists_and_describes_its_options():
    done = subprocess.run([sys.executable, "-m", "toolkeeper", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--version" in done.stdout and "show program's version number" in done.stdout
    for command in ("serve", "mcp", "hook", "audit", "policy", "limits", "eval"):
        assert command in done.stdout
    version = subprocess.run([sys.executable, "-m", "toolkeeper", "--version"], capture_output=True, text=True,
                             timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("toolkeeper ")


@contextlib.contextmanager
def mcp_running(tmp_path: Path, *args: str) -> Iterator[tuple[subprocess.Popen, Path]]:
    """`toolkeeper mcp AGENT_FILE ARGS` with pipes on stdin, stdout and stderr; killed when still running after."""
    agent = write_agent(tmp_path, AGENT)
    dump = tmp_path / "modules.json"
    with subprocess.Popen([sys.executable, "-c", ON_SIGNAL, str(dump), "mcp", str(agent), *args],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(),
                          start_new_session=True) as process:
        try:
            yield process, dump
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)


def exchange(process: subprocess.Popen, message: dict) -> dict:
    process.stdin.write(json.dumps(message).encode() + b"\n")
    process.stdin.flush()
    return json.loads(process.stdout.readline() or b"null")


def modules_now(process: subprocess.Popen, dump: Path) -> list[str]:
    dump.unlink(missing_ok=True)
    os.kill(process.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        text = dump.read_text() if dump.exists() else ""
        if text.endswith("]"):
            return json.loads(text)
        time.sleep(0.02)
    raise AssertionError(f"no module list (status {process.poll()})")


def ended(process: subprocess.Popen) -> int:
    """The status `toolkeeper mcp` exits with once the client closes its stdin."""
    process.stdin.close()
    return process.wait(30)


def test_mcp_answers_initialize_before_it_imports_the_app_and_builds_it_for_the_first_listing(tmp_path):
    with mcp_running(tmp_path) as (process, dump):
        answer = exchange(process, INITIALIZE)
        assert answer["id"] == 1 and answer["result"]["serverInfo"]["name"] == "toolkeeper", answer
        assert answer["result"]["capabilities"]["tools"] == {"listChanged": False}
        assert "checked against its declaration" in answer["result"]["instructions"]
        handshake = modules_now(process, dump)
        assert loaded(handshake, HANDSHAKE_HEAVY) == []
        assert "mcp.server.lowlevel" in handshake and "toolkeeper.tools" in handshake  # the SDK; the agent file

        process.stdin.write(json.dumps(INITIALIZED).encode() + b"\n")
        listed = exchange(process, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        assert [tool["name"] for tool in listed["result"]["tools"]] == ["say_text"], listed
        assert "toolkeeper.app" in modules_now(process, dump)  # built when first needed
        assert ended(process) == 0


def test_the_handshake_is_the_one_build_server_gives():
    """The deferred server says what the app's own would: name, version, instructions, capabilities."""
    from toolkeeper import __version__
    from toolkeeper.wire import build_server, deferred_server

    async def never():
        raise AssertionError("the handshake needs no app")

    deferred = deferred_server(never, __version__).create_initialization_options()
    built = build_server(None, None, __version__).create_initialization_options()
    assert deferred.model_dump() == built.model_dump()


def test_an_app_that_cannot_be_built_still_ends_mcp_with_its_error_and_status_2(tmp_path):
    """The rules are read when the app is built (the first listing): a missing file ends the process as it did
    when it was read before the handshake, the error on stderr and status 2."""
    with mcp_running(tmp_path, "--policy", str(tmp_path / "missing.yaml")) as (process, _):
        assert exchange(process, INITIALIZE)["id"] == 1
        process.stdin.write(json.dumps(INITIALIZED).encode() + b"\n")
        assert exchange(process, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}) is None  # no answer: it ended
        assert process.wait(30) == 2
        said = process.stderr.read().decode()
        assert "toolkeeper: " in said and "missing.yaml" in said, said
