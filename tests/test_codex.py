"""Codex CLI (npm `@openai/codex`, which speaks only the Responses API) through toolkeeper, offline.

Codex runs `codex exec` against a custom model provider whose base URL is toolkeeper, in front of the
strict scripted model. `scripts/test` installs it in `.npm/`.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import ROOT, call

CODEX = ROOT / ".npm" / "node_modules" / ".bin" / "codex"
CONFIG = """
model = "gpt-5.5"
model_provider = "toolkeeper"
approval_policy = "never"
sandbox_mode = "danger-full-access"

[model_providers.toolkeeper]
name = "toolkeeper"
base_url = "{base_url}"
env_key = "TOOLKEEPER_TEST_KEY"
wire_api = "responses"
supports_websockets = false
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 30000

[features]
plugins = false

[analytics]
enabled = false
"""


def config(base_url: str, *, websockets: bool = False) -> str:
    """Codex's config.toml for a provider at base_url; with websockets, Codex first tries the Responses API's
    WebSocket mode, which toolkeeper refuses (403), and falls back to HTTP for the session."""
    text = CONFIG.format(base_url=base_url)
    return text.replace("supports_websockets = false", "supports_websockets = true") if websockets else text


@pytest.fixture
def codex_home(tmp_path, tk):
    assert CODEX.exists(), "Codex CLI is missing: bash scripts/test installs it (npm install @openai/codex)"
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text(CONFIG.format(base_url=tk.base_url))
    work = tmp_path / "work"
    work.mkdir()
    return home, work


def codex(home, work, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "CODEX_HOME": str(home / ".codex"),
           "TOOLKEEPER_TEST_KEY": "sk-codex-test", "NO_COLOR": "1"}
    return subprocess.run([str(CODEX), "exec", *args], capture_output=True, text=True, timeout=120, cwd=work,
                          env=env)


def agent_messages(stdout: str) -> list[str]:
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return [e["item"]["text"] for e in events if e.get("type") == "item.completed"
            and e["item"].get("type") == "agent_message"]


def test_codex_in_websocket_mode_falls_back_to_http_and_the_declared_tool_runs_hidden(scripted, tk, codex_home):
    home, work = codex_home
    (home / ".codex" / "config.toml").write_text(config(tk.base_url, websockets=True))
    scripted.script({"content": "Let me look it up.", "tool_calls": [call("lookup", {"word": "tide"})]},
                    {"content": "A tide is the rise and fall of the sea."})
    run = codex(home, work, "--skip-git-repo-check", "--json", "What is a tide?")
    assert run.returncode == 0, run.stdout + run.stderr
    assert agent_messages(run.stdout)[-1] == "A tide is the rise and fall of the sea."
    assert "Falling back from WebSockets to HTTPS" in run.stdout and "--pass-ungoverned" in run.stdout
    assert "lookup" not in run.stdout and tk.calls() == [["lookup", "tide"]]


def test_codex_runs_a_declared_tool_and_never_sees_it(scripted, tk, codex_home):
    home, work = codex_home
    scripted.script({"content": "Let me look it up.", "tool_calls": [call("lookup", {"word": "fjord"})]},
                    {"content": "A fjord is a long, narrow sea inlet."})
    run = codex(home, work, "--skip-git-repo-check", "--json", "What is a fjord?")
    assert run.returncode == 0, run.stdout + run.stderr
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    messages = [e["item"]["text"] for e in events if e.get("type") == "item.completed"
                and e["item"].get("type") == "agent_message"]
    assert messages[-1] == "A fjord is a long, narrow sea inlet."
    assert "lookup" not in run.stdout  # no trace of the declared call
    assert tk.calls() == [["lookup", "fjord"]]
    first = scripted.bodies()[0]
    assert first["store"] is False and "reasoning.encrypted_content" in first["include"]
    assert any(t.get("name") == "lookup" for t in first["tools"])

    # the next turn: Codex resends its history; the hidden call and its result are back in place
    scripted.script({"content": "Glad to help."})
    again = codex(home, work, "resume", "--last", "--skip-git-repo-check", "--json", "Thanks!")
    assert again.returncode == 0, again.stdout + again.stderr
    sent = scripted.bodies()[0]["input"]
    kinds = [item.get("type") for item in sent]
    assert "function_call" in kinds and "function_call_output" in kinds
    assert sum(1 for item in sent if item.get("name") == "lookup") == 1
