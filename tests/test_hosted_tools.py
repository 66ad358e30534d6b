"""Tools the model server runs itself: decided on the offer, recorded as observed.

Web search, code interpreter and the other hosted tools of the Responses API, and Anthropic's server tools and
MCP connector, run inside one answer: no call of them can be stopped alone. The rules decide on the offer, so a
tool they deny never reaches the model server (recorded `withheld` with the rule), and each call an answer holds
is recorded `observed`, with its arguments and its output's size and digest.
"""

from __future__ import annotations

import json

import anthropic
import pytest
from conftest import STANDARD_AGENT, Toolkeeper, audit_cli, start_toolkeeper, write_agent

RULES = """
rules:
  - id: no-web-search
    effect: deny
    reason: This agent does not search the web.
    when: {source: hosted, tool: web_search}
  - id: no-code-on-secrets
    effect: deny
    reason: Code may not read the vault.
    when: {source: hosted, tool: code_execution, arguments: {code: {matches: vault}}}
  - id: github-mcp-asks
    effect: ask
    reason: A person watches the GitHub server.
    when: {source: hosted, tool: "mcp__github__*"}
"""


@pytest.fixture(scope="module")
def tkh(scripted, tmp_path_factory):
    directory = tmp_path_factory.mktemp("hosted")
    write_agent(directory, STANDARD_AGENT)
    (directory / "rules.yaml").write_text(RULES)
    process = start_toolkeeper(directory / "agent.yaml", scripted.base_url, "--policy", str(directory / "rules.yaml"),
                               "--audit", str(directory / "audit.sqlite3"), "--store", ":memory:")
    tk = Toolkeeper(process, directory)
    yield tk
    tk.close_clients()
    process.stop()


def hosted_records(tk: Toolkeeper) -> list[dict]:
    run = audit_cli(tk.directory / "audit.sqlite3", "export", "--source", "hosted")
    assert run.returncode == 0, run.stderr
    return [json.loads(line) for line in run.stdout.splitlines()]


def test_a_hosted_tool_the_rules_deny_is_withheld_from_the_request_and_recorded(scripted, tkh):
    scripted.script({"content": "Here is what I know."})
    tools = [{"type": "web_search"}, {"type": "code_interpreter", "container": {"type": "auto"}}]
    answer = tkh.client().responses.create(model="m", input="What is new today?", tools=tools)
    assert answer.output_text == "Here is what I know."
    sent = scripted.bodies()[0]["tools"]
    assert [t["type"] for t in sent if t["type"] != "function"] == ["code_interpreter"]  # no web search
    withheld = [r for r in hosted_records(tkh) if r["status"] == "withheld"]
    assert [(r["tool"], r["decision_rule"]) for r in withheld][-1:] == [("web_search", "no-web-search")]


def test_a_hosted_call_in_an_answer_is_recorded_observed(scripted, tkh):
    scripted.script({"content": "The sum is 4.", "items": [
        {"type": "code_interpreter_call", "id": "ci_1", "code": "print(2 + 2)", "container_id": "cntr_1",
         "outputs": [{"type": "logs", "logs": "4"}]}]})
    answer = tkh.client().responses.create(model="m", input="Add 2 and 2.",
                                           tools=[{"type": "code_interpreter", "container": {"type": "auto"}}])
    assert answer.output_text == "The sum is 4."
    observed = next(r for r in hosted_records(tkh) if r["call_id"] == "ci_1")
    assert (observed["tool"], observed["status"]) == ("code_interpreter", "observed")
    assert observed["policy_input"] is None  # observed, not decided: the server ran it within its answer
    assert observed["arguments_sent"]["code"] == "print(2 + 2)" and observed["output_bytes"] > 0


def test_a_rule_on_a_hosted_tools_arguments_withholds_it_whole(scripted, tkh):
    """Its arguments are not known before the server runs it: a deny that reads them holds for the offer."""
    scripted.script({"content": "Done."})
    with anthropic.Anthropic(base_url=tkh.base_url[:-3], api_key="sk-hosted", max_retries=0) as client:
        message = client.messages.create(model="m", max_tokens=50, messages=[{"role": "user", "content": "hi"}],
                                         tools=[{"type": "code_execution_20250825", "name": "code_execution"},
                                                {"name": "get_weather", "input_schema": {"type": "object"}}])
    assert message.content[0].text == "Done."
    sent = scripted.bodies()[0]["tools"]
    assert sent[0]["name"] == "get_weather" and not any(t.get("type", "").startswith("code_execution") for t in sent)
    assert any(r["tool"] == "code_execution" and r["decision_rule"] == "no-code-on-secrets"
               for r in hosted_records(tkh))


def test_anthropics_server_tool_calls_are_recorded_and_the_mcp_connector_governed(scripted, tkh):
    scripted.script({"content": "The weather is mild.", "blocks": [
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_fetch", "input": {"url": "https://example.com"}},
        {"type": "web_fetch_tool_result", "tool_use_id": "srvtoolu_1", "content": {"type": "web_fetch_result",
                                                                                   "url": "https://example.com"}}]})
    servers = [{"type": "url", "url": "https://mcp.example/github", "name": "github"},
               {"type": "url", "url": "https://mcp.example/docs", "name": "docs"}]
    with anthropic.Anthropic(base_url=tkh.base_url[:-3], api_key="sk-hosted", max_retries=0) as client:
        message = client.beta.messages.create(model="m", max_tokens=50, betas=["mcp-client-2025-04-04"],
                                              messages=[{"role": "user", "content": "weather?"}],
                                              tools=[{"type": "web_fetch_20250910", "name": "web_fetch"}],
                                              mcp_servers=servers)
    assert any(block.type == "text" for block in message.content)
    body = scripted.bodies()[0]
    assert [s["name"] for s in body["mcp_servers"]] == ["docs"]  # the asking one is withheld: nobody can answer
    found = hosted_records(tkh)
    observed = next(r for r in found if r["call_id"] == "srvtoolu_1")
    assert (observed["tool"], observed["status"]) == ("web_fetch", "observed")
    assert observed["arguments_sent"] == {"url": "https://example.com"} and observed["output_bytes"] > 0
    assert any(r["tool"] == "mcp__github__*" and r["status"] == "withheld" for r in found)
