"""toolkeeper as an MCP server, driven by the official MCP Python SDK's client over stdio (`toolkeeper mcp`) and
Streamable HTTP (`/mcp` on serve): list, call, an invalid call, a denied call, an ask released by `toolkeeper
approve`, each recorded in the trail."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from conftest import GATED, LOOKUP, RELEASE, YOLO, Process, audit_cli, free_port, recording_tool, run_cli, write_agent

TOKEN = "approver-token-for-the-mcp-tests-0123456789"
AGENT_KEY = "mcp-agent-key-0123456789"
RULES = """
rules:
  - id: no-nightly
    effect: deny
    reason: nightly builds are never released
    when: {tool: release, arguments: {version: {matches: nightly}}}
"""
AGENTS = """
    agents:
      - name: desk
        key_sha256: "{key}"
"""


@pytest.fixture(scope="module")
def directory(tmp_path_factory) -> Path:
    import hashlib

    directory = tmp_path_factory.mktemp("mcp")
    silent_lookup = LOOKUP.replace("description: Look a word up.", "description: Look a word up.\n        tier: silent")
    write_agent(directory, AGENTS + GATED + silent_lookup + RELEASE, key=hashlib.sha256(AGENT_KEY.encode()).hexdigest())
    (directory / "rules.yaml").write_text(RULES)
    return directory


def toolkeeper_env(port: int) -> dict[str, str]:
    return {"TOOLKEEPER_ADMIN_TOKEN": TOKEN, "TOOLKEEPER_PORT": str(port), "TOOLKEEPER_CONSENT": "approvals"}


@asynccontextmanager
async def over_stdio(directory: Path, port: int):
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-m", "toolkeeper", "mcp", str(directory / "agent.yaml"),
                                                                  "--policy", str(directory / "rules.yaml")],
                                   env={**toolkeeper_env(port), "PATH": "/usr/bin:/bin"}, cwd=directory)
    async with Client(params, client_info=_client_info()) as client:
        yield client


@asynccontextmanager
async def over_http(url: str, key: str = AGENT_KEY):
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    root = url.removesuffix("/v1")
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as http, \
            Client(streamable_http_client(root + "/mcp", http_client=http), client_info=_client_info()) as client:
        yield client


def _client_info():
    from mcp_types import Implementation

    return Implementation(name="mcp-tests", version="1")


def text_of(result) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


async def waiting_approval(port: int, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = await asyncio.to_thread(run_cli, "approvals", "--url", f"http://127.0.0.1:{port}",
                                      env={"TOOLKEEPER_ADMIN_TOKEN": TOKEN})
        ids = [line.split()[0] for line in run.stdout.splitlines() if line.startswith("ap_")]
        if ids:
            return ids[0]
        await asyncio.sleep(0.3)
    raise AssertionError("no call came to wait for approval")


async def exercise(client, port: int, directory: Path) -> None:
    """The same checks through either transport."""
    listed = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(listed) == {"lookup", "release"}
    schema = json.loads(run_cli("schema", str(directory / "agent.yaml"), "--api", "mcp").stdout)
    assert [tool.model_dump(by_alias=True, exclude_none=True, include={"name", "description", "input_schema"})
            for tool in listed.values()] == schema  # as `toolkeeper schema --api mcp` prints them

    result = await client.call_tool("lookup", {"word": "otter"})
    assert not result.is_error and "otter" in text_of(result)

    result = await client.call_tool("lookup", {"wrd": "otter"})  # invalid: answered quoting it
    assert result.is_error and 'You sent: lookup({"wrd":"otter"})' in text_of(result)

    result = await client.call_tool("release", {"version": "nightly-7"})  # denied by the rule, with its reason
    assert result.is_error and "nightly builds are never released" in text_of(result)

    asking = asyncio.create_task(client.call_tool("release", {"version": "2.0.0"}))  # gated: asks
    approval = await waiting_approval(port)
    run = await asyncio.to_thread(run_cli, "approve", approval, "--as", "ada", "--url", f"http://127.0.0.1:{port}",
                                  env={"TOOLKEEPER_ADMIN_TOKEN": TOKEN})
    assert run.returncode == 0, run.stderr
    result = await asyncio.wait_for(asking, 30)
    assert not result.is_error, text_of(result)


def recorded(directory: Path) -> dict[tuple[str, str], dict]:
    run = audit_cli(directory / "toolkeeper-audit.sqlite3", "export", "--format", "jsonl")
    assert run.returncode == 0, run.stderr
    entries = [json.loads(line) for line in run.stdout.splitlines()]
    return {(entry["tool"], entry["status"]): entry for entry in entries if entry["api"] == "mcp"}


def check_trail(directory: Path) -> None:
    entries = recorded(directory)
    assert {("lookup", "ok"), ("lookup", "invalid"), ("release", "denied"), ("release", "ok")} <= set(entries)
    assert all(entry["source"] == "declared" for entry in entries.values())
    assert entries[("release", "denied")]["decision_rule"] == "no-nightly"
    assert entries[("release", "ok")]["approver"] == "ada"
    assert entries[("lookup", "ok")]["agent"] in ("mcp-tests", "desk")


def test_over_stdio(directory):
    port = free_port()

    async def run() -> None:
        async with over_stdio(directory, port) as client:
            await exercise(client, port, directory)

    asyncio.run(run())
    check_trail(directory)


def test_over_streamable_http(directory, tmp_path):
    port = free_port()
    process = Process([sys.executable, "-m", "toolkeeper", "serve", str(directory / "agent.yaml"), "--policy",
                       str(directory / "rules.yaml"), "--log-level", "WARNING"], "toolkeeper listening on",
                      env=toolkeeper_env(port))
    try:
        async def run() -> None:
            async with over_http(process.url) as client:
                await exercise(client, port, directory)
        asyncio.run(run())
    finally:
        process.stop()
    check_trail(directory)
    assert recorded(directory)[("lookup", "ok")]["agent"] == "desk"  # the agent key's name


def test_http_needs_a_known_key_and_refuses_web_pages(directory):
    import urllib.error
    import urllib.request

    port = free_port()
    process = Process([sys.executable, "-m", "toolkeeper", "serve", str(directory / "agent.yaml"), "--log-level",
                       "WARNING"], "toolkeeper listening on", env=toolkeeper_env(port))
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
    try:
        for headers, status in (({"Authorization": "Bearer not-a-key"}, 401),
                                ({"Authorization": f"Bearer {AGENT_KEY}", "Origin": "http://evil.example"}, 403)):
            request = urllib.request.Request(process.url.removesuffix("/v1") + "/mcp", data=body, method="POST", headers={
                "Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10)
            assert refused.value.code == status
            refused.value.close()
    finally:
        process.stop()


def test_elicitation_asks_the_clients_user_when_no_channel_can(directory, tmp_path):
    """No approvals channel (no admin token): a client that declares elicitation is asked, and its answer holds."""
    from mcp import Client, StdioServerParameters
    from mcp_types import ElicitResult

    asked: list[str] = []

    async def answer(context, params) -> ElicitResult:
        asked.append(params.message)
        approve = "2.1.0" in params.message
        return ElicitResult(action="accept", content={"approve": approve})

    async def run() -> tuple:
        params = StdioServerParameters(command=sys.executable, args=[
            "-m", "toolkeeper", "mcp", str(directory / "agent.yaml"), "--policy", str(directory / "rules.yaml")],
            env={"PATH": "/usr/bin:/bin"}, cwd=directory)
        # the 2025 handshake: its connection carries the server's requests to the client
        async with Client(params, client_info=_client_info(), elicitation_callback=answer, mode="legacy") as client:
            return (await client.call_tool("release", {"version": "2.1.0"}),
                    await client.call_tool("release", {"version": "2.2.0"}))

    approved, refused = asyncio.run(run())
    assert not approved.is_error, text_of(approved)
    assert refused.is_error and "not allowed" in text_of(refused)
    assert len(asked) == 2 and "release(version=2.1.0)" in asked[0]
    entries = [entry for entry in json.loads("[" + ",".join(audit_cli(
        directory / "toolkeeper-audit.sqlite3", "export", "--format", "jsonl").stdout.splitlines()) + "]")
        if entry["tool"] == "release" and (entry["arguments"] or {}).get("version") in ("2.1.0", "2.2.0")]
    assert {(entry["status"], entry["approver"]) for entry in entries} == {
        ("ok", "mcp-tests (MCP elicitation)"), ("denied", "mcp-tests (MCP elicitation)")}


DISCOVERABLE = recording_tool("export_table", "table", "Write a table to a file.", "The table name.") + """
        visibility: discoverable
        keywords: [csv, spreadsheet]
"""


async def search_then_call(client) -> None:
    """A discoverable tool: not listed until a search finds it, then listed and called on the client's next
    requests (each of which the SDK serves with a session of its own)."""
    assert {tool.name for tool in (await client.list_tools()).tools} == {"lookup", "search_tools"}
    found = await client.call_tool("search_tools", {"query": "export a csv spreadsheet"})
    assert not found.is_error and "export_table" in text_of(found), text_of(found)
    assert {tool.name for tool in (await client.list_tools()).tools} == {"lookup", "search_tools", "export_table"}
    result = await client.call_tool("export_table", {"table": "orders"})
    assert not result.is_error and "orders" in text_of(result), text_of(result)


def test_a_tool_a_search_found_is_listed_and_called_over_either_transport(tmp_path):
    import hashlib

    from mcp import Client, StdioServerParameters

    write_agent(tmp_path, AGENTS + YOLO + LOOKUP + DISCOVERABLE, key=hashlib.sha256(AGENT_KEY.encode()).hexdigest())
    port = free_port()

    async def over_stdio_then_http() -> None:
        params = StdioServerParameters(command=sys.executable, args=["-m", "toolkeeper", "mcp",
                                                                      str(tmp_path / "agent.yaml")],
                                       env={**toolkeeper_env(port), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
        async with Client(params, client_info=_client_info()) as client:
            await search_then_call(client)
        process = Process([sys.executable, "-m", "toolkeeper", "serve", str(tmp_path / "agent.yaml"), "--log-level",
                           "WARNING"], "toolkeeper listening on", env=toolkeeper_env(port))
        try:
            async with over_http(process.url) as client:
                await search_then_call(client)
        finally:
            process.stop()

    asyncio.run(over_stdio_then_http())


INTRUDER_KEY = "mcp-intruder-key-9876543210"


def test_a_session_answers_only_to_the_key_that_opened_it(tmp_path):
    """Agent B, with a valid key of its own, holds agent A's `Mcp-Session-Id`: its GET (the stream elicitations
    travel on), its POST (a call, said to be A's) and its DELETE are each answered 404, as for a session that does
    not exist, and logged without a key; A's session goes on as if nothing happened."""
    import hashlib

    import httpx2

    two_agents = AGENTS + """
      - name: intruder
        key_sha256: "{intruder}"
"""
    write_agent(tmp_path, two_agents + YOLO + LOOKUP, key=hashlib.sha256(AGENT_KEY.encode()).hexdigest(),
                intruder=hashlib.sha256(INTRUDER_KEY.encode()).hexdigest())
    process = Process([sys.executable, "-m", "toolkeeper", "serve", str(tmp_path / "agent.yaml"), "--log-level",
                       "WARNING"], "toolkeeper listening on", env=toolkeeper_env(free_port()))
    mcp_url = process.url.removesuffix("/v1") + "/mcp"
    session_ids: list[str] = []

    async def note_session(response) -> None:
        if "mcp-session-id" in response.headers:
            session_ids.append(response.headers["mcp-session-id"])

    async def intrude(session_id: str) -> list[int]:
        headers = {"Authorization": f"Bearer {INTRUDER_KEY}", "Mcp-Session-Id": session_id,
                   "Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "lookup", "arguments": {"word": "stolen"}}}
        async with httpx2.AsyncClient(headers=headers, timeout=10) as http:
            async with http.stream("GET", mcp_url, headers={"Accept": "text/event-stream"}) as stream:
                statuses = [stream.status_code]
            statuses.append((await http.post(mcp_url, json=call)).status_code)
            statuses.append((await http.delete(mcp_url)).status_code)
        return statuses

    async def run() -> list[int]:
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {AGENT_KEY}"}, timeout=30,
                                      event_hooks={"response": [note_session]}) as http, \
                Client(streamable_http_client(mcp_url, http_client=http), client_info=_client_info(),
                       mode="legacy") as client:  # the 2025 handshake: the protocol with sessions
            assert not (await client.call_tool("lookup", {"word": "first"})).is_error
            statuses = await intrude(session_ids[0])
            result = await client.call_tool("lookup", {"word": "after"})  # A's session is still A's
            assert not result.is_error, text_of(result)
            return statuses

    try:
        statuses = asyncio.run(run())
    finally:
        log = process.stop()
    assert statuses == [404, 404, 404]
    called = (tmp_path / "calls.jsonl").read_text()
    assert "first" in called and "after" in called and "stolen" not in called
    refusals = [line for line in log.splitlines() if "agent 'intruder' sent" in line]
    assert len(refusals) == 3, log
    assert all("a session that agent 'desk' opened" in line and "refused" in line for line in refusals), refusals
    assert AGENT_KEY not in log and INTRUDER_KEY not in log and session_ids[0] not in log
