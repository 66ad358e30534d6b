"""The command corpus (issue 38) through the hooks door: a real `serve`, each command sent to POST
/toolkeeper/hooks as Claude Code's PreToolUse event for its Bash tool, and through Codex's for its shell.

Every evasion family is denied there as by `runs:` itself; the near misses are not denied, and with no rule
deciding them the hook answers no decision (the agent's own permission flow applies), never allow.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
from conftest import start_toolkeeper, write_agent
from test_command_rules import EVASIONS, FAMILY_CASES, NEAR_MISSES, UNRESOLVABLE

AGENT = """
    upstream: http://127.0.0.1:9/v1
    yolo: true
    tools: []
"""
RULES = """
rules:
  - id: no-rm-rf
    effect: deny
    reason: recursive forced deletion is not allowed
    when:
      source: agent
      tool: [Bash, shell_command]
      arguments:
        command: {runs: {program: rm, flags: [r, f]}}
"""


@pytest.fixture(scope="module")
def hooks_url(scripted, tmp_path_factory):
    directory = tmp_path_factory.mktemp("hook-corpus")
    agent = write_agent(directory, AGENT)
    (directory / "rules.yaml").write_text(RULES)
    process = start_toolkeeper(agent, scripted.base_url, "--policy", str(directory / "rules.yaml"))
    yield process.url.removesuffix("/v1") + "/toolkeeper/hooks"
    process.stop()


def decide(url: str, agent: str, tool: str, command: str, number: int) -> dict:
    event = {"session_id": "corpus", "hook_event_name": "PreToolUse", "tool_name": tool,
             "tool_input": {"command": command}, "tool_use_id": f"toolu_{number}", "cwd": "/tmp/project"}
    body = json.dumps({"agent": agent, "event": event}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


@pytest.mark.parametrize(("agent", "tool"), [("claude-code", "Bash"), ("codex", "shell_command")])
def test_every_evasion_is_denied_through_the_hook(hooks_url, agent, tool):
    commands = [command for _, command in FAMILY_CASES] + EVASIONS + UNRESOLVABLE
    wrong = []
    for number, command in enumerate(commands):
        answer = decide(hooks_url, agent, tool, command, number)
        if answer["decision"] != "deny":
            wrong.append((command, answer))
    assert wrong == [], f"{len(wrong)} of {len(commands)} not denied, the first: {wrong[:5]}"
    assert len(commands) > 400


def test_the_near_misses_are_not_denied_and_not_granted_through_the_hook(hooks_url):
    wrong = []
    for number, entry in enumerate(NEAR_MISSES):
        answer = decide(hooks_url, "claude-code", "Bash", entry["command"], 10_000 + number)
        if answer["decision"] in ("deny", "allow"):
            wrong.append((entry["command"], answer))
    assert wrong == [], wrong
