"""The agents' hook formats (wire/hooks.py) and `toolkeeper hook AGENT` relaying toolkeeper's decision.

The events are as the agents sent them to a hook that saved its stdin: Claude Code 2.1.197, Codex CLI 0.169.0
and Gemini CLI 0.61.0, each run against a scripted model making one shell call. The command runs as the
agents run it, a process reading stdin, against a stand-in for toolkeeper's POST /toolkeeper/hooks.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import free_port

from toolkeeper.wire import HOOK_AGENTS, HOOK_AGENTS_THAT_ASK, HookFormatError, read_event, render

SESSION = "a1581a5f-85b9-460d-a404-49fe94c9fc1d"
CLAUDE_PRE = {
    "session_id": SESSION, "transcript_path": f"/home/ada/.claude/projects/-work/{SESSION}.jsonl", "cwd": "/work",
    "prompt_id": "526f4449-b100-4303-9375-4b30c6716de0", "permission_mode": "default", "effort": {"level": "high"},
    "hook_event_name": "PreToolUse", "tool_name": "Bash",
    "tool_input": {"command": "echo hello-from-bash", "description": "Say hello"}, "tool_use_id": "toolu_01ABC"}
CLAUDE_POST = {**CLAUDE_PRE, "hook_event_name": "PostToolUse", "duration_ms": 48,
               "tool_response": {"stdout": "hello-from-bash", "stderr": "", "interrupted": False, "isImage": False,
                                 "noOutputExpected": False}}
CLAUDE_FAILURE = {**CLAUDE_PRE, "hook_event_name": "PostToolUseFailure", "error": "Exit code 1", "is_interrupt": False,
                  "duration_ms": 12}
CODEX_PRE = {
    "session_id": "01a23279-e3e3-70d0-aa0b-86c6b6ba0e9e", "turn_id": "01a23279-e3f3-75a2-b1f8-d126881e978b",
    "transcript_path": "/home/ada/.codex/sessions/2026/12/01/rollout.jsonl", "cwd": "/work",
    "hook_event_name": "PreToolUse", "model": "gpt-5.5", "permission_mode": "bypassPermissions", "tool_name": "Bash",
    "tool_input": {"command": "echo hello-from-codex"}, "tool_use_id": "call_3_0"}
CODEX_POST = {**CODEX_PRE, "hook_event_name": "PostToolUse", "tool_response": "hello-from-codex\n"}
GEMINI_PRE = {
    "session_id": "6b2fc2e4-84ab-4274-b3a5-11efbb1b2112",
    "transcript_path": "/home/ada/.gemini/tmp/work/chats/session-2026-12-01T16-40-6b2fc2e4.jsonl", "cwd": "/work",
    "hook_event_name": "BeforeTool", "timestamp": "2026-12-01T16:40:12.601Z", "tool_name": "run_shell_command",
    "tool_input": {"command": "echo hello-from-gemini", "description": "say hello"}}
GEMINI_POST = {**GEMINI_PRE, "hook_event_name": "AfterTool", "timestamp": "2026-12-01T16:40:12.662Z",
               "tool_response": {"llmContent": "Output: hello-from-gemini", "returnDisplay": "hello-from-gemini"}}
PRE_EVENTS = {"claude-code": CLAUDE_PRE, "codex": CODEX_PRE, "gemini-cli": GEMINI_PRE}


# -- reading events ---------------------------------------------------------------------------------------------

def test_claude_code_events_are_read_and_the_tool_use_id_joins_pre_and_post():
    pre, post = read_event("claude-code", CLAUDE_PRE), read_event("claude-code", CLAUDE_POST)
    assert (pre.agent, pre.phase, pre.tool, pre.session, pre.cwd) == ("claude-code", "pre", "Bash", SESSION, "/work")
    assert pre.arguments == {"command": "echo hello-from-bash", "description": "Say hello"}
    assert pre.call_id == post.call_id == "toolu_01ABC" and pre.result is None
    assert post.phase == "post" and post.result["stdout"] == "hello-from-bash" and post.error is None
    failed = read_event("claude-code", CLAUDE_FAILURE)
    assert (failed.phase, failed.call_id, failed.error) == ("post", "toolu_01ABC", "Exit code 1")
    assert failed.result == {"error": "Exit code 1", "is_interrupt": False}


def test_codex_events_are_read_as_claude_codes_are():
    pre, post = read_event("codex", CODEX_PRE), read_event("codex", CODEX_POST)
    assert (pre.phase, pre.tool, pre.arguments, pre.call_id) == ("pre", "Bash", {"command": "echo hello-from-codex"},
                                                                 "call_3_0")
    assert (post.phase, post.call_id, post.result) == ("post", "call_3_0", "hello-from-codex\n")


def test_gemini_cli_gives_no_call_id_so_the_call_is_known_by_session_tool_and_arguments():
    pre, post = read_event("gemini-cli", GEMINI_PRE), read_event("gemini-cli", GEMINI_POST)
    assert (pre.phase, pre.tool, post.phase) == ("pre", "run_shell_command", "post")
    assert pre.call_id == post.call_id and len(pre.call_id) == 64
    reordered = {**GEMINI_PRE, "tool_input": {"description": "say hello", "command": "echo hello-from-gemini"}}
    assert read_event("gemini-cli", reordered).call_id == pre.call_id  # canonical: key order does not matter
    other_call = {**GEMINI_PRE, "tool_input": {"command": "echo other"}}
    other_session = {**GEMINI_PRE, "session_id": "another"}
    assert len({pre.call_id, read_event("gemini-cli", other_call).call_id,
                read_event("gemini-cli", other_session).call_id}) == 3
    failed = {**GEMINI_POST, "tool_response": {"llmContent": "", "returnDisplay": "",
                                               "error": {"message": "Command exited with code 2", "type": "x"}}}
    assert read_event("gemini-cli", failed).error == "Command exited with code 2"


DEEP: list = []
for _ in range(1000):
    DEEP = [DEEP]


@pytest.mark.parametrize(("agent", "event", "said"), [
    ("claude-code", GEMINI_PRE, "BeforeTool is what gemini-cli sends"),
    ("gemini-cli", CLAUDE_PRE, "PreToolUse is what claude-code and codex send"),
    ("codex", CLAUDE_FAILURE, "PostToolUseFailure is what claude-code sends"),
    ("claude-code", [CLAUDE_PRE], "a JSON object, not list"),
    ("claude-code", {**CLAUDE_PRE, "tool_name": ""}, "`tool_name`"),
    ("claude-code", {k: v for k, v in CLAUDE_PRE.items() if k != "tool_input"}, "`tool_input`"),
    ("claude-code", {k: v for k, v in CLAUDE_POST.items() if k != "tool_response"}, "`tool_response`"),
    ("codex", {**CODEX_PRE, "session_id": 7}, "`session_id`"),
    ("cursor", CLAUDE_PRE, "no hook format is known"),
    # nested past anything a tool takes or gives (1,000 deep would break the record's redaction): a 400, a deny
    ("claude-code", {**CLAUDE_PRE, "tool_input": {"command": DEEP}}, "nests more than 64 levels deep"),
    ("claude-code", {**CLAUDE_POST, "tool_response": DEEP}, "nests more than 64 levels deep"),
])
def test_an_event_that_is_not_the_agents_says_what_is_wrong(agent, event, said):
    with pytest.raises(HookFormatError, match=said.replace("(", r"\(")):
        read_event(agent, event)


# -- rendering decisions ----------------------------------------------------------------------------------------

def claude_answer(decision: str, reason: str) -> dict:
    return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": decision,
                                   "permissionDecisionReason": reason}}


@pytest.mark.parametrize("decision", ["allow", "deny", "ask"])
def test_claude_code_reads_its_permission_decision(decision):
    text, status = render("claude-code", "pre", decision, "rule no-rm: not here")
    assert status == 0 and json.loads(text) == claude_answer(decision, "rule no-rm: not here")


def test_codex_is_told_only_a_deny_since_it_refuses_allow_and_ask():
    assert render("codex", "pre", "allow", "fine") == ("", 0)
    text, status = render("codex", "pre", "deny", "rule no-rm: not here")
    assert status == 0 and json.loads(text) == claude_answer("deny", "rule no-rm: not here")
    asked = json.loads(render("codex", "pre", "ask", "a push leaves this machine")[0])["hookSpecificOutput"]
    assert asked["permissionDecision"] == "deny"
    assert asked["permissionDecisionReason"].startswith("a person must approve this call, and Codex's hook cannot")
    assert asked["permissionDecisionReason"].endswith(": a push leaves this machine")


def test_gemini_cli_reads_its_decision_and_an_ask_is_a_deny_it_can_end():
    assert render("gemini-cli", "pre", "allow", "fine") == ('{"decision": "allow"}', 0)
    assert json.loads(render("gemini-cli", "pre", "deny", "no")[0]) == {"decision": "deny", "reason": "no"}
    asked = json.loads(render("gemini-cli", "pre", "ask", "a push")[0])
    assert asked["decision"] == "deny" and "a person must approve" in asked["reason"] and "a push" in asked["reason"]


@pytest.mark.parametrize("agent", HOOK_AGENTS)
def test_a_defer_is_no_decision_in_every_agents_reading(agent):
    """Nothing on stdout, exit 0: each agent's own permission flow decides (never Claude Code's own
    `permissionDecision: "defer"`, which pauses a `claude -p` session, nor Gemini CLI's `{"decision": "allow"}`)."""
    assert render(agent, "pre", "defer", "no rule decided this call") == ("", 0)


@pytest.mark.parametrize("agent", HOOK_AGENTS)
def test_only_the_agents_that_ask_are_handed_an_ask(agent):
    text, _ = render(agent, "pre", "ask", "a push")
    assert ('"ask"' in text) == (agent in HOOK_AGENTS_THAT_ASK)


@pytest.mark.parametrize("agent", HOOK_AGENTS)
def test_after_the_call_every_agent_gets_a_quiet_success_and_a_reason_is_never_empty(agent):
    for decision in ("allow", "deny", "ask", "defer"):
        assert render(agent, "post", decision, "whatever") == ("", 0)
    text, _ = render(agent, "pre", "deny", "  ")
    assert "toolkeeper decided deny" in text  # Codex refuses a deny without a reason, and runs the call


def test_a_reason_cannot_drive_the_terminal_and_nonsense_is_refused():
    text, _ = render("claude-code", "pre", "deny", "\x1b[2J\x1b]0;pwned\x07 wiped \u202egnp.exe")
    reason = json.loads(text)["hookSpecificOutput"]["permissionDecisionReason"]
    assert reason == "\\x1b[2J\\x1b]0;pwned\\x07 wiped \\u202egnp.exe"
    assert text.isascii()
    with pytest.raises(ValueError, match="decision"):
        render("claude-code", "pre", "maybe", "")
    with pytest.raises(ValueError, match="no hook format"):
        render("cursor", "pre", "deny", "")


# -- the command, against a stand-in toolkeeper -----------------------------------------------------------------

class StandIn:
    """POST /toolkeeper/hooks answered with a fixed status and body; what it received is kept."""

    def __init__(self, answer: dict | bytes, status: int = 200, delay: float = 0.0):
        self.received: list[tuple[str, dict[str, str], dict]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                stand_in.received.append((self.path, dict(self.headers), json.loads(body)))
                time.sleep(delay)
                data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                with contextlib.suppress(OSError):  # the hook may have given up waiting
                    self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in():
    started: list[StandIn] = []

    def start(answer: dict | bytes, status: int = 200, delay: float = 0.0) -> StandIn:
        started.append(StandIn(answer, status, delay))
        return started[-1]

    yield start
    for server in started:
        server.close()


def hook(agent: str, event: dict | str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`toolkeeper hook AGENT ARGS` as the agent runs it: the event on stdin, none of the tester's TOOLKEEPER_*."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOOLKEEPER_")}
    stdin = event if isinstance(event, str) else json.dumps(event)
    return subprocess.run([sys.executable, "-m", "toolkeeper", "hook", agent, *args], input=stdin, text=True,
                          capture_output=True, timeout=60, env={**clean, **(env or {})})


@pytest.mark.parametrize("decision", ["allow", "deny", "ask"])
def test_the_decision_is_relayed_in_claude_codes_format(stand_in, decision):
    server = stand_in({"decision": decision, "reason": "rule no-echo: echo is not allowed"})
    done = hook("claude-code", CLAUDE_PRE, "--url", server.url + "/")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == claude_answer(decision, "rule no-echo: echo is not allowed")
    [(path, headers, body)] = server.received
    assert path == "/toolkeeper/hooks" and body == {"agent": "claude-code", "event": CLAUDE_PRE}
    assert "Authorization" not in headers  # no TOOLKEEPER_AGENT_KEY, no header


@pytest.mark.parametrize("agent", HOOK_AGENTS)
def test_a_defer_is_relayed_as_silence(stand_in, agent):
    server = stand_in({"decision": "defer", "reason": "no rule decided this call"})
    done = hook(agent, {"claude-code": CLAUDE_PRE, "codex": CODEX_PRE, "gemini-cli": GEMINI_PRE}[agent],
                "--url", server.url)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_gemini_cli_and_codex_are_answered_in_theirs(stand_in):
    server = stand_in({"decision": "deny", "reason": "no echo"})
    gemini = hook("gemini-cli", GEMINI_PRE, "--url", server.url)
    assert (gemini.returncode, json.loads(gemini.stdout)) == (0, {"decision": "deny", "reason": "no echo"})
    codex = hook("codex", CODEX_PRE, "--url", server.url)
    assert json.loads(codex.stdout)["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert [body["agent"] for _, _, body in server.received] == ["gemini-cli", "codex"]


def test_the_post_event_is_sent_and_answered_quietly(stand_in):
    server = stand_in({"decision": "allow", "reason": "recorded"})
    done = hook("claude-code", CLAUDE_POST, "--url", server.url)
    assert (done.returncode, done.stdout) == (0, "")
    assert server.received[0][2]["event"]["tool_response"]["stdout"] == "hello-from-bash"


def test_the_agent_key_is_presented_and_serve_is_found_as_the_other_commands_find_it(stand_in, tmp_path):
    server = stand_in({"decision": "allow", "reason": ""})
    done = hook("claude-code", CLAUDE_PRE, env={"TOOLKEEPER_AGENT_KEY": "ak-ci-bot-0123456789",
                                                "TOOLKEEPER_PORT": str(server.port)})
    assert done.returncode == 0 and json.loads(done.stdout)["hookSpecificOutput"]["permissionDecision"] == "allow"
    assert server.received[0][1]["Authorization"] == "Bearer ak-ci-bot-0123456789"
    (tmp_path / "key").write_text("ak-from-a-file\n")
    (tmp_path / "toolkeeper.yaml").write_text(f"port: {server.port}\nagent_key_file: {tmp_path / 'key'}\n")
    hook("claude-code", CLAUDE_PRE, "--config", str(tmp_path / "toolkeeper.yaml"))
    assert server.received[1][1]["Authorization"] == "Bearer ak-from-a-file"


def test_a_reason_with_control_characters_comes_out_escaped(stand_in):
    server = stand_in({"decision": "deny", "reason": "\x1b[2Jrule no-echo"})
    done = hook("claude-code", CLAUDE_PRE, "--url", server.url)
    assert "\x1b" not in done.stdout
    assert json.loads(done.stdout)["hookSpecificOutput"]["permissionDecisionReason"] == "\\x1b[2Jrule no-echo"


def denial(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)["hookSpecificOutput"]
    assert answer["permissionDecision"] == "deny"
    return answer["permissionDecisionReason"]


def test_an_unreachable_toolkeeper_is_a_deny_and_the_hook_fails_closed():
    url = f"http://127.0.0.1:{free_port()}"
    reason = denial(hook("claude-code", CLAUDE_PRE, "--url", url))
    assert reason.startswith(f"toolkeeper could not be reached at {url} (") and reason.endswith("fails closed")
    after = hook("claude-code", CLAUDE_POST, "--url", url)  # the call ran: nothing to deny, only said
    assert (after.returncode, after.stdout) == (0, "") and "could not be reached" in after.stderr


def test_with_fail_open_an_unreachable_toolkeeper_lets_the_agent_go_on_with_a_warning():
    done = hook("gemini-cli", GEMINI_PRE, "--url", f"http://127.0.0.1:{free_port()}", "--fail-open")
    assert (done.returncode, done.stdout) == (0, "")
    assert "could not be reached" in done.stderr and "--fail-open" in done.stderr


@pytest.mark.parametrize(("answer", "status", "said"), [
    ({"error": "toolkeeper does not know this agent's key"}, 401, "refused the hook (401: toolkeeper does not know"),
    (b"<html>bad gateway</html>", 502, "refused the hook (502: <html>bad gateway</html>)"),
    (b"not json", 200, "gave no decision"),
    ({"decision": "perhaps", "reason": "?"}, 200, "gave no decision"),
])
def test_a_refusal_or_an_answer_that_is_not_a_decision_is_a_deny(stand_in, answer, status, said):
    server = stand_in(answer, status)
    assert said in denial(hook("claude-code", CLAUDE_PRE, "--url", server.url))


def test_a_toolkeeper_that_does_not_answer_in_time_is_a_deny(stand_in):
    server = stand_in({"decision": "allow", "reason": ""}, delay=5)
    started = time.monotonic()
    reason = denial(hook("claude-code", CLAUDE_PRE, "--url", server.url, "--timeout", "0.5"))
    assert reason == f"toolkeeper at {server.url} did not answer within 0.5 s: the hook fails closed"
    assert time.monotonic() - started < 5


class Trickle:
    """A server that answers POST /toolkeeper/hooks with an allow, one byte a second: from its first byte
    (`headers`), or with its headers at once and then its body (`body`). A per-read timeout never trips."""

    def __init__(self, start: str):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.start = start
        self.stopped = threading.Event()
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        with contextlib.suppress(OSError):
            connection, _ = self.listener.accept()
            with connection:
                connection.recv(65536)
                body = json.dumps({"decision": "allow", "reason": "trickled"}).encode()
                head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        + f"Content-Length: {len(body)}\r\n\r\n".encode())
                if self.start == "body":
                    connection.sendall(head)
                for byte in (head if self.start == "headers" else b"") + body:
                    if self.stopped.wait(1):
                        return
                    connection.sendall(bytes([byte]))

    def close(self):
        self.stopped.set()
        self.listener.close()


@pytest.mark.parametrize("start", ["headers", "body"])
def test_the_timeout_is_a_deadline_for_the_whole_answer_not_for_each_read(start):
    server = Trickle(start)
    try:
        started = time.monotonic()
        reason = denial(hook("claude-code", CLAUDE_PRE, "--url", server.url, "--timeout", "3"))
        took = time.monotonic() - started
    finally:
        server.close()
    assert reason == f"toolkeeper at {server.url} did not answer within 3 s: the hook fails closed"
    assert took < 3 + 1.5, took  # the process's own start included; the trickle would take over 30 s


def test_an_event_it_cannot_read_is_a_deny_without_asking(stand_in):
    server = stand_in({"decision": "allow", "reason": ""})
    assert "cannot read this claude-code hook event" in denial(hook("claude-code", "{not json", "--url", server.url))
    gemini_event = denial(hook("claude-code", GEMINI_PRE, "--url", server.url, "--fail-open"))
    assert "BeforeTool is what gemini-cli sends" in gemini_event
    assert server.received == []
    refused = hook("claude-code", CLAUDE_PRE, "--url", "ftp://127.0.0.1/")
    assert "--url must be an http:// or https:// address" in denial(refused)


def test_bad_options_are_refused_by_the_parser():
    assert hook("cursor", CLAUDE_PRE).returncode == 2
    assert "more than 0 seconds" in hook("claude-code", CLAUDE_PRE, "--timeout", "0").stderr


def test_the_hook_command_imports_none_of_the_proxy():
    """It runs before and after every tool call of the agent: its start is the hook's cost (a second with the
    proxy's modules, a third of one without)."""
    code = ("import sys; from toolkeeper.cli import command_modules; command_modules('hook'); "
            "import toolkeeper.cli.hooks; print(sorted(m for m in ('aiohttp', 'toolkeeper.app', 'toolkeeper.engine') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
