"""The agent's own tool calls under the security team's rules, through each API and real clients.

A denied call never reaches the agent: the model is told why, in a round the agent does not see. An allowed
call goes to the agent as the model wrote it, recorded `forwarded`; the result the agent sends back on its
next request completes the record. An ask waits for `toolkeeper approve`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import urllib.request

import anthropic
import openai
import pytest
from conftest import (
    ROOT,
    STANDARD_AGENT,
    Toolkeeper,
    call,
    check_every_call_answered,
    start_toolkeeper,
    user,
    write_agent,
)
from test_approvals import TOKEN, cli, waiting

RULES = """
rules:
  - id: shell-no-rm-rf
    effect: deny
    reason: Recursive deletes are not allowed here.
    when:
      source: agent
      tool: [run_shell, Bash]
      arguments: {command: {matches: 'rm\\s+-rf'}}
  - id: codex-no-rm-rf
    effect: deny
    reason: Recursive deletes are not allowed here.
    when:
      source: agent
      tool: exec_command
      arguments: {cmd: {matches: 'rm\\s+-rf'}}
  - id: edits-outside-etc
    effect: deny
    reason: Files under /etc are not to be edited.
    when:
      source: agent
      tool: edit
      arguments: {input.path: {matches: '^/etc/'}}
  - id: deploys-ask
    effect: ask
    reason: A deploy needs a person's yes.
    when: {source: agent, tool: deploy}
"""

SHELL = {"type": "function", "function": {"name": "run_shell", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
EDIT = {"type": "function", "function": {"name": "edit", "description": "Edit a file.", "parameters": {
    "type": "object", "properties": {"input": {"type": "object"}}, "required": ["input"]}}}
DEPLOY = {"type": "function", "function": {"name": "deploy", "description": "Deploy.", "parameters": {
    "type": "object", "properties": {"env": {"type": "string"}}, "required": ["env"]}}}


@pytest.fixture(scope="module")
def governed_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("governed")
    write_agent(directory, STANDARD_AGENT, pids=str(directory / "pids"))
    (directory / "rules.yaml").write_text(RULES)
    return directory


@pytest.fixture(scope="module")
def tkg(scripted, governed_dir):
    process = start_toolkeeper(governed_dir / "agent.yaml", scripted.base_url, "--policy",
                               str(governed_dir / "rules.yaml"), "--audit", str(governed_dir / "audit.sqlite3"),
                               "--store", str(governed_dir / "store.sqlite3"), "--consent", "approvals",
                               "--keepalive", "0.2", env={"TOOLKEEPER_ADMIN_TOKEN": TOKEN})
    tk = Toolkeeper(process, governed_dir)
    yield tk
    tk.close_clients()
    process.stop()


def records(directory, *args: str) -> list[dict]:
    run = subprocess.run([sys.executable, "-m", "toolkeeper", "audit", "export", "--db",
                          str(directory / "audit.sqlite3"), "--source", "agent", *args],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    return [json.loads(line) for line in run.stdout.splitlines()]


def by_call(directory, call_id: str) -> dict:
    return next(r for r in records(directory) if r["call_id"] == call_id)


# -- Chat Completions ------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_denied_call_never_reaches_the_agent_and_the_model_learns_why(scripted, tkg, stream):
    scripted.script({"tool_calls": [call("run_shell", {"command": "rm -rf /srv"}, f"c_rm_{stream}")]},
                    {"content": "I may not: {tool_result}"})
    client = tkg.client()
    if stream:
        chunks = list(client.chat.completions.create(model="m", messages=user(), tools=[SHELL], stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)
    else:
        message = client.chat.completions.create(model="m", messages=user(), tools=[SHELL]).choices[0].message
        assert message.tool_calls is None
        text = message.content
    assert text.startswith("I may not: Not run: run_shell was not allowed (Recursive deletes are not allowed")
    told = scripted.bodies()[-1]["messages"]
    check_every_call_answered(told)
    record = by_call(tkg.directory, f"c_rm_{stream}")
    assert (record["source"], record["status"], record["decision_rule"]) == ("agent", "denied", "shell-no-rm-rf")
    assert record["arguments"] == {"command": "rm -rf /srv"} and record["argv"] is None


def test_an_allowed_and_a_denied_call_in_one_response(scripted, tkg):
    scripted.script({"content": "Both.", "tool_calls": [call("run_shell", {"command": "ls -l"}, "c_ls"),
                                                        call("run_shell", {"command": "rm -rf ~"}, "c_rm2")]},
                    {"content": "Listed."})
    client = tkg.client()
    asked = user()
    message = client.chat.completions.create(model="m", messages=asked, tools=[SHELL]).choices[0].message
    assert [c.id for c in message.tool_calls] == ["c_ls"]
    assert by_call(tkg.directory, "c_ls")["status"] == "forwarded"
    follow = [*asked, message.model_dump(exclude_none=True),
              {"role": "tool", "tool_call_id": "c_ls", "content": "total 0"}]
    final = client.chat.completions.create(model="m", messages=follow, tools=[SHELL]).choices[0].message
    assert final.content == "Listed."
    sent = scripted.bodies()[-1]["messages"]
    check_every_call_answered(sent)  # both calls answered: the denied one by toolkeeper, the other by the agent
    answers = {m["tool_call_id"]: m["content"] for m in sent if m["role"] == "tool"}
    assert answers["c_ls"] == "total 0" and answers["c_rm2"].startswith("Not run: run_shell was not allowed")
    done = by_call(tkg.directory, "c_ls")
    assert (done["status"], done["output_bytes"], done["decision"]) == ("ok", len("total 0"), "allow")


@pytest.mark.parametrize(("path", "reaches"), [("/etc/passwd", False), ("/tmp/notes.txt", True)])
def test_a_rule_on_a_nested_argument(scripted, tkg, path, reaches):
    call_id = "c_edit_" + str(reaches).lower()
    scripted.script({"tool_calls": [call("edit", {"input": {"path": path, "text": "x"}}, call_id)]},
                    *([] if reaches else [{"content": "{tool_result}"}]))
    message = tkg.client().chat.completions.create(model="m", messages=user(), tools=[EDIT]).choices[0].message
    assert bool(message.tool_calls) is reaches
    record = by_call(tkg.directory, call_id)
    assert record["status"] == ("forwarded" if reaches else "denied")
    if not reaches:
        assert "Files under /etc" in message.content and record["decision_rule"] == "edits-outside-etc"


def test_an_ask_waits_for_approve_then_the_call_goes_to_the_agent(scripted, tkg):
    scripted.script({"tool_calls": [call("deploy", {"env": "prod"}, "c_deploy")]})
    got = {}

    def ask() -> None:
        got["message"] = tkg.client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": "ship it"}], tools=[DEPLOY]).choices[0].message

    thread = threading.Thread(target=ask)
    thread.start()
    (approval,) = waiting(tkg)
    assert "deploy(env=prod)" in cli(tkg, "approvals").stdout
    assert cli(tkg, "approve", approval, "--as", "ada").returncode == 0
    thread.join(30)
    assert [c.id for c in got["message"].tool_calls] == ["c_deploy"]
    record = by_call(tkg.directory, "c_deploy")
    assert (record["status"], record["consent"], record["approver"]) == ("forwarded", "approved", "ada")


def test_five_turns_with_refusals_stay_valid_history(scripted, tkg):
    history = []
    client = tkg.client()
    for turn in range(5):
        scripted.script({"tool_calls": [call("run_shell", {"command": f"rm -rf /t{turn}"}, f"c_five_{turn}")]},
                        {"content": f"refused {turn}"})
        history += user()
        message = client.chat.completions.create(model="m", messages=history, tools=[SHELL]).choices[0].message
        assert message.content == f"refused {turn}"
        history.append(message.model_dump(exclude_none=True))
        check_every_call_answered(scripted.bodies()[0]["messages"])
    refusals = [m for m in scripted.bodies()[-1]["messages"] if m["role"] == "tool"]
    assert len(refusals) == 5  # each hidden refusal restored in place


# -- Responses -------------------------------------------------------------------------

SHELL_RESPONSES = {"type": "function", **SHELL["function"]}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_responses_passes_only_the_allowed_call(scripted, tkg, stream):
    scripted.script({"content": "Both.", "tool_calls": [call("run_shell", {"command": "rm -rf /"}, f"r_rm_{stream}"),
                                                        call("run_shell", {"command": "pwd"}, f"r_pwd_{stream}")]},
                    {"content": "done"})
    client = tkg.client()
    first = [{"role": "user", "content": user()[0]["content"]}]
    kwargs = {"model": "m", "input": first, "tools": [SHELL_RESPONSES], "store": False}
    if stream:
        with client.responses.stream(**kwargs) as events:
            seen = list(events)
            response = events.get_final_response()
        assert [e.sequence_number for e in seen] == list(range(len(seen)))
        added = [e.output_index for e in seen if e.type == "response.output_item.added"]
        assert added == list(range(len(added)))
    else:
        response = client.responses.create(**kwargs)
    calls = [item.call_id for item in response.output if item.type == "function_call"]
    assert calls == [f"r_pwd_{stream}"]
    follow = [*first, *[i.model_dump(exclude_none=True) for i in response.output],
              {"type": "function_call_output", "call_id": f"r_pwd_{stream}", "output": "/home"}]
    assert client.responses.create(**{**kwargs, "input": follow}).output_text == "done"
    sent = scripted.bodies()[-1]["input"]
    outputs = {i["call_id"]: i["output"] for i in sent if i.get("type") == "function_call_output"}
    assert outputs[f"r_pwd_{stream}"] == "/home" and outputs[f"r_rm_{stream}"].startswith("Not run")
    assert by_call(tkg.directory, f"r_pwd_{stream}")["status"] == "ok"
    assert by_call(tkg.directory, f"r_rm_{stream}")["api"] == "responses"
    # a function call is `kind: function` to the rules on every API (a built-in's is its item type)
    assert by_call(tkg.directory, f"r_rm_{stream}")["policy_input"]["tool"]["kind"] == "function"


# -- Messages --------------------------------------------------------------------------

BASH = {"name": "Bash", "description": "Run a command.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_messages_passes_only_the_allowed_call(scripted, tkg, stream):
    scripted.script({"thinking": "Clean up first.", "tool_calls": [
                        call("Bash", {"command": "rm -rf build"}, f"toolu_rm_{stream}")]},
                    {"content": "Listing instead.", "tool_calls": [call("Bash", {"command": "ls"}, f"toolu_ls_{stream}")]},
                    {"content": "done"})
    kwargs = {"model": "claude-test", "max_tokens": 256, "tools": [BASH],
              "messages": [{"role": "user", "content": user()[0]["content"]}]}
    with anthropic.Anthropic(base_url=tkg.base_url[: -len("/v1")], api_key="sk-ant-t", max_retries=0) as api:
        if stream:
            with api.messages.stream(**kwargs) as events:
                seen = list(events)
                message = events.get_final_message()
            starts = [e.index for e in seen if e.type == "content_block_start"]
            assert starts == list(range(len(starts)))
        else:
            message = api.messages.create(**kwargs)
        # the denied call and the thinking that led to it are gone; the allowed one is there
        assert [(b.type, getattr(b, "id", None)) for b in message.content] == [
            ("text", None), ("tool_use", f"toolu_ls_{stream}")]
        assert message.stop_reason == "tool_use"
        follow = [*kwargs["messages"], {"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                                         for b in message.content]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_ls_{stream}",
                                                "content": "a.txt"}]}]
        assert api.messages.create(**{**kwargs, "messages": follow}).content[0].text == "done"
    record = by_call(tkg.directory, f"toolu_ls_{stream}")
    assert (record["status"], record["api"], record["source"]) == ("ok", "messages", "agent")


# -- Real coding agents ----------------------------------------------------------------


@pytest.mark.parametrize("websockets", [False, True], ids=["http", "websockets"])
def test_codex_never_receives_a_denied_shell_command(scripted, tkg, tmp_path, websockets):
    from test_codex import CODEX, codex, config

    assert CODEX.exists(), "Codex CLI is missing: bash scripts/test installs it"
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".codex").mkdir(parents=True)
    work.mkdir()
    (home / ".codex" / "config.toml").write_text(config(tkg.base_url, websockets=websockets))
    victim = work / "keep"
    victim.mkdir()
    scripted.script({"tool_calls": [call("exec_command", {"cmd": f"rm -rf {victim}"}, "codex_rm")]},
                    {"content": "I was not allowed to delete it."})
    run = codex(home, work, "--skip-git-repo-check", "--json", "Delete the keep directory.")
    assert run.returncode == 0, run.stdout + run.stderr
    assert victim.exists()
    assert "rm -rf" not in run.stdout  # Codex never saw the call
    assert "I was not allowed to delete it." in run.stdout
    assert by_call(tkg.directory, "codex_rm")["decision_rule"] == "codex-no-rm-rf"


def test_claude_code_never_receives_a_denied_bash_command(scripted, tkg, tmp_path):
    from test_claude_code import CLAUDE, claude, result

    assert CLAUDE.exists(), "Claude Code is missing: bash scripts/test installs it"
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    victim = work / "keep"
    victim.mkdir()
    scripted.script({"tool_calls": [call("Bash", {"command": f"rm -rf {victim}"}, "toolu_cc_rm")]},
                    {"content": "I was not allowed to delete it."})
    answer = result(claude(tkg, home, work, "Delete the keep directory."))
    assert answer["result"] == "I was not allowed to delete it."
    assert victim.exists()
    assert by_call(tkg.directory, "toolu_cc_rm")["decision_rule"] == "shell-no-rm-rf"


def test_policy_test_and_explain_take_the_agents_own_calls(tmp_path, governed_dir):
    (tmp_path / "scenarios.yaml").write_text(f"""
agent_file: {ROOT / 'declared/example/agent.yaml'}
policy: {governed_dir / 'rules.yaml'}
scenarios:
  - name: Claude Code may not rm -rf
    call: {{tool: Bash, source: agent, arguments: {{command: "rm -rf /"}}}}
    expect: deny
    rule: shell-no-rm-rf
  - name: Claude Code may list
    call: {{tool: Bash, source: agent, arguments: {{command: "ls"}}}}
    expect: allow
""")
    run = subprocess.run([sys.executable, "-m", "toolkeeper", "policy", "test", str(tmp_path / "scenarios.yaml")],
                         capture_output=True, text=True, timeout=60, cwd=ROOT, env=os.environ)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout


def test_the_shipped_coding_agent_rules_pass_their_scenarios():
    run = subprocess.run([sys.executable, "-m", "toolkeeper", "policy", "test",
                          "policies/coding-agents_scenarios.yaml"], capture_output=True, text=True, timeout=60,
                         cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 failed" in run.stdout and "WARN" not in run.stdout


def test_the_agents_sdk_runner_never_runs_a_denied_function(scripted, tkg, monkeypatch):
    """The Agents SDK's default model (the Responses API): its run_shell function is never called for the
    denied command, and runs for the allowed one; the model got both results."""
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    from agents import Agent, Runner, function_tool, set_default_openai_client, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    ran: list[str] = []

    @function_tool
    def run_shell(command: str) -> str:
        """Run a shell command."""
        ran.append(command)
        return f"ran {command}"

    scripted.script({"tool_calls": [call("run_shell", {"command": "rm -rf /var"}, "sdk_rm"),
                                    call("run_shell", {"command": "uptime"}, "sdk_up")]},
                    {"content": "Uptime checked; the delete was refused."})

    async def run() -> str:
        client = AsyncOpenAI(base_url=tkg.base_url, api_key="sk-agents-governed", max_retries=0)
        set_default_openai_client(client, use_for_tracing=False)
        try:
            agent = Agent(name="ops", instructions="Answer briefly.", tools=[run_shell])
            return (await Runner.run(agent, "Check uptime and clean /var.")).final_output
        finally:
            await client.close()

    assert asyncio.run(run()) == "Uptime checked; the delete was refused."
    assert ran == ["uptime"]
    outputs = {i["call_id"]: i["output"] for i in scripted.bodies()[-1]["input"]
               if i.get("type") == "function_call_output"}
    assert outputs["sdk_rm"].startswith("Not run: run_shell was not allowed") and "uptime" in outputs["sdk_up"]
    assert by_call(tkg.directory, "sdk_up")["status"] == "ok"


def test_the_audit_page_and_list_show_the_source_beside_declared_calls(scripted, tkg):
    scripted.script({"tool_calls": [call("lookup", {"word": "fjord"}, "c_declared")]}, {"content": "ok"})
    tkg.client().chat.completions.create(model="m", messages=user())
    scripted.script({"tool_calls": [call("run_shell", {"command": "rm -rf /x"}, "c_page")]}, {"content": "no"})
    tkg.client().chat.completions.create(model="m", messages=user(), tools=[SHELL])
    root = tkg.base_url[: -len("/v1")]

    def page(query: str) -> str:
        request = urllib.request.Request(root + "/toolkeeper/audit" + query,
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.read().decode()

    everything, agents_only = page(""), page("?source=agent")
    assert "lookup" in everything and "run_shell <small>agent</small>" in everything
    assert "run_shell" in agents_only and "<td class=tool>lookup" not in agents_only
    listing = subprocess.run([sys.executable, "-m", "toolkeeper", "audit", "list", "--db",
                              str(tkg.directory / "audit.sqlite3")], capture_output=True, text=True, timeout=60,
                             cwd=ROOT).stdout
    assert "run_shell (agent)" in listing and " lookup " in listing and "forwarded" in listing


def test_a_forwarded_call_never_answered_is_closed_unanswered(scripted, governed_dir, tmp_path):
    import time

    audit = tmp_path / "audit.sqlite3"
    process = start_toolkeeper(governed_dir / "agent.yaml", scripted.base_url, "--audit", str(audit),
                               "--store", str(tmp_path / "store.sqlite3"), "--history-ttl", "1")
    tk = Toolkeeper(process, tmp_path)
    try:
        scripted.script({"tool_calls": [call("run_shell", {"command": "uptime"}, "c_left")]})
        message = tk.client().chat.completions.create(model="m", messages=user(), tools=[SHELL]).choices[0].message
        assert [c.id for c in message.tool_calls] == ["c_left"]
        time.sleep(1.5)  # the agent moves on without the result; its next request closes the record
        scripted.script({"content": "hello"})
        tk.client().chat.completions.create(model="m", messages=user())
    finally:
        tk.close_clients()
        process.stop()
    run = subprocess.run([sys.executable, "-m", "toolkeeper", "audit", "export", "--db", str(audit)],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    (record,) = [json.loads(line) for line in run.stdout.splitlines()]
    assert (record["call_id"], record["status"], record["source"]) == ("c_left", "unanswered", "agent")


def test_arguments_that_are_not_json_cannot_slip_past_a_deny_rule(scripted, tkg):
    scripted.script({"tool_calls": [call("run_shell", '{"command": "rm -rf /srv"', "c_broken")]},
                    {"content": "{tool_result}"})
    message = tkg.client().chat.completions.create(model="m", messages=user(), tools=[SHELL]).choices[0].message
    assert message.tool_calls is None and message.content.startswith("Not run: run_shell was not allowed")
    record = by_call(tkg.directory, "c_broken")
    assert (record["status"], record["decision_rule"]) == ("denied", "shell-no-rm-rf")
    assert record["arguments_sent"] == '{"command": "rm -rf /srv"'


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_refused_call_stays_hidden_when_a_later_round_reuses_its_id(scripted, tkg, stream):
    """Servers that number calls per response (call_0, call_1...) reuse ids across rounds."""
    scripted.script({"tool_calls": [call("run_shell", {"command": "rm -rf /srv"}, "call_0")]},
                    {"tool_calls": [call("run_shell", {"command": "ls /srv"}, "call_0")]})
    kwargs = {"model": "m", "input": user()[0]["content"], "tools": [SHELL_RESPONSES], "store": False}
    client = tkg.client()
    if stream:
        with client.responses.stream(**kwargs) as events:
            response = events.get_final_response()
    else:
        response = client.responses.create(**kwargs)
    calls = [json.loads(item.arguments) for item in response.output if item.type == "function_call"]
    assert calls == [{"command": "ls /srv"}]


def test_n_above_one_is_refused_when_the_agents_calls_are_governed(tkg):
    with pytest.raises(openai.BadRequestError) as refused:
        tkg.client().chat.completions.create(model="m", messages=user(), tools=[SHELL], n=2)
    assert refused.value.body["code"] == "n_not_supported"


def test_a_stream_whose_events_and_final_output_disagree_is_a_502(scripted, tkg):
    """The rules read the final output; the agent would get the streamed items: a call that differs between
    the two never reaches the agent."""
    scripted.script({"tool_calls": [call("run_shell", {"command": "ls"}, "c_two_faced")],
                     "streamed_arguments": {"command": "rm -rf /srv"}})
    with pytest.raises(openai.APIStatusError) as failed:
        list(tkg.client().responses.create(model="m", input=user()[0]["content"], tools=[SHELL_RESPONSES],
                                           store=False, stream=True))
    assert failed.value.status_code == 502 and "differ from the streamed ones" in failed.value.message


def test_a_forwarded_calls_secret_never_waits_in_the_store(scripted, tkg):
    scripted.script({"tool_calls": [call("run_shell", {"command": "deploy", "api_token": "tok-9f8e7d6c5b4a"},
                                         "c_secret")]})
    message = tkg.client().chat.completions.create(model="m", messages=user(), tools=[SHELL]).choices[0].message
    assert [c.id for c in message.tool_calls] == ["c_secret"]  # the agent gets its call as the model wrote it
    files = [path for path in tkg.directory.iterdir() if path.name.startswith(("store.sqlite3", "audit.sqlite3"))]
    assert len(files) >= 2  # the databases and their write-ahead logs, wherever the rows are
    for path in files:
        assert b"tok-9f8e7d6c5b4a" not in path.read_bytes(), path.name
    assert by_call(tkg.directory, "c_secret")["arguments"]["api_token"] == "[redacted]"


@pytest.mark.parametrize("arguments", ['{"command": "rm -rf ~", "command": "ls"}', '{"command": "ls", "Command": "rm -rf ~"}'],
                         ids=["twice", "other-case"])
def test_an_agents_call_whose_arguments_parsers_read_differently_is_denied(scripted, tkg, arguments):
    """The rules read the last copy of a key, in its case; a parser keeping the first (or a Go struct, matching any
    case) would run `rm -rf ~`: such a call never reaches the agent, and the model hears why."""
    call_id = "c_amb_" + str(len(arguments))
    scripted.script({"tool_calls": [call("run_shell", arguments, call_id)]}, {"content": "{tool_result}"})
    message = tkg.client().chat.completions.create(model="m", messages=user(), tools=[SHELL]).choices[0].message
    assert not message.tool_calls and "read as one" in message.content
    record = by_call(tkg.directory, call_id)
    assert (record["status"], record["decision_source"]) == ("denied", "toolkeeper")
