"""Issue 39, the smaller items (6) and the revoked approver (7): each against a real `serve` (or the CLI), MCP
driven by the official SDK's client."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import GATED, RELEASE, ROOT, Process, audit_cli, run_cli, write_agent

NOTES_SERVER = ROOT / "tests" / "mcp" / "notes_server.py"
MCP_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "hasty", "version": "1"}}}


def serve(directory: Path, *extra: str, env: dict[str, str] | None = None) -> Process:
    return Process([sys.executable, "-m", "toolkeeper", "serve", str(directory / "agent.yaml"), "--port", "0",
                    "--log-level", "INFO", *extra], "toolkeeper listening on", env=env)


def root_of(process: Process) -> str:
    return process.url.removesuffix("/v1")


def trail(directory: Path) -> list[dict]:
    run = audit_cli(directory / "toolkeeper-audit.sqlite3", "export", "--format", "jsonl")
    assert run.returncode == 0, run.stderr
    return [json.loads(line) for line in run.stdout.splitlines()]


def text_of(result) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


# -- 6a: a client that closes its connection right after `initialize` -------------------------------------------

def initialize_then_hang_up(root: str) -> str:
    """An `initialize` POST whose client reads the answer's headers, takes the session id, and closes at once."""
    host, port = root.removeprefix("http://").split(":")
    body = json.dumps(INITIALIZE).encode()
    head = "".join(f"{name}: {value}\r\n" for name, value in MCP_HEADERS.items())
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(f"POST /mcp HTTP/1.1\r\nHost: {host}\r\n{head}Content-Length: {len(body)}\r\n\r\n"
                           .encode() + body)
        received = b""
        while b"\r\n\r\n" not in received:
            received += connection.recv(1)
    headers = received.decode("latin-1").split("\r\n")
    (session,) = [line.split(":", 1)[1].strip() for line in headers if line.lower().startswith("mcp-session-id:")]
    return session


def test_a_session_outlives_the_connection_that_opened_it(tmp_path):
    write_agent(tmp_path, GATED + RELEASE)
    process = serve(tmp_path)
    try:
        session = initialize_then_hang_up(root_of(process))
        time.sleep(0.5)  # the server has seen the connection close
        statuses = []
        for message in ({"jsonrpc": "2.0", "method": "notifications/initialized"},
                        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}):
            request = urllib.request.Request(root_of(process) + "/mcp", data=json.dumps(message).encode(), headers={
                **MCP_HEADERS, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-06-18"})
            with urllib.request.urlopen(request, timeout=10) as answer:
                statuses.append((answer.status, answer.read().decode()))
    finally:
        log = process.stop()
    assert statuses[0][0] == 202 and statuses[1][0] == 200 and '"name":"release"' in statuses[1][1]
    assert "Traceback" not in log, log


# -- 6b: elicitation on the request's own stream ------------------------------------------------------------------

def without_get_stream():
    """An HTTP client for the SDK that never holds MCP's standalone GET stream (the server's answer to its GET is
    405, which the specification allows): what the server asks must come on a POST's own stream."""
    import httpx2

    class NoGet(httpx2.AsyncBaseTransport):
        def __init__(self) -> None:
            self.inner = httpx2.AsyncHTTPTransport()

        async def handle_async_request(self, request):
            if request.method == "GET":
                return httpx2.Response(405, request=request)
            return await self.inner.handle_async_request(request)

        async def aclose(self) -> None:
            await self.inner.aclose()

    return httpx2.AsyncClient(transport=NoGet(), timeout=60)


def test_elicitation_reaches_a_client_without_a_get_stream(tmp_path):
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp_types import ElicitResult, Implementation

    write_agent(tmp_path, GATED + RELEASE)
    asked: list[str] = []

    async def answer(context, params) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"approve": True})

    async def call(root: str) -> tuple[object, float]:
        async with without_get_stream() as http, Client(
                streamable_http_client(root + "/mcp", http_client=http), mode="legacy", elicitation_callback=answer,
                client_info=Implementation(name="no-get", version="1")) as client:
            started = time.monotonic()
            result = await asyncio.wait_for(client.call_tool("release", {"version": "3.0.0"}), 30)
            return result, time.monotonic() - started

    # no approvals channel (no admin token): the client's own user is asked, through elicitation
    process = serve(tmp_path, env={"TOOLKEEPER_CONSENT_TIMEOUT": "15"})
    try:
        result, took = asyncio.run(call(root_of(process)))
    finally:
        process.stop()
    assert not result.is_error, text_of(result)
    assert took < 10 and len(asked) == 1 and "release(version=3.0.0)" in asked[0]


# -- 6c, 6g: MCP server entries that could only mislead are refused at load -------------------------------------

@pytest.mark.parametrize("entries, said", [
    # `mcp__fake___x` would be both fake's `_x` and fake_'s `x`
    ("""
      - name: fake
        command: [fake-server]
      - name: fake_
        command: [other-server]
    """, "'fake_': a server name is 1 to 32 letters, digits, '_' or '-', without '__' and not ending in '_'"),
    ("""
      - name: tickets
        url: https://mcp.example.com/mcp
        env: [HOME]
    """, "`env:` and `workdir:` apply to a `command:` server; a `url:` server runs elsewhere"),
    ("""
      - name: tickets
        url: https://mcp.example.com/mcp
        workdir: /srv
    """, "`env:` and `workdir:` apply to a `command:` server"),
])
def test_server_entries_that_would_mislead_are_refused_at_load(tmp_path, entries, said):
    path = write_agent(tmp_path, "upstream: http://127.0.0.1:9/v1\nmcp_servers:" + entries)
    run = run_cli("check", str(path))
    assert run.returncode != 0 and said in run.stdout + run.stderr, run.stdout + run.stderr
    assert str(path) in run.stdout + run.stderr and "mcp_servers." in run.stdout + run.stderr


# -- 6e, 6f: proxied calls that time out, name no tool, or reach a server that will not start ---------------------

PROXY_AGENT = """
    upstream: http://127.0.0.1:9/v1
    mcp_servers:
      - name: notes
        command: ["{python}", "{notes}"]
        env: {NOTES_STATE: "{state}"}
        tier: silent
        timeout: 2
      - name: broken
        command: ["{python}", "-c", 'raise SystemExit("no config")']
"""


def test_proxied_calls_that_never_answer_are_recorded_as_they_happened(tmp_path):
    from mcp import Client, StdioServerParameters

    (tmp_path / "state").mkdir()
    write_agent(tmp_path, PROXY_AGENT, notes=str(NOTES_SERVER), state=str(tmp_path / "state"))

    async def run() -> list:
        params = StdioServerParameters(command=sys.executable, args=["-m", "toolkeeper", "mcp",
                                                                      str(tmp_path / "agent.yaml")],
                                       env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path)
        async with Client(params) as client:
            return [await client.call_tool(name, arguments) for name, arguments in (
                ("mcp__notes__slow", {"seconds": 30}), ("mcp__notes__no_such_tool", {"a": 1}),
                ("mcp__nowhere__x", {}), ("mcp__broken__anything", {"b": 2}))]

    hung, unknown_tool, unknown_server, unstarted = asyncio.run(run())
    assert all(result.is_error for result in (hung, unknown_tool, unknown_server, unstarted))
    recorded = {entry["tool"]: entry for entry in trail(tmp_path)}
    slow = recorded["mcp__notes__slow"]
    assert slow["status"] == "timeout" and 1900 <= slow["duration_ms"] < 10_000, slow  # waited 2 s, not 0
    for name, status, said in (("mcp__notes__no_such_tool", "invalid", "no MCP server toolkeeper serves has it"),
                               ("mcp__nowhere__x", "invalid", "no MCP server toolkeeper serves has it"),
                               ("mcp__broken__anything", "failed", "could not be started")):
        entry = recorded[name]
        assert (entry["status"], entry["source"], entry["api"], entry["decision"]) == (status, "mcp", "mcp", "deny")
        assert said in entry["decision_reason"], entry
    assert recorded["mcp__broken__anything"]["arguments"] == {"b": 2}


# -- 7: a revoked approver's open queue stream carries no call waiting after the revocation ------------------------

def test_a_revoked_approvers_stream_never_carries_a_call_that_waits_after(scripted, tmp_path):
    import http.client
    import threading
    import urllib.parse

    from test_approvals import AGENT, Asking, cli, serve, waiting

    write_agent(tmp_path, AGENT)
    tk = serve(scripted, tmp_path)
    try:
        added = run_cli("tokens", "add", "leaving", "--role", "approver", "--store", str(tmp_path / "store.sqlite3"))
        token = added.stdout.split(": ", 1)[1].strip()
        where = urllib.parse.urlsplit(tk.base_url)
        connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
        connection.request("GET", "/toolkeeper/queue/live", headers={"Authorization": f"Bearer {token}"})
        stream = connection.getresponse()
        assert stream.status == 200 and stream.readline().startswith(b"event: queue")
        carried, ended = [], threading.Event()

        def read_to_the_end() -> None:
            while line := stream.readline():
                carried.append(line)
            ended.set()

        threading.Thread(target=read_to_the_end, daemon=True).start()
        revoked = run_cli("tokens", "revoke", "leaving", "--store", str(tmp_path / "store.sqlite3"))
        assert revoked.returncode == 0, revoked.stderr
        # within the old re-check's 5 s: a call starts waiting, its arguments in the queue's next event
        asking = Asking(tk, scripted, "release", {"version": "9.9.9-after-revocation"}, word="after-revocation")
        (approval,) = waiting(tk)
        assert ended.wait(5), "the stream outlived its revoked token"
        assert cli(tk, "deny", approval, "--reason", "test over").returncode == 0
        asking.result()
        connection.close()
    finally:
        tk.process.stop()
    assert not any(b"9.9.9-after-revocation" in line or approval.encode() in line for line in carried), carried


# -- 6h: --identity-header at the MCP and hooks doors --------------------------------------------------------------

TEAM_RULES = """
rules:
  - id: red-team-releases-nothing
    effect: deny
    reason: the red team does not release
    when: {tool: [release, Bash], agent: {header: {matches: '^team-red$'}}}
"""


def test_the_identity_header_is_read_at_the_mcp_and_hooks_doors(tmp_path):
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    write_agent(tmp_path, GATED.replace("yolo: false", "yolo: true") + RELEASE)
    (tmp_path / "rules.yaml").write_text(TEAM_RULES)

    async def over_mcp(root: str, team: str) -> object:
        async with httpx2.AsyncClient(headers={"X-Team": team}, timeout=30) as http, \
                Client(streamable_http_client(root + "/mcp", http_client=http)) as client:
            return await client.call_tool("release", {"version": f"4.0.0-{team}"})

    def through_the_hook(root: str, team: str) -> dict:
        event = {"hook_event_name": "PreToolUse", "session_id": f"s-{team}", "tool_name": "Bash",
                 "tool_input": {"command": "make release"}, "tool_use_id": f"toolu_{team.replace('-', '_')}",
                 "cwd": str(tmp_path)}
        request = urllib.request.Request(root + "/toolkeeper/hooks", method="POST", headers={
            "Content-Type": "application/json", "X-Team": team}, data=json.dumps(
            {"agent": "claude-code", "event": event}).encode())
        with urllib.request.urlopen(request, timeout=20) as answer:
            return json.loads(answer.read())

    process = serve(tmp_path, "--identity-header", "X-Team", "--policy", str(tmp_path / "rules.yaml"))
    try:
        red, blue = (asyncio.run(over_mcp(root_of(process), team)) for team in ("team-red", "team-blue"))
        hooked = {team: through_the_hook(root_of(process), team) for team in ("team-red", "team-blue")}
    finally:
        process.stop()
    assert red.is_error and "the red team does not release" in text_of(red)
    assert not blue.is_error, text_of(blue)
    assert hooked["team-red"]["decision"] == "deny" and "the red team" in hooked["team-red"]["reason"]
    assert hooked["team-blue"]["decision"] != "deny"
    headers = {(entry["api"], entry["policy_input"]["agent"]["header"]) for entry in trail(tmp_path)}
    assert {("mcp", "team-red"), ("mcp", "team-blue"), ("hook", "team-red"), ("hook", "team-blue")} <= headers


# -- 6d: one grammar for times: the console's trail filter and export take `7d` as the CLI does --------------------

def test_the_console_and_its_export_take_times_as_the_cli_does(tmp_path):
    from toolkeeper.audit import ExecutionRecord, open_audit

    write_agent(tmp_path, GATED + RELEASE)
    audit = open_audit(tmp_path / "toolkeeper-audit.sqlite3")
    now = time.time()
    for call_id, days_ago in (("recent", 3), ("old", 10)):
        record = ExecutionRecord(tool="release", runner="argv", call_id=call_id, time=now - days_ago * 86400,
                                 agent="a1", decision="allow", decision_source="yolo", status="ok")
        audit.decided(record)
        audit.completed(record)
    audit.close()
    token = "console-times-token-0123456789abcdef"

    def get(url: str) -> tuple[int, str]:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=20) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as refused:
            with refused:
                return refused.code, refused.read().decode()

    process = serve(tmp_path, env={"TOOLKEEPER_ADMIN_TOKEN": token})
    try:
        root = root_of(process) + "/toolkeeper/audit"
        listed = get(root + "?since=7d")
        exported = get(root + "/export?format=jsonl&since=7d")
        ranged = get(root + "/export?format=jsonl&since=2w&until=5d")
        mistyped = get(root + "/export?format=jsonl&since=7days")
    finally:
        process.stop()
    cli = audit_cli(tmp_path / "toolkeeper-audit.sqlite3", "export", "--format", "jsonl", "--since", "7d")
    ids = lambda text: [json.loads(line)["call_id"] for line in text.splitlines()]  # noqa: E731
    assert listed[0] == 200 and "<span id=total>1</span>" in listed[1]
    assert exported[0] == 200 and ids(exported[1]) == ids(cli.stdout) == ["recent"]
    assert ranged[0] == 200 and ids(ranged[1]) == ["old"]
    assert mistyped[0] == 400 and "7d" in mistyped[1]  # not read as "no filter": said
