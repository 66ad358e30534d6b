"""Claude Code (and Codex CLI) with `toolkeeper hook AGENT` as its PreToolUse/PostToolUse hook, offline.

Claude Code talks to the scripted model directly (its model traffic never passes through toolkeeper); a
`toolkeeper serve` with no declared tools runs beside it, and the hook, which Claude Code runs before and
after each of its own tool calls (declared with `--settings FILE`), asks it at POST /toolkeeper/hooks. The
rules govern Claude Code's own `Bash` (`source: agent`); each call lands in serve's trail, `api: hook`. A
command no rule decides gets no decision from the hook, so Claude Code's own permission check decides it
(issue 38: installing the hook never grants what Claude Code would have asked about).
`scripts/test` installs Claude Code in `.npm/`.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from conftest import audit_cli, call, free_port, start_toolkeeper, write_agent
from test_agents_mcp import TOOLKEEPER, text_of, tool_results
from test_claude_code import CLAUDE, claude, result

# serve with no declared tools: here it only answers the hooks
AGENT = """
    upstream: http://127.0.0.1:9/v1
    yolo: true
    tools: []
"""
REASON = "deleting files is not allowed"
RULES = rf"""
rules:
  - id: no-rm
    effect: deny
    reason: {REASON}
    when:
      tool: Bash
      source: agent
      arguments:
        command: {{runs: {{program: rm}}}}  # read as bash reads it (policy/shell.py), not searched as text
  - id: echo-is-fine
    effect: allow
    reason: echo only prints
    when:
      tool: Bash
      source: agent
      arguments:
        command: {{runs: {{program: echo}}}}  # every command of the line must be an echo
"""


@pytest.fixture(scope="module")
def serve(scripted, tmp_path_factory):
    """`toolkeeper serve agent.yaml --policy rules.yaml` on loopback (no `agents:` listed: no key needed): its
    process, and the directory holding its agent file and trail."""
    directory = tmp_path_factory.mktemp("serve")
    agent = write_agent(directory, AGENT)
    rules = directory / "rules.yaml"
    rules.write_text(RULES)
    process = start_toolkeeper(agent, scripted.base_url, "--policy", str(rules))
    yield process, directory
    process.stop()


@pytest.fixture
def claude_dirs(tmp_path):
    assert CLAUDE.exists(), "Claude Code is missing: bash scripts/test installs it (npm)"
    assert TOOLKEEPER.exists(), f"{TOOLKEEPER} is missing: the package is not installed in this venv"
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    return home, work


def hooked_claude(scripted, tmp_path: Path, home: Path, work: Path, url: str, prompt: str,
                  *args: str) -> subprocess.CompletedProcess:
    """`claude -p PROMPT --settings FILE ARGS...` at the scripted model, FILE setting `toolkeeper hook claude-code
    --url URL` for PreToolUse, PostToolUse and PostToolUseFailure, on every tool (the hook's --timeout 20 and Claude Code's 30 s bound each hook)."""
    command = shlex.join([str(TOOLKEEPER), "hook", "claude-code", "--url", url, "--timeout", "20"])
    hook = [{"matcher": "*", "hooks": [{"type": "command", "command": command, "timeout": 30}]}]
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"hooks": {"PreToolUse": hook, "PostToolUse": hook, "PostToolUseFailure": hook}}))
    # the prompt goes first, as in test_agents_mcp: --allowedTools takes several values
    return claude(scripted, home, work, prompt, "--settings", str(settings), *args)


def trail(directory: Path, call_id: str, awaiting: tuple[str, ...] = ("forwarded", "deferred")) -> dict:
    """serve's record of the call call_id, from `toolkeeper audit export --format jsonl` on its trail (next to
    the agent file). A moment is allowed for the post event's write to land while the record is `awaiting` one
    (a call Claude Code refused has none coming: give `awaiting=()`)."""
    path = directory / "toolkeeper-audit.sqlite3"
    deadline = time.monotonic() + 10
    while True:
        exported = audit_cli(path, "export", "--format", "jsonl")
        assert exported.returncode == 0, exported.stderr
        records = [json.loads(line) for line in exported.stdout.splitlines()]
        found = [r for r in records if r.get("call_id") == call_id]
        if (found and found[-1]["status"] not in awaiting) or time.monotonic() > deadline:
            assert found, f"no record of {call_id} in the trail: {records}"
            return found[-1]
        time.sleep(0.2)


def test_a_rule_denies_claude_codes_bash_through_its_hook(scripted, serve, tmp_path, claude_dirs):
    process, directory = serve
    home, work = claude_dirs
    victim = tmp_path / "keep.txt"
    victim.write_text("keep me\n")
    command = f"rm -f {victim}"
    scripted.script({"content": "Deleting it.",
                     "tool_calls": [call("Bash", {"command": command, "description": "Delete the file"},
                                         "toolu_hook_rm")]},
                    {"content": "I may not: {tool_result}"})
    # --allowedTools Bash: Claude Code itself would run it unasked, so only the hook's deny stops it
    run = hooked_claude(scripted, tmp_path, home, work, process.url[: -len("/v1")], "Delete keep.txt.",
                        "--allowedTools", "Bash")
    answer = result(run)
    assert victim.read_text() == "keep me\n"  # never ran
    assert answer["result"] == f"I may not: {REASON}", answer
    assert [d["tool_use_id"] for d in answer["permission_denials"]] == ["toolu_hook_rm"]  # as Claude Code saw it

    refused = tool_results(scripted.bodies()[-1])["toolu_hook_rm"]
    assert refused["is_error"] is True and REASON in text_of(refused)

    record = trail(directory, "toolu_hook_rm")
    assert (record["api"], record["source"], record["tool"], record["status"], record["decision"]) == (
        "hook", "agent", "Bash", "denied", "deny")
    assert record["decision_rule"] == "no-rm" and record["decision_reason"] == REASON
    assert record["arguments"]["command"] == command and record["agent"] == "hook"  # no key: the loopback agent


def test_an_allowed_bash_command_runs_and_its_post_event_completes_the_record(scripted, serve, tmp_path,
                                                                            claude_dirs):
    process, directory = serve
    home, work = claude_dirs
    made = work / "hooked.txt"
    command = f"echo hooked > {made} && echo done"
    scripted.script({"tool_calls": [call("Bash", {"command": command, "description": "Write a file"},
                                         "toolu_hook_echo")]},
                    {"content": "Ran: {tool_result}"})
    # no --allowedTools, the default permission mode: the allow rule's allow is what lets Bash run unasked
    run = hooked_claude(scripted, tmp_path, home, work, process.url[: -len("/v1")], "Write hooked.txt.")
    answer = result(run)
    assert made.read_text() == "hooked\n", answer
    assert answer["permission_denials"] == [] and answer["result"] == "Ran: done", answer

    returned = tool_results(scripted.bodies()[-1])["toolu_hook_echo"]
    assert "done" in text_of(returned) and not returned.get("is_error")

    record = trail(directory, "toolu_hook_echo")
    assert (record["api"], record["source"], record["tool"], record["status"], record["decision"]) == (
        "hook", "agent", "Bash", "ok", "allow")
    assert record["arguments"]["command"] == command and record["decision_rule"] == "echo-is-fine"
    assert record["kind"] == "completed"  # the PostToolUse event's write
    # Claude Code's tool_response, whole (it is short): its size and digest, and its text as the excerpt
    response = json.loads(record["answer"])
    assert (response["stdout"], response["stderr"], response["interrupted"]) == ("done", "", False)
    assert record["output_bytes"] == len(record["answer"].encode())
    assert record["output_sha256"] == hashlib.sha256(record["answer"].encode()).hexdigest()


def test_a_command_no_rule_decides_is_left_to_claude_codes_own_permission_check(scripted, serve, tmp_path,
                                                                              claude_dirs):
    process, directory = serve
    home, work = claude_dirs
    marker = work / "deferred.txt"
    command = f"touch {marker}"  # no rule names touch
    scripted.script({"tool_calls": [call("Bash", {"command": command, "description": "Make a file"},
                                         "toolu_hook_deferred")]},
                    {"content": "Result: {tool_result}"})
    # -p with no --allowedTools: Claude Code's own check refuses a Bash command nobody allowed, as it would
    # without the hook; toolkeeper's hook gave no decision, so it approved nothing
    run = hooked_claude(scripted, tmp_path, home, work, process.url[: -len("/v1")], "Make deferred.txt.")
    answer = result(run)
    assert not marker.exists(), answer  # never ran
    assert [d["tool_use_id"] for d in answer["permission_denials"]] == ["toolu_hook_deferred"]
    refused = tool_results(scripted.bodies()[-1])["toolu_hook_deferred"]
    said = text_of(refused)
    assert refused["is_error"] is True and "toolkeeper" not in said, said  # Claude Code's own refusal

    record = trail(directory, "toolu_hook_deferred", awaiting=())
    assert (record["api"], record["tool"], record["status"], record["decision_source"]) == (
        "hook", "Bash", "deferred", "default")
    assert record["decision_rule"] is None and record["arguments"]["command"] == command
    assert record["decision_reason"] == "no rule decided this call: the agent's own permission flow decides"


def test_with_hooks_undecided_allow_the_same_command_runs_unasked(scripted, tmp_path, claude_dirs):
    """The contrast: what made Claude Code refuse above is the hook's lack of a decision, not the command."""
    home, work = claude_dirs
    directory = tmp_path / "serve"
    directory.mkdir()
    agent = write_agent(directory, AGENT)
    (directory / "rules.yaml").write_text(RULES)
    process = start_toolkeeper(agent, scripted.base_url, "--policy", str(directory / "rules.yaml"),
                               "--hooks-undecided", "allow")
    marker = work / "deferred.txt"
    scripted.script({"tool_calls": [call("Bash", {"command": f"touch {marker}", "description": "Make a file"},
                                         "toolu_hook_undecided_allowed")]},
                    {"content": "Done."})
    try:
        answer = result(hooked_claude(scripted, tmp_path, home, work, process.url[: -len("/v1")],
                                      "Make deferred.txt."))
    finally:
        process.stop()
    assert marker.exists() and answer["permission_denials"] == [], answer
    assert trail(directory, "toolu_hook_undecided_allowed")["status"] == "ok"


def test_a_deferred_command_claude_codes_own_settings_allow_runs_and_completes_its_record(scripted, serve,
                                                                                         tmp_path, claude_dirs):
    process, directory = serve
    home, work = claude_dirs
    marker = work / "allowed-by-claude.txt"
    command = f"touch {marker} && ls {work}"
    scripted.script({"tool_calls": [call("Bash", {"command": command, "description": "Make a file"},
                                         "toolu_hook_deferred_ran")]},
                    {"content": "Ran: {tool_result}"})
    # Claude Code's own settings allow Bash: with no decision from the hook, that is what applies
    run = hooked_claude(scripted, tmp_path, home, work, process.url[: -len("/v1")], "Make the file.",
                        "--allowedTools", "Bash")
    answer = result(run)
    assert marker.exists() and answer["permission_denials"] == [], answer

    record = trail(directory, "toolu_hook_deferred_ran")
    assert (record["status"], record["kind"], record["decision_source"]) == ("ok", "completed", "default")
    assert "allowed-by-claude.txt" in json.loads(record["answer"])["stdout"]  # the PostToolUse event's output


def test_with_toolkeeper_stopped_the_hook_fails_closed(scripted, tmp_path, claude_dirs):
    home, work = claude_dirs
    made = work / "unreached.txt"
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    scripted.script({"tool_calls": [call("Bash", {"command": f"echo unreached > {made}",
                                                  "description": "Write a file"}, "toolu_hook_down")]},
                    {"content": "Blocked: {tool_result}"})
    started = time.monotonic()
    run = hooked_claude(scripted, tmp_path, home, work, url, "Write unreached.txt.", "--allowedTools", "Bash")
    answer = result(run)
    assert time.monotonic() - started < 20  # refused at once: the hook did not wait out its --timeout 20
    assert not made.exists()  # the hook denied it
    refused = tool_results(scripted.bodies()[-1])["toolu_hook_down"]
    said = text_of(refused)
    assert refused["is_error"] is True and f"toolkeeper could not be reached at {url}" in said, said
    assert "the hook fails closed" in said
    assert answer["result"] == f"Blocked: {said}"
    assert [d["tool_use_id"] for d in answer["permission_denials"]] == ["toolu_hook_down"]


def test_codex_runs_a_deferred_command_under_its_own_policy_and_not_a_denied_one(scripted, serve, tmp_path):
    """Codex CLI 0.169.0, real, with `toolkeeper hook codex` as its PreToolUse and PostToolUse hook: the hook's
    silence for a command no rule decides is no decision (Codex's own approval policy, here `never` with full
    access, lets it run), and its deny stops the other."""
    from test_codex import CODEX, codex, config

    assert CODEX.exists(), "Codex CLI is missing: bash scripts/test installs it"
    process, directory = serve
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".codex").mkdir(parents=True)
    work.mkdir()
    (home / ".codex" / "config.toml").write_text(config(scripted.base_url))  # its model traffic: not toolkeeper's
    command = shlex.join([str(TOOLKEEPER), "hook", "codex", "--url", process.url[: -len("/v1")], "--timeout", "20"])
    hook = [{"matcher": "*", "hooks": [{"type": "command", "command": command, "timeout": 30}]}]
    (home / ".codex" / "hooks.json").write_text(json.dumps({"hooks": {"PreToolUse": hook, "PostToolUse": hook}}))
    made, victim = work / "made-by-codex.txt", work / "keep.txt"
    victim.write_text("keep me\n")
    scripted.script({"tool_calls": [call("exec_command", {"cmd": f"touch {made}"}, "call_hook_deferred"),
                                    call("exec_command", {"cmd": f"rm -f {victim}"}, "call_hook_rm")]},
                    {"content": "Done."})
    run = codex(home, work, "--skip-git-repo-check", "--dangerously-bypass-hook-trust", "--json",
                "Make the file, delete the other.")
    assert run.returncode == 0, run.stdout + run.stderr
    assert made.exists(), run.stdout  # deferred: Codex's own policy let it run
    assert victim.read_text() == "keep me\n"  # denied by the rule through the hook
    deferred, denied = trail(directory, "call_hook_deferred"), trail(directory, "call_hook_rm")
    assert (deferred["tool"], deferred["status"], deferred["decision_source"]) == ("Bash", "ok", "default")
    assert (denied["status"], denied["decision_rule"]) == ("denied", "no-rm")
