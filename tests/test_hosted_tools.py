"""Tools the model server runs itself: decided on the offer, recorded as observed.

Web search, code interpreter and the other hosted tools of the Responses API, and Anthropic's server tools and
MCP connector, run inside one answer: no call of them can be stopped alone. The rules decide on the offer, so a
tool they deny never reaches the model server (recorded `withheld` with the rule), and each call an answer holds
is recorded `observed`, with its arguments and its output's size and digest.
"""

from __future__ import annotations

import json
import urllib.request

import anthropic
import openai
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


def toolkeeper_with_rules(scripted, directory, rules: str):
    """A toolkeeper on the standard agent with these rules, its trail in directory/audit.sqlite3."""
    write_agent(directory, STANDARD_AGENT)
    (directory / "rules.yaml").write_text(rules)
    process = start_toolkeeper(directory / "agent.yaml", scripted.base_url, "--policy", str(directory / "rules.yaml"),
                               "--audit", str(directory / "audit.sqlite3"), "--store", ":memory:")
    tk = Toolkeeper(process, directory)
    try:  # a test that fails inside `for tk in ...` closes the generator here: the process still stops
        yield tk
    finally:
        tk.close_clients()
        process.stop()


@pytest.fixture(scope="module")
def tkh(scripted, tmp_path_factory):
    yield from toolkeeper_with_rules(scripted, tmp_path_factory.mktemp("hosted"), RULES)


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


# -- Hosted MCP on the Responses API: every call asks first, and the rules answer ---------------

MCP_RULES = """
rules:
  - id: no-repo-deletes
    effect: deny
    reason: Repositories are not deleted by agents.
    when: {source: hosted, tool: "mcp__github__delete_*"}
"""


@pytest.fixture(scope="module")
def tkm(scripted, tmp_path_factory):
    yield from toolkeeper_with_rules(scripted, tmp_path_factory.mktemp("hosted-mcp"), MCP_RULES)


def approval_request(request_id: str, name: str, arguments: dict) -> dict:
    return {"type": "mcp_approval_request", "id": request_id, "server_label": "github", "name": name,
            "arguments": json.dumps(arguments)}


def mcp_agent(tk: Toolkeeper, prompt: str, *, require_approval: str = "never", on_approval=None) -> tuple[str, list]:
    """The Agents SDK with a HostedMCPTool, through toolkeeper: its final output and the items it saw."""
    import asyncio

    from agents import Agent, HostedMCPTool, Runner, set_default_openai_client, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    async def run() -> tuple[str, list]:
        async with AsyncOpenAI(base_url=tk.base_url, api_key="sk-mcp", max_retries=0) as client:
            set_default_openai_client(client, use_for_tracing=False)
            tool = HostedMCPTool(tool_config={"type": "mcp", "server_label": "github",
                                              "server_url": "https://mcp.example/github",
                                              "require_approval": require_approval},
                                 on_approval_request=on_approval)
            result = await Runner.run(Agent(name="ops", instructions="Help.", tools=[tool]), prompt)
            return result.final_output, [item.type for item in result.new_items]

    return asyncio.run(run())


def test_a_hosted_mcp_call_the_rules_deny_is_declined_and_never_reaches_the_agent(scripted, tkm):
    scripted.script({"items": [approval_request("mcpr_del", "delete_repo", {"repo": "core"})]},
                    {"content": "I may not delete it."})
    output, seen = mcp_agent(tkm, "Delete the core repository.")
    assert output == "I may not delete it." and "mcp_approval_request_item" not in seen
    first, second = scripted.bodies()
    assert first["tools"][0]["require_approval"] == "always"  # every call asks, so the rules decide
    answered = next(i for i in second["input"] if i.get("type") == "mcp_approval_response")
    assert (answered["approval_request_id"], answered["approve"]) == ("mcpr_del", False)
    assert "Repositories are not deleted" in answered["reason"]
    record = next(r for r in hosted_records(tkm) if r["call_id"] == "mcpr_del")
    assert (record["tool"], record["status"], record["decision_rule"]) == ("mcp__github__delete_repo", "denied",
                                                                          "no-repo-deletes")


def test_an_allowed_hosted_mcp_call_is_approved_by_toolkeeper_and_recorded_with_its_output(scripted, tkm):
    scripted.script({"items": [approval_request("mcpr_list", "list_repos", {"org": "acme"})]},
                    {"content": "There are two.", "items": [
                        {"type": "mcp_call", "id": "mcp_list", "server_label": "github", "name": "list_repos",
                         "arguments": json.dumps({"org": "acme"}), "output": "core, docs",
                         "approval_request_id": "mcpr_list"}]})
    output, _ = mcp_agent(tkm, "List the repositories.")
    assert output == "There are two."
    answered = next(i for i in scripted.bodies()[1]["input"] if i.get("type") == "mcp_approval_response")
    assert answered["approve"] is True
    found = {r["call_id"]: r for r in hosted_records(tkm)}
    assert found["mcpr_list"]["status"] == "ok"  # approved by the rules
    assert (found["mcp_list"]["status"], found["mcp_list"]["tool"]) == ("observed", "mcp__github__list_repos")
    assert found["mcp_list"]["output_bytes"] == len("core, docs")


def test_an_agent_that_approves_itself_still_sees_the_requests_the_rules_allow(scripted, tkm):
    asked: list[str] = []

    def approve(request):
        asked.append(request.data.name)
        return {"approve": True}

    scripted.script({"items": [approval_request("mcpr_read", "read_file", {"path": "README.md"})]},
                    {"content": "Read it.", "items": [
                        {"type": "mcp_call", "id": "mcp_read", "server_label": "github", "name": "read_file",
                         "arguments": json.dumps({"path": "README.md"}), "output": "# readme",
                         "approval_request_id": "mcpr_read"}]})
    output, _ = mcp_agent(tkm, "Read the README.", require_approval="always", on_approval=approve)
    assert output == "Read it." and asked == ["read_file"]
    assert next(r for r in hosted_records(tkm) if r["call_id"] == "mcpr_read")["status"] == "ok"  # its answer came


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_messages_block_of_a_call_toolkeeper_does_not_know_is_refused(scripted, tkh, stream):
    scripted.script({"content": "Teleporting.", "blocks": [
        {"type": "teleport_tool_use", "id": "tp_1", "name": "teleport", "input": {"to": "mars"}}]})
    asked = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "go"}]}
    with anthropic.Anthropic(base_url=tkh.base_url[:-3], api_key="sk-hosted", max_retries=0) as client, \
            pytest.raises(anthropic.APIError) as refused:
        if stream:
            with client.messages.stream(**asked) as events:
                for _ in events:
                    pass
        else:
            client.messages.create(**asked)
    assert "does not know" in str(refused.value)


def test_the_mcp_connectors_allowed_tools_lose_the_ones_the_rules_deny(scripted, tkm):
    """With its tools listed, a connector server keeps those the rules allow; one with none left is withheld."""
    scripted.script({"content": "Listed."})
    servers = [{"type": "url", "url": "https://mcp.example/github", "name": "github",
                "tool_configuration": {"allowed_tools": ["list_repos", "delete_repo", "delete_branch"]}},
               {"type": "url", "url": "https://mcp.example/gh2", "name": "github2",
                "tool_configuration": {"allowed_tools": ["read_file"]}}]
    with anthropic.Anthropic(base_url=tkm.base_url[:-3], api_key="sk-hosted", max_retries=0) as client:
        client.beta.messages.create(model="m", max_tokens=50, betas=["mcp-client-2025-04-04"],
                                    messages=[{"role": "user", "content": "list"}], mcp_servers=servers)
    sent = scripted.bodies()[0]["mcp_servers"]
    assert [(s["name"], s["tool_configuration"]["allowed_tools"]) for s in sent] == [
        ("github", ["list_repos"]), ("github2", ["read_file"])]
    withheld = {r["tool"] for r in hosted_records(tkm) if r["status"] == "withheld"}
    assert {"mcp__github__delete_repo", "mcp__github__delete_branch"} <= withheld


@pytest.mark.parametrize("kind", ["web_search_2025_08_26", "web_search_preview_2025_03_11"])
def test_a_dated_version_of_a_hosted_tool_is_the_same_tool_to_the_rules(scripted, tkh, kind):
    scripted.script({"content": "Nothing searched."})
    answer = tkh.client().responses.create(model="m", input="What is new today?", tools=[{"type": kind}])
    assert answer.output_text == "Nothing searched."
    assert [t["type"] for t in scripted.bodies()[0].get("tools", []) if t["type"] != "function"] == []
    withheld = [r for r in hosted_records(tkh) if r["status"] == "withheld"]
    assert (withheld[-1]["tool"], withheld[-1]["policy_input"]["tool"]["kind"], withheld[-1]["decision_rule"]) == (
        "web_search", kind, "no-web-search")


def test_a_tool_type_toolkeeper_does_not_know_is_the_model_servers_and_the_rules_decide_on_its_offer(scripted,
                                                                                                       tmp_path):
    rules = RULES + """
  - id: no-programs
    effect: deny
    reason: No programmatic tool calling here.
    when: {source: hosted, tool: programmatic_tool_calling}
"""
    for tk in toolkeeper_with_rules(scripted, tmp_path, rules):
        scripted.script({"content": "Done without it."}, {"content": "Done with it."})
        answer = tk.client().responses.create(model="m", input="Go.", tools=[{"type": "programmatic_tool_calling"}])
        assert answer.output_text == "Done without it."
        assert [t["type"] for t in scripted.bodies()[0].get("tools", []) if t["type"] != "function"] == []
        answer = tk.client().responses.create(model="m", input="Go.", tools=[{"type": "image_generation_2026_01_01"}])
        assert answer.output_text == "Done with it."  # no rule names it: offered, as the default for hosted tools
        assert [t["type"] for t in scripted.bodies()[-1]["tools"] if t["type"] != "function"] == [
            "image_generation_2026_01_01"]
        withheld = [r for r in hosted_records(tk) if r["status"] == "withheld"]
        assert [(r["tool"], r["decision_rule"]) for r in withheld] == [("programmatic_tool_calling", "no-programs")]


def test_a_chat_request_asking_for_web_search_is_refused_when_the_rules_deny_web_search(scripted, tkh):
    scripted.script({"content": "Searched."}, {"content": "Searched."})
    with pytest.raises(openai.PermissionDeniedError) as refused:
        tkh.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "News?"}],
                                             web_search_options={})
    assert "web_search_options" in str(refused.value) and scripted.requests() == []
    withheld = [r for r in hosted_records(tkh) if r["status"] == "withheld"]
    assert (withheld[-1]["tool"], withheld[-1]["decision_rule"], withheld[-1]["api"]) == ("web_search",
                                                                                        "no-web-search", "chat")


def test_audit_list_says_whose_tool_each_record_is(scripted, tkh):
    scripted.script({"content": "No search."})
    tkh.client().responses.create(model="m", input="News?", tools=[{"type": "web_search"}])
    listing = audit_cli(tkh.directory / "audit.sqlite3", "list", "--source", "hosted")
    assert listing.returncode == 0 and "web_search (hosted)" in listing.stdout and "(agent)" not in listing.stdout


def test_shadow_rules_are_tried_on_hosted_offers_and_on_the_calls_the_server_ran(scripted, tmp_path):
    rules = """
rules:
  - id: web-search-would-be-denied
    mode: shadow
    effect: deny
    reason: Searching the web is to be refused.
    when: {source: hosted, tool: web_search}
  - id: vault-code-would-be-denied
    mode: shadow
    effect: deny
    reason: Code may not read the vault.
    when: {source: hosted, tool: code_interpreter, arguments: {code: {matches: vault}}}
"""
    for tk in toolkeeper_with_rules(scripted, tmp_path, rules):
        scripted.script({"content": "Found it.", "items": [
            {"type": "code_interpreter_call", "id": "ci_vault", "code": "open('vault')", "container_id": "c",
             "outputs": []}]})
        tk.client().responses.create(model="m", input="Go.", tools=[
            {"type": "web_search"}, {"type": "code_interpreter", "container": {"type": "auto"}}])
        assert [t["type"] for t in scripted.bodies()[0]["tools"] if t["type"] != "function"] == [
            "web_search", "code_interpreter"]  # shadow rules decide nothing
        observed = next(r for r in hosted_records(tk) if r["call_id"] == "ci_vault")
        assert observed["shadow"] == [{"rule": "vault-code-would-be-denied", "effect": "deny"}]
        metrics = urllib.request.urlopen(tk.base_url[:-3] + "/metrics", timeout=10).read().decode()
        # the vault rule twice: on the offer (its arguments unknown, as an enforced rule would withhold the tool),
        # and on the call the server ran
        for rule, times in (("web-search-would-be-denied", 1), ("vault-code-would-be-denied", 2)):
            assert f'toolkeeper_shadow_matches_total{{effect="deny",rule="{rule}"}} {times}.0' in metrics
