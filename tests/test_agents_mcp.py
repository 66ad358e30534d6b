"""Claude Code and Codex CLI with `toolkeeper mcp AGENT_FILE` as one of their MCP servers, offline.

Each agent talks to the scripted model directly (no `toolkeeper serve` in between) and starts
`toolkeeper mcp` itself, from its own MCP settings: Claude Code from `--mcp-config`, Codex from
`[mcp_servers.toolkeeper]` in its config.toml. The declared tool runs through toolkeeper's rules and
lands in the trail next to the agent file, `api: mcp`. `scripts/test` installs both agents in `.npm/`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import LOOKUP, YOLO, audit_cli, call, write_agent
from test_claude_code import CLAUDE, claude, result
from test_codex import CODEX, codex, config

# The console script a user puts in an agent's MCP settings: `toolkeeper`, from the venv the tests run in.
TOOLKEEPER = Path(sys.executable).parent / "toolkeeper"
AGENT = YOLO + LOOKUP
RULES = """
rules:
  - id: no-secret-words
    effect: deny
    reason: Secret words are never looked up.
    when:
      tool: lookup
      arguments:
        word: {equals: classified}
"""
REASON = "Secret words are never looked up."


def governed_agent(tmp_path: Path) -> tuple[Path, Path]:
    """The agent file (its one tool, `lookup`, records its argv in calls.jsonl) and the rules beside it."""
    assert TOOLKEEPER.exists(), f"{TOOLKEEPER} is missing: the package is not installed in this venv"
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    return write_agent(tmp_path, AGENT), rules


def ran(tmp_path: Path) -> list[list[str]]:
    """The argv of every call of the declared tool, as the tool itself recorded it."""
    path = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def trail(tmp_path: Path) -> list[dict]:
    """The records of the trail `toolkeeper mcp` keeps by default: toolkeeper-audit.sqlite3 beside the agent file."""
    path = tmp_path / "toolkeeper-audit.sqlite3"
    assert path.exists(), f"no trail next to the agent file: {sorted(p.name for p in tmp_path.iterdir())}"
    exported = audit_cli(path, "export")
    assert exported.returncode == 0, exported.stderr
    return [json.loads(line) for line in exported.stdout.splitlines()]


def mcp_logs(home: Path) -> str:
    """What Claude Code logged of its MCP server (its stderr included), for a failure's message."""
    return "\n".join(log.read_text() for log in sorted(home.glob(".cache/claude-cli-nodejs/*/mcp-logs-*/*")))


# -- Claude Code: --mcp-config ----------------------------------------------------------------------------------


def claude_with_toolkeeper(scripted, tmp_path: Path, prompt: str):
    """`claude -p PROMPT --mcp-config FILE --strict-mcp-config --allowedTools mcp__toolkeeper__lookup`, at the
    scripted model's Messages API: its answer, and its home (where it logs its MCP servers)."""
    assert CLAUDE.exists(), "Claude Code is missing: bash scripts/test installs it (npm)"
    agent, rules = governed_agent(tmp_path)
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    settings = tmp_path / "mcp.json"
    settings.write_text(json.dumps({"mcpServers": {"toolkeeper": {
        "command": str(TOOLKEEPER), "args": ["mcp", str(agent), "--policy", str(rules)]}}}))
    # --mcp-config takes several files: the prompt goes before it. The scripted model stands where toolkeeper
    # serve stands in test_claude_code: claude() reads only its base_url.
    run = claude(scripted, home, work, prompt, "--mcp-config", str(settings), "--strict-mcp-config",
                 "--allowedTools", "mcp__toolkeeper__lookup")
    assert run.returncode == 0, run.stdout + run.stderr + mcp_logs(home)
    return result(run), home


def tool_results(body: dict) -> dict[str, dict]:
    """The tool_result blocks of a Messages request's last message, by tool_use_id."""
    last = body["messages"][-1]["content"]
    return {b["tool_use_id"]: b for b in last if isinstance(b, dict) and b.get("type") == "tool_result"}


def text_of(block: dict) -> str:
    content = block["content"]
    return content if isinstance(content, str) else "".join(part.get("text", "") for part in content)


def test_claude_code_runs_a_declared_tool_through_toolkeeper_mcp(scripted, tmp_path):
    scripted.script({"content": "Let me look it up.",
                     "tool_calls": [call("mcp__toolkeeper__lookup", {"word": "fjord"}, "toolu_mcp_fjord")]},
                    {"content": "Looked up: {tool_result}"})
    answer, home = claude_with_toolkeeper(scripted, tmp_path, "What is a fjord?")
    assert answer["result"] == 'Looked up: ran ["lookup", "fjord"]\n' and not answer["is_error"], mcp_logs(home)
    assert answer["permission_denials"] == []  # --allowedTools: it ran without asking anyone
    assert ran(tmp_path) == [["lookup", "fjord"]]

    first, last = scripted.bodies()[0], scripted.bodies()[-1]
    offered = {t["name"]: t for t in first["tools"]}
    assert offered["mcp__toolkeeper__lookup"]["description"].startswith("Look a word up.")  # the agent file's
    assert offered["mcp__toolkeeper__lookup"]["input_schema"]["properties"]["word"]["type"] == "string"
    assert "Read" in offered  # beside Claude Code's own tools
    returned = tool_results(last)["toolu_mcp_fjord"]
    assert text_of(returned) == 'ran ["lookup", "fjord"]\n' and not returned.get("is_error")

    [record] = [r for r in trail(tmp_path) if r["tool"] == "lookup"]
    assert (record["api"], record["source"], record["status"], record["decision"]) == ("mcp", "declared", "ok",
                                                                                       "allow")
    assert record["arguments"] == {"word": "fjord"} and record["agent"] == "claude-code"  # its clientInfo name
    assert record["argv"][-2:] == ["lookup", "fjord"] and record["exit_code"] == 0
    assert record["answer"] == 'ran ["lookup", "fjord"]\n'


def test_claude_code_gets_a_rules_denial_as_a_tool_error(scripted, tmp_path):
    scripted.script({"tool_calls": [call("mcp__toolkeeper__lookup", {"word": "classified"}, "toolu_mcp_secret")]},
                    {"content": "I may not: {tool_result}"})
    answer, home = claude_with_toolkeeper(scripted, tmp_path, "What does classified mean?")
    assert answer["result"].startswith("I may not: Not run: lookup was not allowed"), mcp_logs(home)
    assert ran(tmp_path) == []  # the tool never ran

    refused = tool_results(scripted.bodies()[-1])["toolu_mcp_secret"]
    assert refused["is_error"] is True and REASON in text_of(refused)

    [record] = [r for r in trail(tmp_path) if r["tool"] == "lookup"]
    assert (record["api"], record["source"], record["status"], record["decision"]) == ("mcp", "declared", "denied",
                                                                                       "deny")
    assert record["decision_rule"] == "no-secret-words" and record["decision_reason"] == REASON
    assert record["exit_code"] is None and record["arguments"] == {"word": "classified"}


# -- Codex CLI: [mcp_servers] -----------------------------------------------------------------------------------

# Codex starts its MCP servers beside the first model request and waits only about a second for them: without
# `required = true` a `toolkeeper mcp` still starting (a Python process, ~1 s) is left out of the first turn.
CODEX_MCP = """
[mcp_servers.toolkeeper]
command = {command}
args = {args}
required = true
"""


def codex_output(body: dict, call_id: str) -> str:
    """The text of the function_call_output answering call_id in a Responses request."""
    [output] = [i for i in body["input"] if i.get("type") == "function_call_output" and i["call_id"] == call_id]
    value = output["output"]
    return value if isinstance(value, str) else "\n".join(part.get("text", "") for part in value)


def test_codex_runs_a_declared_tool_through_toolkeeper_mcp_and_gets_a_denial_as_its_output(scripted, tmp_path):
    assert CODEX.exists(), "Codex CLI is missing: bash scripts/test installs it (npm install @openai/codex)"
    agent, rules = governed_agent(tmp_path)
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".codex").mkdir(parents=True)
    work.mkdir()
    server = CODEX_MCP.format(command=json.dumps(str(TOOLKEEPER)),
                              args=json.dumps(["mcp", str(agent), "--policy", str(rules)]))
    (home / ".codex" / "config.toml").write_text(config(scripted.base_url) + server)
    # Codex defers MCP tools behind its client-side `tool_search` (gpt-5.5): the model searches, Codex answers
    # with a namespace `mcp__toolkeeper` holding `lookup`, and the model calls that namespace's function.
    lookup = {"type": "function_call", "namespace": "mcp__toolkeeper", "name": "lookup"}
    scripted.script(
        {"items": [{"type": "tool_search_call", "call_id": "ts_words", "execution": "client",
                    "arguments": {"query": "look a word up"}}]},
        {"items": [{**lookup, "call_id": "call_fjord", "arguments": json.dumps({"word": "fjord"})},
                   {**lookup, "call_id": "call_secret", "arguments": json.dumps({"word": "classified"})}]},
        {"content": "A fjord is a long, narrow sea inlet."})
    run = codex(home, work, "--skip-git-repo-check", "--json", "What is a fjord?")
    assert run.returncode == 0, run.stdout + run.stderr
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    done = [e["item"] for e in events if e.get("type") == "item.completed"]
    assert done[-1] == {"id": done[-1]["id"], "type": "agent_message", "text": "A fjord is a long, narrow sea inlet."}
    calls = {json.dumps(i["arguments"]): i for i in done if i["type"] == "mcp_tool_call"}
    assert {(i["server"], i["tool"], i["status"]) for i in calls.values()} == {
        ("toolkeeper", "lookup", "completed"), ("toolkeeper", "lookup", "failed")}, run.stdout + run.stderr
    assert ran(tmp_path) == [["lookup", "fjord"]]  # the denied call never ran

    bodies = scripted.bodies()
    assert len(bodies) == 3
    assert any(t["type"] == "tool_search" for t in bodies[0]["tools"])
    assert not any("lookup" in json.dumps(t) for t in bodies[0]["tools"])  # deferred: only found by searching
    [found] = [i for i in bodies[1]["input"] if i.get("type") == "tool_search_output"]
    [namespace] = found["tools"]
    assert (namespace["type"], namespace["name"]) == ("namespace", "mcp__toolkeeper")
    assert [(t["name"], t["description"].startswith("Look a word up.")) for t in namespace["tools"]] == [
        ("lookup", True)]
    assert 'ran ["lookup", "fjord"]' in codex_output(bodies[2], "call_fjord")
    assert f"Not run: lookup was not allowed ({REASON})" in codex_output(bodies[2], "call_secret")

    records = {r["arguments"]["word"]: r for r in trail(tmp_path) if r["tool"] == "lookup"}
    assert set(records) == {"fjord", "classified"}
    assert {(r["api"], r["source"]) for r in records.values()} == {("mcp", "declared")}
    assert (records["fjord"]["status"], records["fjord"]["answer"]) == ("ok", 'ran ["lookup", "fjord"]\n')
    assert (records["classified"]["status"], records["classified"]["decision_rule"]) == ("denied", "no-secret-words")
    assert {r["agent"] for r in records.values()} == {"codex-mcp-client"}  # its clientInfo name
