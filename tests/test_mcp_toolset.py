"""Anthropic's MCP connector in its current form (issue 39, item 8): `mcp_toolset` tools naming `mcp_servers`
entries, beta `mcp-client-2025-11-20`. Governed as the older form is: a tool the rules deny is switched off in its
toolset's `configs`, the server's other tools stay usable; where the rules deny a server's tools by default, its
`default_config` is switched off and the tools they allow are switched on; the `mcp_tool_use` blocks of an answer
are recorded `observed`. The scripted model server checks the toolsets as Anthropic's does.
"""

from __future__ import annotations

import anthropic
import pytest
from conftest import user
from test_hosted_tools import hosted_records, toolkeeper_with_rules

BETA = "mcp-client-2025-11-20"
RULES = """
rules:
  - id: no-issue-deletes
    effect: deny
    reason: Issues are closed, never deleted.
    when: {source: hosted, tool: mcp__github__delete_issue}
  - id: billing-is-closed
    effect: deny
    reason: The billing server is closed to agents, but for the tools a rule allows.
    when: {source: hosted, tool: "mcp__billing__*", kind: mcp_server}  # its tools as a whole: the default
  - id: invoices-may-be-read
    effect: allow
    reason: Reading invoices is fine.
    when: {source: hosted, tool: mcp__billing__read_invoice}
"""
SERVERS = [{"type": "url", "url": "https://mcp.example/github", "name": "github"},
           {"type": "url", "url": "https://mcp.example/billing", "name": "billing"}]


@pytest.fixture(scope="module")
def tkt(scripted, tmp_path_factory):
    yield from toolkeeper_with_rules(scripted, tmp_path_factory.mktemp("toolsets"), RULES)


def ask(tk, tools: list[dict], servers: list[dict] = SERVERS):
    with anthropic.Anthropic(base_url=tk.base_url[:-3], api_key="sk-toolsets", max_retries=0) as client:
        return client.beta.messages.create(model="m", max_tokens=50, betas=[BETA], messages=user(), tools=tools,
                                           mcp_servers=servers)


def toolsets(body: dict) -> list[dict]:
    """The toolsets the model server received (the declared tools travel beside them)."""
    return [tool for tool in body["tools"] if tool.get("type") == "mcp_toolset"]


def test_a_toolset_is_governed_tool_by_tool_and_its_calls_recorded(scripted, tkt):
    scripted.script({"content": "Issue 7 is listed.", "blocks": [
        {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "list_issues", "server_name": "github",
         "input": {"repo": "core"}},
        {"type": "mcp_tool_result", "tool_use_id": "mcptoolu_1", "is_error": False,
         "content": [{"type": "text", "text": "#7 flaky test"}]}]})
    message = ask(tkt, [
        {"type": "mcp_toolset", "mcp_server_name": "github", "configs": {"list_issues": {"defer_loading": True}}},
        {"type": "mcp_toolset", "mcp_server_name": "billing"}])
    assert message.content[0].type == "text"  # answered, not refused
    body = scripted.bodies()[0]
    github, billing = toolsets(body)
    # the denied tool switched off, the others as the agent set them: the server stays usable
    assert github == {"type": "mcp_toolset", "mcp_server_name": "github", "configs": {
        "list_issues": {"defer_loading": True}, "delete_issue": {"enabled": False}}}
    # denied by default: everything off but the one tool a rule allows
    assert billing == {"type": "mcp_toolset", "mcp_server_name": "billing", "default_config": {"enabled": False},
                       "configs": {"read_invoice": {"enabled": True}}}
    assert body["mcp_servers"] == SERVERS  # each still named by its toolset, as the API requires
    records = hosted_records(tkt)
    observed = next(r for r in records if r["call_id"] == "mcptoolu_1")
    assert (observed["tool"], observed["status"], observed["arguments_sent"]) == (
        "mcp__github__list_issues", "observed", {"repo": "core"})
    assert observed["output_bytes"] > 0
    withheld = {(r["tool"], r["decision_rule"]) for r in records if r["status"] == "withheld"}
    assert {("mcp__github__delete_issue", "no-issue-deletes"), ("mcp__billing__*", "billing-is-closed")} <= withheld


def test_a_tool_the_agent_switched_off_stays_off_and_one_it_switched_on_is_still_ruled(scripted, tkt):
    scripted.script({"content": "Nothing to do."})
    ask(tkt, [{"type": "mcp_toolset", "mcp_server_name": "github", "default_config": {"enabled": False},
               "configs": {"delete_issue": {"enabled": True}, "list_issues": {"enabled": True}}},
              {"type": "mcp_toolset", "mcp_server_name": "billing", "default_config": {"enabled": False}}])
    github, billing = toolsets(scripted.bodies()[0])
    assert github["default_config"] == {"enabled": False}
    assert github["configs"] == {"delete_issue": {"enabled": False}, "list_issues": {"enabled": True}}
    assert billing == {"type": "mcp_toolset", "mcp_server_name": "billing", "default_config": {"enabled": False}}


def test_the_scripted_server_refuses_a_toolset_as_anthropics_does(scripted):
    """What toolkeeper must never send: checked straight against the scripted server."""
    refused = []
    with anthropic.Anthropic(base_url=scripted.base_url[:-3], api_key="sk-direct", max_retries=0) as client:
        for tools, servers, betas in (
                ([{"type": "mcp_toolset", "mcp_server_name": "github"}], SERVERS[:1], []),  # no beta
                ([{"type": "mcp_toolset", "mcp_server_name": "nowhere"}], SERVERS[:1], [BETA]),
                ([{"type": "mcp_toolset", "mcp_server_name": "github"}], SERVERS, [BETA]),  # billing unnamed
                ([{"type": "mcp_toolset", "mcp_server_name": "github", "configs": {"x": {"enabled": "no"}}}],
                 SERVERS[:1], [BETA])):
            with pytest.raises(anthropic.BadRequestError) as error:
                client.beta.messages.create(model="m", max_tokens=5, betas=betas, messages=user(), tools=tools,
                                            mcp_servers=servers)
            refused.append(error.value.message)
    assert "requires the beta header mcp-client-2025-11-20" in refused[0]
    assert "does not name a server" in refused[1] and "exactly one mcp_toolset" in refused[2]
