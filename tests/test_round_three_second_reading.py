"""Issue 39, what a second reader found in its fixes: a definition trusted once is checked against the pin again
(a person may approve another one meanwhile, here or in another process); a declared tool may not take a proxied
tool's name; a rule that denies a server's tools by a pattern holds on Anthropic's MCP connector. Each against a
real `serve` (the official MCP SDK's client, the scripted model for Messages) or the loader."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import anthropic
import pytest
from conftest import ROOT, Process, audit_cli, run_cli, user, write_agent
from test_hosted_tools import hosted_records, toolkeeper_with_rules

NOTES_SERVER = ROOT / "tests" / "mcp" / "notes_server.py"
NOTES_AGENT = """
    upstream: http://127.0.0.1:9/v1
    yolo: true
    mcp_servers:
      - name: notes
        command: ["{python}", "{notes}"]
        env: {NOTES_STATE: "{state}"}
        tier: silent
    tools: []
"""


def serve(directory: Path) -> Process:
    return Process([sys.executable, "-m", "toolkeeper", "serve", str(directory / "agent.yaml"), "--port", "0",
                    "--log-level", "INFO"], "toolkeeper listening on")


async def echo_over_http(process: Process) -> tuple[object, object]:
    """The `echo` tool as a client of `serve`'s /mcp lists it (None when withheld), and a call of it."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    url = process.url.removesuffix("/v1") + "/mcp"
    async with httpx2.AsyncClient(timeout=60) as http, \
            Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        return listed.get("mcp__notes__echo"), await client.call_tool("mcp__notes__echo", {"text": "hi"})


def trail(directory: Path) -> list[dict]:
    run = audit_cli(directory / "toolkeeper-audit.sqlite3", "export", "--format", "jsonl")
    assert run.returncode == 0, run.stderr
    return [json.loads(line) for line in run.stdout.splitlines()]


# -- D: a definition trusted before is checked against the pin again ----------------------------------------------

READ_ONLY = {"annotations": {"readOnlyHint": True}}
DESTRUCTIVE = {"annotations": {"readOnlyHint": False, "destructiveHint": True}}


def test_a_definition_served_before_is_a_change_once_another_is_approved(tmp_path):
    """A is pinned and served; the server changes to B (withheld), a person approves B, the server goes back to A:
    A is now a change from the pinned B, withheld and recorded until approved, in the process that saw B and in
    one that served A and never saw B (the store is shared: another worker or replica)."""
    state = tmp_path / "state"
    state.mkdir()
    write_agent(tmp_path, NOTES_AGENT, notes=str(NOTES_SERVER), state=str(state))
    env = {"TOOLKEEPER_AGENT_FILE": str(tmp_path / "agent.yaml")}
    definition = state / "echo.json"
    first, second = serve(tmp_path), serve(tmp_path)
    try:
        definition.write_text(json.dumps(READ_ONLY))
        for process in (first, second):  # first seen: pinned, served by both
            echo, result = asyncio.run(echo_over_http(process))
            assert echo is not None and not result.is_error
        definition.write_text(json.dumps(DESTRUCTIVE))
        echo, result = asyncio.run(echo_over_http(second))  # only the second sees B
        assert echo is None and result.is_error
        assert run_cli("mcp", "approve", "notes", "echo", "--as", "ada", env=env).returncode == 0
        definition.write_text(json.dumps(READ_ONLY))  # back to A before anyone lists B again
        for process in (first, second):
            echo, result = asyncio.run(echo_over_http(process))
            assert echo is None, process
            assert result.is_error and "changed since it was approved (annotations.destructiveHint, " \
                                      "annotations.readOnlyHint)" in "".join(b.text for b in result.content)
        assert (state / "calls.log").read_text().count("echo ") == 2  # the first two calls: none reached it since
        pins = run_cli("mcp", "pins", env=env).stdout
        assert "notes echo: CHANGED (annotations.destructiveHint, annotations.readOnlyHint)" in pins, pins
        withheld = [entry for entry in trail(tmp_path) if entry["tool"] == "mcp__notes__echo"
                    and entry["status"] == "withheld"]
        # B's change from A (by the process that saw it), then A's from the pinned B (by each process, once)
        assert len(withheld) == 3, withheld
        assert '+    "destructiveHint": true' in withheld[0]["answer"]
        assert all('-    "destructiveHint": true' in entry["answer"] and '+    "readOnlyHint": true' in entry["answer"]
                   for entry in withheld[1:]), withheld
        assert run_cli("mcp", "approve", "notes", "echo", "--as", "ada", env=env).returncode == 0
        for process in (first, second):
            echo, result = asyncio.run(echo_over_http(process))
            assert echo is not None and echo.annotations.read_only_hint is True and not result.is_error
    finally:
        first.stop()
        second.stop()


# -- E: a declared tool may not take a proxied tool's name -------------------------------------------------------

SHADOWING_TOOL = """
      - name: {name}
        description: Echo a text. Use it to repeat words. Returns the text.
        tier: silent
        parameters:
          text: {type: string, description: "The text to echo."}
        {runner}
"""


@pytest.mark.parametrize(("name", "runner"), [
    ("mcp__notes__echo", 'command: ["/bin/echo", "{{text}}"]'),  # a proxied tool's very name
    ("MCP__notes__echo", "mcp: {server: notes, tool: echo}"),  # in another case, run by that very tool
    ("mcp__elsewhere__x", 'command: ["/bin/echo", "{{text}}"]'),  # no such server today: one may come
])
def test_a_declared_tool_may_not_take_a_proxied_tools_name(tmp_path, name, runner):
    from toolkeeper.tools import AgentFileError, load_agent_file

    (tmp_path / "state").mkdir()
    write_agent(tmp_path, NOTES_AGENT.replace("tools: []", "tools:") + SHADOWING_TOOL.replace(
        "{name}", name).replace("{runner}", runner), notes=str(NOTES_SERVER), state=str(tmp_path / "state"))
    with pytest.raises(AgentFileError) as refused:
        load_agent_file(tmp_path / "agent.yaml")
    said = str(refused.value)
    assert said.startswith(f"{tmp_path / 'agent.yaml'}: tool {name!r}: key 'name': {name!r} is a reserved name")
    assert "names starting mcp__ are MCP servers' tools" in said, said
    started = run_cli("serve", str(tmp_path / "agent.yaml"), "--port", "0", timeout=60)
    assert started.returncode != 0 and f"tool {name!r}: key 'name'" in started.stderr, started.stderr


# -- 8 and F: a rule that covers a server's tools by a pattern holds on Anthropic's MCP connector -------------------

PATTERN_RULES = """
rules:
  - id: no-deletes
    effect: deny
    reason: Nothing is deleted.
    when: {source: hosted, tool: "mcp__github__delete_*"}
  - id: issues-may-be-listed
    effect: allow
    reason: Listing issues is fine.
    when: {source: hosted, tool: mcp__github__list_issues}
  - id: each-jira-tool-asks
    effect: ask
    reason: A person watches each Jira tool.
    when: {source: hosted, tool: "mcp__jira__*", kind: mcp_tool}  # its tools one by one, not the offer as one
  - id: drops-watched
    effect: deny
    reason: Only watched for now.
    mode: shadow
    when: {source: hosted, tool: "mcp__docs__drop_*"}
"""
PATTERN_SERVERS = [{"type": "url", "url": f"https://mcp.example/{name}", "name": name}
                   for name in ("github", "jira", "docs")]


@pytest.fixture(scope="module")
def tkp(scripted, tmp_path_factory):
    yield from toolkeeper_with_rules(scripted, tmp_path_factory.mktemp("patterns"), PATTERN_RULES)


def test_a_rule_covering_a_servers_tools_by_a_pattern_switches_its_unnamed_tools_off(scripted, tkp):
    """`mcp__github__delete_*` cannot be told to a toolset tool by tool before the server lists its tools: the
    server's tools no one names are switched off (`default_config`), the ones named and allowed switched on; the
    offer is recorded withheld and logged, with the rule and why. A shadow rule changes nothing."""
    scripted.script({"content": "ok"})
    with anthropic.Anthropic(base_url=tkp.base_url[:-3], api_key="sk-patterns", max_retries=0) as client:
        client.beta.messages.create(model="m", max_tokens=50, betas=["mcp-client-2025-11-20"], messages=user(),
                                    tools=[{"type": "mcp_toolset", "mcp_server_name": name}
                                           for name in ("github", "jira", "docs")], mcp_servers=PATTERN_SERVERS)
    github, jira, docs = (tool for tool in scripted.bodies()[0]["tools"] if tool.get("type") == "mcp_toolset")
    assert github == {"type": "mcp_toolset", "mcp_server_name": "github", "default_config": {"enabled": False},
                      "configs": {"list_issues": {"enabled": True}}}
    assert jira == {"type": "mcp_toolset", "mcp_server_name": "jira", "default_config": {"enabled": False}}
    assert docs == {"type": "mcp_toolset", "mcp_server_name": "docs"}
    withheld = {r["tool"]: r for r in hosted_records(tkp) if r["status"] == "withheld"}
    assert withheld["mcp__github__*"]["decision_rule"] == "no-deletes"
    assert "by the pattern mcp__github__delete_*" in withheld["mcp__github__*"]["decision_reason"]
    assert withheld["mcp__jira__*"]["decision_rule"] == "each-jira-tool-asks" and "mcp__docs__*" not in withheld
    log = tkp.process.stderr()
    assert "mcp__github__*: not offered, Nothing is deleted. (rule no-deletes covers some of the server's tools by " \
           "the pattern mcp__github__delete_*" in log, log


def test_the_older_connector_form_is_withheld_unless_its_allowed_tools_are_listed(scripted, tkp):
    """The `mcp-client-2025-04-04` form has no default to switch off: a server whose tools are not listed is
    withheld whole; one that lists them in `allowed_tools` keeps those the rules allow."""
    def withheld() -> list[tuple[str, str]]:
        return [(r["tool"], r["decision_rule"]) for r in hosted_records(tkp) if r["status"] == "withheld"]

    before = withheld()
    scripted.script({"content": "ok"}, {"content": "ok"})
    listed = {**PATTERN_SERVERS[0], "tool_configuration": {"allowed_tools": ["list_issues", "delete_repo"]}}
    with anthropic.Anthropic(base_url=tkp.base_url[:-3], api_key="sk-patterns", max_retries=0) as client:
        for servers in ([{**PATTERN_SERVERS[0], "tool_configuration": {"enabled": True}}, *PATTERN_SERVERS[1:]],
                        [listed]):
            client.beta.messages.create(model="m", max_tokens=50, betas=["mcp-client-2025-04-04"], messages=user(),
                                        mcp_servers=servers)
    unlisted, named = (body["mcp_servers"] for body in scripted.bodies())
    assert unlisted == [PATTERN_SERVERS[2]]  # docs: no rule in force covers any of its tools
    assert named == [{**listed, "tool_configuration": {"allowed_tools": ["list_issues"]}}]
    now = withheld()[len(before):]
    assert sorted(now) == [("mcp__github__*", "no-deletes"), ("mcp__github__delete_repo", "no-deletes"),
                           ("mcp__jira__*", "each-jira-tool-asks")], now
