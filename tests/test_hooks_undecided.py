"""A door never grants what its host would have asked (issue 38): the hooks door and the calls no rule decides.

Against a real `serve`, its real trail and the real `toolkeeper hook` command: a call no rule (YAML or OPA)
decides gets no decision, so the agent's own permission flow applies, and is recorded `deferred`; only a rule's
allow answers allow. `hooks_undecided` (defer, allow, ask) says what such a call is answered, and the start
line and `toolkeeper check --policy` say which it is. Claude Code itself deciding a deferred call is in
test_agents_hooks.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, Process, audit_cli, run_cli, start_toolkeeper, write_agent
from test_hook_formats import CLAUDE_POST, CLAUDE_PRE, CODEX_PRE, GEMINI_PRE

DEAD_UPSTREAM = "http://127.0.0.1:9/v1"  # the hooks door never asks a model
AGENT = """
    upstream: http://127.0.0.1:9/v1
    tools: []
"""
RULES = """
rules:
  - id: no-rm
    effect: deny
    reason: deleting files is not allowed
    when: {source: agent, tool: [Bash, run_shell_command], arguments: {command: {runs: {program: rm}}}}
  - id: echo-is-fine
    effect: allow
    reason: echo only prints
    when: {source: agent, tool: [Bash, run_shell_command], arguments: {command: {runs: {program: echo}}}}
"""
UNDECIDED = "ls -la"  # no rule names ls
DEFER_SAID = "hooks_undecided defer (a hook call no rule decides: no decision, the agent's own permission flow " \
             "applies)"


def served(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[Process, Path]:
    write_agent(tmp_path, AGENT)
    (tmp_path / "rules.yaml").write_text(RULES)
    process = start_toolkeeper(tmp_path / "agent.yaml", DEAD_UPSTREAM, "--policy", str(tmp_path / "rules.yaml"),
                               "--consent", "none", *args, env=env)
    return process, tmp_path / "toolkeeper-audit.sqlite3"


TOKEN = "admin-token-for-the-hooks-door-0123456789"


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    """serve with the default hooks_undecided (defer), and an admin token for its console."""
    process, trail = served(tmp_path_factory.mktemp("defer"), env={"TOOLKEEPER_ADMIN_TOKEN": TOKEN})
    yield process, process.url.removesuffix("/v1"), trail
    process.stop()


def event(agent: str, command: str, call_id: str | None = None) -> dict:
    """A pre event of `agent` running `command` in its shell; call_id for the agents that give one."""
    base = {"claude-code": CLAUDE_PRE, "codex": CODEX_PRE, "gemini-cli": GEMINI_PRE}[agent]
    made = {**base, "tool_input": {**base["tool_input"], "command": command}}
    if agent != "gemini-cli":
        made["tool_use_id"] = call_id or f"toolu_{time.monotonic_ns()}"
    return made


def post(base: str, agent: str, hook_event: dict) -> dict:
    """POST /toolkeeper/hooks, as `toolkeeper hook` sends it."""
    request = urllib.request.Request(base + "/toolkeeper/hooks", method="POST",
                                     data=json.dumps({"agent": agent, "event": hook_event}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def records(trail: Path, *args: str) -> dict[str, dict]:
    """The trail's records by call id, from `toolkeeper audit export`."""
    exported = audit_cli(trail, "export", *args)
    assert exported.returncode == 0, exported.stderr
    return {record["call_id"]: record for record in map(json.loads, exported.stdout.splitlines())}


def hook(agent: str, hook_event: dict, url: str) -> subprocess.CompletedProcess:
    """`toolkeeper hook AGENT --url URL` as the agent runs it: the event on stdin, none of the tester's TOOLKEEPER_*."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOOLKEEPER_")}
    return subprocess.run([sys.executable, "-m", "toolkeeper", "hook", agent, "--url", url], text=True,
                          input=json.dumps(hook_event), capture_output=True, timeout=60, env=clean)


def test_the_endpoint_defers_what_no_rule_decides_and_relays_a_rules_allow_and_deny(serve):
    _, base, trail = serve
    undecided = post(base, "claude-code", event("claude-code", UNDECIDED, "toolu_undecided"))
    allowed = post(base, "claude-code", event("claude-code", "echo hi", "toolu_allowed"))
    denied = post(base, "claude-code", event("claude-code", "rm -f notes.txt", "toolu_denied"))
    assert undecided == {"decision": "defer",
                         "reason": "no rule decided this call: the agent's own permission flow decides"}
    assert allowed == {"decision": "allow", "reason": "echo only prints"}
    assert denied == {"decision": "deny", "reason": "deleting files is not allowed"}

    found = records(trail)
    said = {call_id: (found[call_id]["status"], found[call_id]["decision"], found[call_id]["decision_source"],
                      found[call_id]["decision_rule"]) for call_id in ("toolu_undecided", "toolu_allowed",
                                                                       "toolu_denied")}
    assert said == {"toolu_undecided": ("deferred", "allow", "default", None),  # the policy's verdict, kept
                    "toolu_allowed": ("forwarded", "allow", "rules", "echo-is-fine"),
                    "toolu_denied": ("denied", "deny", "rules", "no-rm")}
    assert found["toolu_undecided"]["decision_reason"] == undecided["reason"]
    assert found["toolu_undecided"]["consent"] == "deferred" and found["toolu_allowed"]["consent"] is None
    listed = audit_cli(trail, "list", "--status", "deferred")
    assert listed.returncode == 0, listed.stderr
    assert found["toolu_undecided"]["record_id"] in listed.stdout and " deferred " in listed.stdout
    assert found["toolu_allowed"]["record_id"] not in listed.stdout


def test_the_consoles_trail_filters_on_deferred(serve):
    _, base, trail = serve
    post(base, "claude-code", event("claude-code", "date", "toolu_console_deferred"))
    record_id = records(trail)["toolu_console_deferred"]["record_id"]

    def page(query: str) -> str:
        request = urllib.request.Request(f"{base}/toolkeeper/audit?{query}",
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.read().decode()

    listed = page("status=deferred")  # a status the filter takes (an unknown one is a 400)
    assert record_id in listed and "<td class='deferred status'>deferred</td>" in listed
    assert "class='forwarded status'" not in listed and record_id not in page("status=forwarded")


def test_the_post_event_completes_a_deferred_record_with_the_output(serve):
    _, base, trail = serve
    pre = event("claude-code", UNDECIDED, "toolu_deferred_ran")
    assert post(base, "claude-code", pre)["decision"] == "defer"
    # the agent's own permission flow let it run: its PostToolUse comes
    done = post(base, "claude-code", {**CLAUDE_POST, "tool_use_id": "toolu_deferred_ran",
                                      "tool_input": pre["tool_input"]})
    assert done == {"decision": "allow", "reason": "recorded"}
    record = records(trail)["toolu_deferred_ran"]
    assert (record["status"], record["kind"], record["decision_source"]) == ("ok", "completed", "default")
    assert record["consent"] == "deferred"  # it ran, and the trail still says the agent's own flow decided
    assert json.loads(record["answer"])["stdout"] == "hello-from-bash" and record["output_bytes"] > 0
    events = [json.loads(line) for line in audit_cli(trail, "export").stdout.splitlines()]
    assert [e["status"] for e in events if e["call_id"] == "toolu_deferred_ran"] == ["ok"]  # one merged record
    shown = audit_cli(trail, "show", record["record_id"])
    assert '"status": "ok"' in shown.stdout


@pytest.mark.parametrize("agent", ["claude-code", "codex", "gemini-cli"])
def test_the_hook_command_says_nothing_for_a_deferred_call(serve, agent):
    _, base, _ = serve
    deferred = hook(agent, event(agent, UNDECIDED), base)
    assert (deferred.returncode, deferred.stdout, deferred.stderr) == (0, "", "")  # no decision: the agent's own
    allowed = hook(agent, event(agent, "echo hi"), base)
    denied = hook(agent, event(agent, "rm -rf build"), base)
    assert allowed.returncode == denied.returncode == 0
    if agent == "claude-code":
        assert json.loads(allowed.stdout)["hookSpecificOutput"]["permissionDecision"] == "allow"
    elif agent == "codex":
        assert allowed.stdout == ""  # Codex takes no allow from a hook: its approval policy still applies
    else:
        assert json.loads(allowed.stdout) == {"decision": "allow"}
    denial = json.loads(denied.stdout)
    if agent == "gemini-cli":
        assert denial == {"decision": "deny", "reason": "deleting files is not allowed"}
    else:
        assert denial["hookSpecificOutput"]["permissionDecision"] == "deny"
        assert denial["hookSpecificOutput"]["permissionDecisionReason"] == "deleting files is not allowed"


def test_the_start_line_and_check_say_what_an_undecided_hook_call_gets(serve, tmp_path):
    process, _, _ = serve
    assert DEFER_SAID in process.first_line, process.first_line
    write_agent(tmp_path, AGENT)
    (tmp_path / "rules.yaml").write_text(RULES)
    checked = run_cli("check", str(tmp_path / "agent.yaml"), "--policy", str(tmp_path / "rules.yaml"),
                      env={"TOOLKEEPER_HOOKS_UNDECIDED": ""})
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"{tmp_path / 'rules.yaml'}: {DEFER_SAID}\n" in checked.stdout
    (tmp_path / "serve.yaml").write_text("hooks:\n  undecided: ask\n")
    grouped = run_cli("check", str(tmp_path / "agent.yaml"), "--policy", str(tmp_path / "rules.yaml"),
                      "--config", str(tmp_path / "serve.yaml"), "--format", "json")
    assert json.loads(grouped.stdout)["hooks_undecided"] == "ask"
    variable = run_cli("check", str(tmp_path / "agent.yaml"), "--policy", str(tmp_path / "rules.yaml"),
                       env={"TOOLKEEPER_HOOKS_UNDECIDED": "allow"})
    assert "hooks_undecided allow (a hook call no rule decides: allowed, skipping the agent's own permission " \
           "prompt)" in variable.stdout
    assert "hooks_undecided" not in run_cli("check", str(tmp_path / "agent.yaml")).stdout  # no rules, no hooks


def test_hooks_undecided_allow_answers_allow_as_before(tmp_path):
    process, trail = served(tmp_path, "--hooks-undecided", "allow")
    try:
        assert "hooks_undecided allow (" in process.first_line
        base = process.url.removesuffix("/v1")
        answer = post(base, "claude-code", event("claude-code", UNDECIDED, "toolu_allow_setting"))
        assert answer == {"decision": "allow", "reason": "no rule matched this call of the agent's own tool"}
        assert post(base, "claude-code", event("claude-code", "rm x", "toolu_still_denied"))["decision"] == "deny"
    finally:
        process.stop()
    found = records(trail)
    assert found["toolu_allow_setting"]["status"] == "forwarded"
    assert found["toolu_still_denied"]["status"] == "denied"


def test_hooks_undecided_ask_hands_claude_code_the_question_and_denies_the_agents_that_cannot_ask(tmp_path):
    (tmp_path / "serve.yaml").write_text("hooks:\n  undecided: ask\n")
    # --consent none (served): toolkeeper has no one to ask, so Claude Code's own prompt asks its user
    process, trail = served(tmp_path, "--config", str(tmp_path / "serve.yaml"))
    try:
        assert "hooks_undecided ask (a hook call no rule decides: a person is asked)" in process.first_line
        base = process.url.removesuffix("/v1")
        claude = post(base, "claude-code", event("claude-code", UNDECIDED, "toolu_ask_claude"))
        codex = post(base, "codex", event("codex", UNDECIDED, "call_ask_codex"))
        allowed = post(base, "codex", event("codex", "echo hi", "call_allowed_codex"))
    finally:
        process.stop()
    assert claude["decision"] == "ask" and "hooks_undecided is ask" in claude["reason"]
    assert codex["decision"] == "deny"  # Codex's hook cannot ask, and toolkeeper has no one to
    assert allowed["decision"] == "allow"  # a rule's allow is an allow whatever the setting
    found = records(trail)
    assert (found["toolu_ask_claude"]["status"], found["toolu_ask_claude"]["consent"]) == ("forwarded", "delegated")
    assert found["call_ask_codex"]["status"] == "denied"


def test_a_value_hooks_undecided_does_not_take_is_refused(tmp_path):
    write_agent(tmp_path, AGENT)
    started = run_cli("serve", str(tmp_path / "agent.yaml"), "--port", "0", "--hooks-undecided", "grant")
    assert started.returncode == 2 and "invalid choice: 'grant'" in started.stderr
    (tmp_path / "serve.yaml").write_text("hooks:\n  undecided: grant\n")
    configured = run_cli("serve", str(tmp_path / "agent.yaml"), "--port", "0", "--config",
                         str(tmp_path / "serve.yaml"))
    assert configured.returncode == 2 and "hooks_undecided: 'grant' is not one of defer, allow, ask" in \
        configured.stderr


REGO = """
package toolkeeper

import rego.v1

# what Rego must end with, or every call it leaves undefined is denied: the catch-all names no rule
default decision := {"effect": "allow", "rule": null, "reason": "no rule matched"}

decision := {"effect": "allow", "rule": "rego-echo", "reason": "echo only prints"} if {
    startswith(input.arguments.command, "echo ")
}

decision := {"effect": "deny", "rule": "rego-no-rm", "reason": "no rm"} if {
    startswith(input.arguments.command, "rm ")
}
"""


def test_an_opa_allow_that_names_its_rule_allows_and_its_catch_all_defers(tmp_path):
    policies = tmp_path / "rego"
    policies.mkdir()
    (policies / "hooks.rego").write_text(REGO)
    opa = Process([sys.executable, str(ROOT / "tests" / "opa_server.py"), "--policies", str(policies)],
                  "listening on")
    write_agent(tmp_path, AGENT)
    process = start_toolkeeper(tmp_path / "agent.yaml", DEAD_UPSTREAM, "--opa-url", opa.url, "--policy", "none")
    try:
        base = process.url.removesuffix("/v1")
        undecided = post(base, "claude-code", event("claude-code", UNDECIDED, "toolu_opa_undecided"))
        allowed = post(base, "claude-code", event("claude-code", "echo hi", "toolu_opa_allowed"))
        denied = post(base, "claude-code", event("claude-code", "rm x", "toolu_opa_denied"))
    finally:
        process.stop()
        opa.stop()
    assert (undecided["decision"], allowed["decision"], denied["decision"]) == ("defer", "allow", "deny")
    assert allowed["reason"] == "echo only prints" and denied["reason"] == "no rm"
    found = records(tmp_path / "toolkeeper-audit.sqlite3")
    assert [(found[c]["status"], found[c]["decision_source"], found[c]["decision_rule"]) for c in
            ("toolu_opa_undecided", "toolu_opa_allowed")] == [("deferred", "opa", None),
                                                              ("forwarded", "opa", "rego-echo")]
