"""Claude Code (npm `@anthropic-ai/claude-code`) through toolkeeper, offline: `ANTHROPIC_BASE_URL` points at
toolkeeper in front of the strict scripted model. `scripts/test` installs it in `.npm/`."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import ROOT, call

CLAUDE = ROOT / ".npm" / "node_modules" / ".bin" / "claude"


@pytest.fixture
def claude_home(tmp_path):
    assert CLAUDE.exists(), "Claude Code is missing: bash scripts/test installs it (npm)"
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (work / "notes.txt").write_text("The release is on Friday.\n")
    return home, work


def claude(tk, home, work, *args: str) -> subprocess.CompletedProcess:
    # MCP_CONNECTION_NONBLOCKING=false: -p mode waits for its MCP servers before the first request, else one
    # slow to start (a loaded machine) is missing from the tools offered, and its call is "No such tool"
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "TERM": "dumb",
           "ANTHROPIC_BASE_URL": tk.base_url[: -len("/v1")], "ANTHROPIC_API_KEY": "sk-ant-dummy",
           "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "MCP_CONNECTION_NONBLOCKING": "false"}
    return subprocess.run([str(CLAUDE), "-p", *args, "--output-format", "json"], capture_output=True, text=True,
                          timeout=120, cwd=work, env=env, stdin=subprocess.DEVNULL)


def result(run: subprocess.CompletedProcess) -> dict:
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_claude_code_runs_a_declared_tool_and_never_sees_it(scripted, tk, claude_home):
    home, work = claude_home
    scripted.script({"content": "Let me look it up.", "tool_calls": [call("lookup", {"word": "fjord"})]},
                    {"content": "A fjord is a long, narrow sea inlet."})
    answer = result(claude(tk, home, work, "What is a fjord?"))
    assert answer["result"] == "A fjord is a long, narrow sea inlet." and not answer["is_error"]
    assert tk.calls() == [["lookup", "fjord"]]
    first = next(b for b in scripted.bodies() if any(t.get("name") == "lookup" for t in b.get("tools", [])))
    assert any(t.get("name") == "Read" for t in first["tools"])  # its own tools, and ours after them

    # --continue: its history comes back, and the hidden call and its result are restored in place
    scripted.script({"content": "You are welcome."})
    again = result(claude(tk, home, work, "--continue", "Thanks!"))
    assert again["result"] == "You are welcome."
    sent = scripted.bodies()[-1]["messages"]
    used = [b for m in sent if isinstance(m["content"], list) for b in m["content"] if b.get("type") == "tool_use"]
    assert [b["name"] for b in used] == ["lookup"]


def test_claude_code_runs_its_own_read_beside_a_declared_tool(scripted, tk, claude_home):
    home, work = claude_home
    scripted.script({"tool_calls": [call("lookup", {"word": "friday"}, "toolu_dec"),
                                    call("Read", {"file_path": str(work / "notes.txt")}, "toolu_read")]},
                    {"content": "The release is on Friday."})
    answer = result(claude(tk, home, work, "When is the release?"))
    assert answer["result"] == "The release is on Friday."
    assert tk.calls() == [["lookup", "friday"]]
    last = scripted.bodies()[-1]["messages"][-1]["content"]
    results = {b["tool_use_id"]: b for b in last if b.get("type") == "tool_result"}
    assert set(results) == {"toolu_dec", "toolu_read"}  # both answered, in one user message
    assert "Friday" in json.dumps(results["toolu_read"]["content"])
